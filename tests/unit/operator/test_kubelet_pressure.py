"""kubelet_pressure: the Nodes' MemoryPressure, listed once per interval for the whole
operator whatever the number of services asking; a list the API refuses or fails is
no kubelet signal (the floor alone decides), told once in the log. The API server is
a small fake of CoreV1Api.list_node answering raw JSON, as the client does."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from fusebox_operator.kubelet_pressure import (
    READ_INTERVAL_SECONDS,
    WAIT_SECONDS,
    KubeletPressureReader,
    not_ready_nodes,
    pressured_nodes,
)
from fusebox_operator.node_pressure import KubeletPressure
from fusebox_operator.observations import NodeNotReady


def node(name: str, memory_pressure: str, message: str = "") -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True"},
                {
                    "type": "MemoryPressure",
                    "status": memory_pressure,
                    "lastTransitionTime": "2026-12-06T03:20:11Z",
                    "message": message,
                },
            ]
        },
    }


class Raw:
    """The unparsed response the client returns with _preload_content=False."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.data = json.dumps(body).encode()


class FakeCore:
    """list_node as the API server answers it; `refuse` makes it fail as RBAC would."""

    def __init__(self, *nodes: dict[str, Any]) -> None:
        self.nodes = list(nodes)
        self.lists: list[dict[str, Any]] = []
        self.refuse: ApiException | None = None

    def list_node(self, **kwargs: Any) -> Raw:
        self.lists.append(kwargs)
        if self.refuse is not None:
            raise self.refuse
        return Raw({"kind": "NodeList", "items": self.nodes})


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


FORBIDDEN = ApiException(status=403, reason="Forbidden")


def test_only_nodes_whose_kubelet_says_true_are_under() -> None:
    body = {
        "items": [
            node("n1", "False", "kubelet has sufficient memory available"),
            node("n2", "True", "kubelet has insufficient memory available"),
            node("n3", "Unknown", "Kubelet stopped posting node status."),
            {"metadata": {"name": "n4"}, "status": {}},
        ]
    }
    assert pressured_nodes(body) == {
        "n2": KubeletPressure("n2", 1796527211.0, "kubelet has insufficient memory available")
    }


def test_one_list_per_interval_however_many_services_ask() -> None:
    core, clock = FakeCore(node("n1", "False"), node("n2", "True")), Clock()
    reader = KubeletPressureReader(core, clock=clock)

    async def services_ask(count: int) -> list[dict[str, KubeletPressure] | None]:
        return list(await asyncio.gather(*(reader.pressured() for _ in range(count))))

    answers = asyncio.run(services_ask(50))
    assert len(core.lists) == 1
    # Served from the API server's watch cache, raw: no quorum read, no typed Nodes.
    assert core.lists[0]["resource_version"] == "0"
    assert core.lists[0]["_preload_content"] is False
    # The first asked; those asking while its list ran waited for it (briefly: see
    # below) rather than list again.
    assert all(list(answer or {}) == ["n2"] for answer in answers), answers
    clock.now += READ_INTERVAL_SECONDS - 0.1
    assert list(asyncio.run(services_ask(50))[0] or {}) == ["n2"]
    assert len(core.lists) == 1
    core.nodes = [node("n1", "False"), node("n2", "False")]
    clock.now += 0.1
    asyncio.run(services_ask(1))
    assert len(core.lists) == 2
    assert asyncio.run(reader.pressured()) == {}  # n2's kubelet said False


def test_a_refused_list_is_no_signal_told_once_and_asked_again_each_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    core, clock = FakeCore(node("n2", "True")), Clock()
    reader = KubeletPressureReader(core, clock=clock)
    assert list(asyncio.run(reader.pressured()) or {}) == ["n2"]
    core.refuse = FORBIDDEN
    caplog.set_level(logging.INFO, logger="fusebox_operator.kubelet_pressure")
    answers = []
    for _ in range(5):
        clock.now += READ_INTERVAL_SECONDS
        answers.append(asyncio.run(reader.pressured()))
        answers.append(asyncio.run(reader.pressured()))  # a second service in the interval
    assert answers == [None] * 10  # not the last good answer: nothing known now
    assert len(core.lists) == 6
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "cannot read the Nodes' MemoryPressure (403 Forbidden): node memory pressure is "
        "judged from the sidecars' MemAvailable only until they are readable"
    ]
    core.refuse = None
    clock.now += READ_INTERVAL_SECONDS
    assert list(asyncio.run(reader.pressured()) or {}) == ["n2"]
    assert caplog.records[-1].getMessage() == "the Nodes' MemoryPressure is readable again"


def test_a_failing_api_server_is_no_signal_too() -> None:
    core = FakeCore()
    core.refuse = ApiException(status=500, reason="Internal Server Error")
    assert asyncio.run(KubeletPressureReader(core).pressured()) is None


class HangingCore(FakeCore):
    """An API server that takes its time: list_node blocks until `answer` is set."""

    def __init__(self, *nodes: dict[str, Any]) -> None:
        super().__init__(*nodes)
        self.answer = threading.Event()

    def list_node(self, **kwargs: Any) -> Raw:
        self.answer.wait(timeout=10)
        return super().list_node(**kwargs)


def test_a_slow_list_delays_a_tick_by_at_most_the_wait_and_answers_a_later_one() -> None:
    """A restarting API server can swallow a connection for seconds: the tick (a new
    operator's first admin calls with it) goes on without the signal meanwhile."""
    core = HangingCore(node("n2", "True"))
    reader = KubeletPressureReader(core, clock=Clock())

    async def two_ticks() -> tuple[float, dict[str, KubeletPressure] | None, Any]:
        started = time.monotonic()
        first = await reader.pressured()
        waited = time.monotonic() - started
        core.answer.set()
        await asyncio.sleep(0.2)  # the list finishes in the background
        return waited, first, await reader.pressured()

    waited, first, second = asyncio.run(two_ticks())
    # The list hangs 10 s: a tick that waited on it would take that long, not the 1 s wait
    # (the margin is a loaded CI host's, not a figure).
    assert first is None and waited < WAIT_SECONDS + 4
    assert list(second or {}) == ["n2"]
    assert len(core.lists) == 1


def test_nodes_whose_ready_is_false_or_unknown_are_named_with_their_transition() -> None:
    down = node("n2", "Unknown")
    down["status"]["conditions"][0] = {
        "type": "Ready",
        "status": "Unknown",
        "lastTransitionTime": "2026-12-06T03:20:11Z",
    }
    off = node("n3", "False")
    off["status"]["conditions"][0] = {"type": "Ready", "status": "False"}
    registering = {"metadata": {"name": "n4"}, "status": {}}
    listed = {"items": [node("n1", "False"), down, off, registering]}
    assert not_ready_nodes(listed) == {
        "n2": NodeNotReady("n2", 1796527211.0),
        "n3": NodeNotReady("n3", None),
    }
