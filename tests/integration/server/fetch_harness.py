"""What the model-source integration tests share: running the fetcher as the
init container does (`python -m fusebox_server.fetch`, its settings in the
environment), reading its report from the termination log, and starting a
real server it fetches from (versitygw, olah) on loopback."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fusebox_contract.model_fetch import FetchEnv, FetchReport, parse


@dataclass(frozen=True)
class FetchRun:
    returncode: int
    report: FetchReport
    output: str


def pod_link(model_dir: Path, pod: str = "pod") -> Path:
    """Where pod `pod`'s fetcher into `model_dir` links the revision it verified: the
    server's model directory (in a pod, /run/fusebox/model in its runtime volume)."""
    return model_dir.parent / f"{model_dir.name}-{pod}" / "model"


def start_fetch(
    model_dir: Path, settings: Mapping[str, str], scrubbed: tuple[str, ...], pod: str = "pod"
) -> subprocess.Popen[str]:
    """Pod `pod`'s fetcher into the source's directory `model_dir` with `settings`;
    variables of this process starting with a `scrubbed` prefix are left out, so only
    the test's own settings count."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FUSEBOX_", *scrubbed))}
    env |= {
        FetchEnv.MODEL_DIR: str(model_dir),
        FetchEnv.MODEL_LINK: str(pod_link(model_dir, pod)),
        FetchEnv.REPORT_FILE: str(model_dir.parent / f"{model_dir.name}-report.json"),
        FetchEnv.TERMINATION_LOG: str(model_dir.parent / f"{model_dir.name}-termination"),
        **settings,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "fusebox_server.fetch"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finished(process: subprocess.Popen[str], model_dir: Path) -> FetchRun:
    """The fetcher's exit and the report it left, as the kubelet keeps it."""
    output, _ = process.communicate(timeout=120)
    report = parse((model_dir.parent / f"{model_dir.name}-termination").read_text())
    assert report is not None, output
    return FetchRun(process.returncode, report, output)


@contextlib.contextmanager
def serving(
    argv: Sequence[str], workdir: Path, name: str, ready: Callable[[], bool], seconds: float
) -> Iterator[None]:
    """`argv` running (its log in workdir/NAME.log) once `ready()` holds; stopped after."""
    log_path = workdir / f"{name}.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv, cwd=workdir, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + seconds
    while not ready():
        assert process.poll() is None, log_path.read_text()
        assert time.monotonic() < deadline, f"{name} was not ready within {seconds:.0f} s"
        time.sleep(0.2)
    try:
        yield
    finally:
        process.terminate()
        process.wait(timeout=15)
