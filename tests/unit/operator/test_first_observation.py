"""tick.first_observation: a new service's reconcile writes the first tick's status itself,
so the first timer tick finds nothing moved and writes nothing (one write, and one watch
event through kopf, fewer per new service), while status still claims only what was seen."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from fusebox_contract.names import ConditionType, EventReason
from fusebox_operator.actuator import ActionResult, RuntimeCall
from fusebox_operator.observations import PodSample, PodView
from fusebox_operator.policy_state import Action
from fusebox_operator.reconcile_status import applied_status
from fusebox_operator.sizing import MemorySizing
from fusebox_operator.spec import parse_spec
from fusebox_operator.status import QUIET_REFRESH_SECONDS, iso, observed_yet
from fusebox_operator.tick import TickInputs, TickMemory, TickOutcome, first_observation, run_tick

T0 = 1_800_000_000.0
MODEL = {"name": "chat", "source": "pvc://models/tiny"}
RAW = {"model": MODEL, "replicas": 2, "gpu": {"count": 1, "memoryGiB": 24}}
SPEC = parse_spec(RAW)
SIZING = MemorySizing(34 * 1024**3, 34 * 1024**3, 24 * 1024**3, "spec.gpu.memoryGiB")
PENDING = PodView("chat-0", "uid-0", "", "Pending", False, False, False, 0, False, False)


class NoCalls:
    async def execute(
        self, namespace: str, pod: PodView | None, token: str, action: Action
    ) -> ActionResult:
        raise AssertionError(f"no action expected, got {action}")

    async def reconcile_runtime(self, *args: Any, **kwargs: Any) -> RuntimeCall:
        raise AssertionError("no pod to tell")


async def no_scrape(targets: Sequence[PodView]) -> list[PodSample]:
    assert not targets
    return []


def reconciled(raw: Mapping[str, Any] = RAW, now: float = T0) -> dict[str, Any]:
    """What a reconcile of a new service writes before its observation."""
    return applied_status({}, raw, SIZING, "chat", 1, now)


def observe(
    status: Mapping[str, Any], pods: Sequence[PodView] = (), raw: Mapping[str, Any] = RAW
) -> dict[str, Any] | None:
    inputs = TickInputs("ns", "svc", parse_spec(raw), status, pods, "", 1, operator_pod="op-1")
    return asyncio.run(first_observation(inputs, lambda: T0))


def tick(status: Mapping[str, Any], now: float, raw: Mapping[str, Any] = RAW) -> TickOutcome:
    """The timer's tick on the stored status, with the pod watch still showing no pod."""
    inputs = TickInputs("ns", "svc", parse_spec(raw), status, [], "token", 1, operator_pod="op-1")
    return asyncio.run(run_tick(inputs, TickMemory(), no_scrape, NoCalls(), lambda: now))


def condition(status: Mapping[str, Any], kind: ConditionType) -> Mapping[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == kind)


def stored(*patches: Mapping[str, Any]) -> dict[str, Any]:
    """The status after kopf's merge patches: a null deletes the key."""
    out: dict[str, Any] = {}
    for patch in patches:
        out.update(patch)
    return {key: value for key, value in out.items() if value is not None}


def test_a_new_service_with_no_pods_gets_the_first_ticks_status_from_its_reconcile() -> None:
    applied = reconciled()
    observed = observe(applied)
    assert observed is not None
    assert not observed_yet(applied) and observed_yet(observed)

    # What was observed, and when: no pod, so no figure and nothing serving.
    assert (observed["pods"], observed["replicas"], observed["updatedAt"]) == ([], 0, iso(T0))
    assert observed["summary"]["ready"] == "0/2"
    assert "observedAt" not in observed["summary"]  # no figure, so no figure's time
    ready = condition(observed, ConditionType.READY)
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "False",
        "PodsNotReady",
        "0/2 pods serving",
    )
    assert (ready["observedGeneration"], ready["lastTransitionTime"]) == (1, iso(T0))
    assert condition(observed, ConditionType.AVAILABLE)["status"] == "False"
    # The reconcile's own condition is kept in the list the observation writes.
    spec_valid = condition(observed, ConditionType.INVALID_SPEC)
    assert (spec_valid["status"], spec_valid["reason"]) == ("False", "SpecValid")
    assert observed["operator"] == {"pod": "op-1", "since": iso(T0)}


def test_the_first_timer_tick_then_writes_nothing_until_its_refresh_is_due() -> None:
    applied = reconciled()
    observed = observe(applied)
    assert observed is not None
    status = stored(applied, observed)

    first = tick(status, T0 + 2)
    assert first.status_patch == {} and first.events == []
    # The once-a-minute refresh still comes, counted from the reconcile's write.
    assert tick(status, T0 + QUIET_REFRESH_SECONDS - 1).status_patch == {}
    refreshed = tick(status, T0 + QUIET_REFRESH_SECONDS).status_patch
    assert refreshed["updatedAt"] == iso(T0 + QUIET_REFRESH_SECONDS)
    # and its conditions did not move: no transition claimed at the refresh.
    assert condition(refreshed, ConditionType.READY)["lastTransitionTime"] == iso(T0)


def test_without_the_observation_the_first_tick_writes_the_status() -> None:
    """What the fold saves: the reconcile's status alone leaves the tick a write."""
    first = tick(reconciled(), T0 + 2)
    assert first.status_patch["updatedAt"] == iso(T0 + 2)


def test_a_service_scaled_to_zero_is_ready_with_its_zero_pods_as_the_tick_says() -> None:
    raw = {**RAW, "replicas": 0}
    applied = reconciled(raw)
    observed = observe(applied, raw=raw)
    assert observed is not None
    ready = condition(observed, ConditionType.READY)
    assert (ready["status"], ready["message"]) == ("True", "0/0 pods serving")
    assert tick(stored(applied, observed), T0 + 2, raw=raw).status_patch == {}


def test_pods_already_listed_are_left_to_the_tick_which_scrapes_them() -> None:
    assert observe(reconciled(), pods=[PENDING]) is None


def test_an_autoscaled_service_gets_its_observation_and_its_first_tick_stays_quiet() -> None:
    raw = {**RAW, "replicas": None, "autoscaling": {"minReplicas": 1, "maxReplicas": 3}}
    raw = {k: v for k, v in raw.items() if v is not None}
    applied = reconciled(raw)
    observed = observe(applied, raw=raw)
    assert observed is not None
    assert observed["autoscaling"]["replicas"] == 1
    assert condition(observed, ConditionType.SCALING_LIMITED)["status"] == "False"
    assert tick(stored(applied, observed), T0 + 2, raw=raw).status_patch == {}


def test_an_observation_that_would_post_an_event_is_left_to_the_tick() -> None:
    """A reset-breaker annotation already on a new service: its event is the tick's."""
    controls = {"fusebox.dev/reset-breaker": "incident-7"}
    inputs = TickInputs("ns", "svc", SPEC, reconciled(), [], "", 1, annotations=controls)
    outcome = asyncio.run(run_tick(inputs, TickMemory(), no_scrape, NoCalls(), lambda: T0))
    assert EventReason.BREAKER_RESET in [event.reason for event in outcome.events]
    assert asyncio.run(first_observation(inputs, lambda: T0)) is None
