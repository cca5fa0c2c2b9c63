"""The inference server and the sidecar as child processes on loopback.

The benchmarks (sidecar_bench, server_bench), the GPU check (gpu_check) and
the integration tests each start `python -m fusebox_server` and
`python -m fusebox_sidecar` on 127.0.0.1; when each spelled the command line,
the free port and the wait for the sidecar's `listening` log line, the copies
drifted. This module is that one spelling. Stdlib only: gpu_check runs on a
bare CUDA machine, and a test imports it without starting anything.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

HOST = "127.0.0.1"
SERVED_MODEL_NAME = "chat"


class SidecarDidNotStart(RuntimeError):
    """The sidecar exited, or logged no port in time; the message carries its log."""


def free_port() -> int:
    """A port nothing listens on now (the kernel's pick)."""
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def write_token_file(path: Path, token: str) -> Path:
    """The admin token as the server reads it: a file only its owner can read."""
    path.write_text(token)
    path.chmod(0o600)
    return path


def server_command(
    model_dir: Path,
    *,
    api_port: int,
    admin_port: int,
    token_file: Path,
    stats_path: Path,
    device: str,
    extra_flags: tuple[str, ...] = (),
) -> list[str]:
    """`python -m fusebox_server` serving `model_dir` as `chat` on loopback (16 new tokens)."""
    return [
        sys.executable,
        "-m",
        "fusebox_server",
        "--model-dir",
        str(model_dir),
        "--model-name",
        SERVED_MODEL_NAME,
        "--host",
        HOST,
        "--port",
        str(api_port),
        "--admin-port",
        str(admin_port),
        "--admin-token-file",
        str(token_file),
        "--stats-file",
        str(stats_path),
        "--device",
        device,
        "--max-new-tokens",
        "16",
        *extra_flags,
    ]


def start_sidecar(
    stats_path: Path, log_path: Path, *extra_flags: str, timeout_seconds: float = 30
) -> tuple[subprocess.Popen[bytes], int]:
    """Start the sidecar on a port of its choosing; return it and the port its log names.

    Port 0, so parallel runs never race for a port. A sidecar that exits or
    names no port in time is killed, and SidecarDidNotStart carries its log.
    """
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fusebox_sidecar",
                "--stats-file",
                str(stats_path),
                "--host",
                HOST,
                "--port",
                "0",
                *extra_flags,
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        port = _listening_port(log_path)
        if port is not None:
            return process, port
        if process.poll() is not None:
            raise SidecarDidNotStart(
                f"the sidecar exited {process.returncode}:\n{log_path.read_text()}"
            )
        time.sleep(0.05)
    process.kill()
    process.wait()
    raise SidecarDidNotStart(f"the sidecar did not start:\n{log_path.read_text()}")


def stop(process: subprocess.Popen[bytes], grace_seconds: float = 10) -> None:
    """SIGTERM, and SIGKILL if it has not exited after `grace_seconds`; nothing if it has exited."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=grace_seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def generated_model(size: str, model_dir: Path | None = None, *, quiet: bool = False) -> Path:
    """The generated model of `size` (fusebox_server.model.tiny_model), made once.

    By default under the cache (FUSEBOX_CACHE/models/SIZE). It is generated in
    a child process, so the caller never imports torch.
    """
    if model_dir is None:
        cache = Path(os.environ.get("FUSEBOX_CACHE", Path.home() / ".cache" / "fusebox"))
        model_dir = cache / "models" / size
    if not (model_dir / "config.json").exists():
        if not quiet:
            print(f"generating the {size} model into {model_dir}", flush=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "fusebox_server.model.tiny_model",
                str(model_dir),
                "--size",
                size,
            ],
            check=True,
            capture_output=quiet,
            timeout=900,
        )
    return model_dir


def _listening_port(log_path: Path) -> int | None:
    for line in log_path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("event") == "listening":
            return int(entry["port"])
    return None
