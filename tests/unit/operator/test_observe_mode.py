"""spec.mode Observe: every decision is told as WouldAct, and no call reaches a pod.

Whole ticks (tick.run_tick) with a recording actuator: in Observe it must see no
action and no runtime call, whatever the policy decided; the same tick in
Enforce makes the call, so each test would fail without the gate.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from fusebox_contract.names import BreakerState, EventReason, Variant
from fusebox_operator.actuator import ActionResult, RuntimeCall
from fusebox_operator.incident import PAUSE_ACTIONS
from fusebox_operator.observations import PodSample, PodView
from fusebox_operator.observe_mode import NOT_ACTED
from fusebox_operator.policy_state import Action, ActionKind, PolicyState
from fusebox_operator.spec import InferenceServiceSpec, Mode, parse_spec
from fusebox_operator.tick import TickInputs, TickMemory, TickOutcome, run_tick

T0 = 1_800_000_000.0
LIMIT = 4 * 1024**3
MODEL = {"name": "chat", "source": "pvc://models/tiny"}
POD = PodView("p", "uid-p", "10.0.0.1", "Running", True, True, True, 0, False, False)


class RecordingActuator:
    """Records every call the tick makes on a pod; answers as a healthy server would."""

    def __init__(self) -> None:
        self.actions: list[Action] = []
        self.runtime_calls = 0

    async def execute(
        self, namespace: str, pod: PodView | None, token: str, action: Action
    ) -> ActionResult:
        self.actions.append(action)
        return ActionResult("done")

    async def reconcile_runtime(self, *args: Any, **kwargs: Any) -> RuntimeCall:
        self.runtime_calls += 1
        return RuntimeCall(changed=True)


def spec_in(mode: str, **extra: Any) -> InferenceServiceSpec:
    return parse_spec({"model": MODEL, "mode": mode, **extra})


def sample(at: float = T0, **figures: Any) -> PodSample:
    return PodSample("p", at, stats_age_seconds=1.0, heartbeat_age_seconds=0.5, **figures)


def tick(
    spec: InferenceServiceSpec,
    status: dict[str, Any],
    actuator: RecordingActuator,
    scraped: PodSample,
    memory: TickMemory | None = None,
    now: float = T0,
    annotations: dict[str, str] | None = None,
) -> TickOutcome:
    async def scrape(pods: Sequence[PodView]) -> list[PodSample]:
        return [scraped]

    inputs = TickInputs("ns", "svc", spec, status, [POD], "token", 1, annotations or {})
    return asyncio.run(run_tick(inputs, memory or TickMemory(), scrape, actuator, lambda: now))


def would_act(outcome: TickOutcome) -> list[str]:
    return [e.message for e in outcome.events if e.reason is EventReason.WOULD_ACT]


def test_the_default_mode_is_enforce() -> None:
    assert parse_spec({"model": MODEL}).mode is Mode.ENFORCE


def test_a_ladder_rung_in_observe_is_a_would_act_with_its_figures_and_no_call() -> None:
    actuator = RecordingActuator()
    # 97 % of the limit: the ladder's first rung at once, no trend needed.
    leaking = sample(rss_bytes=0.97 * LIMIT, memory_limit_bytes=LIMIT)
    outcome = tick(spec_in("Observe"), {"memory": {"limitBytes": LIMIT}}, actuator, leaking)
    assert actuator.actions == [] and actuator.runtime_calls == 0
    [message] = would_act(outcome)
    assert message.startswith("would gc p: ") and "97" in message
    last = outcome.status_patch["lastWouldAct"]
    assert (last["type"], last["pod"], last["result"]) == ("gc", "p", NOT_ACTED)
    assert "lastAction" not in outcome.status_patch
    assert EventReason.GARBAGE_COLLECTED not in [e.reason for e in outcome.events]


def test_the_same_leak_in_enforce_acts() -> None:
    actuator = RecordingActuator()
    leaking = sample(rss_bytes=0.97 * LIMIT, memory_limit_bytes=LIMIT)
    outcome = tick(spec_in("Enforce"), {"memory": {"limitBytes": LIMIT}}, actuator, leaking)
    assert [a.kind for a in actuator.actions] == [ActionKind.GC]
    assert actuator.runtime_calls == 1
    assert would_act(outcome) == []
    assert "lastWouldAct" not in outcome.status_patch


def test_the_ladder_climbs_in_observe_as_if_nothing_helped() -> None:
    # Each rung is settled as not taken, so the next tick decides the next rung:
    # what Enforce would do to a leak the first rungs do not fix.
    actuator = RecordingActuator()
    memory = TickMemory()
    status: dict[str, Any] = {"memory": {"limitBytes": LIMIT}}
    kinds: list[str] = []
    spec = spec_in("Observe", breaker={"resource": {"cooldownSeconds": 1}})
    for step in range(6):
        now = T0 + 120 * step  # past each rung's cooldown
        leaking = sample(now, rss_bytes=0.97 * LIMIT, memory_limit_bytes=LIMIT)
        outcome = tick(spec, status, actuator, leaking, memory, now)
        status = {**status, **outcome.status_patch}
        if "lastWouldAct" in outcome.status_patch:
            kinds.append(outcome.status_patch["lastWouldAct"]["type"])
    assert actuator.actions == [] and actuator.runtime_calls == 0
    assert kinds[0] == "gc" and len(set(kinds)) > 1, kinds


@pytest.mark.parametrize("kind", list(ActionKind))
def test_every_action_kind_is_held_in_observe_and_run_in_enforce(kind: ActionKind) -> None:
    # An action of each kind waiting for its retry (its outcome unknown): the tick
    # sends it again first, through the same gate as a fresh decision.
    state = PolicyState("svc")
    pending = Action(f"svc-000009-{kind.value}", kind, "p", "RSS high", T0 - 30)
    state.settle(pending, settled=False)
    status = {"memory": {"limitBytes": LIMIT}, "policy": state.to_status()}
    calm = sample(rss_bytes=0.2 * LIMIT, memory_limit_bytes=LIMIT)

    held = RecordingActuator()
    outcome = tick(spec_in("Observe"), status, held, calm)
    assert held.actions == [] and held.runtime_calls == 0
    assert any(f"would {kind.value} p" in m for m in would_act(outcome))
    assert outcome.status_patch["policy"]["inFlight"] == []  # not retried forever

    run = RecordingActuator()
    tick(spec_in("Enforce"), status, run, calm)
    assert [a.id for a in run.actions] == [pending.id]


def test_a_wedged_pod_is_not_restarted_in_observe() -> None:
    actuator = RecordingActuator()
    wedged = PodSample(
        "p", T0, stats_age_seconds=600.0, heartbeat_age_seconds=600.0, model_loaded=True
    )
    outcome = tick(spec_in("Observe"), {"memory": {"limitBytes": LIMIT}}, actuator, wedged)
    assert actuator.actions == []
    assert any(m.startswith("would restart p: ") for m in would_act(outcome))
    assert EventReason.POD_RESTARTED not in [e.reason for e in outcome.events]


AUTOSCALED = {"autoscaling": {"minReplicas": 1, "maxReplicas": 4}}


def test_a_scale_in_observe_is_told_once_and_the_deployment_keeps_its_count() -> None:
    actuator = RecordingActuator()
    busy = sample(queue_length=40.0, requests_running=8.0)
    status: dict[str, Any] = {"memory": {"limitBytes": LIMIT}}
    memory = TickMemory()
    first = tick(spec_in("Observe", **AUTOSCALED), status, actuator, busy, memory)
    assert first.replicas is None
    assert "autoscaling" not in first.status_patch  # reconcile applies that count
    [message] = would_act(first)
    assert message.startswith(f"would {EventReason.SCALED_UP.value}: ")
    assert first.status_patch["lastWouldAct"]["type"] == EventReason.SCALED_UP.value

    second = tick(spec_in("Observe", **AUTOSCALED), {**status, **first.status_patch}, actuator,
                  busy, memory)  # fmt: skip
    assert would_act(second) == []

    enforced = tick(spec_in("Enforce", **AUTOSCALED), status, RecordingActuator(), busy)
    assert enforced.replicas == 4


def ready_of(status: dict[str, Any]) -> tuple[str, str, str]:
    [ready] = [c for c in status["conditions"] if c["type"] == "Ready"]
    return ready["status"], ready["reason"], ready["message"]


# The two ways to hold: spec.mode Observe, or the pause-actions annotation in Enforce.
HOLDS = [
    pytest.param("Observe", {}, id="observe"),
    pytest.param("Enforce", {PAUSE_ACTIONS: "INC-42"}, id="pause-actions"),
]


@pytest.mark.parametrize(("mode", "annotations"), HOLDS)
def test_a_held_scale_up_counts_ready_against_the_pods_the_deployment_runs(
    mode: str, annotations: dict[str, str]
) -> None:
    # The Deployment keeps its one pod, and that pod serves: Ready, "1/1", not the
    # would-be "1/4" of pods that were never asked for.
    busy = sample(queue_length=40.0, requests_running=8.0)
    status: dict[str, Any] = {"memory": {"limitBytes": LIMIT}}
    spec = spec_in(mode, **AUTOSCALED)
    outcome = tick(spec, status, RecordingActuator(), busy, annotations=annotations)
    assert would_act(outcome)  # the scale-up was decided
    assert outcome.replicas is None
    assert ready_of(outcome.status_patch) == ("True", "PodsReady", "1/1 pods serving")
    assert outcome.status_patch["summary"]["ready"] == "1/1"


@pytest.mark.parametrize(("mode", "annotations"), HOLDS)
def test_a_held_scale_counts_against_the_count_status_autoscaling_records(
    mode: str, annotations: dict[str, str]
) -> None:
    # An earlier Enforce scale set the Deployment to 2 (status.autoscaling): held at 2.
    busy = sample(queue_length=40.0, requests_running=8.0)
    status: dict[str, Any] = {"memory": {"limitBytes": LIMIT}, "autoscaling": {"replicas": 2}}
    spec = spec_in(mode, **AUTOSCALED)
    outcome = tick(spec, status, RecordingActuator(), busy, annotations=annotations)
    assert would_act(outcome)
    assert outcome.status_patch["summary"]["ready"] == "1/2"


def test_the_same_scale_up_in_enforce_counts_the_pods_it_asked_for() -> None:
    # The control: in Enforce the Deployment is set to 4, so one serving pod is 1/4.
    busy = sample(queue_length=40.0, requests_running=8.0)
    status: dict[str, Any] = {"memory": {"limitBytes": LIMIT}}
    outcome = tick(spec_in("Enforce", **AUTOSCALED), status, RecordingActuator(), busy)
    assert outcome.replicas == 4
    assert outcome.status_patch["summary"]["ready"] == "1/4"
    assert ready_of(outcome.status_patch)[0] == "False"


SLOW = "p99 ttft 450 ms > 200 ms"


def open_breaker_status(mode: str) -> dict[str, Any]:
    """A status whose breaker the operator opened (or, held, would have) 5 s ago."""
    state = PolicyState("svc", breaker=BreakerState.OPEN, breaker_since=T0 - 5, breaker_reason=SLOW)
    return {
        "memory": {"limitBytes": LIMIT},
        "mode": mode,
        "policy": state.to_status(),
        "breaker": {"state": "Open", "reason": SLOW, "trips": 1},
    }


def conditions_of(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


@pytest.mark.parametrize(("mode", "annotations"), HOLDS)
def test_a_held_open_breaker_leaves_ready_and_available_to_the_pods_that_serve(
    mode: str, annotations: dict[str, str]
) -> None:
    # Nothing was sent: the pod admits every request, so Ready and Available say it
    # serves; the would-be Open stays in status.breaker and the BREAKER column.
    status = open_breaker_status("Observe" if mode == "Observe" else "Enforce")
    calm = sample(rss_bytes=0.2 * LIMIT, memory_limit_bytes=LIMIT)
    actuator = RecordingActuator()
    outcome = tick(spec_in(mode), status, actuator, calm, annotations=annotations)
    assert actuator.runtime_calls == 0
    patch = outcome.status_patch
    assert conditions_of(patch)["Ready"] == ("True", "PodsReady")
    assert conditions_of(patch)["Available"] == ("True", "MinimumPodsReady")
    assert patch["breaker"]["state"] == "Open"
    assert patch["summary"]["breaker"] == "Open"


def test_in_observe_a_pod_enforce_left_refusing_still_makes_ready_false() -> None:
    # Switching to Observe freezes the pods: a breaker Enforce opened on a pod still
    # refuses there, and Ready and Available say so from the pod's own report.
    refusing = sample(
        rss_bytes=0.2 * LIMIT, memory_limit_bytes=LIMIT, breaker_state=BreakerState.OPEN
    )
    outcome = tick(
        spec_in("Observe"), open_breaker_status("Observe"), RecordingActuator(), refusing
    )
    assert conditions_of(outcome.status_patch)["Ready"] == ("False", "PodBreakerOpen")
    assert conditions_of(outcome.status_patch)["Available"] == ("False", "PodBreakerOpen")


def degraded_of(status: dict[str, Any]) -> tuple[str, str, str]:
    found = next(c for c in status["conditions"] if c["type"] == "Degraded")
    return found["status"], found["reason"], found["message"]


@pytest.mark.parametrize(("mode", "annotations"), HOLDS)
def test_a_held_open_breaker_leaves_degraded_to_what_the_pods_run(
    mode: str, annotations: dict[str, str]
) -> None:
    # The pods run the primary with their breakers closed: the service is not
    # degraded, and the message says what the operator would have set instead.
    status = open_breaker_status("Observe" if mode == "Observe" else "Enforce")
    calm = sample(
        rss_bytes=0.2 * LIMIT,
        memory_limit_bytes=LIMIT,
        breaker_state=BreakerState.CLOSED,
        degradation_level=0,
    )
    outcome = tick(spec_in(mode), status, RecordingActuator(), calm, annotations=annotations)
    state, reason, message = degraded_of(outcome.status_patch)
    assert (state, reason) == ("False", "FullService")
    assert "would set" in message and "breaker Open" in message


def test_a_pause_keeps_degraded_true_while_the_pods_still_run_the_tier_enforce_set() -> None:
    status = open_breaker_status("Enforce")
    degraded = sample(
        rss_bytes=0.2 * LIMIT,
        memory_limit_bytes=LIMIT,
        breaker_state=BreakerState.CLOSED,
        degradation_level=1,
    )
    outcome = tick(
        spec_in("Enforce"), status, RecordingActuator(), degraded, annotations={PAUSE_ACTIONS: ""}
    )
    state, reason, message = degraded_of(outcome.status_patch)
    assert (state, reason) == ("True", "Degraded")
    assert message.startswith("pods report tier")


@pytest.mark.parametrize(("mode", "annotations"), HOLDS)
def test_a_held_pod_serving_the_fallback_below_its_tier_is_degraded_by_a_ladder_swap(
    mode: str, annotations: dict[str, str]
) -> None:
    swapped = sample(
        rss_bytes=0.2 * LIMIT,
        memory_limit_bytes=LIMIT,
        breaker_state=BreakerState.CLOSED,
        degradation_level=0,
        variant=Variant.FALLBACK,
    )
    status = open_breaker_status("Observe" if mode == "Observe" else "Enforce")
    outcome = tick(spec_in(mode), status, RecordingActuator(), swapped, annotations=annotations)
    state, reason, message = degraded_of(outcome.status_patch)
    assert (state, reason) == ("True", "SwappedToFallback")
    assert message.startswith("p serves the fallback model")


def test_an_open_breaker_in_enforce_makes_degraded_true_from_the_operators_state() -> None:
    calm = sample(rss_bytes=0.2 * LIMIT, memory_limit_bytes=LIMIT)
    outcome = tick(spec_in("Enforce"), open_breaker_status("Enforce"), RecordingActuator(), calm)
    state, reason, message = degraded_of(outcome.status_patch)
    assert (state, reason) == ("True", "Degraded") and "breaker Open" in message


def test_an_open_breaker_in_enforce_makes_ready_and_available_false() -> None:
    # The control: in Enforce the pods were told to admit nothing.
    calm = sample(rss_bytes=0.2 * LIMIT, memory_limit_bytes=LIMIT)
    outcome = tick(spec_in("Enforce"), open_breaker_status("Enforce"), RecordingActuator(), calm)
    assert conditions_of(outcome.status_patch)["Ready"] == ("False", "BreakerOpen")
    assert conditions_of(outcome.status_patch)["Available"] == ("False", "BreakerOpen")


def test_enforce_after_observe_acts_at_once_from_the_first_rung_with_fresh_ids() -> None:
    memory = TickMemory()
    status: dict[str, Any] = {"memory": {"limitBytes": LIMIT}}
    leaking = sample(rss_bytes=0.97 * LIMIT, memory_limit_bytes=LIMIT)
    observed = tick(spec_in("Observe"), status, RecordingActuator(), leaking, memory)
    status = {**status, **observed.status_patch}
    assert status["mode"] == "Observe"
    would_id = status["lastWouldAct"]["id"]

    # The next tick, seconds later: inside the would-be gc's cooldown, yet Enforce
    # acts, because that gc never happened.
    actuator = RecordingActuator()
    later = T0 + 5
    leaking = sample(later, rss_bytes=0.97 * LIMIT, memory_limit_bytes=LIMIT)
    enforced = tick(spec_in("Enforce"), status, actuator, leaking, memory, later)
    assert [a.kind for a in actuator.actions] == [ActionKind.GC]
    assert actuator.actions[0].id != would_id  # the id sequence carried over
    assert enforced.status_patch["mode"] == "Enforce"
    assert enforced.status_patch["lastAction"]["type"] == "gc"


def test_without_the_switch_a_second_enforce_tick_waits_its_cooldown() -> None:
    # The control for the test above: in Enforce throughout, the same two ticks act once.
    memory = TickMemory()
    status: dict[str, Any] = {"memory": {"limitBytes": LIMIT}}
    actuator = RecordingActuator()
    leaking = sample(rss_bytes=0.97 * LIMIT, memory_limit_bytes=LIMIT)
    first = tick(spec_in("Enforce"), status, actuator, leaking, memory)
    status = {**status, **first.status_patch}
    later = T0 + 5
    leaking = sample(later, rss_bytes=0.97 * LIMIT, memory_limit_bytes=LIMIT)
    tick(spec_in("Enforce"), status, actuator, leaking, memory, later)
    assert [a.kind for a in actuator.actions] == [ActionKind.GC]


@pytest.mark.parametrize("mode", ["Observe", "Enforce"])
def test_quality_failing_with_no_remedy_is_the_same_warning_in_every_mode(mode: str) -> None:
    # No tier that helps quality: there is nothing Enforce would do, so Observe tells
    # the observation as Enforce does (Warning Degraded), never as a would-be action.
    streaming_only = spec_in(mode, degradation={"tiers": ["no-streaming"]})
    failing = sample(quality_failure_ratio=0.5, model_loaded=True)
    outcome = tick(streaming_only, {}, RecordingActuator(), failing)
    told = [e for e in outcome.events if "no quality remedy" in e.message]
    assert [(e.type, e.reason) for e in told] == [("Warning", EventReason.DEGRADED)]
    assert not [m for m in would_act(outcome) if "no quality remedy" in m]
    # Nothing is stepped up for it (no-streaming is no quality remedy): that one is told.
    assert outcome.status_patch["degradation"]["tier"] == "none"
    degraded = next(c for c in outcome.status_patch["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "NoQualityRemedy"
