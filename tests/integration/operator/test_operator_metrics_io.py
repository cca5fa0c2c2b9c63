"""The operator's /metrics after whole ticks against the real server and sidecar.

The ticks run as the kopf timer runs them (tick.run_tick, then the handler's one
`METRICS.tick` call), with the real actuator acting on the real admin API; the
endpoint is the one `python -m fusebox_operator` serves (operator_metrics.serve on
the process's registry), read over HTTP and checked by promtool.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fusebox_operator.actuator import Actuator
from fusebox_operator.observations import PodSample, PodView
from fusebox_operator.operator_metrics import METRICS, OperatorMetric, serve
from fusebox_operator.telemetry import scrape_all
from fusebox_operator.tick import TickInputs, TickMemory, run_tick

from .test_operator_io import POD, SPEC, TOKEN, Pair, _base_status, pair

__all__ = ["pair"]  # the real server and sidecar, started once for this module

# A second pod whose sidecar nobody serves: 127.0.0.2 is loopback, where nothing listens.
GONE = replace(POD, name="pod-gone", uid="uid-gone", ip="127.0.0.2")
TICKS = 3


@pytest.fixture
def endpoint() -> Iterator[str]:
    server = serve(METRICS, 0, host="127.0.0.1")
    try:
        yield f"http://127.0.0.1:{server.server_port}/metrics"
    finally:
        server.shutdown()
        server.server_close()


def scraped(url: str) -> tuple[str, dict[tuple[str, frozenset[tuple[str, str]]], float]]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    values = {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    return text, values


def value(values: dict[Any, float], name: str, **labels: str) -> float:
    return values.get((name, frozenset(labels.items())), 0.0)


async def ticks(pair: Pair, count: int) -> None:
    memory = TickMemory()
    status: dict[str, Any] = _base_status(0)
    async with aiohttp.ClientSession() as session:
        actuator = Actuator(session, None, admin_port=pair.admin_port)

        async def scrape(pods: Sequence[PodView]) -> list[PodSample]:
            # The real sidecar's figures, the limit set so that RSS is at 97 % of it:
            # the memory ladder's first rung (gc) is due at once.
            samples = await scrape_all(session, pods, 2.0, "ttft", port=pair.metrics_port)
            return [
                replace(s, memory_limit_bytes=s.rss_bytes / 0.97) if s.rss_bytes else s
                for s in samples
            ]

        for _ in range(count):
            inputs = TickInputs("ns", "itmetrics", SPEC, status, [POD, GONE], TOKEN, 1)
            started = time.perf_counter()
            outcome = await run_tick(inputs, memory, scrape, actuator, time.time)
            METRICS.tick("ns/chat", time.perf_counter() - started, status, outcome.status_patch)
            status = {**status, **outcome.status_patch}
            await asyncio.sleep(1.0)


def test_the_operators_metrics_count_whole_ticks_actions_and_unreachable_sidecars(
    pair: Pair, endpoint: str
) -> None:
    ticks_name = f"{OperatorMetric.TICK_DURATION_SECONDS.value}_count"
    gc = {"action": "gc", "reason": "memory", "result": "succeeded"}
    actions = OperatorMetric.ACTIONS.samples[0]
    errors = OperatorMetric.SCRAPE_ERRORS.samples[0]
    _, before = scraped(endpoint)

    asyncio.run(ticks(pair, TICKS))

    text, after = scraped(endpoint)
    assert value(after, ticks_name) == value(before, ticks_name) + TICKS
    # The ladder's gc ran on the real server and answered with its figures.
    assert value(after, actions, **gc) >= value(before, actions, **gc) + 1
    # pod-gone's sidecar was tried on every tick and never answered.
    unreachable = value(after, errors, kind="unreachable") - value(
        before, errors, kind="unreachable"
    )
    assert unreachable >= TICKS
    services = [
        (dict(labels), v)
        for (name, labels), v in after.items()
        if name == OperatorMetric.SERVICES.value
    ]
    assert sum(v for _, v in services) >= 1
    assert {labels["breaker"] for labels, _ in services} <= {
        "Closed", "Open", "HalfOpen", "Refusing", "Unknown"
    }  # fmt: skip
    checked = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
