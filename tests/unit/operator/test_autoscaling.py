"""autoscaling: the replica count from the pods' load, the windows, and the GPU hold."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Any

import pytest

from fusebox_contract.names import BreakerState, ConditionType, EventReason
from fusebox_operator.autoscaling import (
    Recommendation,
    ScaleDecision,
    ScaleHold,
    decide_scale,
    pending_for_gpu,
    pod_load,
    recommend,
)
from fusebox_operator.observations import PodSample, PodView, RequestCounts
from fusebox_operator.spec import AutoscalingMetric, AutoscalingSpec, SpecError, parse_spec
from fusebox_operator.status import (
    SCALE_LIMIT_GPU,
    add_autoscaling_status,
    iso,
    scale_down_held_events,
    scaling_events,
    should_write,
)
from fusebox_operator.tick import TickMemory, autoscale, current_replicas

SPEC = AutoscalingSpec(
    min_replicas=1,
    max_replicas=4,
    target_per_replica=2,
    scale_up_stabilization_seconds=0,
    scale_down_stabilization_seconds=60,
)


def sample(pod: str, queue: float | None, running: float | None = 0, ok: bool = True) -> PodSample:
    """A scrape of a pod whose server wrote its stats a second before."""
    return PodSample(
        pod, 0.0, ok=ok, queue_length=queue, requests_running=running, stats_age_seconds=1.0
    )


def test_a_pods_load_is_its_queue_or_its_queue_plus_running_requests() -> None:
    busy = sample("a", 3, running=2)
    assert pod_load(busy, AutoscalingMetric.QUEUE_LENGTH) == 3
    assert pod_load(busy, AutoscalingMetric.IN_FLIGHT) == 5
    assert pod_load(sample("a", None), AutoscalingMetric.QUEUE_LENGTH) is None
    assert pod_load(sample("a", 3, ok=False), AutoscalingMetric.QUEUE_LENGTH) is None


@pytest.mark.parametrize(
    ("current", "loads", "wanted"),
    [
        (1, [7.0], 4),  # ceil(7 / 2)
        (1, [20.0], 4),  # clamped to max
        (2, [0.0, 0.0], 1),  # clamped to min
        (2, [2.1, 2.0], 2),  # 2.05 per replica: within the tolerance of 2
        (2, [], 2),  # nothing measured: hold
        (9, [], 4),  # ... inside the range
    ],
)
def test_the_recommendation_is_the_load_over_the_target_rounded_up_and_clamped(
    current: int, loads: list[float], wanted: int
) -> None:
    assert recommend(current, loads, SPEC) == wanted


def test_load_scales_up_at_once_and_says_why_in_the_decision() -> None:
    decision = decide_scale(SPEC, 1, [sample("a", 6)], [], (), now=100)
    assert decision.replicas == 3
    assert decision.reason is EventReason.SCALED_UP
    assert "1 -> 3 replicas" in decision.message and "target 2" in decision.message


def test_scale_up_waits_for_load_to_last_through_its_window() -> None:
    spec = replace(SPEC, scale_up_stabilization_seconds=30)
    history = (Recommendation(80, 1),)
    held = decide_scale(spec, 1, [sample("a", 6)], [], history, now=100)
    assert held.replicas == 1 and held.reason is None
    later = decide_scale(spec, 1, [sample("a", 6)], [], held.history, now=115)
    assert later.replicas == 3  # the idle recommendation of t=80 left the window


def test_scale_down_takes_the_highest_recommendation_of_its_window() -> None:
    history = (Recommendation(50, 3), Recommendation(80, 2))
    first = decide_scale(
        SPEC, 3, [sample("a", 0), sample("b", 0), sample("c", 0)], [], history, 100
    )
    assert first.replicas == 3 and first.reason is None  # 3 was asked 50 s ago
    second = decide_scale(SPEC, 3, [sample("a", 0)] * 3, [], first.history, now=115)
    assert second.replicas == 2  # t=50 left the 60 s window; t=80 still asks for 2
    assert second.reason is EventReason.SCALED_DOWN
    third = decide_scale(SPEC, 2, [sample("a", 0)] * 2, [], second.history, now=141)
    assert third.replicas == 1


def test_pods_pending_for_gpus_hold_scale_up_with_a_reason() -> None:
    decision = decide_scale(SPEC, 2, [sample("a", 8), sample("b", 8)], ["p-3"], (), now=10)
    assert decision.replicas == 2
    assert decision.blocked
    assert decision.reason is EventReason.SCALE_UP_BLOCKED
    assert "p-3" in decision.message and "GPU" in decision.message
    # ...but scaling down is never held.
    down = decide_scale(replace(SPEC, scale_down_stabilization_seconds=0), 2, [], ["p-3"], (), 10)
    assert not down.blocked


def test_the_history_keeps_only_what_the_longest_window_needs() -> None:
    history = tuple(Recommendation(t, 1) for t in (0, 30, 50))
    decision = decide_scale(SPEC, 1, [sample("a", 0)], [], history, now=100)
    assert [r.at for r in decision.history] == [50, 100]


def test_only_gpu_shortage_counts_as_pending_for_gpus() -> None:
    unschedulable = {
        "a": "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.",
        "b": "0/1 nodes are available: 1 Insufficient memory.",
    }
    assert pending_for_gpu(unschedulable) == ["a"]


def base(**autoscaling: object) -> dict[str, object]:
    return {"model": {"name": "m", "source": "pvc://models/tiny"}, "autoscaling": autoscaling}


def test_the_spec_parses_autoscaling_with_its_defaults() -> None:
    spec = parse_spec(base(maxReplicas=3))
    assert spec.autoscaling == AutoscalingSpec(
        max_replicas=3, pod_max_queue=64, pod_max_concurrency=8
    )
    assert parse_spec(base(maxReplicas=3, metric="inFlight")).autoscaling is not None
    assert parse_spec({"model": {"name": "m", "source": "pvc://m/x"}}).autoscaling is None


def test_replicas_start_inside_the_autoscalers_range() -> None:
    spec = parse_spec({**base(minReplicas=2, maxReplicas=3), "replicas": 1})
    assert spec.initial_replicas() == 2
    assert parse_spec({**base(maxReplicas=3), "replicas": 5}).initial_replicas() == 3


@pytest.mark.parametrize(
    ("autoscaling", "message"),
    [
        ({"minReplicas": 0, "maxReplicas": 2}, "scale to zero is not offered"),
        ({"minReplicas": 3, "maxReplicas": 2}, "must not exceed"),
        ({}, "maxReplicas is required"),
        ({"maxReplicas": 2, "targetPerReplica": 0}, "targetPerReplica"),
        ({"maxReplicas": 2, "metric": "gpuUtilization"}, "metric"),
        ({"maxReplicas": 2, "scaleDownStabilizationSeconds": 7200}, "scaleDown"),
    ],
)
def test_bad_autoscaling_is_refused_naming_the_field(
    autoscaling: dict[str, object], message: str
) -> None:
    with pytest.raises(SpecError, match=message):
        parse_spec(base(**autoscaling))


# --- in the tick: the count, the status and the events -----------------------------------

AUTOSCALED = parse_spec(
    {
        "model": {"name": "m", "source": "pvc://models/tiny"},
        "autoscaling": {"minReplicas": 1, "maxReplicas": 3, "targetPerReplica": 2},
    }
)


def view(name: str, ready: bool = True, unschedulable: str = "") -> PodView:
    return PodView(name, f"uid-{name}", "10.0.0.1", "Running" if ready else "Pending", ready,
                   ready, ready, 0, False, False, unschedulable)  # fmt: skip


def test_the_count_resumes_from_status_inside_the_current_range() -> None:
    assert current_replicas(AUTOSCALED, {}) == 1
    assert current_replicas(AUTOSCALED, {"autoscaling": {"replicas": 2}}) == 2
    assert current_replicas(AUTOSCALED, {"autoscaling": {"replicas": 7}}) == 3
    plain = parse_spec({"model": {"name": "m", "source": "pvc://m/x"}, "replicas": 2})
    assert current_replicas(plain, {"autoscaling": {"replicas": 7}}) == 2


def test_only_ready_pods_load_counts_and_an_unscheduled_gpu_pod_holds_scale_up() -> None:
    memory = TickMemory()
    pods = [view("a"), view("b", ready=False)]
    samples = {"a": sample("a", 5), "b": sample("b", 50)}
    decision = autoscale(AUTOSCALED, {}, pods, samples, memory, now=10)
    assert decision is not None and decision.replicas == 3  # ceil(5 / 2), b ignored
    assert memory.scale_history == decision.history

    gpu_short = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    pending = [view("a"), view("b"), view("c", ready=False, unschedulable=gpu_short)]
    held = autoscale(
        AUTOSCALED,
        {"autoscaling": {"replicas": 2}},
        pending,
        {"a": sample("a", 9), "b": sample("b", 9)},
        TickMemory(),
        now=20,
    )
    assert held is not None and held.blocked and held.replicas == 2
    assert autoscale(parse_spec({"model": {"name": "m", "source": "pvc://m/x"}}), {}, pods,
                     samples, memory, 10) is None  # fmt: skip


def test_the_status_shows_the_count_and_the_condition_names_the_gpu_hold() -> None:
    assert AUTOSCALED.autoscaling is not None
    up = decide_scale(AUTOSCALED.autoscaling, 1, [sample("a", 4)], [], (), now=100)
    status: dict[str, object] = {}
    add_autoscaling_status(status, {}, up, AUTOSCALED, 1, 100)
    entry = status["autoscaling"]
    assert isinstance(entry, dict)
    assert entry["replicas"] == 2 and entry["load"] == 4 and entry["metric"] == "queueLength"
    assert entry["lastScaleTime"]
    conditions = {c["type"]: c for c in status["conditions"]}  # type: ignore[attr-defined]
    assert conditions[ConditionType.SCALING_LIMITED]["status"] == "False"
    assert [e.reason for e in scaling_events({}, up)] == [EventReason.SCALED_UP]

    held = decide_scale(
        AUTOSCALED.autoscaling, 2, [sample("a", 8), sample("b", 8)], ["p-3"], (), now=110
    )
    blocked_status: dict[str, object] = {}
    add_autoscaling_status(blocked_status, status, held, AUTOSCALED, 1, 110)
    conditions = {c["type"]: c for c in blocked_status["conditions"]}  # type: ignore[attr-defined]
    limited = conditions[ConditionType.SCALING_LIMITED]
    assert limited["status"] == "True" and limited["reason"] == SCALE_LIMIT_GPU
    # The held scale-up is told once, when the hold starts, not every tick.
    assert [e.type for e in scaling_events(status, held)] == ["Warning"]
    assert scaling_events(blocked_status, held) == []
    quiet = decide_scale(AUTOSCALED.autoscaling, 1, [sample("a", 2)], [], (), now=120)
    at_max = decide_scale(AUTOSCALED.autoscaling, 2, [sample("a", 20)], [], (), now=130)
    maxed: dict[str, object] = {}
    add_autoscaling_status(maxed, {}, at_max, AUTOSCALED, 1, 130)
    conditions = {c["type"]: c for c in maxed["conditions"]}  # type: ignore[attr-defined]
    assert conditions[ConditionType.SCALING_LIMITED]["reason"] == "AtMaxReplicas"
    assert scaling_events(status, quiet) == []


def test_a_pod_out_of_service_counts_at_the_target_so_it_never_scales_down() -> None:
    down_at_once = replace(SPEC, max_replicas=8, scale_down_stabilization_seconds=0)
    # 4 replicas; one is rolling (not Ready); the 3 serving carry the target each.
    serving = [sample(p, 2) for p in ("a", "b", "c")]
    assert decide_scale(down_at_once, 4, serving, [], (), now=100).replicas == 4
    # Idle serving pods still scale down, the unready one counted at the target.
    idle = decide_scale(down_at_once, 4, [sample(p, 0) for p in "abc"], [], (), now=100)
    assert idle.replicas == 1 and idle.reason is EventReason.SCALED_DOWN
    low = decide_scale(down_at_once, 4, [sample(p, 1) for p in "abc"], [], (), now=100)
    assert low.replicas == 3  # (3 + 2) / 2, rounded up
    assert "1 not measured counted at the target" in low.message


def test_a_pod_out_of_service_counts_idle_for_scale_up_and_busy_pods_never_scale_down() -> None:
    # Overloaded serving pods ask for more; the unready one adds no load.
    assert recommend(2, [5.0], SPEC) == 3  # ceil(5 / 2)
    # Measured pods are busy but the load seen fits the pods asked for: hold, never down.
    assert recommend(4, [3.0], replace(SPEC, max_replicas=8)) == 4


# --- a saturated service is never scaled down (issue 32, N1) -----------------------------

DOWN_AT_ONCE = replace(SPEC, scale_down_stabilization_seconds=0)


def refusing(pod: str, queue: float, rejected: float) -> PodSample:
    return PodSample(
        pod,
        0.0,
        queue_length=queue,
        requests_running=0,
        requests=RequestCounts(rejected=rejected),
        stats_age_seconds=1.0,
    )


def test_pods_refusing_requests_with_429_are_never_scaled_down() -> None:
    # At the target a tick ago, 10 refusals each counted so far.
    before = decide_scale(DOWN_AT_ONCE, 3, [refusing(p, 2, 10) for p in "abc"], [], (), now=0)
    assert before.replicas == 3
    # The queues read empty at this scrape, but pod a refused 15 more requests since.
    pods = [refusing("a", 0, 25), refusing("b", 0, 10), refusing("c", 0, 10)]
    held = decide_scale(DOWN_AT_ONCE, 3, pods, [], before.history, now=5)
    assert held.replicas == 3 and held.recommended == 3 and held.reason is None
    # Without a refusal since the last tick, the same empty queues scale down.
    quiet = [refusing(p, 0, 25 if p == "a" else 10) for p in "abc"]
    down = decide_scale(DOWN_AT_ONCE, 3, quiet, [], held.history, now=10)
    assert down.replicas == 1 and down.reason is EventReason.SCALED_DOWN


def test_a_restarted_server_that_refused_again_counts_as_refusing() -> None:
    before = decide_scale(DOWN_AT_ONCE, 2, [refusing(p, 2, 40) for p in "ab"], [], (), now=0)
    # Pod a's server restarted (its count fell from 40) and has refused 3 since.
    restarted = [refusing("a", 0, 3), refusing("b", 0, 40)]
    assert decide_scale(DOWN_AT_ONCE, 2, restarted, [], before.history, now=5).replicas == 2
    # Restarted with no refusal yet: nothing holds the idle pods.
    fresh = [refusing("a", 0, 0), refusing("b", 0, 40)]
    assert decide_scale(DOWN_AT_ONCE, 2, fresh, [], before.history, now=5).replicas == 1


def test_pods_whose_queue_and_slots_are_full_are_never_scaled_down() -> None:
    # maxQueue 0 (a spec the parser now refuses with autoscaling): the queue always reads
    # 0 and the load never shows; every slot busy is what saturation looks like.
    capped = replace(DOWN_AT_ONCE, pod_max_queue=0, pod_max_concurrency=4)
    full = [sample(p, 0, running=4) for p in "abc"]
    held = decide_scale(capped, 3, full, [], (), now=0)
    assert held.replicas == 3 and held.recommended == 3
    # One pod with free slots: the service is not saturated, and idle queues scale down,
    # as far as the slots in use allow (8 generations fill two 4-slot pods).
    some_free = [*full[:2], sample("c", 0, running=0)]
    assert decide_scale(capped, 3, some_free, [], (), now=0).replicas == 2


def test_the_parsed_spec_gives_the_autoscaler_the_servers_queue_and_slots() -> None:
    parsed = parse_spec({**base(maxReplicas=3), "server": {"maxQueue": 16, "maxConcurrency": 2}})
    assert parsed.autoscaling is not None
    assert (parsed.autoscaling.pod_max_queue, parsed.autoscaling.pod_max_concurrency) == (16, 2)


# --- review of the autoscaler: restarts, busy pods, stale figures, holds, steps -------------

WINDOWED = parse_spec(
    {
        "model": {"name": "m", "source": "pvc://models/tiny"},
        "autoscaling": {
            "maxReplicas": 4,
            "targetPerReplica": 2,
            "scaleDownStabilizationSeconds": 60,
        },
    }
)


def idle_tick(memory: TickMemory, now: float) -> int:
    """One tick of three Ready, idle pods the autoscaler last set to 3; the count it sets."""
    pods = [view(p) for p in "abc"]
    samples = {p: sample(p, 0) for p in "abc"}
    decision = autoscale(WINDOWED, {"autoscaling": {"replicas": 3}}, pods, samples, memory, now)
    assert decision is not None
    return decision.replicas


def test_a_restarted_operator_waits_a_full_scale_down_window_before_scaling_down() -> None:
    memory = TickMemory()  # a restarted operator: no window remembered
    assert idle_tick(memory, 1000) == 3  # not one idle scrape: the count in place stands
    assert idle_tick(memory, 1059) == 3
    assert idle_tick(memory, 1061) == 1  # idle a full 60 s window, seen by this operator


def test_a_start_over_handover_waits_a_full_scale_down_window_again() -> None:
    memory = TickMemory()
    assert idle_tick(memory, 0) == 3
    assert idle_tick(memory, 100) == 1  # past the window: down
    memory.start_over()  # another replica took the service over, or it started over
    assert idle_tick(memory, 105) == 3
    assert idle_tick(memory, 166) == 1


def test_a_new_service_with_no_windows_still_scales_up_and_down_at_once() -> None:
    # Windows of 0 are "at once": the count in place is no part of them.
    at_once = replace(SPEC, scale_down_stabilization_seconds=0)
    assert decide_scale(at_once, 1, [sample("a", 6)], [], (), now=0).replicas == 3
    assert decide_scale(at_once, 3, [sample(p, 0) for p in "abc"], [], (), now=0).replicas == 1


BUSY = AutoscalingSpec(
    min_replicas=1,
    max_replicas=8,
    target_per_replica=4,
    pod_max_queue=64,
    pod_max_concurrency=8,
    scale_down_stabilization_seconds=0,
)


def generating(pod: str, running: float, queue: float = 0) -> PodSample:
    return sample(pod, queue, running=running)


def test_pods_with_every_slot_generating_are_not_idle_under_queue_length() -> None:
    # Four pods, each generating 8 of 8 with nothing waiting: the queue reads 0.
    full = [generating(p, 8) for p in "abcd"]
    assert decide_scale(BUSY, 4, full, [], (), now=0).replicas == 4
    # Six pods sharing the same 32 generations: down to the 4 they fill, not to 1.
    spread = [generating(p, 32 / 6) for p in "abcdef"]
    down = decide_scale(BUSY, 6, spread, [], (), now=0)
    assert down.replicas == 4 and down.reason is EventReason.SCALED_DOWN
    assert "the 32 requests generating keep 4 pod(s)" in down.message
    # With inFlight the generations are in the load already: the target alone decides.
    in_flight = replace(BUSY, metric=AutoscalingMetric.IN_FLIGHT, target_per_replica=16)
    assert decide_scale(in_flight, 4, full, [], (), now=0).replicas == 2


def test_steady_load_settles_instead_of_flapping() -> None:
    """32 requests always in flight; a new pod serves 120 s after it is asked for."""
    spec = replace(BUSY, scale_down_stabilization_seconds=300)
    demand, startup = 32.0, 120
    count, ready_at, history = 1, {0: -1e9}, ()
    changes: list[tuple[int, int, int]] = []
    for now in range(0, 3000, 5):
        ready = [i for i in range(count) if ready_at.get(i, -1e9) <= now] or [0]
        per_pod = demand / len(ready)
        samples = [
            generating(f"p{i}", min(8.0, per_pod), queue=max(0.0, per_pod - 8)) for i in ready
        ]
        decision = decide_scale(spec, count, samples, [], history, float(now))
        history = decision.history
        if decision.replicas != count:
            for i in range(count, decision.replicas):
                ready_at[i] = now + startup
            changes.append((now, count, decision.replicas))
            count = decision.replicas
    assert count == 4, changes  # the pods 32 generations fill
    assert all(at < 1000 for at, _, _ in changes), changes  # and it stays there
    assert min(to for _, _, to in changes[1:]) >= 4, changes  # never back below the load


def frozen(pod: str, queue: float, age: float = 900.0, valid: bool | None = True) -> PodSample:
    """A scrape that relays a stats file the server stopped writing `age` seconds ago."""
    return PodSample(
        pod, 0.0, queue_length=queue, requests_running=0, stats_age_seconds=age, stats_valid=valid
    )


def test_stale_or_invalid_stats_are_no_load() -> None:
    # Two pods at the target; two relay a frozen queue of 0 (stale, and invalid).
    pods = [sample("a", 2), sample("b", 2), frozen("c", 0), frozen("d", 0, age=1, valid=False)]
    held = decide_scale(replace(SPEC, scale_down_stabilization_seconds=0), 4, pods, [], (), 0)
    assert held.replicas == 4 and held.load == 4  # the frozen pods counted at the target
    # A frozen high queue asks for nothing either.
    stuck = decide_scale(SPEC, 2, [sample("a", 2), frozen("b", 60)], [], (), now=0)
    assert stuck.replicas == 2 and stuck.load == 2
    # A scrape with no stats age (no valid file seen) is not measured.
    unseen = replace(frozen("e", 3), stats_age_seconds=None)
    assert pod_load(unseen, AutoscalingMetric.QUEUE_LENGTH) is None


def test_the_tick_judges_staleness_by_the_services_wedge_threshold() -> None:
    patient = parse_spec(
        {
            "model": {"name": "m", "source": "pvc://models/tiny"},
            "telemetry": {"wedgeAfterSeconds": 600},
            "autoscaling": {"maxReplicas": 4, "targetPerReplica": 2},
        }
    )
    samples = {"a": frozen("a", 6, age=300)}  # 300 s old: within this service's 600 s
    decision = autoscale(patient, {}, [view("a")], samples, TickMemory(), now=0)
    assert decision is not None and decision.load == 6 and decision.replicas == 3
    quick = autoscale(AUTOSCALED, {}, [view("a")], samples, TickMemory(), now=0)
    assert quick is not None and quick.load is None and quick.replicas == 1  # default 15 s


def test_a_service_refusing_requests_tells_why_its_count_is_held() -> None:
    assert AUTOSCALED.autoscaling is not None
    spec = replace(AUTOSCALED.autoscaling, scale_down_stabilization_seconds=0)
    before = decide_scale(spec, 3, [refusing(p, 2, 10) for p in "abc"], [], (), now=0)
    tripped = replace(refusing("a", 0, 90), breaker_state=BreakerState.OPEN)
    guarded = replace(refusing("b", 0, 40), memory_guard_active=True)
    held = decide_scale(spec, 3, [tripped, guarded, refusing("c", 0, 10)], [], before.history, 5)
    assert held.replicas == 3 and held.hold is ScaleHold.PODS_REFUSING
    status: dict[str, Any] = {}
    add_autoscaling_status(status, {}, held, AUTOSCALED, 1, 5)
    limited = {c["type"]: c for c in status["conditions"]}[ConditionType.SCALING_LIMITED]
    assert limited["status"] == "True" and limited["reason"] == "PodsRefusingRequests"
    assert "a (breaker Open, 503), b (memory guard, 503)" in limited["message"]
    assert "held at 3" in limited["message"] and ", c" not in limited["message"]
    # Full queues and slots (a cap of 0 the parser now refuses): held too, and told so.
    capped = replace(
        spec,
        metric=AutoscalingMetric.IN_FLIGHT,
        target_per_replica=4,
        pod_max_queue=0,
        pod_max_concurrency=2,
    )
    full = decide_scale(capped, 3, [sample(p, 0, running=2) for p in "abc"], [], (), 0)
    assert full.hold is ScaleHold.QUEUES_FULL
    status = {}
    add_autoscaling_status(status, {}, full, AUTOSCALED, 1, 0)
    limited = {c["type"]: c for c in status["conditions"]}[ConditionType.SCALING_LIMITED]
    assert limited["reason"] == "QueuesFull" and "full" in limited["message"]


def test_one_spiky_scrape_adds_at_most_the_hpas_step() -> None:
    wide = replace(BUSY, max_replicas=20, scale_down_stabilization_seconds=300)
    spike = decide_scale(wide, 1, [generating("a", 8, queue=64)], [], (), now=0)
    assert spike.replicas == 5 and spike.recommended == 16  # max(2 x 1, 1 + 4)
    assert "load asks for 16" in spike.message and "1 -> 5 replicas" in spike.message
    load = [generating(p, 8, queue=64) for p in "abcde"]
    assert decide_scale(wide, 5, load, [], spike.history, now=5).replicas == 10  # 2 x 5
    assert decide_scale(BUSY, 1, [generating("a", 8, queue=24)], [], (), 0).replicas == 5


T_WRITTEN = dt.datetime(2027, 1, 15, 8, tzinfo=dt.UTC).timestamp()


def test_the_load_is_deleted_from_status_when_nothing_is_measured() -> None:
    assert AUTOSCALED.autoscaling is not None
    measured = decide_scale(AUTOSCALED.autoscaling, 2, [sample("a", 2), sample("b", 2)], [], (), 0)
    previous: dict[str, Any] = {"updatedAt": "2027-01-15T08:00:00Z"}
    add_autoscaling_status(previous, {}, measured, AUTOSCALED, 1, 0)
    assert previous["autoscaling"]["load"] == 4
    blind = decide_scale(AUTOSCALED.autoscaling, 2, [], [], measured.history, 5)
    assert blind.load is None
    status: dict[str, Any] = {
        "updatedAt": "2027-01-15T08:00:05Z",
        "conditions": previous["conditions"],
    }
    add_autoscaling_status(status, previous, blind, AUTOSCALED, 1, 5)
    # A merge patch deletes a key only by a null: omitting it would keep 4 for ever.
    assert "load" in status["autoscaling"] and status["autoscaling"]["load"] is None
    assert should_write(previous, status, T_WRITTEN + 5)  # news, not a figure to batch
    never: dict[str, Any] = {}
    add_autoscaling_status(never, {}, blind, AUTOSCALED, 1, 5)
    assert "load" not in never["autoscaling"]  # nothing to delete


# --- a scale-down the window holds: told once a hold ------------------------------------

IDLE = [sample(p, 0) for p in "abc"]  # three pods, nothing queued: the load asks for 1
AT_TARGET = [sample(p, 2) for p in "abc"]  # 2 per pod, the target: the load asks for 3


def held_ticks(
    loads: list[list[PodSample]], history: tuple[Recommendation, ...] = (), start: float = 100
) -> list[tuple[ScaleDecision, list[str]]]:
    """Ticks 5 s apart at 3 replicas; each decision and the ScaleDownHeld messages posted."""
    told = None
    out = []
    for step, load in enumerate(loads):
        decision = decide_scale(SPEC, 3, load, [], history, now=start + 5 * step)
        history = decision.history
        events, told = scale_down_held_events(told, decision)
        assert all(e.reason is EventReason.SCALE_DOWN_HELD and e.type == "Normal" for e in events)
        out.append((decision, [e.message for e in events]))
    return out


def test_a_scale_down_held_by_its_window_is_told_once_with_the_counts_and_when() -> None:
    # 3 asked for at t=50: the 60 s window keeps 3 until after t=110.
    ticks = held_ticks([IDLE, IDLE, IDLE], (Recommendation(50, 3),))
    [(first, [message]), (_, again), (_, third)] = ticks
    assert first.replicas == 3 and first.reason is None  # held, no count changed
    assert message == (
        "3 replicas held, load asks for 1: the scale-down window (60 s) keeps the highest "
        f"count asked for in it; the count can go down after {iso(110)} if the load stays low"
    )
    assert again == [] and third == []
    down = decide_scale(SPEC, 3, IDLE, [], ticks[-1][0].history, now=115)
    assert down.replicas == 1 and down.reason is EventReason.SCALED_DOWN
    assert scale_down_held_events(None, down) == ([], None)  # the hold is over


def test_a_load_hovering_at_the_count_does_not_repeat_the_hold() -> None:
    ticks = held_ticks([IDLE, AT_TARGET, IDLE, AT_TARGET, IDLE])
    assert [len(messages) for _, messages in ticks] == [1, 0, 0, 0, 0]
    # Each return of the load to the count restarts the window: the hold goes on.
    assert [d.window_hold.allowed_after for d, _ in ticks if d.window_hold] == [
        160,
        165,
        165,
        175,
        175,
    ]


def test_a_new_count_wanted_or_a_new_hold_is_told_again() -> None:
    two = [sample("a", 3), sample("b", 0), sample("c", 0)]  # 3 queued: the load asks for 2
    ticks = held_ticks([IDLE, two, IDLE])
    assert [messages for _, messages in ticks][1] == [
        f"3 replicas held, load asks for 2: the scale-down window (60 s) keeps the highest "
        f"count asked for in it; the count can go down after {iso(160)} if the load stays low"
    ]
    assert ticks[2][1] == []  # 2 is still the most asked for since 3 was
    # Once the window keeps no lower count the hold is over; the next is a new one.
    after = held_ticks([IDLE] + [AT_TARGET] * 13 + [IDLE])
    assert [len(m) for _, m in after] == [1] + [0] * 13 + [1]
    assert after[13][0].window_hold is None
