"""The fleet bench's memory probe (bench/fleet/memory_probe): a process started with it
on its path and FUSEBOX_MEMORY_PROBE_DIR set answers SIGUSR1 with a tracemalloc
snapshot that `compare_to` can read and the facts beside it; without the variable it
does nothing. And --operator-env reaches the operator only as NAME=VALUE."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import tracemalloc
from pathlib import Path

import pytest

from bench.operator_scale_bench import MEMORY_PROBE, open_connections, operator_env

from .probed_process import probed_process

# Holds 2,000 lists of its own, then waits: the snapshot must show them at this line.
HOLDER = """
import sys, time
held = [[index] * 50 for index in range(2000)]
print("ready", flush=True)
time.sleep(60)
"""


def _holder(env: dict[str, str]) -> contextlib.AbstractContextManager[subprocess.Popen[str]]:
    return probed_process(HOLDER, MEMORY_PROBE, env)


def test_sigusr1_writes_a_snapshot_and_the_memory_facts(tmp_path: Path) -> None:
    with _holder({"FUSEBOX_MEMORY_PROBE_DIR": str(tmp_path)}) as process:
        process.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 30
        while not (tmp_path / "1.json").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    facts = json.loads((tmp_path / "1.json").read_text())
    assert facts["rss_bytes"] > facts["traced_bytes"] > 2000 * 50 * 8
    assert facts["malloc"]["arena"] > 0
    assert sum(facts["rss_by_mapping"].values()) > 0
    snapshot = tracemalloc.Snapshot.load(str(tmp_path / "1.snapshot"))
    biggest = snapshot.statistics("lineno")[0]
    assert biggest.traceback[0].filename == "<string>" and biggest.traceback[0].lineno == 3


def test_with_no_frames_the_probe_writes_the_figures_alone(tmp_path: Path) -> None:
    env = {"FUSEBOX_MEMORY_PROBE_DIR": str(tmp_path), "FUSEBOX_MEMORY_PROBE_FRAMES": "0"}
    with _holder(env) as process:
        process.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 30
        while not (tmp_path / "1.json").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    facts = json.loads((tmp_path / "1.json").read_text())
    assert facts["traced_bytes"] == 0 and not (tmp_path / "1.snapshot").exists()
    assert facts["rss_after_malloc_trim_bytes"] > 0  # loading libc may add a page or two


def test_without_its_folder_the_probe_leaves_the_process_alone(tmp_path: Path) -> None:
    with _holder({}) as process:
        # Python's default for SIGUSR1 ends the process: no handler was installed.
        process.send_signal(signal.SIGUSR1)
        assert process.wait(timeout=30) == -signal.SIGUSR1
    assert not list(tmp_path.iterdir())


def test_operator_env_takes_name_value_pairs_and_refuses_others() -> None:
    assert operator_env(["MALLOC_ARENA_MAX=2", "A=b=c"]) == {"MALLOC_ARENA_MAX": "2", "A": "b=c"}
    with pytest.raises(SystemExit, match="NAME=VALUE"):
        operator_env(["MALLOC_ARENA_MAX"])


def test_open_connections_counts_this_process_established_connections() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        before = open_connections(os.getpid())["apiserver"]
        with socket.create_connection(server.getsockname()):
            accepted, _ = server.accept()
            with accepted:
                # Both ends are this process's: the client's and the accepted socket.
                assert open_connections(os.getpid())["apiserver"] == before + 2
