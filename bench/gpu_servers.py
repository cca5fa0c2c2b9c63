"""Starting the servers a GPU bench compares, and what it records of the machine.

Why one module: gpu_bench.py and gpu_realistic.py both start the real
Fusebox server and `transformers serve --continuous-batching` on the lent
device, wait for their health checks, keep their logs' tails and describe the
machine they ran on. Written once, both scripts start their servers the same
way (offline, with the same thread settings and the same module entry
points), so a difference in their figures is the workload's, not the launch's.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench import loopback
from bench.server_bench import thread_environment, wait_http

FUSEBOX_MODEL = "bench"  # the name Fusebox serves the bench model under


def fusebox_command(model_dir: Path, workdir: Path, port: int, flags: dict[str, Any]) -> list[str]:
    """`python -m fusebox_server` on loopback at `port`, with its stats file in `workdir`
    (stats-PORT.json) and `flags` (their names as the CLI spells them, `max-queue`)."""
    args: dict[str, Any] = {
        "model-dir": model_dir,
        "model-name": FUSEBOX_MODEL,
        "host": "127.0.0.1",
        "port": port,
        "admin-port": loopback.free_port(),
        "stats-file": fusebox_stats_file(workdir, port),
    }
    args |= flags
    args.setdefault("log-level", "warning")
    command = [sys.executable, "-m", "fusebox_server"]
    for flag, value in args.items():
        command += [f"--{flag}", str(value)]
    return command


def fusebox_stats_file(workdir: Path, port: int) -> Path:
    return workdir / f"stats-{port}.json"


def launch(
    name: str,
    command: list[str],
    health_path: str,
    port: int,
    workdir: Path,
    threads: int,
    timeout_seconds: float,
) -> tuple[subprocess.Popen[bytes], str, Path]:
    """Start a server (its output in workdir/NAME-PORT.log) and wait for its health check,
    at most `timeout_seconds`; one that does not answer in time is stopped."""
    log = workdir / f"{name}-{port}.log"
    with log.open("wb") as sink:  # the child keeps its own copy of the descriptor
        process = subprocess.Popen(
            command, stdout=sink, stderr=subprocess.STDOUT, env=thread_environment(threads)
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}{health_path}", process, log, timeout=timeout_seconds)
    except RuntimeError:
        loopback.stop(process, grace_seconds=10)
        raise
    return process, url, log


def log_tail(path: Path, limit: int = 3000) -> str:
    """The last `limit` characters of a log, or "" when it is not there."""
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError:
        return ""


def environment_report(device: str) -> dict[str, Any]:
    """The versions and machine a run's figures come from (the GPU's name on CUDA)."""
    import torch
    import transformers

    report: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpus": os.cpu_count(),
        "load_average_1m_at_start": os.getloadavg()[0],
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        report["gpu"] = torch.cuda.get_device_name(0)
    return report
