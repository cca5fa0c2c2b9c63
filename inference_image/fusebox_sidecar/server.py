"""HTTP for the sidecar: `/metrics` and `/healthz` on a small threaded WSGI server.

The standard library's wsgiref plus prometheus-client's WSGI app keep the
sidecar's own memory small (no ASGI stack, no torch). `/healthz` says only
that the sidecar answers: it must not fail when the server is wedged, or the
kubelet would restart the one container that is reporting the wedge.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from prometheus_client import make_wsgi_app
from prometheus_client.registry import CollectorRegistry

from fusebox_contract.wiring import HttpPath


def _text_headers(*extra: tuple[str, str]) -> list[tuple[str, str]]:
    # A fresh list each time: wsgiref appends Content-Length to the list it gets.
    return [("Content-Type", "text/plain; charset=utf-8"), *extra]


def make_app(registry: CollectorRegistry) -> WSGIApplication:
    metrics_app = make_wsgi_app(registry)

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        method = environ.get("REQUEST_METHOD", "GET")
        if path not in (HttpPath.METRICS, HttpPath.HEALTHZ):
            start_response("404 Not Found", _text_headers())
            return [b"not found: try /metrics or /healthz\n"]
        if method not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", _text_headers(("Allow", "GET, HEAD")))
            return [b"method not allowed\n"]
        if path == HttpPath.METRICS:
            body: Iterable[bytes] = metrics_app(environ, start_response)
            return body
        start_response("200 OK", _text_headers())
        return [b"ok\n"]

    return app


# A scrape is one short request; a client that holds a connection longer, or more
# clients at once than this, are not scrapers (a slow client must not use up the
# sidecar's threads and memory, or its liveness on this same server fails).
IDLE_TIMEOUT_SECONDS = 10.0
MAX_CONNECTIONS = 32


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    """A thread per connection, at most `max_connections` at once: one more is closed
    unanswered (the kubelet's probe and the scrapers retry)."""

    daemon_threads = True
    allow_reuse_address = True
    max_connections = MAX_CONNECTIONS

    def server_activate(self) -> None:
        super().server_activate()
        self._slots = threading.BoundedSemaphore(self.max_connections)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class _ThreadingServerV6(_ThreadingServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    """No access log: a scrape every few seconds is not news. A connection idle for
    `timeout` seconds (no request line, no body) is closed."""

    timeout = IDLE_TIMEOUT_SECONDS

    def log_message(self, format: str, *args: Any) -> None:
        pass


def make_http_server(
    host: str,
    port: int,
    app: WSGIApplication,
    idle_timeout_seconds: float = IDLE_TIMEOUT_SECONDS,
    max_connections: int = MAX_CONNECTIONS,
) -> WSGIServer:
    base = _ThreadingServerV6 if ":" in host else _ThreadingServer
    server_class = type(base.__name__, (base,), {"max_connections": max_connections})
    handler_class = type(
        _QuietHandler.__name__, (_QuietHandler,), {"timeout": idle_timeout_seconds}
    )
    return make_server(host, port, app, server_class=server_class, handler_class=handler_class)
