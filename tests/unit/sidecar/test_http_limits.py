"""The sidecar's HTTP server bounds what one client can hold: an idle connection is
closed after its timeout, and connections past the cap are closed unanswered, while
a scrape still gets its answer (a slow client must not cost the pod its telemetry)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from fusebox_sidecar.server import make_app, make_http_server


@pytest.fixture
def server_port() -> Iterator[int]:
    httpd = make_http_server(
        "127.0.0.1", 0, make_app(CollectorRegistry()), idle_timeout_seconds=0.5, max_connections=2
    )
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(httpd.server_address[1])
    finally:
        httpd.shutdown()
        httpd.server_close()


def idle(port: int) -> socket.socket:
    connection = socket.create_connection(("127.0.0.1", port), timeout=5)
    connection.settimeout(5)
    return connection


def healthz(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
        connection.settimeout(5)
        connection.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
        answer = b""
        while chunk := connection.recv(4096):
            answer += chunk
        return answer


def test_an_idle_connection_is_closed_after_the_timeout(server_port: int) -> None:
    connection = idle(server_port)
    started = time.monotonic()
    assert connection.recv(1) == b""  # closed by the server, not by our 5 s timeout
    assert time.monotonic() - started < 4
    connection.close()


def test_connections_past_the_cap_are_closed_and_scrapes_answer_once_slots_free(
    server_port: int,
) -> None:
    held = [idle(server_port), idle(server_port)]
    time.sleep(0.1)  # both accepted and holding their slots
    assert healthz(server_port) == b""  # the third: closed unanswered
    for connection in held:
        assert connection.recv(1) == b""  # their idle timeout frees the slots
        connection.close()
    # A slot is released just after its connection closes: allow that moment.
    deadline = time.monotonic() + 3
    while not (answer := healthz(server_port)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert answer.startswith(b"HTTP/1.0 200")
