"""status: conditions flip times, write throttling, events with numbers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from fusebox_contract.names import BreakerState, ConditionType, EventReason, Variant
from fusebox_operator.observations import PodSample, RequestCounts
from fusebox_operator.policy import decide
from fusebox_operator.policy_state import Action, ActionKind, PolicyState
from fusebox_operator.serving import PodServing, ServiceView, ServingReason
from fusebox_operator.spec import InferenceServiceSpec, parse_spec
from fusebox_operator.status import (
    build_status,
    iso,
    rebase_conditions,
    set_condition,
    should_write,
    stuck_pod_events,
    transition_events,
)

T0 = 1_800_000_000.0
MODEL = {"name": "chat", "source": "pvc://models/tiny", "revision": "v2", "dtype": "bfloat16"}
SPEC = parse_spec({"model": MODEL, "replicas": 2, "fallback": {"quantization": "int8"}})
ONE_POD = parse_spec({"model": MODEL, "replicas": 1, "fallback": {"quantization": "int8"}})
NO_FALLBACK = parse_spec({"model": MODEL, "replicas": 2})


def seen(serving: int, figures: Sequence[PodSample] = ()) -> ServiceView:
    """`serving` pods that serve, observed with these figures."""
    verdicts = tuple(PodServing(f"p-{i}", ServingReason.SERVING) for i in range(serving))
    return ServiceView(verdicts, figures=tuple(figures))


def test_last_transition_time_moves_only_when_status_flips() -> None:
    first = set_condition([], ConditionType.READY, True, "PodsReady", "2/2", 1, T0)
    same = set_condition(first, ConditionType.READY, True, "PodsReady", "2/2 again", 2, T0 + 60)
    assert same[0]["lastTransitionTime"] == iso(T0)
    assert same[0]["message"] == "2/2 again" and same[0]["observedGeneration"] == 2
    flipped = set_condition(same, ConditionType.READY, False, "PodsNotReady", "1/2", 2, T0 + 90)
    assert flipped[0]["lastTransitionTime"] == iso(T0 + 90)


def status_for(
    state: PolicyState,
    rss: float,
    now: float,
    previous: dict | None = None,
    spec: InferenceServiceSpec = SPEC,
    variant: Variant | None = None,
) -> dict:
    samples = [PodSample("p", now, rss_bytes=rss, gpu_memory_used_bytes=None, variant=variant)]
    return build_status(previous or {}, state, samples, [], seen(2, samples), spec, 1, now)


def test_status_not_rewritten_for_new_figures_within_30_seconds() -> None:
    state = PolicyState("svc")
    written = status_for(state, 1e9, T0)
    assert should_write({}, written, T0)
    assert not should_write(written, status_for(state, 1.1e9, T0 + 5, written), T0 + 5)
    assert should_write(written, status_for(state, 1.2e9, T0 + 31, written), T0 + 31)


def test_unmoved_figures_are_refreshed_every_60_seconds_not_every_30() -> None:
    state = PolicyState("svc")
    written = status_for(state, 1e9, T0)
    # A few KiB more RSS prints the same (953.7Mi): only the scrape's stamps moved.
    same = status_for(state, 1e9 + 4096, T0 + 31, written)
    assert same["pods"][0]["sampledAt"] != written["pods"][0]["sampledAt"]
    assert not should_write(written, same, T0 + 31)
    assert not should_write(written, status_for(state, 1e9, T0 + 59, written), T0 + 59)
    # Once a minute anyway: SEEN stays under a minute for a service the operator scrapes.
    assert should_write(written, status_for(state, 1e9, T0 + 60, written), T0 + 60)


def test_a_serving_pod_s_request_counters_alone_wait_for_the_minute_refresh() -> None:
    served = PolicyState("svc", last_counts={"p": RequestCounts(succeeded=100)})
    written = status_for(served, 1e9, T0)
    more = PolicyState("svc", last_counts={"p": RequestCounts(succeeded=200)})
    assert not should_write(written, status_for(more, 1e9, T0 + 31, written), T0 + 31)
    assert should_write(written, status_for(more, 1e9, T0 + 60, written), T0 + 60)


def test_the_policy_as_stored_without_its_nulls_is_not_a_moved_figure() -> None:
    state = PolicyState("svc")  # breakerSince, slowSince... are null: never set
    built = status_for(state, 1e9, T0)
    assert None in built["policy"].values()
    # The merge patch's nulls delete those keys: the stored policy has none of them.
    stored = {**built, "policy": {k: v for k, v in built["policy"].items() if v is not None}}
    assert not should_write(stored, status_for(state, 1e9, T0 + 31, stored), T0 + 31)


def test_moved_figures_are_written_after_30_seconds() -> None:
    written = status_for(PolicyState("svc", time_to_oom={"p": 300.0}), 1e9, T0)
    oom_sooner = status_for(PolicyState("svc", time_to_oom={"p": 200.0}), 1e9, T0 + 31, written)
    assert should_write(written, oom_sooner, T0 + 31)  # OOM-IN 5m -> 3m
    assert should_write(written, status_for(PolicyState("svc"), 1.2e9, T0 + 31, written), T0 + 31)
    ladder = PolicyState("svc", slow_calls=3)  # the persisted policy moved
    assert should_write(written, status_for(ladder, 1e9, T0 + 31, written), T0 + 31)


def test_status_written_at_once_when_the_breaker_changes() -> None:
    written = status_for(PolicyState("svc"), 1e9, T0)
    opened = PolicyState("svc", breaker=BreakerState.OPEN, breaker_since=T0 + 5)
    new = status_for(opened, 1e9, T0 + 5, written)
    assert should_write(written, new, T0 + 5)
    ready = next(c for c in new["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "BreakerOpen"


def test_summary_holds_printer_column_figures() -> None:
    status = status_for(PolicyState("svc", level=2), 3 * 1024**3, T0, variant=Variant.FALLBACK)
    assert status["summary"] == {
        "ready": "2/2",
        "breaker": "Closed",
        "gpuMemory": "-",
        "rss": "3.0Gi",
        "timeToOOM": "-",
        "observedAt": iso(T0),
    }
    assert status["degradation"]["tier"] == "fallback-model"
    assert status["activeVariant"] == "fallback"


def test_time_to_oom_is_shown_per_pod_and_the_soonest_in_the_summary() -> None:
    state = PolicyState("svc", time_to_oom={"a": 41.6, "b": 600.0})
    samples = [PodSample("a", T0, rss_bytes=1e9), PodSample("b", T0, rss_bytes=1e9)]
    status = build_status({}, state, samples, [], seen(2, samples), SPEC, 1, T0)
    assert [p.get("timeToOOMSeconds") for p in status["pods"]] == [41.6, 600.0]
    assert status["summary"]["timeToOOM"] == "42s"
    calm = build_status({}, PolicyState("svc"), samples, [], seen(2, samples), SPEC, 1, T0)
    assert all("timeToOOMSeconds" not in p for p in calm["pods"])
    assert calm["summary"]["timeToOOM"] == "-"


def test_a_changing_time_to_oom_alone_does_not_rewrite_the_status() -> None:
    written = status_for(PolicyState("svc", time_to_oom={"p": 300.0}), 1e9, T0)
    later = status_for(PolicyState("svc", time_to_oom={"p": 250.0}), 1e9, T0 + 5, written)
    assert not should_write(written, later, T0 + 5)


def test_active_variant_is_what_the_pods_report_not_what_was_asked() -> None:
    # Level 2 asked, the swap still rolling: the pod still serves the primary.
    status = status_for(PolicyState("svc", level=2), 1e9, T0, variant=Variant.PRIMARY)
    assert status["activeVariant"] == "primary"
    pods = [
        PodSample("a", T0, variant=Variant.PRIMARY),
        PodSample("b", T0, variant=Variant.FALLBACK),
    ]
    mixed = build_status({}, PolicyState("svc", level=2), pods, [], seen(2, pods), SPEC, 1, T0)
    assert mixed["activeVariant"] == "fallback"  # any pod serving it
    assert [p["variant"] for p in mixed["pods"]] == ["primary", "fallback"]


def test_canned_answers_tier_without_a_fallback_stays_primary() -> None:
    state = PolicyState("svc", level=3)
    status = status_for(state, 1e9, T0, spec=NO_FALLBACK, variant=Variant.PRIMARY)
    assert status["degradation"]["tier"] == "canned-answers"
    assert status["activeVariant"] == "primary"
    events = transition_events(PolicyState("svc", level=1), state, [], has_fallback=False)
    assert [e.reason for e in events] == [EventReason.DEGRADED]


def test_status_shows_the_model_and_the_effective_tiers() -> None:
    status = status_for(PolicyState("svc"), 1e9, T0, spec=NO_FALLBACK)
    assert status["model"] == {"name": "chat"}  # no pod reported a revision or a dtype
    assert status["degradation"]["tiers"] == list(NO_FALLBACK.degradation.tiers)
    assert "fallback-model" not in status["degradation"]["tiers"]


def model_status(samples: Sequence[PodSample], previous: dict | None = None) -> dict:
    built = build_status(
        previous or {}, PolicyState("svc"), samples, [], seen(2, samples), SPEC, 1, T0
    )
    model: dict = built["model"]
    return model


def test_status_model_is_the_revision_and_dtype_the_pods_report_not_the_spec() -> None:
    # The spec asks for v2 in bfloat16; the pods' servers report what they serve.
    served = [
        PodSample("a", T0, model_revision="v3", model_dtype="float16"),
        PodSample("b", T0, model_revision="v3", model_dtype="float16"),
    ]
    assert model_status(served) == {"name": "chat", "revision": "v3", "dtype": "float16"}
    # A pod that reports nothing (still loading) does not vouch against the others.
    quiet = [served[0], PodSample("b", T0)]
    assert model_status(quiet) == {"name": "chat", "revision": "v3", "dtype": "float16"}


def test_status_model_leaves_out_what_the_pods_disagree_on_and_deletes_it_when_stored() -> None:
    rolling = [
        PodSample("a", T0, model_revision="v3", model_dtype="float16"),
        PodSample("b", T0, model_revision="v4", model_dtype="float16"),
    ]
    assert model_status(rolling) == {"name": "chat", "dtype": "float16"}
    stored = {"model": {"name": "chat", "revision": "v3", "dtype": "float16"}}
    # A merge patch keeps a key it does not name: the stale revision is deleted by a null.
    assert model_status(rolling, stored) == {"name": "chat", "revision": None, "dtype": "float16"}
    assert model_status([], stored) == {"name": "chat", "revision": None, "dtype": None}


def test_events_name_transitions_and_actions_with_numbers() -> None:
    before = PolicyState("svc")
    after = PolicyState(
        "svc", breaker=BreakerState.OPEN, breaker_reason="p99 ttft 450 ms > 200 ms", level=2
    )
    action = Action("svc-000001-reload", ActionKind.RELOAD, "pod-a", "RSS 3500 MiB = 85%", T0)
    events = transition_events(before, after, [(action, "freed 1.2 GiB")])
    reasons = [e.reason for e in events]
    assert reasons == [
        "BreakerOpened",
        "Degraded",
        "SwappedToFallback",
        "ModelUnloaded",
        "ModelReloaded",
    ]
    assert "450 ms" in events[0].message
    assert "freed 1.2 GiB" in events[-1].message and "svc-000001-reload" in events[-1].message


def test_a_pod_that_cannot_swap_is_named_by_one_event_and_in_degraded() -> None:
    reason = "the fallback is unavailable: int4 needs a CUDA device"
    before = PolicyState("svc", level=2)
    after = PolicyState("svc", level=2, fallback_unavailable={"pod-a": reason})
    events = transition_events(before, after, [])
    assert [(e.type, e.reason) for e in events] == [("Warning", "FallbackUnavailable")]
    assert events[0].message.startswith("pod-a cannot swap") and reason in events[0].message
    assert transition_events(after, after, []) == []  # once per pod, not per tick
    status = build_status({}, after, [], [], seen(2), SPEC, 1, T0)
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert "cannot swap on pod-a" in degraded["message"]
    calm = build_status({}, replace(after, level=1), [], [], seen(2), SPEC, 1, T0)
    degraded = next(c for c in calm["conditions"] if c["type"] == "Degraded")
    assert "cannot swap" not in degraded["message"]


def test_a_pod_the_memory_ladder_swapped_to_the_fallback_is_degraded_not_full_service() -> None:
    """VARIANT says fallback: Degraded must not say every feature is on."""
    swapped = PolicyState("svc", variants={"pod-a": Variant.FALLBACK}, swapped_at={"pod-a": T0})
    status = build_status({}, swapped, [], [], seen(2), SPEC, 1, T0)
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "SwappedToFallback")
    assert degraded["message"].startswith("pod-a serves the fallback model")
    # Under a tier as well: both are told, the tier's reason first.
    tiered = build_status({}, replace(swapped, level=1), [], [], seen(2), SPEC, 1, T0)
    degraded = next(c for c in tiered["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "Degraded" and "pod-a serves the fallback" in degraded["message"]
    # At the fallback tier every pod serves it: no pod is named as a ladder swap.
    at_tier = build_status({}, replace(swapped, level=2), [], [], seen(2), SPEC, 1, T0)
    degraded = next(c for c in at_tier["conditions"] if c["type"] == "Degraded")
    assert "memory ladder" not in degraded["message"]


def test_last_action_and_bounded_history() -> None:
    state = PolicyState("svc")
    previous: dict = {}
    for i in range(15):
        action = Action(f"svc-{i:06d}-gc", ActionKind.GC, "p", "RSS high", T0 + i)
        previous = build_status(previous, state, [], [(action, "ok")], seen(1), ONE_POD, 1, T0 + i)
    assert len(previous["recentActions"]) == 10
    assert previous["lastAction"]["id"] == "svc-000014-gc"


def test_keys_owned_by_reconcile_do_not_force_a_write() -> None:
    written = status_for(PolicyState("svc"), 1e9, T0)
    stored = {**written, "observedGeneration": 3, "memory": {"limitBytes": 1}}
    assert not should_write(stored, status_for(PolicyState("svc"), 1e9, T0 + 5, stored), T0 + 5)


GPU_SHORT = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."


def ready_condition(status: dict) -> dict:
    return next(c for c in status["conditions"] if c["type"] == ConditionType.READY)


def test_a_pod_the_scheduler_cannot_place_is_named_in_ready_with_its_message() -> None:
    status = build_status(
        {}, PolicyState("svc"), [], [], seen(0), ONE_POD, 1, T0, unschedulable={"p-1": GPU_SHORT}
    )
    ready = ready_condition(status)
    assert ready["status"] == "False"
    assert ready["reason"] == EventReason.PODS_UNSCHEDULABLE
    assert ready["message"] == f"0/1 pods serving; p-1 unschedulable: {GPU_SHORT}"


def test_pods_still_starting_are_only_not_ready() -> None:
    status = build_status({}, PolicyState("svc"), [], [], seen(0), ONE_POD, 1, T0, unschedulable={})
    assert ready_condition(status)["reason"] == "PodsNotReady"


def test_an_extra_unschedulable_pod_does_not_unready_a_service_with_its_pods_ready() -> None:
    status = build_status(
        {}, PolicyState("svc"), [], [], seen(1), ONE_POD, 1, T0, unschedulable={"p-2": GPU_SHORT}
    )
    assert ready_condition(status)["reason"] == "PodsReady"


def test_unschedulable_event_posted_once_per_spell_and_again_after_recovery() -> None:
    def tick(previous: dict, ready_pods: int, unschedulable: dict[str, str]) -> dict:
        return build_status(
            previous,
            PolicyState("svc"),
            [],
            [],
            seen(ready_pods),
            ONE_POD,
            1,
            T0,
            None,
            unschedulable,
        )

    starting = tick({}, 0, {})
    pending = tick(starting, 0, {"p-1": GPU_SHORT})
    (event,) = stuck_pod_events(starting, pending)
    assert event.type == "Warning" and event.reason == EventReason.PODS_UNSCHEDULABLE
    assert "p-1 unschedulable" in event.message and GPU_SHORT in event.message
    # Still Pending on the next tick, or after an operator restart (status says so): quiet.
    assert stuck_pod_events(pending, tick(pending, 0, {"p-1": GPU_SHORT})) == []
    placed = tick(pending, 1, {})
    assert stuck_pod_events(pending, placed) == []
    assert len(stuck_pod_events(placed, tick(placed, 0, {"p-2": GPU_SHORT}))) == 1


CRASHING = "server CrashLoopBackOff (last exit 1: Error): back-off 40s restarting failed container"


def test_a_crash_looping_pod_is_named_in_ready_and_posted_once() -> None:
    def tick(previous: dict, failing: dict[str, str]) -> dict:
        return build_status(
            previous, PolicyState("svc"), [], [], seen(0), ONE_POD, 1, T0, None, {}, failing
        )

    starting = tick({}, {})
    crashing = tick(starting, {"p-1": CRASHING})
    ready = ready_condition(crashing)
    assert ready["status"] == "False" and ready["reason"] == EventReason.PODS_FAILING
    assert ready["message"] == f"0/1 pods serving; p-1 failing: {CRASHING}"
    (event,) = stuck_pod_events(starting, crashing)
    assert event.type == "Warning" and event.reason == EventReason.PODS_FAILING
    assert stuck_pod_events(crashing, tick(crashing, {"p-1": CRASHING})) == []


def test_unschedulable_pods_are_named_before_failing_ones_and_the_list_is_bounded() -> None:
    unschedulable = {f"p-{i}": GPU_SHORT for i in range(5)}
    status = build_status(
        {}, PolicyState("svc"), [], [], seen(0), SPEC, 1, T0, None, unschedulable, {"q": CRASHING}
    )
    ready = ready_condition(status)
    assert ready["reason"] == EventReason.PODS_UNSCHEDULABLE
    assert ready["message"].count("unschedulable:") == 3 and ready["message"].endswith("and 2 more")


def quality_run(spec: InferenceServiceSpec, ticks: int = 6) -> tuple[list[int], list, dict]:
    """Sustained quality failures: the levels, the events and the last status."""
    state, levels, events = PolicyState("svc"), [], []
    for i in range(ticks):
        now = T0 + 5 * i
        sample = PodSample("p", now, quality_failure_ratio=0.5, model_loaded=True)
        new, _ = decide(state, [sample], now, spec)
        events += transition_events(state, new, [], spec.degrades_to_fallback)
        state = new
        levels.append(state.level)
    return levels, events, build_status({}, state, [sample], [], seen(2, [sample]), spec, 1, now)


def degraded_condition(status: dict) -> dict:
    return next(c for c in status["conditions"] if c["type"] == ConditionType.DEGRADED)


def test_quality_failures_degrade_to_the_fallback_tier_else_the_highest_listed() -> None:
    levels, events, status = quality_run(SPEC)
    assert levels == [1, 2, 2, 2, 2, 2]
    assert degraded_condition(status)["reason"] == "Degraded"
    # Without a fallback the default tiers are [no-streaming, canned-answers].
    levels, events, status = quality_run(NO_FALLBACK)
    assert levels == [1, 3, 3, 3, 3, 3]
    assert degraded_condition(status)["reason"] == "Degraded"
    assert not [e for e in events if "no quality remedy" in e.message]


def test_quality_failing_with_no_tier_that_helps_is_degraded_with_no_remedy() -> None:
    streaming_only = parse_spec({"model": MODEL, "degradation": {"tiers": ["no-streaming"]}})
    levels, events, status = quality_run(streaming_only)
    assert levels == [0] * 6  # no-streaming changes nothing the model writes: not stepped up
    degraded = degraded_condition(status)
    assert (degraded["status"], degraded["reason"]) == ("True", "NoQualityRemedy")
    assert "no quality remedy configured" in degraded["message"]
    told = [e for e in events if "no quality remedy" in e.message]
    assert [(e.type, e.reason) for e in told] == [("Warning", EventReason.DEGRADED)]


def condition(kind: ConditionType, status: str, generation: int = 1) -> dict[str, object]:
    return {"type": kind, "status": status, "reason": "R", "observedGeneration": generation}


def test_rebase_keeps_what_the_other_writer_wrote_and_what_this_one_changed() -> None:
    base = [condition(ConditionType.READY, "False"), condition(ConditionType.INVALID_SPEC, "False")]
    ours = [condition(ConditionType.READY, "True"), condition(ConditionType.INVALID_SPEC, "False")]
    theirs = [
        condition(ConditionType.READY, "False"),
        condition(ConditionType.INVALID_SPEC, "True", generation=2),
    ]
    assert rebase_conditions(base, ours, theirs) == [
        condition(ConditionType.READY, "True"),
        condition(ConditionType.INVALID_SPEC, "True", generation=2),
    ]


def test_rebase_adds_what_either_writer_added_and_drops_what_this_one_dropped() -> None:
    gpu = condition(ConditionType.GPU_HEALTHY, "True")
    base = [condition(ConditionType.READY, "True"), gpu]
    ours = [condition(ConditionType.READY, "True"), condition(ConditionType.DEGRADED, "True")]
    theirs = [*base, condition(ConditionType.SCALING_LIMITED, "True")]
    assert rebase_conditions(base, ours, theirs) == [
        condition(ConditionType.READY, "True"),
        condition(ConditionType.SCALING_LIMITED, "True"),
        condition(ConditionType.DEGRADED, "True"),
    ]


def test_rebase_keeps_a_dropped_condition_the_other_writer_changed_and_no_stale_one() -> None:
    base = [condition(ConditionType.GPU_HEALTHY, "True"), condition(ConditionType.READY, "True")]
    ours = [condition(ConditionType.READY, "True")]
    theirs = [condition(ConditionType.GPU_HEALTHY, "False", generation=2)]
    # GPUHealthy changed meanwhile: theirs stays. Ready, unchanged here and gone there: gone.
    assert rebase_conditions(base, ours, theirs) == [
        condition(ConditionType.GPU_HEALTHY, "False", generation=2)
    ]
