"""The server harness: a real fusebox_server process on loopback, and what tests ask of it.

Imported by this folder's conftest and tests as `fusebox_server_harness` (the
conftest puts this folder on sys.path; the unique name cannot clash with
another part's test modules).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from fusebox_contract.admin import (
    ActionRequest,
    ActionResult,
    AdminPath,
    AdminRequest,
    BreakerRequest,
    DegradationRequest,
    FaultsRequest,
    ServerState,
)
from fusebox_contract.names import ActionType, BreakerState, DegradationLevel, Fault, Variant
from fusebox_server.zoo.release import ensure_zoo_model

CORPUS = (
    Path(__file__).resolve().parents[3] / "inference_image" / "fusebox_server" / "model" / "corpus"
)
TEMPLATES_FILE = CORPUS / "templates.json"
CANNED_FILE = CORPUS / "canned_answers.json"
MODEL_NAME = "tiny"
ADMIN_TOKEN = "s3cr3t-admin-token-for-tests"
STARTUP_TIMEOUT_SECONDS = 240.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """A running server: its URLs, admin client, stats file and log."""

    def __init__(
        self,
        workdir: Path,
        model_dir: Path,
        flags: dict[str, Any],
        env: dict[str, str],
        preexec: Any = None,
    ):
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.admin_port = free_port()
        self.stats_file = workdir / "run" / "stats.json"
        self.log_file = workdir / "server.log"
        token_file = workdir / "admin-token"
        token_file.write_text(ADMIN_TOKEN + "\n")
        args = {
            "model-dir": str(model_dir),
            "model-name": MODEL_NAME,
            "host": "127.0.0.1",
            "port": self.port,
            "admin-port": self.admin_port,
            "admin-token-file": str(token_file),
            "stats-file": str(self.stats_file),
            "templates-file": str(TEMPLATES_FILE),
            "canned-answers-file": str(CANNED_FILE),
            # One intra-op thread: on a shared 2-core box more threads only contend.
            "torch-threads": 1,
        }
        args.update(flags)
        command = [sys.executable, "-m", "fusebox_server"]
        for name, value in args.items():
            command += [f"--{name}", str(value)]
        environment = {k: v for k, v in os.environ.items() if not k.startswith("FUSEBOX_")}
        environment.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
        environment.update(env)
        self._log = open(self.log_file, "wb")
        self.process = subprocess.Popen(
            command,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=environment,
            preexec_fn=preexec,
        )
        self.url = f"http://127.0.0.1:{self.port}"
        self.admin_url = f"http://127.0.0.1:{self.admin_port}"
        self.client = httpx.Client(base_url=self.url, timeout=60)
        self.admin = httpx.Client(
            base_url=self.admin_url,
            timeout=60,
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_text(self) -> str:
        return self.log_file.read_text(errors="replace")

    def wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log_text()[-4000:]}")
            try:
                if self.client.get("/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server not ready in time:\n{self.log_text()[-4000:]}")

    def state(self) -> ServerState:
        response = self.admin.get(AdminPath.STATE)
        response.raise_for_status()
        return ServerState.parse(response.json())

    def send(self, request: AdminRequest, timeout: float = 60) -> httpx.Response:
        """One admin request, to its path, in the contract's wire form."""
        path = request.path
        return self.admin.request(path.method, path, json=request.encode(), timeout=timeout)

    def act(
        self, action_type: ActionType, variant: Variant | None = None, action_id: str | None = None
    ) -> ActionResult:
        """Run an admin action (a fresh id unless given); it must succeed."""
        request = ActionRequest(action_id or uuid.uuid4().hex, action_type, variant)
        response = self.send(request)
        assert response.status_code == 200, response.text
        return ActionResult.parse(response.json())

    def set_faults(self, **values: int) -> None:
        """Switch armed faults at run time."""
        response = self.send(FaultsRequest({Fault(name): mib for name, mib in values.items()}))
        assert response.status_code == 200, response.text

    def stats(self) -> dict[str, Any]:
        return dict(json.loads(self.stats_file.read_text()))

    def wait_for(self, predicate: Any, timeout: float = 20.0, what: str = "condition") -> Any:
        """Poll predicate() until it returns something truthy (no wall-time assertion)."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            last = predicate()
            if last:
                return last
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}; last value {last!r}")

    def chat(self, content: str, **fields: Any) -> httpx.Response:
        body = {
            "model": MODEL_NAME,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 4,
            "temperature": 0,
        }
        body.update(fields)
        return self.client.post("/v1/chat/completions", json=body)

    def reset_runtime(self) -> None:
        """Put the runtime state back to the defaults other tests expect."""
        self.send(BreakerRequest(BreakerState.CLOSED)).raise_for_status()
        self.send(DegradationRequest(DegradationLevel.NONE)).raise_for_status()

        # A level left by the test may still be converging in the background (a fallback
        # load under way): a swap after the reset would change the serving variant, and
        # with it the prompt cache, in the middle of the next test.
        def settled() -> ServerState | None:
            state = self.state()
            return None if state.converging else state

        state = self.wait_for(settled, timeout=120, what="the degradation to settle")
        if not state.model_loaded or state.variant != Variant.PRIMARY:
            self.act(ActionType.LOAD, Variant.PRIMARY, action_id=f"reset-{time.time_ns()}")

    def stop(self, graceful: bool = True) -> None:
        self.client.close()
        self.admin.close()
        if self.process.poll() is None and not graceful:
            self.process.kill()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)
        self._log.close()


@contextmanager
def zoo_server(family: str, parent: Path, max_new_tokens: int) -> Iterator[ServerProcess]:
    """A ready server of one zoo family's release (built into the cache on first use),
    in its own workdir under `parent`; stopped and its workdir removed afterwards."""
    workdir = Path(tempfile.mkdtemp(prefix=f"zoo-{family}-", dir=parent))
    server = ServerProcess(
        workdir, ensure_zoo_model(family), {"max-new-tokens": max_new_tokens}, {}
    )
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def streamed_calls(chunks: Any) -> tuple[dict[int, dict[str, str]], list[str | None], str]:
    """A streamed chat's tool calls by index (id, name and arguments joined from their
    deltas), every chunk's finish_reason (None until the last), and its content."""
    calls: dict[int, dict[str, str]] = {}
    finishes: list[str | None] = []
    content = ""
    for chunk in chunks:
        for choice in chunk.choices:
            finishes.append(choice.finish_reason)
            content += choice.delta.content or ""
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                call["id"] += delta.id or ""
                if delta.function is not None:
                    call["name"] += delta.function.name or ""
                    call["arguments"] += delta.function.arguments or ""
    return calls, finishes, content
