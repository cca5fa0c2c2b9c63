"""Whole ticks against the real sidecar when the server's stats file is missing or old.

The sidecar is the real process, scraped over loopback; the stats file is
written with the contract's own writer, as the server writes it, or never.
No server runs: what is under test is what the operator makes of the
sidecar's answer (fusebox_stats_valid, the stats age, what it measured
itself), and the admin API is not called (an idle actuator).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from fusebox_contract.names import BreakerState, ConditionType, EventReason, HeartbeatThread
from fusebox_contract.stats import RuntimeState, StatsDocument, dumps
from fusebox_operator.actuator import ActionResult, RuntimeCall
from fusebox_operator.observations import PodSample, PodView
from fusebox_operator.spec import parse_spec
from fusebox_operator.telemetry import scrape_all
from fusebox_operator.tick import TickInputs, TickMemory, run_tick

from .test_operator_io import free_port

SPEC = parse_spec({"model": {"name": "chat", "source": "pvc://models/tiny"}, "replicas": 1})
MIB = 1024**2
# The largest pid Linux allows, free here: the sidecar cannot read its RSS, so relays it.
NO_SUCH_PID = 4_194_303


def pod(ready: bool) -> PodView:
    return PodView("pod-a", "uid-a", "127.0.0.1", "Running", ready, True, True, 0, False, False)


@dataclass
class Sidecar:
    stats_file: Path
    port: int

    def write(self, written_at: float) -> None:
        """A valid stats file as the server writes it, stamped `written_at`."""
        document = StatsDocument(
            written_at=written_at,
            pid=NO_SUCH_PID,
            rss_bytes=800 * MIB,
            heartbeats={thread: written_at for thread in HeartbeatThread},
            state=RuntimeState(
                breaker=BreakerState.CLOSED, model_loaded=True, memory_guard_active=False
            ),
        )
        temporary = self.stats_file.with_suffix(".tmp")
        temporary.write_text(dumps(document))
        temporary.replace(self.stats_file)


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[Sidecar]:
    """The real sidecar on loopback, pointed at a stats file nobody has written yet."""
    port = free_port()
    stats_file = tmp_path / "stats.json"
    log = open(tmp_path / "sidecar.log", "wb")  # noqa: SIM115
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fusebox_sidecar",
            "--stats-file",
            str(stats_file),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        env={**os.environ},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                    break
            except OSError:
                pass
            assert process.poll() is None, (tmp_path / "sidecar.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "sidecar not up in 60 s"
            time.sleep(0.2)
        yield Sidecar(stats_file, port)
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


class IdleActuator:
    async def execute(self, *_: Any) -> ActionResult:
        return ActionResult("not called")

    async def reconcile_runtime(self, *_: Any) -> RuntimeCall:
        return RuntimeCall()


@dataclass
class Tick:
    status: dict[str, Any]
    events: list[Any]
    sample: PodSample


def tick(sidecar: Sidecar, ready: bool) -> Tick:
    """One tick of a fresh operator's memory against the sidecar."""

    async def go() -> Tick:
        async with aiohttp.ClientSession() as session:
            scraped: list[PodSample] = []

            async def scrape(pods: Sequence[PodView]) -> list[PodSample]:
                scraped[:] = await scrape_all(session, pods, 2.0, "ttft", port=sidecar.port)
                return list(scraped)

            inputs = TickInputs("ns", "svc", SPEC, {}, [pod(ready)], "token", 1)
            outcome = await run_tick(inputs, TickMemory(), scrape, IdleActuator(), time.time)
            return Tick(outcome.status_patch, outcome.events, scraped[0])

    return asyncio.run(go())


def condition(status: dict[str, Any], kind: ConditionType) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == kind)


def test_a_ready_pod_whose_stats_file_is_never_written_is_not_serving(sidecar: Sidecar) -> None:
    seen = tick(sidecar, ready=True)
    assert seen.sample.ok and seen.sample.stats_valid is False
    ready = condition(seen.status, ConditionType.READY)
    assert (ready["status"], ready["reason"]) == ("Unknown", "StatsInvalid")
    fresh = condition(seen.status, ConditionType.TELEMETRY_FRESH)
    assert (fresh["status"], fresh["reason"]) == ("False", "StatsInvalid")
    assert fresh["message"].startswith("pod-a stats file never valid")
    assert EventReason.TELEMETRY_STALE in [e.reason for e in seen.events]


def test_a_starting_pod_before_its_first_stats_file_is_only_not_ready(sidecar: Sidecar) -> None:
    """Model loading: no stats file yet and the kubelet says not Ready. No alarm, and
    Ready once the server writes its stats and the kubelet agrees."""
    seen = tick(sidecar, ready=False)
    ready = condition(seen.status, ConditionType.READY)
    assert (ready["status"], ready["reason"]) == ("False", "PodsNotReady")
    assert condition(seen.status, ConditionType.TELEMETRY_FRESH)["status"] == "True"
    assert EventReason.TELEMETRY_STALE not in [e.reason for e in seen.events]
    sidecar.write(time.time())
    loaded = tick(sidecar, ready=True)
    ready = condition(loaded.status, ConditionType.READY)
    assert (ready["status"], ready["reason"]) == ("True", "PodsReady")


def test_a_relayed_figure_is_as_old_as_the_stats_file_in_the_seen_column(
    sidecar: Sidecar,
) -> None:
    """RSS the sidecar cannot read from /proc is the server's, from a file 10 s old."""
    sidecar.write(time.time() - 10)
    seen = tick(sidecar, ready=True)
    assert seen.sample.rss_measured is False
    summary = seen.status["summary"]
    assert summary["rss"] == "800.0Mi"
    observed_at = dt.datetime.strptime(summary["observedAt"], "%Y-%m-%dT%H:%M:%SZ")
    age = seen.sample.sampled_at - observed_at.replace(tzinfo=dt.UTC).timestamp()
    assert 9 <= age <= 13
