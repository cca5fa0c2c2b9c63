"""The sidecar as a real process on loopback, scraped over HTTP, and promtool.

The sidecar binds port 0 and logs the port it got, so parallel runs never
race for a port.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families


class Samples(dict[tuple[str, tuple[tuple[str, str], ...]], float]):
    """One parsed scrape; `value(name, **labels)` is None when absent."""

    def value(self, name: str, **labels: str) -> float | None:
        return self.get((name, tuple(sorted(labels.items()))))


@dataclass
class Sidecar:
    process: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def get(self, path: str, method: str = "GET", data: bytes | None = None) -> tuple[int, str]:
        request = urllib.request.Request(self.url + path, data=data, method=method)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            with error:
                return error.code, error.read().decode()

    def scrape_text(self) -> str:
        status, body = self.get("/metrics")
        assert status == 200, body
        return body

    def scrape(self) -> Samples:
        samples = Samples()
        for family in text_string_to_metric_families(self.scrape_text()):
            for sample in family.samples:
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return samples

    def log_lines(self) -> list[dict[str, object]]:
        lines = []
        for line in self.log_path.read_text().splitlines():
            try:
                lines.append(json.loads(line))
            except ValueError:
                continue
        return lines


def _wait_for_port(process: subprocess.Popen[bytes], log_path: Path) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for line in log_path.read_text().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if entry.get("event") == "listening":
                return int(entry["port"])
        if process.poll() is not None:
            raise AssertionError(f"sidecar exited {process.returncode}: {log_path.read_text()}")
        time.sleep(0.05)
    raise AssertionError(f"sidecar did not start: {log_path.read_text()}")


@pytest.fixture
def start_sidecar(tmp_path: Path) -> Iterator[Callable[..., Sidecar]]:
    """Factory: `start_sidecar(stats_path, *extra_flags)` → a running sidecar."""
    started: list[subprocess.Popen[bytes]] = []

    def start(stats_path: Path, *extra: str) -> Sidecar:
        log_path = tmp_path / f"sidecar-{len(started)}.log"
        with log_path.open("wb") as log_file:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "fusebox_sidecar",
                    "--stats-file",
                    str(stats_path),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    "0",
                    *extra,
                ],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        started.append(process)
        port = _wait_for_port(process, log_path)
        return Sidecar(process, f"http://127.0.0.1:{port}", log_path)

    yield start
    for process in started:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture(scope="session")
def promtool() -> Callable[[str], subprocess.CompletedProcess[str]]:
    """`promtool check metrics` on an exposition text."""
    path = shutil.which("promtool") or (
        "/usr/bin/promtool" if Path("/usr/bin/promtool").exists() else None
    )
    if path is None:
        pytest.fail(
            "promtool is not installed; run `make setup` (it installs Debian's prometheus "
            "package, which provides /usr/bin/promtool)"
        )

    def check(exposition: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [path, "check", "metrics"],
            input=exposition,
            capture_output=True,
            text=True,
            timeout=30,
        )

    return check


@pytest.fixture
def write_stats(tmp_path: Path) -> Callable[..., Path]:
    """Factory: write a realistic stats file stamped now; keyword overrides
    replace top-level fields. Written by rename, as the server does."""
    path = tmp_path / "stats.json"

    def write(**overrides: object) -> Path:
        now = time.time()
        document: dict[str, object] = {
            "schema": 1,
            "written_at": now,
            "pid": os.getpid(),
            "model_name": "chat",
            "gpu_device_id": None,
            "rss_bytes": 123_456_789,
            "cgroup_memory_usage_bytes": 234_567_890,
            "cgroup_memory_limit_bytes": 1_610_612_736,
            "cuda": {
                "allocated_bytes": None,
                "reserved_bytes": None,
                "num_alloc_retries": None,
                "num_ooms": None,
                "contexts": None,
            },
            "nvml": [],
            "queue_length": 3,
            "running": 8,
            "tokenizer_cache_entries": 512,
            "tokenizer_cache_hits_total": 40,
            "tokenizer_template_hits_total": 7,
            "requests": {
                "succeeded_total": 100,
                "failed_total": 1,
                "rejected_total": 5,
                "timed_out_total": 0,
            },
            "latency_seconds": {
                "ttft": {"p50": 0.01, "p99": 0.05, "count": 100},
                "itl": {"p50": 0.01, "p99": 0.02, "count": 3000},
                "e2e": None,
            },
            "quality": {"sampled_total": 10, "failed_total": 1, "failure_ratio": 0.1},
            "heartbeats": {"loop": now, "worker": now},
            "state": {
                "breaker": "closed",
                "admit_percent": 100,
                "degradation_level": 0,
                "variant": "primary",
                "model_loaded": True,
                "memory_guard_active": False,
            },
        }
        document.update(overrides)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(document))
        temporary.replace(path)
        return path

    return write
