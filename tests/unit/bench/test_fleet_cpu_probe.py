"""The fleet bench's CPU probe (bench/fleet/cpu_probe): a process started with it on its
path and FUSEBOX_CPU_PROBE_DIR set answers SIGUSR2 with the CPU since its last answer, by
stack, charged to the function that spent it, on the event loop's thread and on others;
without the variable it does nothing. And the bench keeps the head of a profile."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.operator_scale_bench import CPU_PROBE, cpu_probe_digest

from .probed_process import probed_process

# Spends CPU in one function on the main thread and in another on a thread of its own,
# while a third thread only waits; then waits for the signals.
WORKER = """
import sys, threading, time

def spin(seconds):
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        sum(range(200))

def main_thread_work():
    spin(0.6)

def other_thread_work():
    spin(0.3)

waiter = threading.Thread(target=time.sleep, args=(30,), daemon=True)
waiter.start()
other = threading.Thread(target=other_thread_work)
other.start()
main_thread_work()
other.join()
print("ready", flush=True)
time.sleep(60)
"""


def _worker(env: dict[str, str]) -> contextlib.AbstractContextManager[subprocess.Popen[str]]:
    return probed_process(WORKER, CPU_PROBE, env)


def _profile(folder: Path, number: int) -> dict[str, Any]:
    path = folder / f"{number}.json"
    deadline = time.monotonic() + 30
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    profile: dict[str, Any] = json.loads(path.read_text())
    return profile


def test_sigusr2_charges_each_threads_cpu_to_the_function_that_spent_it(tmp_path: Path) -> None:
    with _worker({"FUSEBOX_CPU_PROBE_DIR": str(tmp_path)}) as process:
        time.sleep(0.5)  # a moment more for the probe thread's last look at the threads
        process.send_signal(signal.SIGUSR2)
        first = _profile(tmp_path, 1)
        process.send_signal(signal.SIGUSR2)  # nothing spent since: counting starts afresh
        second = _profile(tmp_path, 2)
    cumulative = dict(first["cumulative_by_function"])
    assert cumulative["<string>:main_thread_work"] > 0.4
    assert cumulative["<string>:other_thread_work"] > 0.15
    assert "stdlib/threading.py:_bootstrap" in cumulative  # the other thread's stack
    assert 0.6 < first["sampled_cpu_seconds"] < 1.5
    folded = (tmp_path / "1.folded").read_text().splitlines()
    assert any(line.startswith("<string>:<module>;<string>:main_thread_work") for line in folded)
    assert second["sampled_cpu_seconds"] < 0.1


def test_without_its_folder_the_probe_leaves_the_process_alone(tmp_path: Path) -> None:
    with _worker({}) as process:
        # Python's default for SIGUSR2 ends the process: no handler was installed.
        process.send_signal(signal.SIGUSR2)
        assert process.wait(timeout=30) == -signal.SIGUSR2
    assert not list(tmp_path.iterdir())


def test_the_bench_keeps_the_head_of_a_profile_and_says_when_there_is_none() -> None:
    profile = {
        "file": "/tmp/p/2.json",
        "sampled_cpu_seconds": 3.0,
        "own_by_package": [["kopf", 2.0], ["aiohttp", 1.0]],
        "own_by_function": [[f"f{i}", 0.1] for i in range(40)],
        "cumulative_by_function": [[f"g{i}", 0.1] for i in range(40)],
    }
    digest = cpu_probe_digest(profile, top=5)
    assert digest["own_by_package"] == [["kopf", 2.0], ["aiohttp", 1.0]]
    assert len(digest["own_by_function"]) == 5 and len(digest["cumulative_by_function"]) == 5
    assert cpu_probe_digest({"error": "no profile within 60 s"}) == {
        "error": "no profile within 60 s"
    }
