"""A tick that resumes: after kopf peering paused this replica while another acted, and
after a pause or Observe. What the pods were told, what was run and what status says
come from what was done (status, the pods' reports), never from a memory that missed it.

Driven through tick.run_tick with a recording actuator, as a user would see it: the
calls that reach a pod, the events, the status patch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from fusebox_contract.names import BreakerState, EventReason, Variant
from fusebox_operator.actuator import ActionResult, RuntimeCall, RuntimeTarget
from fusebox_operator.incident import PAUSE_ACTIONS
from fusebox_operator.node_pressure import KubeletPressure
from fusebox_operator.observations import PodSample, PodView
from fusebox_operator.policy_state import Action, ActionKind, PolicyState
from fusebox_operator.spec import InferenceServiceSpec, parse_spec
from fusebox_operator.status import iso
from fusebox_operator.tick import TickInputs, TickMemory, TickOutcome, run_tick

T0 = 1_800_000_000.0
GIB = 1024**3
LIMIT = 4 * GIB
MODEL = {"name": "chat", "source": "pvc://models/tiny"}
ON_CPU = parse_spec({"model": MODEL, "gpu": {"count": 0}, "replicas": 1})
WITH_FALLBACK = parse_spec(
    {"model": MODEL, "gpu": {"count": 0}, "replicas": 2, "fallback": {"quantization": "int8"}}
)
ON_GPU = parse_spec({"model": MODEL, "gpu": {"count": 1, "memoryGiB": 16}, "replicas": 1})
PAUSED = {PAUSE_ACTIONS: "INC-7"}


def pod(name: str) -> PodView:
    return PodView(name, f"uid-{name}", "10.0.0.1", "Running", True, True, True, 0, False, False)


def report(name: str, at: float = T0, **figures: Any) -> PodSample:
    values: dict[str, Any] = {
        "model_loaded": True,
        "degradation_level": 0,
        "variant": Variant.PRIMARY,
        "stats_age_seconds": 1.0,
        "rss_bytes": 0.2 * LIMIT,
        "memory_limit_bytes": LIMIT,
    }
    values.update(figures)
    return PodSample(name, at, **values)


class RecordingActuator:
    """Every call succeeds; the actions run and the runtime targets told are kept."""

    def __init__(self) -> None:
        self.actions: list[Action] = []
        self.told: dict[str, RuntimeTarget] = {}

    async def execute(
        self, namespace: str, pod: PodView | None, token: str, action: Action
    ) -> ActionResult:
        self.actions.append(action)
        return ActionResult("done")

    async def reconcile_runtime(
        self, pod: PodView, token: str, target: RuntimeTarget, *_: Any
    ) -> RuntimeCall:
        self.told[pod.name] = target
        return RuntimeCall(changed=True)

    def sent(self) -> list[tuple[ActionKind, str]]:
        return [(action.kind, action.pod) for action in self.actions]


def tick(
    spec: InferenceServiceSpec,
    status: dict[str, Any],
    memory: TickMemory,
    reports: Sequence[PodSample],
    actuator: RecordingActuator,
    now: float = T0,
    pods: Sequence[PodView] | None = None,
    operator_pod: str = "",
    annotations: dict[str, str] | None = None,
    kubelet: dict[str, KubeletPressure] | None = None,
) -> TickOutcome:
    by_pod = {sample.pod: sample for sample in reports}

    async def scrape(targets: Sequence[PodView]) -> list[PodSample]:
        return [by_pod[p.name] for p in targets if p.name in by_pod]

    listed = list(pods) if pods is not None else [pod(s.pod) for s in reports]
    inputs = TickInputs(
        "ns", "svc", spec, status, listed, "token", 1, annotations or {}, operator_pod, kubelet
    )
    return asyncio.run(run_tick(inputs, memory, scrape, actuator, lambda: now))


def merged(status: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """The stored status after kopf's merge patch: a null deletes the key."""
    out = {**status, **patch}
    return {key: value for key, value in out.items() if value is not None}


# ----- a replica kopf peering paused while another acted --------------------------------------


def left_by_the_other_replica(sequence: int = 40) -> dict[str, Any]:
    """Status as replica op-a left it: it opened the breaker and set tier 1."""
    state = PolicyState(
        "svc",
        sequence=sequence,
        breaker=BreakerState.OPEN,
        breaker_since=T0 - 10,
        level=1,
        level_since=T0 - 10,
    )
    return {
        "memory": {"limitBytes": LIMIT},
        "breaker": {"state": "Open", "reason": "p99 ttft 900 ms > 200 ms", "trips": 3},
        "degradation": {"level": 1, "tier": "no-streaming", "reason": "breaker open"},
        "policy": state.to_status(),
        "operator": {"pod": "op-a", "since": iso(T0 - 600)},
        "updatedAt": iso(T0 - 5),
    }


@pytest.mark.parametrize("remembered_sequence", [3, 40])
def test_a_replica_resumed_after_another_acted_keeps_the_breaker_tier_and_ids_it_left(
    remembered_sequence: int,
) -> None:
    # op-b acted long ago (sequence 3), or up to op-a's last id (40) without seeing
    # op-a open the breaker: kopf kept its memory through the pause either way.
    stale = TickMemory(policy=PolicyState("svc", sequence=remembered_sequence))
    actuator = RecordingActuator()
    open_on_the_pod = report("a", degradation_level=1, breaker_state=BreakerState.OPEN)

    out = tick(ON_CPU, left_by_the_other_replica(), stale, [open_on_the_pod], actuator,
               operator_pod="op-b")  # fmt: skip

    assert (out.status_patch["breaker"]["state"], out.status_patch["breaker"]["trips"]) == (
        "Open",
        3,
    )
    assert out.status_patch["degradation"]["level"] == 1
    assert out.status_patch["policy"]["sequence"] >= 40  # no id of op-a's is issued again
    breaker, admit, degradation = actuator.told["a"]
    assert (breaker, admit, degradation.level) == (BreakerState.OPEN, 0, 1)
    assert EventReason.BREAKER_CLOSED not in [e.reason for e in out.events]
    assert out.status_patch["operator"]["pod"] == "op-b"


def test_a_body_still_showing_the_other_replicas_write_does_not_undo_this_ones_actions() -> None:
    memory = TickMemory(policy=PolicyState("svc", sequence=3))
    status = left_by_the_other_replica()
    leaking = report("a", rss_bytes=0.97 * LIMIT)
    first = RecordingActuator()
    tick(ON_CPU, status, memory, [leaking], first, operator_pod="op-b")
    assert first.sent() == [(ActionKind.GC, "a")]

    # kopf hands the next tick the body from before op-b's write landed: op-a's still.
    later = RecordingActuator()
    tick(ON_CPU, status, memory, [report("a", T0 + 5, rss_bytes=0.97 * LIMIT)], later,
         now=T0 + 5, operator_pod="op-b")  # fmt: skip

    assert later.sent() == []  # the gc's cooldown runs: the ladder was not started over


# ----- after a pause or Observe -----------------------------------------------------------------


def test_a_pod_the_ladder_swapped_before_a_pause_is_swapped_back_after_the_cool_off() -> None:
    swapped = PolicyState("svc", sequence=7, variants={"a": Variant.FALLBACK},
                          swapped_at={"a": T0 - 1000})  # fmt: skip
    memory = TickMemory(policy=swapped)
    status = {"memory": {"limitBytes": LIMIT}, "mode": "Observe"}  # the last tick held
    reports = [report("a", variant=Variant.FALLBACK), report("b")]
    actuator = RecordingActuator()

    tick(WITH_FALLBACK, status, memory, reports, actuator)

    assert actuator.sent() == [(ActionKind.RESTORE_PRIMARY, "a")]


def test_a_fallback_pod_the_memory_lost_is_known_swapped_and_blocks_no_other_pod() -> None:
    # Restarted while paused: status.policy says nothing of a swap, a's report does.
    memory = TickMemory()
    status = {"memory": {"limitBytes": LIMIT}, "mode": "Observe"}
    reports = [report("a", variant=Variant.FALLBACK), report("b", rss_bytes=0.97 * LIMIT)]
    actuator = RecordingActuator()
    first = tick(WITH_FALLBACK, status, memory, reports, actuator)
    assert actuator.sent() == [(ActionKind.GC, "b")]
    pods = {p["pod"]: p for p in first.status_patch["policy"]["pods"]}
    assert pods["a"]["variant"] == "fallback"

    # One cool-off later, a goes back to the primary.
    later = T0 + WITH_FALLBACK.degradation.cool_off_seconds + 5
    actuator = RecordingActuator()
    reports = [report("a", later, variant=Variant.FALLBACK), report("b", later)]
    tick(WITH_FALLBACK, merged(status, first.status_patch), memory, reports, actuator, later)
    assert actuator.sent() == [(ActionKind.RESTORE_PRIMARY, "a")]


def test_a_gpu_drain_decided_while_paused_runs_once_the_pause_ends() -> None:
    sick = replace(pod("a"), unhealthy_gpus=("GPU-1",))
    memory = TickMemory()
    held = RecordingActuator()
    paused = tick(ON_GPU, {}, memory, [report("a")], held, pods=[sick], annotations=PAUSED)
    assert held.sent() == []
    assert EventReason.WOULD_ACT in [e.reason for e in paused.events]

    resumed = RecordingActuator()
    tick(ON_GPU, merged({}, paused.status_patch), memory, [report("a", T0 + 5)], resumed,
         now=T0 + 5, pods=[sick])  # fmt: skip

    assert resumed.sent() == [(ActionKind.DRAIN, "a")]


def test_a_cache_shed_decided_while_paused_runs_once_the_pause_ends() -> None:
    on_n1 = replace(pod("a"), node="n1")
    pressured = {"n1": KubeletPressure("n1", T0 - 5, "kubelet has insufficient memory available")}
    memory = TickMemory()
    held = RecordingActuator()
    paused = tick(ON_CPU, {}, memory, [report("a")], held, pods=[on_n1], annotations=PAUSED,
                  kubelet=pressured)  # fmt: skip
    assert held.sent() == []

    resumed = RecordingActuator()
    tick(ON_CPU, merged({}, paused.status_patch), memory, [report("a", T0 + 5)], resumed,
         now=T0 + 5, pods=[on_n1], kubelet=pressured)  # fmt: skip

    assert resumed.sent() == [(ActionKind.GC, "a"), (ActionKind.EMPTY_CACHE, "a")]
