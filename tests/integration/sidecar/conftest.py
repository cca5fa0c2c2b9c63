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
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench import loopback
from fusebox_contract.admin import AdminRequest
from fusebox_contract.names import (
    BreakerState,
    DegradationLevel,
    Dtype,
    HeartbeatThread,
    LatencyMetric,
    Quantization,
    RequestOutcome,
    Variant,
)
from fusebox_contract.stats import (
    LatencySummary,
    Quality,
    RuntimeState,
    StatsDocument,
    dumps,
)


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


@pytest.fixture
def start_sidecar(tmp_path: Path) -> Iterator[Callable[..., Sidecar]]:
    """Factory: `start_sidecar(stats_path, *extra_flags)` → a running sidecar."""
    started: list[subprocess.Popen[bytes]] = []

    def start(stats_path: Path, *extra: str) -> Sidecar:
        log_path = tmp_path / f"sidecar-{len(started)}.log"
        process, port = loopback.start_sidecar(stats_path, log_path, *extra)
        started.append(process)
        return Sidecar(process, f"http://{loopback.HOST}:{port}", log_path)

    yield start
    for process in started:
        loopback.stop(process)


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
    """Factory: write a realistic stats file stamped now with the contract's
    writer; keyword overrides replace `StatsDocument` fields. Written by
    rename, as the server does."""
    path = tmp_path / "stats.json"

    def write(**overrides: object) -> Path:
        now = time.time()
        document = StatsDocument(
            written_at=now,
            pid=os.getpid(),
            model_name="chat",
            rss_bytes=123_456_789,
            cgroup_memory_usage_bytes=234_567_890,
            cgroup_memory_limit_bytes=1_610_612_736,
            queue_length=3,
            running=8,
            tokenizer_cache_entries=512,
            tokenizer_cache_hits_total=40,
            tokenizer_template_hits_total=7,
            requests={outcome: 10 + position for position, outcome in enumerate(RequestOutcome)},
            latency={
                LatencyMetric.TTFT: LatencySummary(p99_seconds=0.05, count=100),
                LatencyMetric.ITL: LatencySummary(p99_seconds=0.02, count=3000),
            },
            quality=Quality(sampled_total=10, failed_total=1, failure_ratio=0.1),
            heartbeats=dict.fromkeys(HeartbeatThread, now),
            state=RuntimeState(
                breaker=BreakerState.CLOSED,
                admit_percent=100,
                degradation_level=DegradationLevel.NONE,
                variant=Variant.PRIMARY,
                model_loaded=True,
                memory_guard_active=False,
                model_revision="main",
                dtype=Dtype.FLOAT32,
                quantization=Quantization.NONE,
                fallback_configured=True,
                target_variant=Variant.PRIMARY,
                converging=False,
            ),
        )
        temporary = path.with_suffix(".tmp")
        temporary.write_text(dumps(replace(document, **overrides)))
        temporary.replace(path)
        return path

    return write


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The generated tiny model, made once into the cache (deterministic files)."""
    return loopback.generated_model("tiny", quiet=True)


@dataclass
class Server:
    """A real `python -m fusebox_server` process on loopback."""

    process: subprocess.Popen[bytes]
    api_url: str
    admin_url: str
    token: str
    stats_path: Path
    log_path: Path

    def _call(
        self, url: str, method: str, body: object | None, headers: dict[str, str]
    ) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            url, data=data, method=method, headers={"Content-Type": "application/json", **headers}
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            parsed: dict[str, Any] = json.loads(response.read())
            return parsed

    def complete(self, prompt: str, max_tokens: int = 2) -> dict[str, Any]:
        return self._call(
            self.api_url + "/v1/completions",
            "POST",
            {"model": "chat", "prompt": prompt, "max_tokens": max_tokens},
            {},
        )

    def admin(self, request: AdminRequest) -> dict[str, Any]:
        """One admin request, to its path, in the contract's wire form."""
        path = request.path
        return self._call(
            self.admin_url + path,
            path.method,
            request.encode(),
            {"Authorization": f"Bearer {self.token}"},
        )

    def stats(self) -> dict[str, Any]:
        for _ in range(40):
            try:
                parsed: dict[str, Any] = json.loads(self.stats_path.read_text())
                return parsed
            except (FileNotFoundError, ValueError):
                time.sleep(0.1)
        raise AssertionError(f"no readable stats file at {self.stats_path}")

    def log_tail(self) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-30:])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)  # a stopped process handles no SIGTERM
        loopback.stop(self.process, grace_seconds=5)  # a wedged loop never handles SIGTERM


def _wait_until_ready(server: Server) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise AssertionError(f"server exited {server.process.returncode}:\n{server.log_tail()}")
        try:
            with urllib.request.urlopen(server.api_url + "/readyz", timeout=5) as response:
                if response.status == 200 and server.stats_path.exists():
                    if server.stats().get("state", {}).get("model_loaded"):
                        return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"server not ready in time:\n{server.log_tail()}")


@pytest.fixture(scope="module")
def server_factory(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., Server]]:
    """Factory: `server_factory(faults="leak:64")` → a ready server on CPU."""
    servers: list[Server] = []

    def start(faults: str = "") -> Server:
        workdir = tmp_path_factory.mktemp("server")
        token = "test-admin-token-" + os.urandom(8).hex()
        token_file = loopback.write_token_file(workdir / "admin-token", token)
        api_port, admin_port = loopback.free_port(), loopback.free_port()
        stats_path = workdir / "run" / "stats.json"
        log_path = workdir / "server.log"
        command = loopback.server_command(
            tiny_model_dir,
            api_port=api_port,
            admin_port=admin_port,
            token_file=token_file,
            stats_path=stats_path,
            device="cpu",
        )
        with log_path.open("wb") as log_file:
            process = subprocess.Popen(
                command,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env={**os.environ, "FUSEBOX_FAULTS": faults, "PYTHONUNBUFFERED": "1"},
            )
        server = Server(
            process,
            f"http://{loopback.HOST}:{api_port}",
            f"http://{loopback.HOST}:{admin_port}",
            token,
            stats_path,
            log_path,
        )
        servers.append(server)
        _wait_until_ready(server)
        return server

    yield start
    for server in servers:
        server.stop()
