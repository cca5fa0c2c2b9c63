"""run_tick: a fresh decision the server had already run is recorded, told exactly once.

An operator that acted and died before its status was written leaves its
successor to decide the same step under the same id; the server replays its
recorded result. The successor records the action in status, and posts its
event only when no Event on the service names the action already (the
predecessor may have died before posting it). A retry of an action whose
outcome was unknown still posts its event: none was posted for it before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from fusebox_contract.names import EventReason
from fusebox_operator.actuator import ActionResult, RuntimeCall
from fusebox_operator.observations import PodSample, PodView
from fusebox_operator.policy_state import Action, ActionKind, PolicyState
from fusebox_operator.spec import parse_spec
from fusebox_operator.tick import TickInputs, TickMemory, TickOutcome, run_tick

T0 = 1_800_000_000.0
LIMIT = 4 * 1024**3
SPEC = parse_spec({"model": {"name": "chat", "source": "pvc://models/tiny"}})
POD = PodView("p", "uid-p", "10.0.0.1", "Running", True, True, True, 0, False, False)


class ReplayingActuator:
    """Answers every action as the server does for an id it has already run."""

    def __init__(self, replayed: bool) -> None:
        self.replayed = replayed
        self.ids: list[str] = []

    async def execute(
        self, namespace: str, pod: PodView | None, token: str, action: Action
    ) -> ActionResult:
        self.ids.append(action.id)
        return ActionResult("RSS 3.9 GiB -> 3.9 GiB (freed 0 B)", replayed=self.replayed)

    async def reconcile_runtime(self, *args: Any, **kwargs: Any) -> RuntimeCall:
        return RuntimeCall()


class Events:
    """The action ids the service's Events name, and the ids each lookup asked about."""

    def __init__(self, *named: str) -> None:
        self.named = set(named)
        self.asked: list[list[str]] = []

    async def told_before(self, ids: Sequence[str]) -> set[str]:
        self.asked.append(list(ids))
        return self.named & set(ids)


def tick(
    actuator: ReplayingActuator, status: dict[str, Any], events: Events | None = None
) -> TickOutcome:
    async def scrape(pods: Sequence[PodView]) -> list[PodSample]:
        # 97 % of the limit: the ladder's first rung at once, no trend needed.
        return [PodSample("p", T0, rss_bytes=0.97 * LIMIT, memory_limit_bytes=LIMIT,
                          stats_age_seconds=1.0, heartbeat_age_seconds=0.5)]  # fmt: skip

    inputs = TickInputs("ns", "svc", SPEC, status, [POD], "token", 1)
    events = events or Events()
    return asyncio.run(
        run_tick(inputs, TickMemory(), scrape, actuator, lambda: T0, events.told_before)
    )


def test_a_replayed_fresh_decision_already_told_is_recorded_without_a_second_event() -> None:
    actuator = ReplayingActuator(replayed=True)
    # The id the successor issues first: one past the empty status' sequence.
    events = Events("svc-000001-gc")
    outcome = tick(actuator, {"memory": {"limitBytes": LIMIT}}, events)
    assert actuator.ids == ["svc-000001-gc"] and events.asked == [["svc-000001-gc"]]
    assert outcome.status_patch["lastAction"]["id"] == actuator.ids[0]
    assert EventReason.GARBAGE_COLLECTED not in [e.reason for e in outcome.events]


def test_a_replayed_fresh_decision_no_event_names_is_told_now() -> None:
    # The predecessor died after the server ran the action, before posting its event.
    actuator = ReplayingActuator(replayed=True)
    outcome = tick(actuator, {"memory": {"limitBytes": LIMIT}}, Events("svc-000000-gc"))
    (told,) = [e for e in outcome.events if e.reason is EventReason.GARBAGE_COLLECTED]
    assert told.message.endswith(f"[{actuator.ids[0]}]")
    assert outcome.status_patch["lastAction"]["id"] == actuator.ids[0]


def test_a_fresh_decision_the_server_runs_now_is_announced_without_reading_events() -> None:
    events = Events()
    outcome = tick(ReplayingActuator(replayed=False), {"memory": {"limitBytes": LIMIT}}, events)
    assert EventReason.GARBAGE_COLLECTED in [e.reason for e in outcome.events]
    assert events.asked == []  # no replay, no lookup: a tick costs no extra request


def test_a_retried_action_is_announced_even_when_the_server_replays_it() -> None:
    state = PolicyState("svc")
    state.settle(Action("svc-000009-gc", ActionKind.GC, "p", "RSS high", T0 - 30), settled=False)
    status = {"memory": {"limitBytes": LIMIT}, "policy": state.to_status()}
    actuator = ReplayingActuator(replayed=True)
    events = Events()
    outcome = tick(actuator, status, events)
    assert actuator.ids[0] == "svc-000009-gc"
    assert EventReason.GARBAGE_COLLECTED in [e.reason for e in outcome.events]
    assert events.asked == []
