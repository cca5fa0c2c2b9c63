"""Real fusebox_server processes on loopback, with the real tiny model.

One default server is shared by the whole session (tests that change its
runtime state put it back); servers with different flags are started by
the modules that need them through `start_server`.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fusebox_server_harness import ServerProcess  # noqa: E402

from fusebox_server.model.tiny_model import ensure_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    return ensure_model("tiny")


@pytest.fixture(scope="session")
def server_workdir() -> Iterator[Path]:
    """Our own directory for the servers' files, removed at the end.

    Not pytest's tmp_path: concurrent pytest sessions of the same user prune
    each other's numbered base directories, and a server outlives many tests.
    """
    path = Path(tempfile.mkdtemp(prefix="fusebox-server-tests-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def start_server(tiny_model_dir: Path, server_workdir: Path) -> Iterator[Any]:
    """Factory: start_server(flags={...}, env={...}, preexec=fn) -> a ready ServerProcess."""
    started: list[ServerProcess] = []

    def start(
        flags: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        ready: bool = True,
        preexec: Any = None,
    ) -> ServerProcess:
        for attempt in range(3):
            server = ServerProcess(
                Path(tempfile.mkdtemp(prefix="server-", dir=server_workdir)),
                tiny_model_dir,
                flags or {},
                env or {},
                preexec,
            )
            started.append(server)
            if not ready:
                return server
            try:
                server.wait_ready()
                return server
            except RuntimeError:
                # A free port can be taken by another process before the server binds it.
                if attempt == 2 or "address already in use" not in server.log_text().lower():
                    raise
                server.stop()
        raise AssertionError("unreachable")

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def server(start_server: Any) -> ServerProcess:
    """The shared default server: no faults armed, a small tokenizer cache, an int8 fallback."""
    return start_server(
        flags={
            "tokenizer-cache-size": 100,
            "max-new-tokens": 512,
            "max-input-tokens": 256,
            "fallback-quantization": "int8",
        }
    )


@pytest.fixture
def clean_server(server: ServerProcess) -> Iterator[ServerProcess]:
    """The shared server, reset to closed breaker, level 0, primary loaded, before and after."""
    server.reset_runtime()
    yield server
    server.reset_runtime()
