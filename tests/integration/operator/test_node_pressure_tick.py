"""Whole ticks against the real server and sidecar: a node below its floor gets its
pod's caches shed through the real admin API, the event and the condition, and
nothing else; above the floor again, the condition clears with one event. The
same for a node whose kubelet reports MemoryPressure while MemAvailable is fine.

The node is this machine, read by the real sidecar from /proc/meminfo; the floor
is put where this machine is certainly below it (1Pi) and then certainly above
it (1Mi), so the test needs no memory pressure of its own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import aiohttp

from fusebox_contract.names import ConditionType, EventReason
from fusebox_operator.actuator import Actuator
from fusebox_operator.node_pressure import KubeletPressure
from fusebox_operator.observations import PodSample, PodView
from fusebox_operator.spec import InferenceServiceSpec, parse_spec
from fusebox_operator.status import EventRecord
from fusebox_operator.telemetry import scrape_all
from fusebox_operator.tick import TickInputs, TickMemory, run_tick

from .test_operator_io import POD, TOKEN, Pair, pair  # noqa: F401 (the module's fixture)

ON_THIS_HOST = replace(POD, node="this-host")


def spec_with_floor(floor: str) -> InferenceServiceSpec:
    return parse_spec(
        {
            "model": {"name": "chat", "source": "pvc://models/tiny"},
            "replicas": 1,
            "memory": {"nodeAvailableFloor": floor},
            "telemetry": {
                "scrapeIntervalSeconds": 1,
                "scrapeTimeoutSeconds": 1,
                "wedgeAfterSeconds": 60,
            },
        }
    )


def condition(status: dict[str, Any]) -> dict[str, Any]:
    for entry in status.get("conditions") or []:
        if entry["type"] == ConditionType.NODE_MEMORY_PRESSURE:
            return dict(entry)
    return {}


async def ticks(
    pair: Pair,  # noqa: F811 (the fixture's value)
    memory: TickMemory,
    status: dict[str, Any],
    spec: InferenceServiceSpec,
    until_status: str,
    kubelet: Mapping[str, KubeletPressure] | None = None,
    service_id: str = "itsvc",
) -> tuple[dict[str, Any], list[EventRecord]]:
    """Ticks as the kopf timer runs them, applying each patch, until the condition's status."""
    events: list[EventRecord] = []
    async with aiohttp.ClientSession() as session:
        actuator = Actuator(session, None, admin_port=pair.admin_port)

        async def scrape(pods: Sequence[PodView]) -> list[PodSample]:
            return await scrape_all(session, pods, 2.0, "ttft", port=pair.metrics_port)

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            inputs = TickInputs(
                "ns", service_id, spec, status, [ON_THIS_HOST], TOKEN, 1, kubelet_pressure=kubelet
            )
            outcome = await run_tick(inputs, memory, scrape, actuator, time.time)
            events += outcome.events
            status = {**status, **outcome.status_patch}
            if condition(status).get("status") == until_status:
                return status, events
            await asyncio.sleep(1.0)
    raise AssertionError(f"condition never {until_status}; last status {status}")


def test_a_node_below_its_floor_gets_the_pods_caches_shed_and_nothing_else(
    pair: Pair,  # noqa: F811 (the fixture)
) -> None:
    memory = TickMemory()
    base = {"memory": {"limitBytes": 8 * 1024**3}}
    status, events = asyncio.run(ticks(pair, memory, base, spec_with_floor("1Pi"), "True"))
    pressure = condition(status)
    assert pressure["reason"] == "BelowFloor"
    assert "node this-host: MemAvailable" in pressure["message"]
    reasons = [e.reason for e in events]
    assert reasons == [
        EventReason.NODE_MEMORY_PRESSURE,
        EventReason.GARBAGE_COLLECTED,
        EventReason.CACHE_EMPTIED,
    ]
    # Both ran on the real server: their results carry its memory before and after.
    shed = [a for a in status["recentActions"] if "node memory pressure" in a["reason"]]
    assert [a["type"] for a in shed] == ["gc", "empty_cache"]
    assert all(a["result"].startswith("RSS ") for a in shed), shed

    status, events = asyncio.run(ticks(pair, memory, status, spec_with_floor("1Mi"), "False"))
    assert condition(status)["reason"] == "AboveFloor"
    assert [e.reason for e in events] == [EventReason.NODE_MEMORY_RECOVERED]


def test_a_node_whose_kubelet_reports_memory_pressure_gets_the_pods_caches_shed(
    pair: Pair,  # noqa: F811 (the fixture)
) -> None:
    memory = TickMemory()
    base = {"memory": {"limitBytes": 8 * 1024**3}}
    spec = spec_with_floor("1Mi")  # this host is certainly above it: only the kubelet says under
    reported = KubeletPressure(
        "this-host", time.time(), "kubelet has insufficient memory available"
    )
    status, events = asyncio.run(
        ticks(pair, memory, base, spec, "True", {"this-host": reported}, "itkubelet")
    )
    pressure = condition(status)
    assert pressure["reason"] == "KubeletMemoryPressure"
    assert "node this-host: the kubelet reports MemoryPressure since " in pressure["message"]
    assert ", MemAvailable " in pressure["message"]  # the sidecar's figures beside it
    assert [e.reason for e in events] == [
        EventReason.NODE_MEMORY_PRESSURE,
        EventReason.GARBAGE_COLLECTED,
        EventReason.CACHE_EMPTIED,
    ]
    shed = [a for a in status["recentActions"] if "node memory pressure" in a["reason"]]
    assert [a["type"] for a in shed] == ["gc", "empty_cache"]
    assert all(a["result"].startswith("RSS ") for a in shed), shed

    status, events = asyncio.run(ticks(pair, memory, status, spec, "False", {}, "itkubelet"))
    (recovered,) = events
    assert recovered.reason is EventReason.NODE_MEMORY_RECOVERED
    assert "back above the floor, and the kubelet reports no MemoryPressure" in recovered.message
