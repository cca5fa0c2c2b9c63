"""The pod sandbox binary (localcluster/images/pause/pause.c), compiled as
build-images.sh compiles it: it stays up, stops cleanly on SIGTERM/SIGINT,
and reaps children left to it so a pod never accumulates zombies."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[3] / "localcluster" / "images" / "pause" / "pause.c"
DEADLINE_SECONDS = 10.0


@pytest.fixture(scope="module")
def pause_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("gcc") is None:
        pytest.fail("gcc is needed to build the pause image (run `make setup-system`)")
    binary = tmp_path_factory.mktemp("pause") / "pause"
    subprocess.run(
        [
            "gcc",
            "-static",
            "-Os",
            "-s",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-o",
            str(binary),
            str(SOURCE),
        ],
        check=True,
    )
    return binary


def _handles(pid: int, signum: int) -> bool:
    """Whether the process has installed a handler for the signal (SigCgt)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def _until_ready(pid: int) -> None:
    """Signals sent before pause installs its handlers would kill it outright."""
    deadline = time.monotonic() + DEADLINE_SECONDS
    while not _handles(pid, signal.SIGTERM) and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.fixture
def running(pause_binary: Path) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([str(pause_binary)])
    _until_ready(proc.pid)
    yield proc
    proc.kill()
    proc.wait()


def _wait(proc: subprocess.Popen[bytes]) -> int:
    return proc.wait(timeout=DEADLINE_SECONDS)


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_stop_signal_exits_zero(running: subprocess.Popen[bytes], stop_signal: int) -> None:
    assert running.poll() is None
    running.send_signal(stop_signal)
    assert _wait(running) == 0


def test_other_signals_do_not_stop_it(running: subprocess.Popen[bytes]) -> None:
    running.send_signal(signal.SIGCHLD)
    running.send_signal(signal.SIGTERM)
    assert _wait(running) == 0  # still alive to receive SIGTERM, exit status of a clean stop


def _state(pid: int) -> str | None:
    """The process's state letter (Z: zombie), or None once it is reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def test_children_left_to_it_are_reaped(pause_binary: Path) -> None:
    # sh starts a short-lived child, then becomes pause: the child's parent is now pause.
    proc = subprocess.Popen(
        ["sh", "-c", f"sleep 0.3 & echo $!; exec {pause_binary}"], stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        _until_ready(proc.pid)
        deadline = time.monotonic() + DEADLINE_SECONDS
        while _state(child) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _state(child) is None, "the exited child was left a zombie"
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
