"""Test app for localcluster's e2e tests (standard library only).

Endpoints (port $PORT, default 8080):
  GET  /            JSON: pod name, pod IP, pid; logs one line per request
  GET  /healthz     200, or 500 after POST /fail-liveness
  GET  /readyz      200 when ready, else 503; POST /ready?value=true|false toggles
  POST /alloc?mib=N allocates and touches N MiB, kept until the process exits
On SIGTERM it appends "sigterm <unix time>" to $SIGTERM_RECORD (if set),
waits $TERM_DELAY_SECONDS (default 0), appends "exit", and exits 0: a test
can see that the signal arrived and that the grace period was honoured.
"""

import json
import os
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

STATE = {"ready": os.environ.get("START_READY", "true") == "true", "live": True}
HELD: list[bytearray] = []


def record(line: str) -> None:
    path = os.environ.get("SIGTERM_RECORD")
    if path:
        with open(path, "a") as out:
            out.write(line + "\n")
            out.flush()
            os.fsync(out.fileno())


class Handler(BaseHTTPRequestHandler):
    def _send(self, status: int, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        path = urlparse(self.path).path
        if path == "/":
            self._send(
                200,
                {
                    "pod": os.environ.get("POD_NAME", socket.gethostname()),
                    "ip": os.environ.get("POD_IP", ""),
                    "pid": os.getpid(),
                },
            )
        elif path == "/healthz":
            self._send(200 if STATE["live"] else 500, {"live": STATE["live"]})
        elif path == "/readyz":
            self._send(200 if STATE["ready"] else 503, {"ready": STATE["ready"]})
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self) -> None:
        url = urlparse(self.path)
        query = parse_qs(url.query)
        if url.path == "/ready":
            STATE["ready"] = query.get("value", ["true"])[0] == "true"
            self._send(200, {"ready": STATE["ready"]})
        elif url.path == "/fail-liveness":
            STATE["live"] = False
            self._send(200, {"live": False})
        elif url.path == "/alloc":
            try:
                mib = int(query.get("mib", ["0"])[0])
            except ValueError:
                self._send(400, {"error": "mib must be an integer"})
                return
            block = bytearray(mib * 1024 * 1024)
            for offset in range(0, len(block), 4096):
                block[offset] = 1
            HELD.append(block)
            self._send(200, {"held_mib": sum(len(b) for b in HELD) // (1024 * 1024)})
        else:
            self._send(404, {"error": "not found"})

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        sys.stdout.write(f"testapp {self.command} {self.path} {args[1] if len(args) > 1 else ''}\n")


def main() -> None:
    server = ThreadingHTTPServer(("0.0.0.0", int(os.environ.get("PORT", "8080"))), Handler)
    server.daemon_threads = True

    def on_sigterm(signum: int, frame: object) -> None:
        record(f"sigterm {time.time()}")
        print("testapp received SIGTERM", flush=True)
        delay = float(os.environ.get("TERM_DELAY_SECONDS", "0"))

        def finish() -> None:
            time.sleep(delay)
            record("exit")
            server.shutdown()

        threading.Thread(target=finish, daemon=True).start()

    signal.signal(signal.SIGTERM, on_sigterm)
    print("testapp listening", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
