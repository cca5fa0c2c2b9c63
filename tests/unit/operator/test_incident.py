"""Incident annotations: pause, reset the breaker, pin a tier; bad values named, never a crash.

The parsing is tested directly; the effects through whole ticks (tick.run_tick) with a
recording actuator, as a user sees them: the calls that reach a pod, the events, the status.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from fusebox_contract.names import BreakerState, EventReason
from fusebox_operator.actuator import ActionResult, RuntimeCall
from fusebox_operator.incident import (
    PAUSE_ACTIONS,
    PIN_TIER,
    RESET_BREAKER,
    IncidentControls,
    parse_controls,
)
from fusebox_operator.observations import PodSample, PodView
from fusebox_operator.policy_state import Action, ActionKind, PolicyState
from fusebox_operator.spec import InferenceServiceSpec, parse_spec
from fusebox_operator.tick import TickInputs, TickMemory, TickOutcome, run_tick

T0 = 1_800_000_000.0
LIMIT = 4 * 1024**3
SPEC = parse_spec({"model": {"name": "chat", "source": "pvc://models/tiny"}})
POD = PodView("p", "uid-p", "10.0.0.1", "Running", True, True, True, 0, False, False)


class RecordingActuator:
    def __init__(self) -> None:
        self.actions: list[Action] = []
        self.runtime: list[Any] = []  # the targets told to pods: (breaker, admit, degradation)

    async def execute(
        self, namespace: str, pod: PodView | None, token: str, action: Action
    ) -> ActionResult:
        self.actions.append(action)
        return ActionResult("done")

    async def reconcile_runtime(
        self, pod: PodView, token: str, target: Any, *_: Any
    ) -> RuntimeCall:
        self.runtime.append(target)
        return RuntimeCall(changed=True)


def sample(at: float = T0, **figures: Any) -> PodSample:
    return PodSample("p", at, stats_age_seconds=1.0, heartbeat_age_seconds=0.5, **figures)


LEAKING = sample(rss_bytes=0.97 * LIMIT, memory_limit_bytes=LIMIT)
CALM = sample(rss_bytes=0.2 * LIMIT, memory_limit_bytes=LIMIT)


def tick(
    annotations: dict[str, str],
    status: dict[str, Any],
    actuator: RecordingActuator,
    scraped: PodSample = CALM,
    now: float = T0,
    spec: InferenceServiceSpec = SPEC,
) -> TickOutcome:
    async def scrape(pods: Sequence[PodView]) -> list[PodSample]:
        return [scraped]

    inputs = TickInputs("ns", "svc", spec, status, [POD], "token", 1, annotations)
    return asyncio.run(run_tick(inputs, TickMemory(), scrape, actuator, lambda: now))


def reasons(outcome: TickOutcome) -> list[EventReason]:
    return [e.reason for e in outcome.events]


def controls_of(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["annotation"]: c for c in status["incident"]["controls"]}


BASE: dict[str, Any] = {"memory": {"limitBytes": LIMIT}}


# ----- parsing ---------------------------------------------------------------------------------


def test_no_annotations_ask_for_nothing() -> None:
    assert parse_controls({"other.io/x": "1"}, SPEC) == IncidentControls()


def test_each_annotation_is_read() -> None:
    controls = parse_controls(
        {PAUSE_ACTIONS: "INC-42 bad deploy", RESET_BREAKER: "t1", PIN_TIER: "fallback-model"},
        parse_spec({**SPEC_RAW, "fallback": {"quantization": "int8"}}),
    )
    assert controls.paused == "INC-42 bad deploy"
    assert controls.reset_token == "t1"
    assert controls.pinned_level == 2
    assert controls.refused == ()


SPEC_RAW = {"model": {"name": "chat", "source": "pvc://models/tiny"}}


def test_an_empty_pause_still_pauses_with_no_reason_given() -> None:
    assert parse_controls({PAUSE_ACTIONS: " "}, SPEC).paused == "no reason given"


def test_pin_none_holds_full_service() -> None:
    assert parse_controls({PIN_TIER: "none"}, SPEC).pinned_level == 0


@pytest.mark.parametrize(
    ("annotations", "named", "why"),
    [
        ({PIN_TIER: "level-9"}, PIN_TIER, "unknown tier 'level-9': one of none, no-streaming"),
        ({PIN_TIER: "2"}, PIN_TIER, "unknown tier '2'"),
        ({RESET_BREAKER: ""}, RESET_BREAKER, "needs a value"),
        ({"fusebox.dev/pause-action": "x"}, "fusebox.dev/pause-action", f"mean {PAUSE_ACTIONS}"),
        ({"fusebox.dev/pin-teir": "none"}, "fusebox.dev/pin-teir", "did you mean " + PIN_TIER),
    ],
)  # fmt: skip
def test_a_bad_value_or_name_is_refused_with_its_reason(
    annotations: dict[str, str], named: str, why: str
) -> None:
    [refusal] = parse_controls(annotations, SPEC).refused
    assert refusal.annotation == named and why in refusal.why


def test_a_tier_the_service_does_not_list_is_refused_naming_the_listed_ones() -> None:
    spec = parse_spec({**SPEC_RAW, "degradation": {"tiers": ["no-streaming"]}})
    controls = parse_controls({PIN_TIER: "canned-answers"}, spec)
    assert controls.pinned_level is None
    [refusal] = controls.refused
    assert "not in spec.degradation.tiers (no-streaming)" in refusal.why


def test_kopf_s_own_annotations_and_unrelated_ones_are_not_refused() -> None:
    kopf = {"fusebox.dev/last-handled-configuration": "{}", "fusebox.dev/reconcile": "{}"}
    assert parse_controls(kopf, SPEC).refused == ()


# ----- pause -----------------------------------------------------------------------------------


def test_paused_decides_posts_would_act_and_calls_nothing() -> None:
    actuator = RecordingActuator()
    outcome = tick({PAUSE_ACTIONS: "INC-42"}, BASE, actuator, LEAKING)
    assert actuator.actions == [] and actuator.runtime == []
    would = [e.message for e in outcome.events if e.reason is EventReason.WOULD_ACT]
    assert would and would[0].startswith("would gc p: ")
    assert f"paused by {PAUSE_ACTIONS} (INC-42)" in would[0]
    assert outcome.status_patch["lastWouldAct"]["result"].startswith("not acted: paused")
    assert "lastAction" not in outcome.status_patch
    paused = next(e for e in outcome.events if e.reason is EventReason.ACTIONS_PAUSED)
    assert paused.type == "Warning" and "INC-42" in paused.message
    entry = controls_of(outcome.status_patch)[PAUSE_ACTIONS]
    assert (entry["value"], entry["reason"], entry["since"]) == (
        "INC-42",
        "ActionsPaused",
        "2027-01-15T08:00:00Z",
    )


def test_the_same_leak_unpaused_acts() -> None:
    actuator = RecordingActuator()
    outcome = tick({}, BASE, actuator, LEAKING)
    assert [a.kind for a in actuator.actions] == [ActionKind.GC]
    assert "incident" not in outcome.status_patch  # nothing set, ever: nothing written


def test_a_pause_is_told_once_and_keeps_its_since() -> None:
    first = tick({PAUSE_ACTIONS: "INC-42"}, BASE, RecordingActuator(), CALM)
    status = {**BASE, **first.status_patch}
    second = tick({PAUSE_ACTIONS: "INC-42"}, status, RecordingActuator(), CALM, T0 + 60)
    assert EventReason.ACTIONS_PAUSED not in reasons(second)
    assert controls_of(second.status_patch)[PAUSE_ACTIONS]["since"] == "2027-01-15T08:00:00Z"


def test_resuming_is_an_event_acts_at_once_and_clears_the_entry() -> None:
    paused = tick({PAUSE_ACTIONS: "INC-42"}, BASE, RecordingActuator(), LEAKING)
    status = {**BASE, **paused.status_patch}
    actuator = RecordingActuator()
    # Five seconds later, inside the would-be gc's cooldown: that gc never happened.
    later = T0 + 5
    resumed = tick({}, status, actuator, sample(later, rss_bytes=0.97 * LIMIT,
                   memory_limit_bytes=LIMIT), later)  # fmt: skip
    assert [a.kind for a in actuator.actions] == [ActionKind.GC]
    assert EventReason.ACTIONS_RESUMED in reasons(resumed)
    assert resumed.status_patch["incident"]["controls"] == []


# ----- reset-breaker ---------------------------------------------------------------------------


def open_breaker_status() -> dict[str, Any]:
    state = PolicyState("svc", breaker=BreakerState.OPEN, breaker_since=T0 - 1, trips=3)
    return {
        **BASE,
        "breaker": {"state": "Open", "reason": "p99 ttft 900 ms > 500 ms", "trips": 3},
        "policy": state.to_status(),
    }


def test_reset_closes_an_open_breaker_once_and_records_the_value() -> None:
    actuator = RecordingActuator()
    outcome = tick({RESET_BREAKER: "2027-01-15"}, open_breaker_status(), actuator)
    assert outcome.status_patch["breaker"]["state"] == "Closed"
    assert actuator.runtime[0][0] is BreakerState.CLOSED  # the pods are told at once
    [event] = [e for e in outcome.events if e.reason is EventReason.BREAKER_RESET]
    assert "Open -> Closed" in event.message and "trips so far: 3" in event.message
    incident = outcome.status_patch["incident"]
    assert incident["breakerResetHonoured"]["value"] == "2027-01-15"
    assert controls_of(outcome.status_patch)[RESET_BREAKER]["reason"] == "BreakerReset"


def test_a_value_already_honoured_resets_nothing_even_after_a_restart() -> None:
    first = tick({RESET_BREAKER: "t1"}, open_breaker_status(), RecordingActuator())
    # The breaker opened again since; the annotation is still there (or set back):
    # the stored honoured value keeps it from resetting twice.
    reopened = {**open_breaker_status(), "incident": first.status_patch["incident"]}
    again = tick({RESET_BREAKER: "t1"}, reopened, RecordingActuator(), CALM, T0 + 30)
    assert again.status_patch.get("breaker", reopened["breaker"])["state"] == "Open"
    assert EventReason.BREAKER_RESET not in reasons(again)

    removed = {**reopened, "incident": {**first.status_patch["incident"], "controls": []}}
    set_back = tick({RESET_BREAKER: "t1"}, removed, RecordingActuator(), CALM, T0 + 60)
    [told] = [e.message for e in set_back.events if e.reason is EventReason.BREAKER_RESET]
    assert "was honoured at" in told and "nothing reset" in told
    assert set_back.status_patch["breaker"]["state"] == "Open"

    new_value = tick({RESET_BREAKER: "t2"}, reopened, RecordingActuator(), CALM, T0 + 90)
    assert new_value.status_patch["breaker"]["state"] == "Closed"


def test_removing_reset_breaker_is_an_event_and_keeps_the_honoured_value() -> None:
    first = tick({RESET_BREAKER: "t1"}, open_breaker_status(), RecordingActuator())
    status = {**open_breaker_status(), **first.status_patch}
    removed = tick({}, status, RecordingActuator(), CALM, T0 + 30)
    assert EventReason.INCIDENT_ANNOTATION_REMOVED in reasons(removed)
    assert removed.status_patch["incident"] == {
        "controls": [],
        "breakerResetHonoured": {"value": "t1", "at": "2027-01-15T08:00:00Z"},
    }


# ----- pin-tier --------------------------------------------------------------------------------


def test_pin_holds_the_tier_and_tells_the_pods() -> None:
    actuator = RecordingActuator()
    outcome = tick({PIN_TIER: "no-streaming"}, BASE, actuator)
    assert outcome.status_patch["degradation"]["level"] == 1
    assert outcome.status_patch["degradation"]["reason"] == f"pinned by {PIN_TIER}=no-streaming"
    assert actuator.runtime[0][2].level == 1
    assert EventReason.TIER_PINNED in reasons(outcome)
    assert EventReason.DEGRADED in reasons(outcome)


def test_a_pinned_tier_outlasts_the_policy_s_cool_off() -> None:
    status = {**BASE, **tick({PIN_TIER: "no-streaming"}, BASE, RecordingActuator()).status_patch}
    later = T0 + 3600  # far past degradation.coolOffSeconds, healthy all along
    outcome = tick({PIN_TIER: "no-streaming"}, status, RecordingActuator(), sample(later), later)
    assert outcome.status_patch.get("degradation", status["degradation"])["level"] == 1


def test_pin_none_holds_full_service_over_a_raised_tier() -> None:
    state = PolicyState("svc", level=1, level_since=T0 - 10)
    status = {**BASE, "degradation": {"level": 1}, "policy": state.to_status()}
    outcome = tick({PIN_TIER: "none"}, status, RecordingActuator())
    assert outcome.status_patch["degradation"]["level"] == 0


def test_unpinning_is_an_event_and_the_policy_steps_the_tier_again() -> None:
    pinned = tick({PIN_TIER: "no-streaming"}, BASE, RecordingActuator())
    status = {**BASE, **pinned.status_patch}
    outcome = tick({}, status, RecordingActuator(), sample(T0 + 5), T0 + 5)
    assert EventReason.TIER_UNPINNED in reasons(outcome)


def test_a_bad_pin_is_a_warning_an_entry_and_no_change() -> None:
    actuator = RecordingActuator()
    outcome = tick({PIN_TIER: "turbo"}, BASE, actuator)
    [event] = [e for e in outcome.events if e.reason is EventReason.INVALID_INCIDENT_ANNOTATION]
    assert event.type == "Warning" and "unknown tier 'turbo'" in event.message
    entry = controls_of(outcome.status_patch)[PIN_TIER]
    assert entry["reason"] == "InvalidIncidentAnnotation" and entry["value"] == "turbo"
    assert outcome.status_patch["degradation"]["level"] == 0
    assert actuator.runtime  # the service goes on as if unpinned


def test_a_misspelt_pause_is_named_and_does_not_pause() -> None:
    actuator = RecordingActuator()
    outcome = tick({"fusebox.dev/pause-action": "INC-1"}, BASE, actuator, LEAKING)
    assert [a.kind for a in actuator.actions] == [ActionKind.GC]
    [event] = [e for e in outcome.events if e.reason is EventReason.INVALID_INCIDENT_ANNOTATION]
    assert f"did you mean {PAUSE_ACTIONS}?" in event.message
