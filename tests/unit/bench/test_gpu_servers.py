"""bench/gpu_servers.py, the launching gpu_bench.py and gpu_realistic.py share (and the peer's
command line, from server_bench): a server that dies or never answers, and the logs' tails."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from bench import gpu_servers, loopback
from bench.server_bench import transformers_serve_command


def test_the_peer_runs_continuous_batching_with_the_settings_flags_last(tmp_path: Path) -> None:
    command = transformers_serve_command(tmp_path, 8124, "cuda", "auto", ["--cb-use-cuda-graph"])

    assert command[:5] == [
        sys.executable,
        "-m",
        "transformers.cli.transformers",
        "serve",
        str(tmp_path),
    ]
    assert command[command.index("--port") + 1] == "8124"
    assert command[command.index("--dtype") + 1] == "auto"
    assert command[-2:] == ["--continuous-batching", "--cb-use-cuda-graph"]


def test_a_server_that_exits_before_its_health_check_fails_with_its_log(tmp_path: Path) -> None:
    command = [sys.executable, "-c", "print('no model here'); raise SystemExit(3)"]
    port = loopback.free_port()
    with pytest.raises(RuntimeError, match="no model here"):
        gpu_servers.launch("dies", command, "/health", port, tmp_path, 1, timeout_seconds=30.0)
    assert (tmp_path / f"dies-{port}.log").read_text().strip() == "no model here"


def test_a_server_that_never_answers_is_stopped_at_its_timeout(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    command = [
        sys.executable,
        "-c",
        f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)",
    ]
    with pytest.raises(RuntimeError, match="not ready"):
        gpu_servers.launch(
            "silent", command, "/health", loopback.free_port(), tmp_path, 1, timeout_seconds=5.0
        )
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):  # stopped and reaped, not left running
        os.kill(pid, 0)


def test_a_logs_tail_is_its_last_characters_and_a_missing_log_reads_empty(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("x" * 10 + "the end")

    assert gpu_servers.log_tail(log, 7) == "the end"
    assert gpu_servers.log_tail(tmp_path / "absent.log") == ""
