"""tick: the per-tick decisions, driven without kopf by real PodSample values and a clock."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from fusebox_contract.model_fetch import FetchReason, FetchReport
from fusebox_contract.names import BreakerState, EventReason, Variant
from fusebox_operator.actuator import ActionResult, RuntimeCall, RuntimeTarget
from fusebox_operator.node_pressure import KubeletPressure
from fusebox_operator.observations import FetchProgress, FetchState, PodSample, PodView
from fusebox_operator.policy_state import Action, ActionKind, Ladder, PolicyState
from fusebox_operator.rollout import Degradation
from fusebox_operator.spec import InferenceServiceSpec, parse_spec
from fusebox_operator.status import iso
from fusebox_operator.telemetry import scrapable
from fusebox_operator.tick import (
    TickInputs,
    TickMemory,
    TickOutcome,
    converging,
    execute_per_pod,
    pod_degradation,
    readiness,
    run_tick,
    runtime_targets,
    service_swaps,
    settable,
    unable_to_swap,
    unplaced,
)

T0 = 1_800_000_000.0
MODEL = {"name": "chat", "source": "pvc://models/tiny"}
WITH_FALLBACK = parse_spec({"model": MODEL, "replicas": 2, "fallback": {"quantization": "int8"}})
NO_FALLBACK = parse_spec({"model": MODEL, "replicas": 2})


def pod(name: str, ready: bool = True, terminating: bool = False, restarts: int = 0) -> PodView:
    return PodView(name, f"uid-{name}", "10.0.0.1", "Running", ready, True, True, restarts,
                   terminating, False)  # fmt: skip


def report(name: str, level: int, variant: Variant, **extra: Any) -> PodSample:
    values: dict[str, Any] = {"model_loaded": True, "degradation_level": level, "variant": variant}
    values.update(extra)
    return PodSample(name, T0, **values)


def targets(
    state: PolicyState,
    spec: InferenceServiceSpec,
    pods: list[PodView],
    samples: list[PodSample],
    applied: dict[str, RuntimeTarget] | None = None,
) -> dict[str, int]:
    applied = applied or {}
    by_pod = {s.pod: s for s in samples}
    gate = readiness(pods, by_pod, state, applied, spec)
    reachable = settable(scrapable(pods), by_pod)  # as run_tick picks them
    wanted = runtime_targets(state, spec, reachable, by_pod, applied, gate)
    return {name: told.level for name, (_, _, told) in wanted.items()}


def test_fallback_level_is_pushed_to_one_pod_then_the_next_once_it_converged() -> None:
    state = PolicyState("svc", level=2)
    pods = [pod("a"), pod("b")]
    primary = [report("a", 1, Variant.PRIMARY), report("b", 1, Variant.PRIMARY)]
    assert targets(state, WITH_FALLBACK, pods, primary) == {"a": 2, "b": 1}

    # a was told 2: still on the primary (loading) -> b waits.
    applied = {pods[0].instance: (BreakerState.CLOSED, 100, Degradation(2))}
    loading = [report("a", 2, Variant.PRIMARY, converging=True), primary[1]]
    assert targets(state, WITH_FALLBACK, pods, loading, applied) == {"a": 2, "b": 1}
    # Loaded but its readiness not back yet -> b still waits.
    swapped = [report("a", 2, Variant.FALLBACK), primary[1]]
    unready_a = [pod("a", ready=False), pod("b")]
    assert targets(state, WITH_FALLBACK, unready_a, swapped, applied) == {"a": 2, "b": 1}
    # The fallback serves and a is Ready again: now b.
    assert targets(state, WITH_FALLBACK, pods, swapped, applied) == {"a": 2, "b": 2}


def test_a_pod_told_to_swap_counts_as_converging_before_its_report_catches_up() -> None:
    state = PolicyState("svc", level=2)
    pods = [pod("a"), pod("b")]
    applied = {pods[0].instance: (BreakerState.CLOSED, 100, Degradation(2))}
    # The stats file still says level 1, primary: what we told it decides.
    stale_report = [report("a", 1, Variant.PRIMARY), report("b", 1, Variant.PRIMARY)]
    assert targets(state, WITH_FALLBACK, pods, stale_report, applied) == {"a": 2, "b": 1}


def test_a_pod_that_cannot_load_the_fallback_never_holds_up_the_rollout() -> None:
    state = PolicyState("svc", level=2)
    pods = [pod("a"), pod("b")]
    refused = {"fallback_available": False, "fallback_unavailable_reason": "int4 needs CUDA"}
    # a was told level 2 and, unable to swap, stays on the primary: that is converged.
    applied = {pods[0].instance: (BreakerState.CLOSED, 100, Degradation(2))}
    reports = [report("a", 2, Variant.PRIMARY, **refused), report("b", 1, Variant.PRIMARY)]
    assert not converging(pods[0], reports[0], state, applied, WITH_FALLBACK)
    assert targets(state, WITH_FALLBACK, pods, reports, applied) == {"a": 2, "b": 2}
    # Neither can swap: the level goes to both at once, as without a fallback.
    both = [report("a", 1, Variant.PRIMARY, **refused), report("b", 1, Variant.PRIMARY, **refused)]
    assert targets(state, WITH_FALLBACK, pods, both) == {"a": 2, "b": 2}
    # A pod that can swap still converges to the fallback before the next may go.
    able = report("a", 2, Variant.PRIMARY, fallback_available=True)
    assert converging(pods[0], able, state, applied, WITH_FALLBACK)


def test_a_failed_scrape_does_not_make_a_pod_that_could_not_swap_able_again() -> None:
    state = PolicyState("svc", level=2, fallback_unavailable={"a": "int4 needs CUDA"})
    failed = PodSample("a", T0, ok=False, error="timeout")
    refused = report("b", 1, Variant.PRIMARY, fallback_available=False)
    # a's scrape failed this tick: the state's memory of it stands, b says so itself.
    assert unable_to_swap({"a": failed, "b": refused}, state) == {"a", "b"}
    assert unable_to_swap({}, state) == {"a"}
    # Neither pod can swap, so neither waits for the other.
    assert targets(state, WITH_FALLBACK, [pod("a"), pod("b")], [failed, refused]) == {
        "a": 2,
        "b": 2,
    }
    # A report that the pod can swap now overrides the memory.
    able = report("a", 1, Variant.PRIMARY, fallback_available=True)
    assert unable_to_swap({"a": able, "b": refused}, state) == {"b"}
    # A report that does not say (an older sidecar) leaves the memory as it was.
    silent = report("a", 1, Variant.PRIMARY)
    assert unable_to_swap({"a": silent}, state) == {"a"}


def test_the_service_swaps_unless_a_pod_is_known_unable_and_none_said_it_can() -> None:
    knows_a = PolicyState("svc", fallback_unavailable={"a": "int4 needs CUDA"})
    unheard = PodSample("b", T0, ok=False, error="timeout")
    refused = report("a", 1, Variant.PRIMARY, fallback_available=False)
    able = report("b", 1, Variant.PRIMARY, fallback_available=True)
    silent = report("b", 1, Variant.PRIMARY)  # an older sidecar: says nothing either way
    # a is known unable; b was not heard from, or said nothing: b is on the same device.
    assert not service_swaps({"a": refused, "b": unheard}, knows_a)
    assert not service_swaps({"b": unheard}, knows_a)
    assert not service_swaps({"b": silent}, knows_a)
    # b said it can: the service swaps (b will).
    assert service_swaps({"a": refused, "b": able}, knows_a)
    # Nothing known against swapping: as before pods could say so.
    assert service_swaps({"b": silent}, PolicyState("svc"))
    assert service_swaps({}, PolicyState("svc"))


def test_without_a_fallback_every_level_goes_to_every_pod_at_once() -> None:
    state = PolicyState("svc", level=3)
    samples = [report("a", 1, Variant.PRIMARY), report("b", 1, Variant.PRIMARY)]
    assert targets(state, NO_FALLBACK, [pod("a"), pod("b")], samples) == {"a": 3, "b": 3}


def test_levels_one_and_three_relative_to_two_go_to_every_pod_at_once() -> None:
    samples = [report("a", 2, Variant.FALLBACK), report("b", 2, Variant.FALLBACK)]
    pods = [pod("a"), pod("b")]
    assert targets(PolicyState("svc", level=3), WITH_FALLBACK, pods, samples) == {"a": 3, "b": 3}
    low = [report("a", 0, Variant.PRIMARY), report("b", 0, Variant.PRIMARY)]
    assert targets(PolicyState("svc", level=1), WITH_FALLBACK, pods, low) == {"a": 1, "b": 1}


SKIPS_FALLBACK = parse_spec(
    {
        "model": MODEL,
        "replicas": 2,
        "fallback": {"quantization": "int8"},
        "degradation": {"tiers": ["no-streaming", "canned-answers"]},
    }
)


def test_tiers_without_fallback_model_swap_no_model_even_with_a_fallback() -> None:
    state = PolicyState("svc", level=3)
    pods = [pod("a"), pod("b")]
    samples = [report("a", 1, Variant.PRIMARY), report("b", 1, Variant.PRIMARY)]
    # Level 3 engages no-streaming and canned-answers only: no turn needed, both at once.
    assert targets(state, SKIPS_FALLBACK, pods, samples) == {"a": 3, "b": 3}
    told = runtime_targets(state, SKIPS_FALLBACK, pods, {s.pod: s for s in samples}, {},
                           readiness(pods, {}, state, {}, SKIPS_FALLBACK))  # fmt: skip
    assert told["a"][2] == Degradation(3, SKIPS_FALLBACK.degradation.tiers)
    assert told["a"][2].variant(has_fallback=True) is Variant.PRIMARY
    # A pod on the primary at level 3 is where it should be, not converging.
    applied = {pods[0].instance: told["a"]}
    at_three = report("a", 3, Variant.PRIMARY)
    assert not converging(pods[0], at_three, state, applied, SKIPS_FALLBACK)
    assert not SKIPS_FALLBACK.degrades_to_fallback and WITH_FALLBACK.degrades_to_fallback


def test_dropping_fallback_model_from_the_tiers_swaps_back_one_pod_at_a_time() -> None:
    # Both pods serve the fallback at level 3 with every tier; then the tiers are edited.
    state = PolicyState("svc", level=3)
    pods = [pod("a"), pod("b")]
    every_tier = (BreakerState.CLOSED, 100, Degradation(3, WITH_FALLBACK.degradation.tiers))
    applied = {p.instance: every_tier for p in pods}
    on_fallback = [report("a", 3, Variant.FALLBACK), report("b", 3, Variant.FALLBACK)]
    by_pod = {s.pod: s for s in on_fallback}
    gate = readiness(pods, by_pod, state, applied, SKIPS_FALLBACK)
    told = runtime_targets(state, SKIPS_FALLBACK, pods, by_pod, applied, gate)
    assert [told[p.name][2].tiers for p in pods] == [
        SKIPS_FALLBACK.degradation.tiers,  # a goes back to the primary now
        WITH_FALLBACK.degradation.tiers,  # b keeps the fallback until a is back
    ]


def test_a_restarted_operator_takes_pods_where_they_serve_after_a_tier_edit() -> None:
    # The tiers lost fallback-model while the operator was down; both pods still
    # serve the fallback at level 3. Nothing was told by this run of the operator.
    state = PolicyState("svc", level=3)
    pods = [pod("a"), pod("b")]
    on_fallback = {p.name: report(p.name, 3, Variant.FALLBACK) for p in pods}
    where = pod_degradation(pods[0], on_fallback["a"], {}, SKIPS_FALLBACK)
    assert where.variant(has_fallback=True) is Variant.FALLBACK
    gate = readiness(pods, on_fallback, state, {}, SKIPS_FALLBACK)
    assert all(gate.in_service(p.name) for p in pods)  # where they are, not converging
    told = runtime_targets(state, SKIPS_FALLBACK, pods, on_fallback, {}, gate)
    # One swaps back to the primary now, the other keeps the fallback for its turn.
    assert sorted(t[2].variant(has_fallback=True) for t in told.values()) == [
        Variant.FALLBACK,
        Variant.PRIMARY,
    ]
    # The reverse edit: fallback-model listed again, both pods still on the primary.
    on_primary = {p.name: report(p.name, 3, Variant.PRIMARY) for p in pods}
    gate = readiness(pods, on_primary, state, {}, WITH_FALLBACK)
    told = runtime_targets(state, WITH_FALLBACK, pods, on_primary, {}, gate)
    assert sorted(t[2].variant(has_fallback=True) for t in told.values()) == [
        Variant.FALLBACK,
        Variant.PRIMARY,
    ]
    # With the tiers as the spec says, the report changes nothing.
    assert pod_degradation(pods[0], on_fallback["a"], {}, WITH_FALLBACK) == Degradation(
        3, WITH_FALLBACK.degradation.tiers
    )


def test_a_terminating_pod_holds_every_swap() -> None:
    state = PolicyState("svc", level=2)
    pods = [pod("a"), pod("b"), pod("old", terminating=True)]
    samples = [report("a", 1, Variant.PRIMARY), report("b", 1, Variant.PRIMARY)]
    assert targets(state, WITH_FALLBACK, pods, samples) == {"a": 1, "b": 1}


def test_a_restarted_container_starts_from_its_own_report() -> None:
    before = pod("a")
    applied = {before.instance: (BreakerState.CLOSED, 100, Degradation(2))}
    after = pod("a", restarts=1)
    fresh = report("a", 0, Variant.PRIMARY)
    assert pod_degradation(before, fresh, applied, WITH_FALLBACK).level == 2
    assert pod_degradation(after, fresh, applied, WITH_FALLBACK).level == 0
    assert pod_degradation(after, None, applied, WITH_FALLBACK).level == 0


def test_breaker_state_goes_to_every_pod_at_once_whatever_the_rollout() -> None:
    state = PolicyState("svc", level=2, breaker=BreakerState.HALF_OPEN)
    pods = [pod("a"), pod("b")]
    samples = [report("a", 1, Variant.PRIMARY), report("b", 1, Variant.PRIMARY)]
    by_pod = {s.pod: s for s in samples}
    gate = readiness(pods, by_pod, state, {}, WITH_FALLBACK)
    wanted = runtime_targets(state, WITH_FALLBACK, pods, by_pod, {}, gate)
    assert {breaker for breaker, _, _ in wanted.values()} == {BreakerState.HALF_OPEN}
    assert {admit for _, admit, _ in wanted.values()} == {
        WITH_FALLBACK.breaker.half_open.admit_percent
    }


def test_a_crash_looping_pod_is_not_called_on_its_admin_api_though_its_sidecar_answers() -> None:
    sidecar_answers = {"a": PodSample("a", T0), "b": PodSample("b", T0)}
    failing = "server CrashLoopBackOff (last exit 1: Error)"
    crashing = replace(pod("a", ready=False), failing=failing, server_started=False)
    # Between back-offs the server runs again and may answer: it is told its state.
    retrying = replace(pod("b", ready=False), failing="server restarted 1 time(s)")
    assert [p.name for p in settable([crashing, retrying], sidecar_answers)] == ["b"]


CPU_SHORT = "0/1 nodes are available: 1 Insufficient cpu, 1 Insufficient nvidia.com/gpu."


def unschedulable(name: str) -> PodView:
    return replace(pod(name, ready=False), phase="Pending", unschedulable=CPU_SHORT)


def test_a_replacement_waiting_for_a_terminating_pods_resources_is_not_unplaceable() -> None:
    # A rollout on a full node: the old pod still holds its CPU and GPU.
    leaving = replace(pod("old", terminating=True), grace_ends_at=T0 + 30)
    assert unplaced([pod("a"), leaving, unschedulable("new")], T0) == {}
    # Once the old pod is gone, a pod still unschedulable lacks room for good.
    assert unplaced([pod("a"), unschedulable("new")], T0) == {"new": CPU_SHORT}


def test_a_pod_stuck_terminating_past_its_grace_holds_nothing_back() -> None:
    # Its node is gone: the kubelet will never confirm the deletion.
    stuck = replace(pod("old", terminating=True), grace_ends_at=T0 - 31)
    assert unplaced([stuck, unschedulable("new")], T0) == {"new": CPU_SHORT}
    still_leaving = replace(stuck, grace_ends_at=T0 - 29)
    assert unplaced([still_leaving, unschedulable("new")], T0) == {}


class IdleActuator:
    async def execute(
        self, namespace: str, pod: PodView | None, token: str, action: Action
    ) -> ActionResult:
        raise AssertionError(f"no action expected, got {action}")

    async def reconcile_runtime(self, *args: Any, **kwargs: Any) -> RuntimeCall:
        return RuntimeCall()


def tick_with(pods: list[PodView], status: dict[str, Any]) -> TickOutcome:
    async def scrape(targets: Sequence[PodView]) -> list[PodSample]:
        return [report(p.name, 0, Variant.PRIMARY, stats_age_seconds=1.0) for p in targets]

    inputs = TickInputs("ns", "svc", NO_FALLBACK, status, pods, "token", 1)
    return asyncio.run(run_tick(inputs, TickMemory(), scrape, IdleActuator(), lambda: T0))


def test_a_rollout_on_a_full_node_posts_no_unschedulable_warning_but_a_shortage_does() -> None:
    leaving = replace(pod("old", terminating=True), grace_ends_at=T0 + 30)
    rolling = tick_with([pod("a"), leaving, unschedulable("new")], {})
    ready = next(c for c in rolling.status_patch["conditions"] if c["type"] == "Ready")
    assert (ready["reason"], ready["message"]) == ("PodsNotReady", "1/2 pods serving")
    assert EventReason.PODS_UNSCHEDULABLE not in [e.reason for e in rolling.events]

    short = tick_with([pod("a"), unschedulable("new")], rolling.status_patch)
    ready = next(c for c in short.status_patch["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == EventReason.PODS_UNSCHEDULABLE
    assert [e.reason for e in short.events].count(EventReason.PODS_UNSCHEDULABLE) == 1


def test_status_replicas_counts_the_pods_that_exist_ready_or_not_but_not_leaving() -> None:
    pods = [
        pod("a"),
        pod("starting", ready=False),
        unschedulable("pending"),
        replace(pod("old", terminating=True), grace_ends_at=T0 + 30),
        replace(pod("evicted", ready=False), phase="Failed"),
    ]
    assert tick_with(pods, {}).status_patch["replicas"] == 3


GIB = 1024**3
MIB = 1024**2


class RecordingActuator:
    """Every action succeeds; what was sent is kept, in order."""

    def __init__(self) -> None:
        self.sent: list[Action] = []

    async def execute(
        self, namespace: str, pod: PodView | None, token: str, action: Action
    ) -> ActionResult:
        self.sent.append(action)
        return ActionResult("done")

    async def reconcile_runtime(self, *args: Any, **kwargs: Any) -> RuntimeCall:
        return RuntimeCall()


def run(
    spec: InferenceServiceSpec,
    status: dict[str, Any],
    pods: list[PodView],
    memory: TickMemory,
    reports: Sequence[Sequence[PodSample]] = (),
    actuator: Any = None,
    now: float = T0,
    operator_pod: str = "",
) -> TickOutcome:
    """One tick; each scrape answers the next of `reports` (then an idle report per pod)."""
    answers = list(reports)

    async def scrape(targets: Sequence[PodView]) -> list[PodSample]:
        if answers:
            return list(answers.pop(0))
        return [report(p.name, 0, Variant.PRIMARY, stats_age_seconds=1.0) for p in targets]

    inputs = TickInputs("ns", "svc", spec, status, pods, "token", 1, operator_pod=operator_pod)
    return asyncio.run(run_tick(inputs, memory, scrape, actuator or IdleActuator(), lambda: now))


def merged(status: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """The stored status after kopf's merge patch: a null deletes the key."""
    out = {**status, **patch}
    return {key: value for key, value in out.items() if value is not None}


def condition_types(status: dict[str, Any]) -> list[str]:
    return [c["type"] for c in status.get("conditions") or []]


def test_the_grow_limit_rung_targets_the_limit_reconcile_sized_after_a_spec_edit() -> None:
    spec = parse_spec({"model": MODEL, "gpu": {"count": 0}, "memory": {"maxGrowthRatio": 1.5}})
    memory = TickMemory()
    run(spec, {"memory": {"limitBytes": 34 * GIB}}, [pod("a")], memory)
    # The edit: reconcile sized 10 GiB; the pod rolled onto it and its RSS is at 97 %.
    memory.policy = replace(memory.policy or PolicyState("svc"), ladders={})
    memory.policy.ladders["a/rss"] = Ladder(step=2, last_action_at=T0 - 600)  # next: grow
    full = report("a", 0, Variant.PRIMARY, stats_age_seconds=1.0,
                  rss_bytes=0.97 * 10 * GIB, memory_limit_bytes=10 * GIB)  # fmt: skip
    actuator = RecordingActuator()
    out = run(spec, {"memory": {"limitBytes": 10 * GIB}}, [pod("a")], memory, [[full]], actuator)
    grown = [a for a in actuator.sent if a.kind is ActionKind.GROW_LIMIT]
    assert [a.memory_limit_bytes for a in grown] == [int(15 * GIB)]
    assert out.status_patch["lastAction"]["type"] == "grow_limit"


def test_turning_autoscaling_off_deletes_its_status_and_scaling_limited() -> None:
    autoscaled = parse_spec({"model": MODEL, "gpu": {"count": 0},
                             "autoscaling": {"minReplicas": 1, "maxReplicas": 4}})  # fmt: skip
    fixed = parse_spec({"model": MODEL, "gpu": {"count": 0}, "replicas": 1})
    memory = TickMemory()
    status = merged({}, run(autoscaled, {}, [pod("a")], memory).status_patch)
    assert "ScalingLimited" in condition_types(status) and status["autoscaling"]["replicas"] == 1

    patch = run(fixed, status, [pod("a")], memory, now=T0 + 5).status_patch
    assert patch["autoscaling"] is None  # a merge patch deletes only what it names
    status = merged(status, patch)
    assert "autoscaling" not in status and "ScalingLimited" not in condition_types(status)
    # Nothing left to delete: the next ticks name no autoscaling at all.
    assert "autoscaling" not in run(fixed, status, [pod("a")], memory, now=T0 + 40).status_patch


WINDOWED = {"minReplicas": 1, "maxReplicas": 4, "scaleDownStabilizationSeconds": 60}


def idle_reports(pods: list[PodView]) -> list[PodSample]:
    """Nothing queued or running on any pod: the load asks for the fewest pods."""
    return [report(p.name, 0, Variant.PRIMARY, stats_age_seconds=1.0, queue_length=0.0,
                   requests_running=0.0) for p in pods]  # fmt: skip


def test_a_scale_down_the_window_holds_posts_one_event_then_scales_down() -> None:
    spec = parse_spec({"model": MODEL, "gpu": {"count": 0}, "autoscaling": WINDOWED})
    pods = [pod(name) for name in "abc"]
    idle = idle_reports(pods)
    status: dict[str, Any] = {"autoscaling": {"replicas": 3}}
    memory = TickMemory()
    told: list[list[str]] = []
    for step in range(14):  # T0 .. T0 + 65
        outcome = run(spec, status, pods, memory, [idle], now=T0 + 5 * step)
        status = merged(status, outcome.status_patch)
        told.append([e.reason.value for e in outcome.events if e.reason.startswith("Scale")])
    assert told[0] == ["ScaleDownHeld"]
    assert told[1:13] == [[]] * 12  # held, not told again
    assert told[13] == ["ScaledDown"] and status["autoscaling"]["replicas"] == 1


def test_a_scale_down_hold_is_told_again_after_observe_mode_interrupted_it() -> None:
    enforce = parse_spec({"model": MODEL, "gpu": {"count": 0}, "autoscaling": WINDOWED})
    observe = parse_spec({"model": MODEL, "gpu": {"count": 0}, "mode": "Observe",
                          "autoscaling": WINDOWED})  # fmt: skip
    pods = [pod(name) for name in "abc"]
    idle = idle_reports(pods)
    status: dict[str, Any] = {"autoscaling": {"replicas": 3}}
    memory = TickMemory()
    told: list[list[str]] = []
    for step, spec in enumerate([enforce, observe, observe, enforce, enforce]):
        outcome = run(spec, status, pods, memory, [idle], now=T0 + 5 * step)
        status = merged(status, outcome.status_patch)
        told.append([e.reason.value for e in outcome.events if e.reason == "ScaleDownHeld"])
    # Observe decided without the hold being told; back in Enforce the hold is news again.
    assert told == [["ScaleDownHeld"], [], [], ["ScaleDownHeld"], []]


def test_a_service_moved_off_gpus_drops_gpu_healthy() -> None:
    on_gpu = parse_spec({"model": MODEL, "gpu": {"count": 1, "memoryGiB": 16}})
    on_cpu = parse_spec({"model": MODEL, "gpu": {"count": 0}})
    memory = TickMemory()
    sick = replace(pod("old", terminating=True), unhealthy_gpus=("GPU-1",), grace_ends_at=T0 + 30)
    status = merged({}, run(on_gpu, {}, [pod("a"), sick], memory).status_patch)
    assert "GPUHealthy" in condition_types(status)
    status = merged(status, run(on_cpu, status, [pod("a")], memory, now=T0 + 40).status_patch)
    assert "GPUHealthy" not in condition_types(status)


def test_a_pod_missing_one_scrape_keeps_its_in_flight_action_and_swapped_variant() -> None:
    state = PolicyState("svc", sequence=7, variants={"a": Variant.FALLBACK}, swapped_at={"a": T0})
    reload = Action("svc-000007-reload", ActionKind.RELOAD, "a", "rss", T0 - 5, attempts=2)
    state.in_flight[reload.id] = reload
    memory = TickMemory(policy=state)
    unscrapable = replace(pod("a", ready=False), sidecar_ready=False)  # its sidecar blinked
    out = run(WITH_FALLBACK, {}, [unscrapable, pod("b")], memory)
    assert [a["id"] for a in out.status_patch["policy"]["inFlight"]] == [reload.id]
    assert {"pod": "a", "variant": "fallback"}.items() <= next(
        p for p in out.status_patch["policy"]["pods"] if p["pod"] == "a"
    ).items()
    # Back next tick: the same id is sent again, never a new one.
    actuator = RecordingActuator()
    run(WITH_FALLBACK, out.status_patch, [pod("a"), pod("b")], memory, actuator=actuator,
        now=T0 + 5)  # fmt: skip
    assert [a.id for a in actuator.sent] == [reload.id]
    # Gone from the pod list: forgotten.
    out = run(WITH_FALLBACK, {}, [pod("b")], memory, now=T0 + 10)
    assert out.state.in_flight == {} and "a" not in out.state.variants


def test_after_an_action_the_status_never_pairs_new_figures_with_the_old_time_to_oom() -> None:
    limit = 4 * GIB
    leak = [(T0 - 10, 3.0 * GIB), (T0 - 5, 3.0 * GIB + 85 * MIB)]  # ~1 GiB/min
    state = PolicyState("svc", history={"a": [(t, rss, None) for t, rss in leak]})
    state.first_seen["a"] = T0 - 10
    memory = TickMemory(policy=state)

    def figures(rss: float) -> list[PodSample]:
        return [report("a", 0, Variant.PRIMARY, stats_age_seconds=1.0, rss_bytes=rss,
                       memory_limit_bytes=limit)]  # fmt: skip

    before, after = figures(3.0 * GIB + 170 * MIB), figures(2.0 * GIB)
    out = run(NO_FALLBACK, {}, [pod("a")], memory, [before, after], RecordingActuator())
    assert out.status_patch["recentActions"], "the leak was acted on"
    (entry,) = out.status_patch["pods"]
    assert entry["rssBytes"] == 2 * GIB
    assert "timeToOOMSeconds" not in entry
    assert out.status_patch["summary"]["timeToOOM"] == "-"


def test_one_pods_slow_action_never_holds_back_another_pods() -> None:
    spec = parse_spec({"model": MODEL, "gpu": {"count": 0}, "replicas": 2})
    pods = {name: pod(name) for name in ("a", "b")}
    b_acted = asyncio.Event()
    started: list[str] = []

    class LoadWaitingForB:
        async def execute(
            self, namespace: str, target: PodView | None, token: str, action: Action
        ) -> ActionResult:
            started.append(action.id)
            if action.id == "load-a":
                # A load that ends only once pod b was acted on: run one after
                # the other, this tick would never end.
                await b_acted.wait()
            if action.pod == "b":
                b_acted.set()
            return ActionResult(f"done {action.id}")

    actions = [
        Action("load-a", ActionKind.RELOAD, "a", "rss", T0),
        Action("restart-b", ActionKind.RESTART, "b", "wedged", T0),
        Action("gc-a", ActionKind.GC, "a", "rss", T0),
    ]
    inputs = TickInputs("ns", "svc", spec, {}, list(pods.values()), "token", 1)

    async def scenario() -> list[tuple[Action, ActionResult]]:
        return await asyncio.wait_for(
            execute_per_pod(actions, inputs, pods, LoadWaitingForB()), timeout=10
        )

    results = asyncio.run(scenario())
    assert [(a.id, r.text) for a, r in results] == [
        ("load-a", "done load-a"),
        ("restart-b", "done restart-b"),
        ("gc-a", "done gc-a"),
    ]
    assert started.index("gc-a") > started.index("load-a")  # pod a's own order kept


def test_a_wedged_pod_is_restarted_without_first_retrying_its_in_flight_reload() -> None:
    """The reload timed out because its load wedged the server: retried first, its unload
    would wait up to 300 s on the wedged server before the restart, holding the tick."""
    reload = Action("svc-000007-reload", ActionKind.RELOAD, "a", "rss 97%", T0 - 10)
    state = PolicyState("svc", sequence=7, in_flight={reload.id: reload}, served_once={"a"})
    wedged = report("a", 0, Variant.PRIMARY, stats_age_seconds=60.0, heartbeat_age_seconds=60.0)
    actuator = RecordingActuator()
    out = run(NO_FALLBACK, {}, [pod("a")], TickMemory(policy=state), [[wedged]], actuator)
    assert [(a.kind, a.pod) for a in actuator.sent] == [(ActionKind.RESTART, "a")]
    assert out.status_patch["policy"]["inFlight"] == []  # the reload died with the pod


def test_a_pod_drained_this_tick_no_longer_counts_as_serving() -> None:
    """Deleted, it leaves the Service's endpoints at once: the same tick's Ready must not
    say it serves, nor the summary show its figures."""
    spec = parse_spec({"model": MODEL, "replicas": 1, "gpu": {"count": 1, "memoryGiB": 24}})
    sick = replace(pod("a"), unhealthy_gpus=("GPU-1",))
    figures = report("a", 0, Variant.PRIMARY, stats_age_seconds=1.0, rss_bytes=3e9,
                     gpu_memory_used_bytes=2e10)  # fmt: skip
    actuator = RecordingActuator()
    out = run(spec, {"memory": {"limitBytes": 32 * GIB}}, [sick], TickMemory(), [[figures]],
              actuator)  # fmt: skip
    assert [a.kind for a in actuator.sent] == [ActionKind.DRAIN]
    status = out.status_patch
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "False",
        "PodsNotReady",
        "0/1 pods serving",
    )
    available = next(c for c in status["conditions"] if c["type"] == "Available")
    assert available["status"] == "False"
    assert status["summary"]["ready"] == "0/1"
    assert [p["name"] for p in status["pods"]] == []


def test_the_tick_shows_the_model_download_and_the_commit_it_was_verified_at() -> None:
    hub = parse_spec({"model": {"name": "chat", "source": "hf://acme/chat@main"}, "replicas": 2})
    commit = "0123456789abcdef0123456789abcdef01234567"

    def fetching(name: str, report: FetchReport, done: bool) -> PodView:
        state = FetchState(name, running=not done, succeeded=done, failed=False, report=report)
        return replace(pod(name, ready=done), fetch=state)

    half = FetchReport(FetchReason.DOWNLOADING, "", 2 * GIB, 4 * GIB, 1e8)
    whole = FetchReport(FetchReason.VERIFIED, "ok", 4 * GIB, 4 * GIB, 1e8, revision=commit)
    memory = TickMemory()
    first = run(hub, {}, [fetching("a", whole, True), fetching("b", half, False)], memory)
    model = next(c for c in first.status_patch["conditions"] if c["type"] == "ModelReady")
    assert (model["status"], model["reason"]) == ("False", "Downloading")
    assert "b 2.0Gi of 4.0Gi" in model["message"]
    assert EventReason.MODEL_DOWNLOADING in [e.reason for e in first.events]
    assert first.status_patch["modelRevision"] == commit  # where a's verified copy is

    both = [fetching("a", whole, True), fetching("b", whole, True)]
    second = run(hub, merged({}, first.status_patch), both, memory, now=T0 + 2)
    model = next(c for c in second.status_patch["conditions"] if c["type"] == "ModelReady")
    assert (model["status"], model["reason"]) == ("True", "Verified")
    assert second.status_patch["modelRevision"] == commit
    assert EventReason.MODEL_VERIFIED in [e.reason for e in second.events]
    gone = run(hub, merged({}, second.status_patch), [], memory, now=T0 + 4)
    assert gone.status_patch["modelRevision"] is None  # no pod holds a copy any more


def test_a_first_download_s_figures_are_read_through_the_sidecar_and_told_every_ten_s() -> None:
    bucket = parse_spec({"model": {"name": "chat", "source": "s3://models/chat"}})
    # Pending: the native sidecar (started before the fetcher) is Ready, the server not.
    state = FetchState("a", running=True, succeeded=False, failed=False, report=None)
    waiting = replace(pod("a", ready=False), phase="Pending", server_started=False, fetch=state)
    scraped: list[list[str]] = []

    def tick(done: int, now: float, status: dict[str, Any], memory: TickMemory) -> TickOutcome:
        progress = FetchProgress(done, 4 * GIB, 1e8, 0.5, now)

        async def scrape(targets: Sequence[PodView]) -> list[PodSample]:
            scraped.append([p.name for p in targets])
            # What else the sidecar exports (a node's memory) is no sample of a serving pod.
            return [PodSample(p.name, now, node_available_bytes=GIB, fetch=progress)
                    for p in targets]  # fmt: skip

        inputs = TickInputs("ns", "svc", bucket, status, [waiting], "token", 1)
        return asyncio.run(run_tick(inputs, memory, scrape, IdleActuator(), lambda: now))

    memory = TickMemory()
    first = tick(GIB, T0, {}, memory)
    assert scraped == [["a"]]
    assert first.samples == []  # the policy saw no pod: nothing of it is served yet
    model = next(c for c in first.status_patch["conditions"] if c["type"] == "ModelReady")
    assert model["reason"] == "Downloading"
    assert model["message"] == (
        f"s3://models/chat: a 1.0Gi of 4.0Gi (25%) at 95.4Mi/s (read {iso(T0)})"
    )
    # Ready says what it waits for.
    ready = next(c for c in first.status_patch["conditions"] if c["type"] == "Ready")
    assert (ready["reason"], ready["message"]) == (
        "PodsNotReady",
        "0/1 pods serving; a starting: its model downloading (ModelReady)",
    )
    # Four seconds on: the same message (the figures it holds say when they were read).
    status = merged({}, first.status_patch)
    soon = tick(2 * GIB, T0 + 4, status, memory)
    assert soon.status_patch == {}
    later = tick(3 * GIB, T0 + 10, status, memory)
    model = next(c for c in later.status_patch["conditions"] if c["type"] == "ModelReady")
    assert "a 3.0Gi of 4.0Gi (75%)" in model["message"], model
    assert f"(read {iso(T0 + 10)})" in model["message"], model
    assert [e.reason for e in later.events] == []  # one ModelDownloading per spell

    # A sidecar not Ready yet is not asked: the download is told without figures.
    unready = replace(waiting, sidecar_ready=False)
    inputs = TickInputs("ns", "svc", bucket, {}, [unready], "token", 1)

    async def no_scrape(targets: Sequence[PodView]) -> list[PodSample]:
        assert not targets
        return []

    out = asyncio.run(run_tick(inputs, TickMemory(), no_scrape, IdleActuator(), lambda: T0))
    model = next(c for c in out.status_patch["conditions"] if c["type"] == "ModelReady")
    assert model["message"] == "s3://models/chat: a downloading"


def test_an_s3_copy_is_named_by_its_etags_digest_and_no_revision_is_claimed() -> None:
    bucket = parse_spec({"model": {"name": "chat", "source": "s3://models/chat"}, "replicas": 2})

    def verified(name: str, digest: str) -> PodView:
        report = FetchReport(FetchReason.VERIFIED, "ok", GIB, GIB, 1e8, revision=digest)
        state = FetchState(name, running=False, succeeded=True, failed=False, report=report)
        return replace(pod(name), fetch=state)

    memory = TickMemory()
    same = [verified("a", "etags:0123456789abcdef"), verified("b", "etags:0123456789abcdef")]
    out = run(bucket, {}, same, memory)
    assert out.status_patch["modelRevision"] == "etags:0123456789abcdef"
    assert "revision" not in out.status_patch["model"]  # a bucket has no revision to report
    # An object replaced between the two downloads: the pods hold different copies.
    moved = [verified("a", "etags:0123456789abcdef"), verified("b", "etags:fedcba9876543210")]
    later = run(bucket, merged({}, out.status_patch), moved, memory, now=T0 + 2)
    assert later.status_patch["modelRevision"] is None


def test_an_evicted_pod_s_failed_fetch_no_longer_holds_model_ready_false() -> None:
    """An evicted pod stays in the API (phase Failed) with its fetcher killed; once its
    replacement has its copy, the model is ready."""
    bucket = parse_spec({"model": {"name": "chat", "source": "s3://models/chat"}})
    killed = FetchState("old", running=False, succeeded=False, failed=True, report=None)
    evicted = replace(pod("old", ready=False), phase="Failed", fetch=killed)
    report = FetchReport(FetchReason.VERIFIED, "ok", GIB, GIB, 1e8, revision="etags:01")
    copy = FetchState("new", running=False, succeeded=True, failed=False, report=report)
    out = run(bucket, {}, [evicted, replace(pod("new"), fetch=copy)], TickMemory())
    model = next(c for c in out.status_patch["conditions"] if c["type"] == "ModelReady")
    assert (model["status"], model["reason"]) == ("True", "Verified")
    assert "old" not in model["message"]


def test_a_local_source_has_no_model_ready_condition_in_the_tick() -> None:
    out = run(NO_FALLBACK, {}, [pod("a")], TickMemory())
    assert "ModelReady" not in condition_types(out.status_patch)
    assert "modelRevision" not in out.status_patch


def test_status_names_the_acting_operator_replica_and_a_handover_is_written_at_once() -> None:
    first = run(NO_FALLBACK, {}, [pod("a")], TickMemory(), operator_pod="op-1")
    assert first.status_patch["operator"] == {"pod": "op-1", "since": iso(T0)}
    stored = merged({}, first.status_patch)
    # The same replica a tick later: nothing new to say, the figures not yet due.
    same = run(NO_FALLBACK, stored, [pod("a")], TickMemory(), now=T0 + 2, operator_pod="op-1")
    assert same.status_patch == {}
    # Another replica took over: status says so on its first tick, since then.
    taken = run(NO_FALLBACK, stored, [pod("a")], TickMemory(), now=T0 + 4, operator_pod="op-2")
    assert taken.status_patch["operator"] == {"pod": "op-2", "since": iso(T0 + 4)}


def test_the_kubelets_memory_pressure_on_one_node_reaches_only_its_pod_through_the_tick() -> None:
    spec = parse_spec({"model": MODEL, "gpu": {"count": 0}, "replicas": 2})
    pods = [replace(pod("a"), node="n1"), replace(pod("b"), node="n2")]
    pressured = {"n2": KubeletPressure("n2", T0 - 5, "kubelet has insufficient memory available")}
    actuator = RecordingActuator()
    memory = TickMemory()

    async def scrape(targets: Sequence[PodView]) -> list[PodSample]:
        return [report(p.name, 0, Variant.PRIMARY, stats_age_seconds=1.0) for p in targets]

    inputs = TickInputs("ns", "svc", spec, {}, pods, "token", 1, kubelet_pressure=pressured)
    out = asyncio.run(run_tick(inputs, memory, scrape, actuator, lambda: T0))
    assert [(a.kind, a.pod) for a in actuator.sent] == [
        (ActionKind.GC, "b"),
        (ActionKind.EMPTY_CACHE, "b"),
    ]
    (warning,) = [e for e in out.events if e.reason is EventReason.NODE_MEMORY_PRESSURE]
    assert warning.message.startswith("node n2: the kubelet reports MemoryPressure")
    (condition,) = [c for c in out.status_patch["conditions"] if c["type"] == "NodeMemoryPressure"]
    assert (condition["status"], condition["reason"]) == ("True", "KubeletMemoryPressure")
    # Without the Nodes (unread: None), nothing on either pod: the sidecars report no figures.
    quiet = replace(inputs, kubelet_pressure=None)
    asyncio.run(run_tick(quiet, TickMemory(), scrape, IdleActuator(), lambda: T0))


LIMIT_BYTES = 8 * 2**30


def leaking(name: str, at: float) -> PodSample:
    return PodSample(name, at, model_loaded=True, rss_bytes=0.97 * LIMIT_BYTES,
                     memory_limit_bytes=LIMIT_BYTES, stats_age_seconds=1.0,
                     heartbeat_age_seconds=1.0)  # fmt: skip


def ladder_ticks(pods: list[PodView], ticks: int = 12) -> tuple[list[str], list[TickOutcome]]:
    """The leaking pod's ladder over `ticks` ticks 35 s apart (its cooldown is 30 s): the
    kinds sent, and each tick's outcome."""
    actuator, memory, outcomes = RecordingActuator(), TickMemory(), []
    status: dict[str, Any] = {"memory": {"limitBytes": LIMIT_BYTES}}
    for i in range(ticks):
        now = T0 + 35 * i

        async def scrape(targets: Sequence[PodView], now: float = now) -> list[PodSample]:
            return [leaking(t.name, now) if t.name == "leaky" else report(t.name, 0,
                    Variant.PRIMARY, stats_age_seconds=1.0) for t in targets]  # fmt: skip

        inputs = TickInputs("ns", "svc", NO_FALLBACK, status, pods, "token", 1)
        outcome = asyncio.run(run_tick(inputs, memory, scrape, actuator, lambda t=now: t))
        status = {**status, **outcome.status_patch}
        outcomes.append(outcome)
    return [a.kind.value for a in actuator.sent if a.pod == "leaky"], outcomes


def stuck_on_a_lost_node(name: str) -> PodView:
    """Evicted an hour ago from a node that is gone: Terminating until it comes back."""
    return replace(pod(name, ready=False, terminating=True), grace_ends_at=T0 - 3600)


def test_a_pod_stuck_terminating_does_not_hold_the_other_pods_reload() -> None:
    kinds, _ = ladder_ticks([pod("leaky"), pod("fresh"), stuck_on_a_lost_node("lost")])
    assert kinds[:3] == ["gc", "empty_cache", "reload"]
    gate = readiness([stuck_on_a_lost_node("lost"), pod("a")], {}, PolicyState("s"), {},
                     NO_FALLBACK, T0)  # fmt: skip
    assert gate.may_disrupt("a")
    # Still within its grace period (plus the margin), a terminating pod is leaving: it holds.
    leaving = replace(stuck_on_a_lost_node("lost"), grace_ends_at=T0)
    assert not readiness([leaving, pod("a")], {}, PolicyState("s"), {}, NO_FALLBACK,
                         T0).may_disrupt("a")  # fmt: skip


def test_a_ladder_step_the_rollout_holds_is_told_once_and_in_memory_pressure() -> None:
    # "starting" is not Ready: the reload would take the only serving pod out as well.
    kinds, outcomes = ladder_ticks([pod("leaky"), pod("starting", ready=False)])
    assert kinds == ["gc", "empty_cache"]
    held = [e for o in outcomes for e in o.events if e.reason is EventReason.LADDER_STEP_HELD]
    assert [(e.type, e.message) for e in held] == [(
        "Warning",
        "reload on leaky waits: starting out of service (one pod out of service at a time)",
    )]  # fmt: skip
    written = [o.status_patch for o in outcomes if o.status_patch]
    pressure = next(c for c in written[-1]["conditions"] if c["type"] == "MemoryPressure")
    assert pressure["message"] == (
        "resource ladder active on leaky; reload on leaky waits: starting out of service "
        "(one pod out of service at a time)"
    )
