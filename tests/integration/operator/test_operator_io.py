"""The operator's I/O edge against the real server and sidecar processes.

What the e2e tier does through a cluster, in seconds on loopback: telemetry
scrapes the real sidecar, the actuator drives the real admin API with
idempotency ids, and runtime-state reconciliation shows up in the next scrape.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from fusebox_operator.actuator import Actuator
from fusebox_operator.kube import PodView
from fusebox_operator.policy import Action, ActionKind, PodSample
from fusebox_operator.telemetry import scrape_all

TOKEN = "integration-admin-token"
POD = PodView("pod-a", "uid-a", "127.0.0.1", "Running", True, True, True, 0, False, False)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Pair:
    api_port: int
    admin_port: int
    metrics_port: int


def _model_dir(tmp: Path) -> Path:
    cache = Path(os.environ.get("FUSEBOX_CACHE", Path.home() / ".cache" / "fusebox"))
    model = cache / "models" / "tiny"
    if not (model / "config.json").exists():
        model = tmp / "tiny"
        subprocess.run(
            [sys.executable, "-m", "fusebox_server.tiny_model", str(model)], check=True, timeout=300
        )
    return model


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    tmp = tmp_path_factory.mktemp("operator-io")
    (tmp / "token").write_text(TOKEN)
    ports = Pair(free_port(), free_port(), free_port())
    model = _model_dir(tmp)
    env = {**os.environ, "FUSEBOX_FAULTS": "leak:8"}
    server_log = open(tmp / "server.log", "wb")  # noqa: SIM115
    sidecar_log = open(tmp / "sidecar.log", "wb")  # noqa: SIM115
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fusebox_server",
            "--model-dir",
            str(model),
            "--fallback-dir",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(ports.api_port),
            "--admin-port",
            str(ports.admin_port),
            "--admin-token-file",
            str(tmp / "token"),
            "--stats-file",
            str(tmp / "stats.json"),
            "--device",
            "cpu",
        ],
        env=env,
        stdout=server_log,
        stderr=subprocess.STDOUT,
    )
    sidecar = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fusebox_sidecar",
            "--stats-file",
            str(tmp / "stats.json"),
            "--host",
            "127.0.0.1",
            "--port",
            str(ports.metrics_port),
        ],
        stdout=sidecar_log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                url = f"http://127.0.0.1:{ports.api_port}/readyz"
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            assert server.poll() is None, (tmp / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "server not ready in 180 s"
            time.sleep(0.5)
        yield ports
    finally:
        for process in (sidecar, server):
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        server_log.close()
        sidecar_log.close()


async def _scrape(pair: Pair) -> PodSample:
    async with aiohttp.ClientSession() as session:
        for _ in range(20):
            (sample,) = await scrape_all(session, [POD], 2.0, "ttft", port=pair.metrics_port)
            if sample.ok and sample.rss_bytes is not None:
                return sample
            await asyncio.sleep(0.5)
    raise AssertionError(f"no usable scrape: {sample}")


async def _execute(pair: Pair, action: Action, token: str = TOKEN) -> str:
    async with aiohttp.ClientSession() as session:
        actuator = Actuator(session, None, admin_port=pair.admin_port)
        return await actuator.execute("ns", POD, token, action)


def _action(kind: ActionKind, action_id: str, variant: str = "primary") -> Action:
    return Action(action_id, kind, "pod-a", "test", time.time(), variant)


def test_scrape_of_the_real_sidecar_gives_memory_counters_and_state(pair: Pair) -> None:
    # /readyz flips before the stats thread's next write (once a second), so
    # the first scrape may still carry the loading state.
    deadline = time.monotonic() + 30
    sample = asyncio.run(_scrape(pair))
    while not sample.model_loaded and time.monotonic() < deadline:
        time.sleep(0.5)
        sample = asyncio.run(_scrape(pair))
    assert sample.rss_bytes is not None and sample.rss_bytes > 10 * 1024**2
    assert sample.requests is not None
    assert sample.breaker_state == "closed" and sample.model_loaded is True
    assert sample.stats_age_seconds is not None and sample.stats_age_seconds < 10


def test_gc_action_reports_memory_and_replays_by_id(pair: Pair) -> None:
    first = asyncio.run(_execute(pair, _action(ActionKind.GC, "it-gc-1")))
    assert first.startswith("RSS ") and "replayed" not in first
    again = asyncio.run(_execute(pair, _action(ActionKind.GC, "it-gc-1")))
    assert again.endswith("replayed")


def test_reload_and_swap_change_the_variant(pair: Pair) -> None:
    assert "variant primary" in asyncio.run(_execute(pair, _action(ActionKind.RELOAD, "it-reload")))
    swapped = asyncio.run(_execute(pair, _action(ActionKind.SWAP_FALLBACK, "it-swap", "fallback")))
    assert "variant fallback" in swapped
    restored = asyncio.run(
        _execute(pair, _action(ActionKind.RESTORE_PRIMARY, "it-restore", "primary"))
    )
    assert "variant primary" in restored


def test_wrong_token_is_reported_as_a_failed_action(pair: Pair) -> None:
    result = asyncio.run(_execute(pair, _action(ActionKind.GC, "it-gc-bad"), token="wrong"))
    assert result.startswith("failed:") and "401" in result


def test_runtime_state_reconciled_shows_in_the_next_scrape(pair: Pair) -> None:
    async def go() -> PodSample:
        async with aiohttp.ClientSession() as session:
            actuator = Actuator(session, None, admin_port=pair.admin_port)
            applied: dict[str, tuple[str, int, int]] = {}
            assert await actuator.reconcile_runtime(POD, TOKEN, ("half_open", 5, 1), None, applied)
            # Same target, nothing observed yet: no second call.
            assert not await actuator.reconcile_runtime(
                POD, TOKEN, ("half_open", 5, 1), None, applied
            )
        for _ in range(20):
            sample = await _scrape(pair)
            if sample.breaker_state == "half_open":
                return sample
            await asyncio.sleep(0.5)
        return sample

    sample = asyncio.run(go())
    assert (sample.breaker_state, sample.degradation_level) == ("half_open", 1)

    async def back() -> None:
        async with aiohttp.ClientSession() as session:
            actuator = Actuator(session, None, admin_port=pair.admin_port)
            await actuator.reconcile_runtime(POD, TOKEN, ("closed", 100, 0), None, {})

    asyncio.run(back())
