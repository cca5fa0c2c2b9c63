"""autoscaling: the replica count from the pods' load, the windows, and the GPU hold."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fusebox_contract.names import ConditionType, EventReason
from fusebox_operator.autoscaling import (
    Recommendation,
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
    scaling_events,
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
    return PodSample(pod, 0.0, ok=ok, queue_length=queue, requests_running=running)


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
        pod, 0.0, queue_length=queue, requests_running=0, requests=RequestCounts(rejected=rejected)
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
    full = [PodSample(p, 0.0, queue_length=0, requests_running=4) for p in "abc"]
    held = decide_scale(capped, 3, full, [], (), now=0)
    assert held.replicas == 3 and held.recommended == 3
    # One pod with a free slot: the service is not saturated, and idle queues scale down.
    some_free = [*full[:2], PodSample("c", 0.0, queue_length=0, requests_running=1)]
    assert decide_scale(capped, 3, some_free, [], (), now=0).replicas == 1


def test_the_parsed_spec_gives_the_autoscaler_the_servers_queue_and_slots() -> None:
    parsed = parse_spec({**base(maxReplicas=3), "server": {"maxQueue": 16, "maxConcurrency": 2}})
    assert parsed.autoscaling is not None
    assert (parsed.autoscaling.pod_max_queue, parsed.autoscaling.pod_max_concurrency) == (16, 2)
