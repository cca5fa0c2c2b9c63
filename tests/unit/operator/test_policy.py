"""policy.decide with an injected clock: the ladder, the breakers, staleness, restarts."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fusebox_contract.names import BreakerState, Variant
from fusebox_operator.memory_trend import (
    NOISE_BYTES,
    least_squares_slope,
    time_to_limit_seconds,
)
from fusebox_operator.observations import PodSample, RequestCounts
from fusebox_operator.policy import (
    CHEAP_STEPS,
    admit_percent,
    decide,
    no_time_to_wait,
    skipped_for_time,
)
from fusebox_operator.policy_state import MAX_ATTEMPTS, Action, ActionKind, Ladder, PolicyState
from fusebox_operator.rollout import PodReadiness, Rollout
from fusebox_operator.spec import InferenceServiceSpec, parse_spec

MIB = 1024**2
LIMIT = 4096 * MIB
INTERVAL = 5.0
COOLDOWN = 20.0
T0 = 1_800_000_000.0


def make_spec(**breaker: Any) -> InferenceServiceSpec:
    raw_breaker: dict[str, Any] = {
        "latency": {"p99ThresholdMillis": 200, "forSeconds": 30, "minRequests": 10},
        "openSeconds": 20,
        "halfOpen": {"admitPercent": 10, "minRequests": 20, "p99RecoveryMillis": 100},
        "resource": {"cooldownSeconds": COOLDOWN, "windowSeconds": 60},
    }
    raw_breaker.update(breaker)
    return parse_spec(
        {
            "model": {"name": "chat", "source": "pvc://models/tiny"},
            "fallback": {"quantization": "int8"},
            "breaker": raw_breaker,
            "degradation": {"coolOffSeconds": 60},
            "telemetry": {"scrapeIntervalSeconds": INTERVAL, "wedgeAfterSeconds": 15},
        }
    )


SPEC = make_spec()


def sample(pod: str, at: float, rss_mib: float | None = None, **fields: Any) -> PodSample:
    values: dict[str, Any] = {
        "rss_bytes": None if rss_mib is None else rss_mib * MIB,
        "memory_limit_bytes": LIMIT,
        "stats_age_seconds": 1.0,
        "heartbeat_age_seconds": 0.5,
    }
    values.update(fields)
    return PodSample(pod=pod, sampled_at=at, **values)


def run(
    state: PolicyState,
    steps: list[tuple[float, list[PodSample]]],
    spec: InferenceServiceSpec = SPEC,
) -> tuple[PolicyState, list[Any]]:
    actions: list[Any] = []
    for now, samples in steps:
        state, new = decide(state, samples, now, spec)
        actions.extend(new)
    return state, actions


def leak_steps(seconds: float, start_mib: float, mib_per_minute: float) -> list[Any]:
    steps = []
    t = 0.0
    while t <= seconds:
        steps.append((T0 + t, [sample("p", T0 + t, start_mib + mib_per_minute * t / 60)]))
        t += INTERVAL
    return steps


# --- resource ladder -----------------------------------------------------------------


def test_least_squares_slope_of_a_line() -> None:
    assert least_squares_slope([(0, 1.0), (1, 3.0), (2, 5.0)]) == 2.0
    assert least_squares_slope([(0, 1.0)]) is None


def test_ladder_climbs_in_order_with_cooldowns_while_the_signal_stays_high() -> None:
    # 80% of the limit and growing 600 MiB/min: above ratio 0.75 and growth 200.
    _, actions = run(PolicyState("svc"), leak_steps(120, 0.80 * 4096, 600))
    kinds = [a.kind for a in actions]
    assert kinds == [
        ActionKind.GC,
        ActionKind.EMPTY_CACHE,
        ActionKind.RELOAD,
        ActionKind.SWAP_FALLBACK,
        ActionKind.RESTART,
    ]
    gaps = [b.at - a.at for a, b in zip(actions, actions[1:], strict=False)]
    assert all(gap >= COOLDOWN for gap in gaps)
    assert actions[0].reason.startswith("RSS") and "MiB/min" in actions[0].reason
    assert actions[3].variant == "fallback"


def test_ladder_stops_when_the_signal_comes_back_under() -> None:
    steps = leak_steps(15, 0.80 * 4096, 600)  # triggers gc at the third sample
    t = T0 + 20
    steps += [(t + i * INTERVAL, [sample("p", t + i * INTERVAL, 0.5 * 4096)]) for i in range(20)]
    state, actions = run(PolicyState("svc"), steps)
    assert [a.kind for a in actions] == [ActionKind.GC]
    assert state.ladders == {}  # episode over after a calm cooldown


def test_a_rung_that_brings_memory_back_under_is_repeated_when_the_leak_returns() -> None:
    # gc at t=10 brings RSS under 75%; the leak is back before a calm cooldown ends.
    spec = make_spec(resource={"cooldownSeconds": COOLDOWN, "windowSeconds": 10})
    steps = leak_steps(10, 0.80 * 4096, 600)
    for i, ratio in enumerate([0.74, 0.74, 0.76, 0.765, 0.77, 0.775]):
        t = T0 + 15 + 5 * i
        steps.append((t, [sample("p", t, ratio * 4096)]))
    state, actions = run(PolicyState("svc"), steps, spec)
    assert [(a.kind, a.at - T0) for a in actions] == [(ActionKind.GC, 10), (ActionKind.GC, 30)]
    assert state.ladders["p/rss"].step == 1  # judged again from here: empty_cache only if gc fails


def test_a_rung_that_leaves_memory_above_the_trigger_climbs_after_the_cooldown() -> None:
    _, actions = run(PolicyState("svc"), leak_steps(30, 0.80 * 4096, 300))
    assert [(a.kind, a.at - T0) for a in actions] == [
        (ActionKind.GC, 10),
        (ActionKind.EMPTY_CACHE, 10 + COOLDOWN),
    ]


def test_time_to_limit_is_the_fitted_growth_from_the_latest_value() -> None:
    growing = [(0.0, 100.0), (5.0, 150.0), (10.0, 200.0)]  # 10 per second
    assert time_to_limit_seconds(growing, 1000.0) == 80.0
    assert time_to_limit_seconds(growing, 150.0) == 0.0  # already past it
    assert time_to_limit_seconds([(0.0, 100.0), (5.0, 150.0)], 1000.0) is None  # too few
    assert time_to_limit_seconds([(0.0, 200.0), (5.0, 200.0), (10.0, 200.0)], 1000.0) is None
    assert time_to_limit_seconds([(0.0, 300.0), (5.0, 250.0), (10.0, 200.0)], 1000.0) is None


def test_jitter_below_the_noise_floor_is_no_time_to_oom() -> None:
    # A flat pod's RSS moves by a few MiB with its batches (measured on the demo: +4 KiB
    # showed OOM-IN 1009h, +2 MiB in 20 s showed 9h).
    jitter = [(0.0, 800 * MIB), (2.0, 802 * MIB), (4.0, 801 * MIB), (6.0, 803 * MIB)]
    assert time_to_limit_seconds(jitter, LIMIT) is not None  # without a floor: an estimate
    assert time_to_limit_seconds(jitter, LIMIT, NOISE_BYTES) is None
    # A leak of 1 GiB/min rises 68 MiB over three 2 s scrapes: timed at once.
    leak = [(t, 800 * MIB + t * 1024 * MIB / 60) for t in (0.0, 2.0, 4.0)]
    assert time_to_limit_seconds(leak, LIMIT, NOISE_BYTES) == pytest.approx(
        (LIMIT - leak[-1][1]) / (1024 * MIB / 60)
    )
    # So is a slow one (20 MiB/min) once the window spans more than its noise.
    slow = [(t, 800 * MIB + t * 20 * MIB / 60) for t in range(0, 181, 30)]
    assert time_to_limit_seconds(slow, LIMIT, NOISE_BYTES) is not None
    assert time_to_limit_seconds(slow[:3], LIMIT, NOISE_BYTES) is None  # 20 MiB in 60 s


def test_a_pod_loading_its_model_has_no_trend_and_no_time_to_oom() -> None:
    # RSS climbs 0.2 -> 0.8 GiB while the weights load: not a leak.
    loading = [(T0 + t, [sample("p", T0 + t, 200 + 60 * t, model_loaded=False)])
               for t in range(0, 11, 2)]  # fmt: skip
    state, actions = run(PolicyState("svc"), loading)
    assert actions == [] and "p" not in state.time_to_oom and "p" not in state.history
    # Loaded and flat from there: still nothing; the load's climb is not in the window.
    loaded = [(T0 + t, [sample("p", T0 + t, 800, model_loaded=True)]) for t in range(12, 21, 2)]
    state, _ = run(state, loaded)
    assert "p" not in state.time_to_oom and len(state.history["p"]) == 5
    # The same climb reported by a loaded model is growth, and is timed.
    leaking = [(T0 + t, [sample("p", T0 + t, 200 + 60 * t, model_loaded=True)])
               for t in range(0, 11, 2)]  # fmt: skip
    state, _ = run(PolicyState("svc"), leaking)
    assert state.time_to_oom["p"] > 0


def test_a_leak_that_just_sped_up_is_timed_by_its_recent_growth() -> None:
    flat_then_fast = [(float(t), 100.0) for t in range(0, 50, 5)] + [
        (50.0, 150.0),
        (55.0, 250.0),
    ]  # the last three samples grow 15 per second, the whole window ~3
    assert time_to_limit_seconds(flat_then_fast, 1000.0) == 50.0


def test_a_cheap_step_is_skipped_only_when_a_reload_after_it_would_come_too_late() -> None:
    # Skipped below 1 s (gc) + 20 s (cooldown, to judge it) + 30 s (a reload).
    assert skipped_for_time(ActionKind.GC, 50.0, SPEC)
    assert not skipped_for_time(ActionKind.GC, 52.0, SPEC)
    assert not skipped_for_time(ActionKind.GC, None, SPEC)  # not growing: all the time there is
    assert not skipped_for_time(ActionKind.RELOAD, 1.0, SPEC)  # nothing faster frees the model


def test_a_fast_leak_goes_straight_to_reload_and_says_why() -> None:
    # 80% and +1200 MiB/min: the limit is ~40 s away, too soon to try gc and empty_cache.
    state, actions = run(PolicyState("svc"), leak_steps(10, 0.80 * 4096, 1200))
    assert [a.kind for a in actions] == [ActionKind.RELOAD]
    assert "time to OOM ~" in actions[0].reason
    assert actions[0].reason.endswith(": skipping gc and empty_cache"), actions[0].reason
    assert 30 < state.time_to_oom["p"] < 40


def test_a_slow_leak_starts_at_gc_and_names_its_time_to_oom() -> None:
    state, actions = run(PolicyState("svc"), leak_steps(10, 0.80 * 4096, 300))
    assert [a.kind for a in actions] == [ActionKind.GC]
    assert "time to OOM ~" in actions[0].reason and "skipping" not in actions[0].reason
    assert state.time_to_oom["p"] > 100


def test_a_leak_that_speeds_up_after_gc_skips_empty_cache() -> None:
    steps = leak_steps(10, 0.80 * 4096, 300)  # gc at t=10
    start = 0.80 * 4096 + 50
    for i in range(1, 7):  # then +1500 MiB/min
        t = T0 + 10 + 5 * i
        steps.append((t, [sample("p", t, start + 125 * i)]))
    _, actions = run(PolicyState("svc"), steps)
    assert [a.kind for a in actions][:2] == [ActionKind.GC, ActionKind.RELOAD]
    assert actions[1].reason.endswith(": skipping empty_cache"), actions[1].reason


def test_a_leak_that_outruns_the_cooldown_gets_its_reload_without_waiting_it_out() -> None:
    steps = leak_steps(10, 0.80 * 4096, 300)  # gc at t=10, the limit minutes away
    start = 0.80 * 4096 + 50
    for i in range(1, 3):  # then +3000 MiB/min: the limit ~15 s away
        t = T0 + 10 + 5 * i
        steps.append((t, [sample("p", t, start + 250 * i)]))
    _, actions = run(PolicyState("svc"), steps)
    assert [(a.kind, a.at - T0) for a in actions] == [
        (ActionKind.GC, 10),
        (ActionKind.RELOAD, 15),  # 5 s into a 20 s cooldown
    ]
    assert no_time_to_wait(40.0, 5.0, SPEC)  # 15 s of cooldown left + a 30 s reload
    assert not no_time_to_wait(50.0, 5.0, SPEC)
    assert not no_time_to_wait(None, 5.0, SPEC)


def test_time_to_oom_is_absent_while_memory_does_not_grow() -> None:
    state, _ = run(PolicyState("svc"), leak_steps(20, 0.50 * 4096, 0))
    assert "p" not in state.time_to_oom


def test_above_ratio_but_flat_does_nothing() -> None:
    _, actions = run(PolicyState("svc"), leak_steps(120, 0.85 * 4096, 0))
    assert actions == []


def test_growing_below_ratio_does_nothing() -> None:
    _, actions = run(PolicyState("svc"), leak_steps(60, 0.30 * 4096, 1000))
    assert actions == []


def test_above_95_percent_acts_regardless_of_slope() -> None:
    _, actions = run(PolicyState("svc"), [(T0, [sample("p", T0, 0.96 * 4096)])])
    assert [a.kind for a in actions] == [ActionKind.GC]


def test_sized_limit_is_used_when_the_pod_reports_none() -> None:
    state = PolicyState("svc", memory_limit_bytes=LIMIT)
    _, actions = run(state, [(T0, [sample("p", T0, 0.96 * 4096, memory_limit_bytes=None)])])
    assert [a.kind for a in actions] == [ActionKind.GC]


def test_stale_samples_never_trigger_memory_actions() -> None:
    old = T0 - 4 * INTERVAL
    steps = [(T0 + i * INTERVAL, [sample("p", old, 0.99 * 4096)]) for i in range(10)]
    state, actions = run(PolicyState("svc"), steps)
    assert actions == []
    assert state.stale_pods == {"p"}


def test_failed_scrapes_never_trigger_memory_actions() -> None:
    steps = [
        (T0 + i * INTERVAL, [replace(sample("p", T0 + i * INTERVAL, 0.99 * 4096), ok=False)])
        for i in range(10)
    ]
    _, actions = run(PolicyState("svc"), steps)
    assert actions == []


def test_swap_is_skipped_without_a_fallback() -> None:
    spec = parse_spec(
        {
            "model": {"name": "chat", "source": "pvc://models/tiny"},
            "breaker": {"resource": {"cooldownSeconds": COOLDOWN}},
            "degradation": {"tiers": ["no-streaming"]},
            "telemetry": {"scrapeIntervalSeconds": INTERVAL},
        }
    )
    _, actions = run(PolicyState("svc"), leak_steps(120, 0.8 * 4096, 600), spec)
    assert ActionKind.SWAP_FALLBACK not in [a.kind for a in actions]
    assert actions[-1].kind is ActionKind.RESTART


def test_swap_is_skipped_on_a_pod_whose_server_cannot_load_the_fallback() -> None:
    reason = "the fallback is unavailable: int4 needs a CUDA device"
    steps = [
        (now, [replace(s, fallback_available=False, fallback_unavailable_reason=reason)])
        for now, [s] in leak_steps(120, 0.8 * 4096, 600)
    ]
    state, actions = run(PolicyState("svc"), steps)
    assert ActionKind.SWAP_FALLBACK not in [a.kind for a in actions]
    assert actions[-1].kind is ActionKind.RESTART
    assert state.fallback_unavailable == {"p": reason}


def test_a_pod_that_cannot_swap_is_remembered_until_it_can_or_is_gone() -> None:
    refused = sample("a", T0, fallback_available=False)
    state, _ = decide(
        PolicyState("svc"), [refused, sample("b", T0, fallback_available=True)], T0, SPEC
    )
    assert state.fallback_unavailable == {"a": "the server reports no usable fallback"}
    unreported = sample("a", T0 + INTERVAL)  # an older sidecar: nothing learnt, nothing forgotten
    state, _ = decide(state, [unreported], T0 + INTERVAL, SPEC)
    assert set(state.fallback_unavailable) == {"a"}
    state, _ = decide(state, [sample("b", T0 + 2 * INTERVAL)], T0 + 2 * INTERVAL, SPEC)
    assert state.fallback_unavailable == {}


def test_swapped_pod_returns_to_primary_after_calm_cool_off() -> None:
    state = PolicyState("svc", variants={"p": Variant.FALLBACK}, swapped_at={"p": T0})
    steps = [(T0 + i * INTERVAL, [sample("p", T0 + i * INTERVAL, 1000)]) for i in range(14)]
    state, actions = run(state, steps)
    assert [a.kind for a in actions] == [ActionKind.RESTORE_PRIMARY]
    assert actions[0].at - T0 >= 60
    assert state.pod_variant("p") == "primary"


def test_wedged_server_is_restarted_once() -> None:
    steps = [(T0, [sample("p", T0, 100)])]
    steps += [
        (T0 + i * INTERVAL, [sample("p", T0 + i * INTERVAL, 100, stats_age_seconds=10 + 5 * i)])
        for i in range(1, 8)
    ]
    _, actions = run(PolicyState("svc"), steps)
    assert [(a.kind, a.pod) for a in actions] == [(ActionKind.RESTART, "p")]
    assert "wedged" in actions[0].reason


def test_a_pod_that_never_served_is_not_called_wedged() -> None:
    steps = [
        (T0 + i * INTERVAL, [sample("p", T0 + i * INTERVAL, 100, stats_age_seconds=999)])
        for i in range(5)
    ]
    _, actions = run(PolicyState("svc"), steps)
    assert actions == []


def test_a_stall_while_the_model_is_still_loading_is_not_a_wedge() -> None:
    loading = {"model_loaded": False}
    steps = [(T0, [sample("p", T0, 100, **loading)])]
    steps += [
        (T0 + i * INTERVAL, [sample("p", T0 + i * INTERVAL, 100, stats_age_seconds=30, **loading)])
        for i in range(1, 5)
    ]
    _, actions = run(PolicyState("svc"), steps)
    assert actions == []


def test_only_one_restart_per_cooldown_across_pods() -> None:
    steps = [(T0, [sample("a", T0, 100), sample("b", T0, 100)])]
    wedged = {"stats_age_seconds": 100}
    steps.append((T0 + 5, [sample("a", T0 + 5, 100, **wedged), sample("b", T0 + 5, 100, **wedged)]))
    steps.append((T0 + 30, [sample("b", T0 + 30, 100, **wedged)]))
    _, actions = run(PolicyState("svc"), steps)
    assert [(a.pod, a.at - T0) for a in actions] == [("a", 5), ("b", 30)]


def test_pods_that_disappear_are_forgotten() -> None:
    state, _ = run(PolicyState("svc"), leak_steps(15, 0.8 * 4096, 600))
    assert state.ladders
    state, _ = decide(state, [sample("q", T0 + 20, 100)], T0 + 20, SPEC)
    assert not any(key.startswith("p/") for key in state.ladders)
    assert "p" not in state.history


# --- latency breaker ---------------------------------------------------------------------


def latency(
    at: float, p99_ms: float | None, calls: float, pod: str = "p", **extra: Any
) -> PodSample:
    succeeded = extra.pop("succeeded", calls)
    failed = extra.pop("failed", 0)
    return sample(
        pod,
        at,
        100,
        latency_p99_seconds=None if p99_ms is None else p99_ms / 1000,
        requests=RequestCounts(succeeded=succeeded, failed=failed),
        **extra,
    )


def latency_run(
    points: list[tuple[float, float | None, float]], state: PolicyState | None = None
) -> tuple[PolicyState, list[tuple[float, BreakerState]]]:
    """points: (seconds after T0, p99 ms, cumulative calls); returns breaker transitions."""
    state = state or PolicyState("svc")
    transitions = []
    for offset, p99, calls in points:
        before = state.breaker
        state, _ = decide(state, [latency(T0 + offset, p99, calls)], T0 + offset, SPEC)
        if state.breaker is not before:
            transitions.append((offset, state.breaker))
    return state, transitions


def test_breaker_opens_only_after_for_seconds_of_slow_p99() -> None:
    points = [(t, 450.0, 10.0 * t) for t in range(0, 40, 5)]
    state, transitions = latency_run(points)
    assert transitions == [(30, BreakerState.OPEN)]
    assert "p99 ttft 450 ms > 200 ms" in state.breaker_reason
    assert state.trips == 1


def test_breaker_needs_minimum_calls_before_opening() -> None:
    points = [(t, 450.0, 0.0) for t in range(0, 100, 5)]  # slow window, no new requests
    _, transitions = latency_run(points)
    assert transitions == []


def test_p99_equal_to_threshold_is_not_slow() -> None:
    points = [(t, 200.0, 10.0 * t) for t in range(0, 100, 5)]
    _, transitions = latency_run(points)
    assert transitions == []


def test_a_fast_scrape_resets_the_slow_window() -> None:
    points = [(t, 450.0 if t != 20 else 50.0, 10.0 * t) for t in range(0, 65, 5)]
    _, transitions = latency_run(points)
    assert transitions == [(55, BreakerState.OPEN)]  # 30 s after the slow run restarted at 25


def test_open_goes_half_open_only_after_open_seconds_then_closes_on_good_results() -> None:
    points = [(t, 450.0, 10.0 * t) for t in range(0, 35, 5)]  # opens at 30
    points += [(t, 50.0, 300.0) for t in range(35, 55, 5)]  # half-open at 50
    points += [(55, 50.0, 310.0), (60, 50.0, 325.0)]  # 25 half-open calls, all fast and good
    state, transitions = latency_run(points)
    assert transitions == [
        (30, BreakerState.OPEN),
        (50, BreakerState.HALF_OPEN),
        (60, BreakerState.CLOSED),
    ]
    assert "25 half-open requests" in state.breaker_reason


def test_half_open_waits_for_min_requests() -> None:
    state = PolicyState("svc", breaker=BreakerState.HALF_OPEN, breaker_since=T0)
    state.last_counts["p"] = RequestCounts(succeeded=100)
    points = [(t, 10.0, 100.0 + t / 5) for t in range(5, 60, 5)]  # 1 call per scrape
    _, transitions = latency_run(points, state)
    assert transitions == []


def test_half_open_reopens_when_p99_not_under_recovery() -> None:
    state = PolicyState("svc", breaker=BreakerState.HALF_OPEN, breaker_since=T0, trips=1)
    state.last_counts["p"] = RequestCounts(succeeded=100)
    state, transitions = latency_run([(5, 150.0, 130.0)], state)  # 150 ms: < 200 but > 100
    assert transitions == [(5, BreakerState.OPEN)]
    assert state.trips == 2


def test_half_open_reopens_when_success_rate_is_too_low() -> None:
    state = PolicyState("svc", breaker=BreakerState.HALF_OPEN, breaker_since=T0)
    state.last_counts["p"] = RequestCounts(succeeded=100)
    sample_ = latency(T0 + 5, 10.0, 0, succeeded=125, failed=5)
    state, _ = decide(state, [sample_], T0 + 5, SPEC)
    assert state.breaker is BreakerState.OPEN
    assert "success 83.3%" in state.breaker_reason


def test_stale_telemetry_moves_no_breaker() -> None:
    state = PolicyState("svc", breaker=BreakerState.OPEN, breaker_since=T0)
    stale = latency(T0, 10.0, 0)
    state, _ = decide(state, [stale], T0 + 100, SPEC)
    assert state.breaker is BreakerState.OPEN


# --- degradation ---------------------------------------------------------------------------


def test_quality_failures_escalate_one_tier_at_a_time_to_fallback_then_cool_off() -> None:
    state = PolicyState("svc")
    levels = []
    for i in range(6):
        t = T0 + i * INTERVAL
        state, _ = decide(state, [latency(t, 10, i * 10, quality_failure_ratio=0.5)], t, SPEC)
        levels.append(state.level)
    assert levels == [1, 2, 2, 2, 2, 2]
    good_levels = []
    for i in range(6, 40):
        t = T0 + i * INTERVAL
        state, _ = decide(state, [latency(t, 10, i * 10, quality_failure_ratio=0.0)], t, SPEC)
        good_levels.append((i * INTERVAL, state.level))
    steps_down = [
        (t, lv)
        for (t, lv), (_, prev) in zip(good_levels[1:], good_levels, strict=False)
        if lv != prev
    ]
    assert steps_down == [(90.0, 1), (150.0, 0)]  # 60 s cool-off each


@pytest.mark.parametrize(
    ("tiers", "top"),
    [(["no-streaming"], 0), (["no-streaming", "canned-answers"], 3), (["canned-answers"], 3)],
)
def test_quality_failures_step_up_only_to_a_tier_that_remedies_quality(
    tiers: list[str], top: int
) -> None:
    # no-streaming changes how an answer is sent, not what the model writes: with no
    # remedy listed, quality failing steps nothing up and is told as NoQualityRemedy.
    spec = parse_spec(
        {
            "model": {"name": "chat", "source": "pvc://models/tiny"},
            "degradation": {"tiers": tiers},
            "telemetry": {"scrapeIntervalSeconds": INTERVAL, "wedgeAfterSeconds": 15},
        }
    )
    state = PolicyState("svc")
    for i in range(6):
        t = T0 + i * INTERVAL
        state, _ = decide(state, [latency(t, 10, i * 10, quality_failure_ratio=0.5)], t, spec)
    assert state.level == top
    assert ("no quality remedy" in state.quality_unremedied) is (top == 0)


def test_latency_trip_raises_one_tier() -> None:
    points = [(t, 450.0, 10.0 * t) for t in range(0, 35, 5)]
    state, _ = latency_run(points)
    assert state.breaker is BreakerState.OPEN and state.level == 1


# --- restart from status ------------------------------------------------------------------


def test_restart_from_status_repeats_no_action() -> None:
    steps = leak_steps(45, 0.8 * 4096, 600)
    state, actions = run(PolicyState("svc"), steps)
    assert [a.kind for a in actions] == [ActionKind.GC, ActionKind.EMPTY_CACHE]
    rebuilt = PolicyState.from_status(
        "svc", {"policy": state.to_status(), "breaker": {"state": "Closed"}}
    )
    now, samples = steps[-1]
    _, again = decide(rebuilt, samples, now, SPEC)
    assert again == []
    later, more = run(rebuilt, leak_steps(120, 0.8 * 4096, 600)[10:])
    ids = [a.id for a in actions + more]
    assert len(ids) == len(set(ids))
    assert more[0].kind is ActionKind.RELOAD  # resumes the ladder where it stood


# --- properties ----------------------------------------------------------------------------

pod_step = st.tuples(
    st.floats(min_value=0.0, max_value=1.0),  # rss ratio
    st.booleans(),  # scrape ok
    st.sampled_from([0.0, 0.0, 0.0, 30.0]),  # sample age: mostly fresh, sometimes stale
)
timeline = st.lists(
    st.tuples(st.sampled_from([1.0, 5.0, 5.0, 10.0]), pod_step, pod_step), min_size=1, max_size=60
)


def replay(
    steps: list[Any], restart_every: int = 0
) -> list[tuple[float, list[PodSample], Any, list[Any]]]:
    state = PolicyState("svc")
    now = T0
    log = []
    for index, (dt, *pods) in enumerate(steps):
        now += dt
        samples = [
            PodSample(
                pod=name,
                sampled_at=now - age,
                ok=ok,
                rss_bytes=ratio * LIMIT,
                memory_limit_bytes=LIMIT,
                stats_age_seconds=1.0,
            )
            for name, (ratio, ok, age) in zip(("a", "b"), pods, strict=True)
        ]
        if restart_every and index % restart_every == 0:
            state = PolicyState.from_status("svc", {"policy": state.to_status()})
        state, actions = decide(state, samples, now, SPEC)
        log.append((now, samples, state, actions))
    return log


@settings(max_examples=150, deadline=None)
@given(timeline)
def test_property_never_acts_on_stale_or_failed_samples(steps: list[Any]) -> None:
    for now, samples, _, actions in replay(steps):
        fresh = {s.pod for s in samples if s.ok and now - s.sampled_at <= 3 * INTERVAL}
        assert {a.pod for a in actions} <= fresh


@settings(max_examples=150, deadline=None)
@given(timeline, st.sampled_from([0, 1, 3]))
def test_property_ladder_steps_respect_cooldown_and_ids_are_unique(
    steps: list[Any], restart_every: int
) -> None:
    log = replay(steps, restart_every)
    actions = [a for *_, acts in log for a in acts]
    assert len({a.id for a in actions}) == len(actions)
    for pod in ("a", "b"):
        mine = [a for a in actions if a.pod == pod and a.kind is not ActionKind.RESTORE_PRIMARY]
        for first, then in zip(mine, mine[1:], strict=False):
            # Only a pod with no time left for the cooldown gets its next step sooner,
            # and then never a cheap one.
            assert then.at - first.at >= COOLDOWN or (
                then.kind not in CHEAP_STEPS and "time to OOM" in then.reason
            ), (first, then)
    restarts = [a.at for a in actions if a.kind is ActionKind.RESTART]
    assert all(b - a >= COOLDOWN for a, b in zip(restarts, restarts[1:], strict=False))


@settings(max_examples=150, deadline=None)
@given(timeline)
def test_property_restart_from_status_repeats_nothing(steps: list[Any]) -> None:
    for now, samples, state, _ in replay(steps):
        rebuilt = PolicyState.from_status("svc", {"policy": state.to_status()})
        _, again = decide(rebuilt, samples, now, SPEC)
        assert again == []


latency_step = st.tuples(
    st.sampled_from([1.0, 5.0, 5.0, 10.0]),
    st.one_of(st.none(), st.floats(min_value=1, max_value=1000)),
    st.integers(min_value=0, max_value=20),  # new calls
    st.integers(min_value=0, max_value=2),  # new failures
)


@settings(max_examples=200, deadline=None)
@given(st.lists(latency_step, min_size=1, max_size=80))
def test_property_breaker_transitions_respect_their_windows(steps: list[Any]) -> None:
    state = PolicyState("svc")
    now, succeeded, failed = T0, 0, 0
    slow_since: float | None = None
    entered = T0
    half_open_calls = 0.0
    for dt, p99, calls, failures in steps:
        now += dt
        succeeded += calls
        failed += failures
        before = state.breaker
        state, _ = decide(
            state, [latency(now, p99, 0, succeeded=succeeded, failed=failed)], now, SPEC
        )
        if before is BreakerState.HALF_OPEN:
            half_open_calls += calls + failures
        if before is BreakerState.CLOSED:
            slow = p99 is not None and p99 > 200
            slow_since = (slow_since if slow_since is not None else now) if slow else None
        if state.breaker is before:
            continue
        if before is BreakerState.CLOSED:
            assert state.breaker is BreakerState.OPEN
            assert slow_since is not None and now - slow_since >= 30
        elif before is BreakerState.OPEN:
            assert state.breaker is BreakerState.HALF_OPEN and now - entered >= 20
            half_open_calls = 0.0
        else:
            assert half_open_calls >= 20
            if state.breaker is BreakerState.CLOSED:
                assert p99 is not None and p99 < 100
        slow_since = None
        entered = now


# --- rollout: one pod out of service at a time -------------------------------------------


def gate(**ready: bool) -> Rollout:
    return Rollout(PodReadiness(name, ok) for name, ok in ready.items())


def both_leaking(at: float) -> list[PodSample]:
    return [sample("a", at, 0.96 * 4096), sample("b", at, 0.96 * 4096)]


def test_a_reload_waits_while_another_pod_is_not_ready() -> None:
    state = PolicyState("svc", ladders={"a/rss": Ladder(step=2), "b/rss": Ladder(step=2)})
    _, actions = decide(state, both_leaking(T0), T0, SPEC, gate(a=True, b=False))
    # b is already out of service: acting on it takes nothing more out; a waits.
    assert [(a.kind, a.pod) for a in actions] == [(ActionKind.RELOAD, "b")]


def test_two_pods_wanting_a_reload_get_it_one_per_tick() -> None:
    state = PolicyState("svc", ladders={"a/rss": Ladder(step=2), "b/rss": Ladder(step=2)})
    state, first = decide(state, both_leaking(T0), T0, SPEC, gate(a=True, b=True))
    assert [(a.kind, a.pod) for a in first] == [(ActionKind.RELOAD, "a")]
    assert state.ladders["b/rss"].step == 2  # b's ladder waited, nothing skipped
    # Next tick a is reloading (not Ready): b still waits; then a is back and b goes.
    state, second = decide(state, both_leaking(T0 + 5), T0 + 5, SPEC, gate(a=False, b=True))
    assert second == []
    _, third = decide(state, both_leaking(T0 + 10), T0 + 10, SPEC, gate(a=True, b=True))
    assert [(a.kind, a.pod) for a in third] == [(ActionKind.RELOAD, "b")]


def test_gc_and_empty_cache_need_no_turn() -> None:
    _, actions = decide(PolicyState("svc"), both_leaking(T0), T0, SPEC, gate(a=False, b=False))
    assert sorted((a.kind, a.pod) for a in actions) == [
        (ActionKind.GC, "a"),
        (ActionKind.GC, "b"),
    ]


def test_a_wedge_restart_waits_for_its_turn() -> None:
    state = PolicyState("svc", served_once={"a", "b"})
    wedged = [sample("a", T0, 100, stats_age_seconds=60), sample("b", T0, 100)]
    _, actions = decide(state, wedged, T0, SPEC, gate(a=True, b=False))
    assert actions == []
    _, actions = decide(state, wedged, T0, SPEC, gate(a=False, b=True))
    assert [(a.kind, a.pod) for a in actions] == [(ActionKind.RESTART, "a")]


# --- wedge: acts at the first scrape past wedgeAfterSeconds --------------------------------


def test_wedge_fires_at_the_first_scrape_past_wedge_after_seconds() -> None:
    limit = SPEC.telemetry.wedge_after_seconds
    state, actions = decide(PolicyState("svc"), [sample("p", T0, 100)], T0, SPEC)
    at_limit = [sample("p", T0 + 5, 100, stats_age_seconds=limit)]
    state, actions = decide(state, at_limit, T0 + 5, SPEC)
    assert actions == []  # not older than the limit yet
    past = [sample("p", T0 + 10, 100, stats_age_seconds=limit + 0.5)]
    _, actions = decide(state, past, T0 + 10, SPEC)
    assert [a.kind for a in actions] == [ActionKind.RESTART]
    assert f"> {limit:g} s" in actions[0].reason


def test_a_restarted_operator_acts_on_a_loaded_wedged_pod_at_its_first_scrape() -> None:
    limit = SPEC.telemetry.wedge_after_seconds
    wedged = sample("p", T0, 100, stats_age_seconds=limit + 1, model_loaded=True)
    rebuilt = PolicyState.from_status("svc", {"policy": PolicyState("svc").to_status()})
    _, actions = decide(rebuilt, [wedged], T0, SPEC)
    assert [a.kind for a in actions] == [ActionKind.RESTART]


def test_wedge_uses_the_oldest_heartbeat_too() -> None:
    limit = SPEC.telemetry.wedge_after_seconds
    state, _ = decide(PolicyState("svc"), [sample("p", T0, 100)], T0, SPEC)
    stuck_worker = [sample("p", T0 + 5, 100, heartbeat_age_seconds=limit + 1)]
    _, actions = decide(state, stuck_worker, T0 + 5, SPEC)
    assert [a.kind for a in actions] == [ActionKind.RESTART]


# --- actions in flight: retried with the same id, never doubled ------------------------------


def test_an_action_in_flight_is_kept_and_the_pod_gets_no_other_one() -> None:
    state, actions = decide(PolicyState("svc"), [sample("p", T0, 0.96 * 4096)], T0, SPEC)
    (gc,) = actions
    assert not state.settle(gc, settled=False)  # timed out: outcome unknown
    assert list(state.in_flight) == [gc.id] and state.in_flight[gc.id].attempts == 2
    later = [sample("p", T0 + 60, 0.96 * 4096)]
    state, actions = decide(state, later, T0 + 60, SPEC)
    assert actions == []  # no second action on top of the one in flight
    assert state.settle(state.in_flight[gc.id], settled=True)
    _, actions = decide(state, [sample("p", T0 + 65, 0.96 * 4096)], T0 + 65, SPEC)
    assert [a.kind for a in actions] == [ActionKind.EMPTY_CACHE]


def test_in_flight_actions_survive_an_operator_restart_with_their_ids() -> None:
    state = PolicyState("svc")
    action = Action("svc-000007-reload", ActionKind.RELOAD, "p", "RSS", T0, Variant.PRIMARY)
    state.settle(action, settled=False)
    rebuilt = PolicyState.from_status("svc", {"policy": state.to_status()})
    assert rebuilt.in_flight == state.in_flight
    assert rebuilt.busy_pods() == {"p"}


def test_an_action_whose_outcome_stays_unknown_is_given_up_after_max_attempts() -> None:
    state = PolicyState("svc")
    action = Action("svc-000001-gc", ActionKind.GC, "p", "RSS", T0)
    for _ in range(MAX_ATTEMPTS - 1):
        assert not state.settle(action, settled=False)
        action = state.in_flight[action.id]
    assert state.settle(action, settled=False)
    assert state.in_flight == {}


def test_a_restart_clears_what_was_in_flight_on_that_pod() -> None:
    state = PolicyState("svc")
    reload = Action("svc-000001-reload", ActionKind.RELOAD, "p", "RSS", T0)
    state.settle(reload, settled=False)
    state.settle(Action("svc-000002-restart", ActionKind.RESTART, "p", "wedged", T0), True)
    assert state.in_flight == {}


def test_in_flight_actions_of_a_pod_that_is_gone_are_dropped() -> None:
    state = PolicyState("svc")
    state.settle(Action("svc-000001-gc", ActionKind.GC, "gone", "RSS", T0), settled=False)
    state, _ = decide(state, [sample("p", T0, 100)], T0, SPEC)
    assert state.in_flight == {}


# --- request counting ----------------------------------------------------------------------------


def test_only_requests_that_ran_count_as_breaker_calls() -> None:
    counts = RequestCounts(succeeded=5, failed=1, rejected=7, timed_out=2, cancelled=3, invalid=4)
    assert counts.calls == 8


def test_rejected_invalid_and_cancelled_requests_never_open_the_breaker() -> None:
    state = PolicyState("svc")
    for i in range(10):
        t = T0 + i * INTERVAL
        noise = RequestCounts(rejected=50 * i, invalid=50 * i, cancelled=50 * i)
        slow = sample("p", t, 100, latency_p99_seconds=0.45, requests=noise)
        state, _ = decide(state, [slow], t, SPEC)
    assert state.breaker is BreakerState.CLOSED  # slow, but below minRequests calls


def test_old_four_outcome_counters_in_status_still_load() -> None:
    status = {
        "policy": {"halfOpenCounts": [1, 2, 3, 4], "pods": [{"pod": "p", "counts": [5, 6, 7, 8]}]}
    }
    state = PolicyState.from_status("svc", status)
    assert state.half_open_counts == RequestCounts(1, 2, 3, 4)
    assert state.last_counts["p"].as_tuple() == (5, 6, 7, 8, 0, 0)


# --- fields of the resource breaker and half-open ------------------------------------------


def gpu_steps(spec_ratio: float, used_ratio: float, mib_per_minute: float) -> list[Any]:
    vram = 16384 * MIB
    steps = []
    for i in range(6):
        t = T0 + i * INTERVAL
        used = used_ratio * vram + mib_per_minute * MIB * (i * INTERVAL) / 60
        steps.append((t, [sample("p", t, 100, gpu_memory_used_bytes=used,
                                 gpu_memory_total_bytes=vram)]))  # fmt: skip
    return steps


def test_gpu_memory_above_ratio_of_vram_and_growing_climbs_the_ladder() -> None:
    tight = make_spec(resource={
        "cooldownSeconds": COOLDOWN,
        "gpuMemory": {"ratioOfVRAM": 0.5, "growthMiBPerMinute": 100},
    })  # fmt: skip
    _, actions = run(PolicyState("svc"), gpu_steps(0.5, 0.6, 300), tight)
    assert [a.kind for a in actions] == [ActionKind.GC]
    assert actions[0].reason.startswith("GPU memory") and "of VRAM" in actions[0].reason
    # The same pod under the default thresholds (87.5% of VRAM, 500 MiB/min): nothing.
    _, actions = run(PolicyState("svc"), gpu_steps(0.5, 0.6, 300))
    assert actions == []


def test_growth_is_fitted_over_window_seconds_only() -> None:
    # A fast climb under the ratio (30% -> 70% in 30 s), then a slow one
    # (+246 MiB/min) that crosses 75% at t = 80 s.
    def rss_mib(t: float) -> float:
        ratio = 0.30 + 0.40 * t / 30 if t <= 30 else 0.70 + 0.001 * (t - 30)
        return ratio * 4096

    steps = [(T0 + t, [sample("p", T0 + t, rss_mib(t))]) for t in range(0, 130, 5)]
    resource = {"cooldownSeconds": 1000, "rss": {"ratioOfLimit": 0.75, "growthMiBPerMinute": 500}}
    short = make_spec(resource={**resource, "windowSeconds": 20})
    long = make_spec(resource={**resource, "windowSeconds": 120})
    _, short_actions = run(PolicyState("svc"), steps, short)
    _, long_actions = run(PolicyState("svc"), steps, long)
    assert short_actions == []  # over 20 s only the slow climb is fitted
    # (A reload: with a 1000 s cooldown no cheap step could be judged before the limit.)
    assert [a.at - T0 for a in long_actions] == [85]


def test_half_open_admits_admit_percent() -> None:
    half = PolicyState("svc", breaker=BreakerState.HALF_OPEN)
    assert admit_percent(half, SPEC) == SPEC.breaker.half_open.admit_percent == 10
    assert admit_percent(PolicyState("svc", breaker=BreakerState.OPEN), SPEC) == 0
    assert admit_percent(PolicyState("svc"), SPEC) == 100


def test_a_restarted_operator_without_a_trend_does_not_take_the_last_rung_for_a_cure() -> None:
    # gc was the last rung (status says so); the new operator has no samples yet, so
    # "not triggered" above the ratio means "no trend yet", not "gc cured it".
    state = PolicyState("svc")
    state.ladders["p/rss"] = Ladder(step=1, last_action_at=T0 - COOLDOWN, acted_step=0)
    state, actions = run(state, leak_steps(60, 0.80 * 4096, 600))
    assert [a.kind for a in actions][:1] == [ActionKind.EMPTY_CACHE]


def test_persisted_list_entries_hold_no_nulls_so_the_stored_status_equals_the_patch() -> None:
    # The API server prunes nulls inside list entries; kopf then warned "Merge-patching
    # finished with inconsistencies" on every status write of a service with pods.
    state = PolicyState("svc")
    state.last_counts["p"] = RequestCounts(succeeded=3)
    state.ladders["p/rss"] = Ladder(1, 10.0, None, None)
    persisted = state.to_status()
    entries = [*persisted["pods"], *persisted["ladders"]]
    assert entries and all(None not in entry.values() for entry in entries), entries
    rebuilt = PolicyState.from_status("svc", {"policy": persisted})
    assert rebuilt.last_counts == state.last_counts and rebuilt.ladders == state.ladders
    assert rebuilt.pod_variant("p") is Variant.PRIMARY
