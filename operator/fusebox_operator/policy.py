"""Breaker state machines and the per-pod action ladder (DESIGN §6).

Why: every decision the operator makes about a pod (collect garbage, empty
the CUDA cache, reload, swap, restart) and about a service (open, half-open
or close its latency breaker, step degradation tiers) must be explainable,
repeatable and testable with a fake clock. So it is one pure function,
`decide(state, samples, now, spec) -> (state, actions)`: no I/O, no clock,
no randomness. Action ids come from a persisted sequence, so after an
operator restart the same decision carries the same id and the server's
idempotency turns a repeat into a no-op.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence

from fusebox_contract.names import BreakerState, DegradationLevel, Variant
from fusebox_operator.latency import (
    LATENCY_WINDOW_SECONDS,
    Buckets,
    quantile_since,
    remember,
    window_quantile,
)
from fusebox_operator.memory_trend import read_resources
from fusebox_operator.observations import PodSample, RequestCounts
from fusebox_operator.policy_state import (
    DISRUPTIVE,
    Action,
    ActionKind,
    Ladder,
    PolicyState,
    next_action_id,
)
from fusebox_operator.rollout import Rollout
from fusebox_operator.spec import InferenceServiceSpec

STALE_INTERVALS = 3
QUALITY_REMEDY_LEVELS: tuple[int, ...] = (
    int(DegradationLevel.FALLBACK_MODEL),
    int(DegradationLevel.CANNED_ANSWERS),
)
"""The tiers that change what a failing primary writes, the first listed one quality
steps up to; no-streaming changes only how an answer is sent, so it is no remedy."""


LADDER: tuple[ActionKind, ...] = (
    ActionKind.GC,
    ActionKind.EMPTY_CACHE,
    ActionKind.GROW_LIMIT,
    ActionKind.RELOAD,
    ActionKind.SWAP_FALLBACK,
    ActionKind.RESTART,
)
ACT_SECONDS: dict[ActionKind, float] = {
    ActionKind.GC: 1,
    ActionKind.EMPTY_CACHE: 1,
    ActionKind.GROW_LIMIT: 5,
    ActionKind.RELOAD: 30,
    ActionKind.SWAP_FALLBACK: 30,
    ActionKind.RESTORE_PRIMARY: 30,
    ActionKind.RESTART: 60,
}
"""Roughly how long each step takes to act: a model load dominates reload and swap, a
restart adds scheduling and start-up. Only the estimates of time-to-OOM skipping use it."""
CHEAP_STEPS: frozenset[ActionKind] = frozenset({ActionKind.GC, ActionKind.EMPTY_CACHE})
"""Steps that free only what nothing references: guesses, worth a try only with time to
spare. A reload (and what follows) frees whatever the model holds, so it is never skipped."""


def swaps_to_fallback(spec: InferenceServiceSpec, sample: PodSample | None) -> bool:
    """Whether level 2 and the ladder's swap step move this pod to a fallback.

    Only with a fallback in the spec, and not on a pod whose server reported
    that it cannot load it (a device without CUDA for int4/fp8): that pod is
    a pod without a fallback. Not reported (an older sidecar, a failed
    scrape) counts as able, as before the server could say so.
    """
    return spec.fallback is not None and not (sample is not None and sample.cannot_swap)


def skipped_for_time(
    kind: ActionKind, seconds_to_limit: float | None, spec: InferenceServiceSpec
) -> bool:
    """Whether a cheap step cannot act in time: should it fail, the pod would reach its
    limit before the step was judged (one cooldown) and a reload could act."""
    if kind not in CHEAP_STEPS or seconds_to_limit is None:
        return False
    needed = (
        ACT_SECONDS[kind] + spec.breaker.resource.cooldown_seconds + ACT_SECONDS[ActionKind.RELOAD]
    )
    return seconds_to_limit < needed


def no_time_to_wait(
    seconds_to_limit: float | None, waited_seconds: float, spec: InferenceServiceSpec
) -> bool:
    """Whether waiting out the rest of the cooldown would leave no time for a reload: then
    a cheap last step is not waited for (a fast leak its first estimate took for slow)."""
    if seconds_to_limit is None:
        return False
    rest = max(0.0, spec.breaker.resource.cooldown_seconds - waited_seconds)
    return seconds_to_limit < rest + ACT_SECONDS[ActionKind.RELOAD]


def _forget_pod(state: PolicyState, pod: str) -> None:
    for key in [k for k in state.ladders if k.split("/", 1)[0] == pod]:
        del state.ladders[key]
    for mapping in (
        state.variants,
        state.swapped_at,
        state.last_counts,
        state.history,
        state.latency_history,
        state.half_open_buckets,
        state.fallback_unavailable,
        state.time_to_oom,
    ):
        mapping.pop(pod, None)
    for times in (state.first_seen, state.last_fresh):
        times.pop(pod, None)
    state.served_once.discard(pod)
    state.stale_pods.discard(pod)
    for action_id in [i for i, a in state.in_flight.items() if a.pod == pod]:
        del state.in_flight[action_id]


def _may_act(rollout: Rollout | None, pod: str, kind: ActionKind) -> bool:
    """Whether this action may run now: one that takes the pod out of service needs its turn."""
    if rollout is None or kind not in DISRUPTIVE:
        return True
    return rollout.take(pod)


def grown_limit_bytes(spec: InferenceServiceSpec, state: PolicyState) -> int | None:
    """The limit the grow-limit rung resizes the server to, or None when it may not."""
    if not spec.memory.grows_in_place or not state.memory_limit_bytes:
        return None
    return int(state.memory_limit_bytes * spec.memory.max_growth_ratio)


def can_grow(
    spec: InferenceServiceSpec, state: PolicyState, sample: PodSample, resource: str
) -> bool:
    """Whether growing the limit can help: host memory only (VRAM does not grow), the
    spec allows it, and this pod's limit is not already there."""
    target = grown_limit_bytes(spec, state)
    if resource != "rss" or target is None:
        return False
    current = sample.memory_limit_bytes or state.memory_limit_bytes or 0
    return current < target * 0.99


def _ladder_step(
    state: PolicyState,
    sample: PodSample,
    ladder: Ladder,
    spec: InferenceServiceSpec,
    now: float,
    seconds_to_limit: float | None = None,
    resource: str = "rss",
) -> tuple[ActionKind | None, list[ActionKind]]:
    """The next rung for this pod and the rungs skipped on the way: a swap that cannot
    help (or cannot load), a limit that cannot grow, and cheap steps there is no time
    left to try."""
    skipped: list[ActionKind] = []
    while ladder.step < len(LADDER):
        kind = LADDER[ladder.step]
        if kind is ActionKind.GROW_LIMIT and not can_grow(spec, state, sample, resource):
            ladder.step += 1
            continue
        if kind is ActionKind.SWAP_FALLBACK and (
            not swaps_to_fallback(spec, sample) or state.pod_variant(sample.pod) == Variant.FALLBACK
        ):
            ladder.step += 1
            continue
        if skipped_for_time(kind, seconds_to_limit, spec):
            skipped.append(kind)
            ladder.step += 1
            continue
        if kind is ActionKind.RESTART and not _restart_allowed(state, spec, now):
            return None, skipped  # wait: one restart per cooldown keeps the service up
        return kind, skipped
    return None, skipped


def _time_note(seconds_to_limit: float | None, skipped: Sequence[ActionKind]) -> str:
    """ "; time to OOM ~40 s: skipping gc and empty_cache" for an action's reason."""
    if seconds_to_limit is None:
        return ""
    note = f"; time to OOM ~{seconds_to_limit:.0f} s"
    if skipped:
        note += ": skipping " + " and ".join(kind.value for kind in skipped)
    return note


def _restart_allowed(state: PolicyState, spec: InferenceServiceSpec, now: float) -> bool:
    last = state.last_restart_at
    return last is None or now - last >= spec.breaker.resource.cooldown_seconds


def _memory_ladder(
    state: PolicyState,
    sample: PodSample,
    spec: InferenceServiceSpec,
    now: float,
    actions: list[Action],
    rollout: Rollout | None,
) -> None:
    """Climb one pod's ladder, one rung per cooldown, and stop at the rung that cures.

    A rung is judged by the samples after it: one that brings the signal back
    under the trigger cured this leak, so the ladder goes back to that rung and
    a leak that returns gets the same step again, not the next one. Only a
    signal still triggered a cooldown after the step climbs, unless waiting the
    cooldown out would leave no time for a reload (`no_time_to_wait`). Cheap
    rungs are skipped when the memory would reach its limit before they could
    be judged and a reload act (`skipped_for_time`).
    """
    cooldown = spec.breaker.resource.cooldown_seconds
    pod = sample.pod
    acted = False
    readings = read_resources(state, pod, sample, spec)
    soonest = [r.seconds_to_limit for r in readings if r.seconds_to_limit is not None]
    if soonest:
        state.time_to_oom[pod] = min(soonest)
    else:
        state.time_to_oom.pop(pod, None)
    for reading in readings:
        key = f"{pod}/{reading.resource}"
        ladder = state.ladders.get(key)
        if not reading.triggered:
            if ladder is not None and reading.judgeable:
                if ladder.acted_step is not None:
                    # Back under after that rung: it cured; a return of the leak repeats it.
                    ladder.step, ladder.acted_step = ladder.acted_step, None
                ladder.calm_since = ladder.calm_since if ladder.calm_since is not None else now
                if now - ladder.calm_since >= cooldown:
                    del state.ladders[key]  # back under for a cooldown: the episode is over
            continue
        if ladder is None:
            ladder = state.ladders[key] = Ladder()
        ladder.calm_since = None
        if acted:
            continue
        if ladder.last_action_at is not None and now - ladder.last_action_at < cooldown:
            # Only a cheap guess is not waited for, and only when the limit is closer
            # than the rest of the cooldown plus a reload; a reload or swap is.
            guessed = ladder.acted_step is not None and LADDER[ladder.acted_step] in CHEAP_STEPS
            waited = now - ladder.last_action_at
            if not (guessed and no_time_to_wait(reading.seconds_to_limit, waited, spec)):
                continue
        step_before = ladder.step
        kind, skipped = _ladder_step(
            state, sample, ladder, spec, now, reading.seconds_to_limit, reading.resource
        )
        if kind is None or not _may_act(rollout, pod, kind):
            if kind is not None and rollout is not None:
                rollout.hold(pod, kind.value)  # told: MemoryPressure and an event
            ladder.step = step_before  # waits for its turn: the next tick decides afresh
            continue
        variant = state.pod_variant(pod)
        if kind is ActionKind.SWAP_FALLBACK:
            variant = Variant.FALLBACK
            state.variants[pod] = Variant.FALLBACK
            state.swapped_at[pod] = now
        if kind is ActionKind.RESTART:
            state.last_restart_at = now
        reason = reading.reason + _time_note(reading.seconds_to_limit, skipped)
        grow_to = grown_limit_bytes(spec, state) if kind is ActionKind.GROW_LIMIT else None
        actions.append(
            Action(
                next_action_id(state, kind),
                kind,
                pod,
                reason,
                now,
                variant,
                memory_limit_bytes=grow_to,
            )
        )
        ladder.acted_step = ladder.step
        ladder.step += 1
        ladder.last_action_at = now
        acted = True


def _restore_primary(
    state: PolicyState,
    pod: str,
    spec: InferenceServiceSpec,
    now: float,
    actions: list[Action],
    rollout: Rollout | None,
) -> None:
    """A pod the ladder swapped goes back to primary once calm for the degradation cool-off."""
    if state.pod_variant(pod) != Variant.FALLBACK:
        return
    if any(k.split("/", 1)[0] == pod and k.split("/", 1)[1] != "wedge" for k in state.ladders):
        return
    if now - state.swapped_at.get(pod, now) < spec.degradation.cool_off_seconds:
        return
    kind = ActionKind.RESTORE_PRIMARY
    if not _may_act(rollout, pod, kind):
        return
    reason = f"memory calm for {spec.degradation.cool_off_seconds:g} s after the swap"
    actions.append(Action(next_action_id(state, kind), kind, pod, reason, now, Variant.PRIMARY))
    del state.variants[pod]
    state.swapped_at.pop(pod, None)


def _wedge_check(
    state: PolicyState,
    sample: PodSample,
    spec: InferenceServiceSpec,
    now: float,
    actions: list[Action],
    rollout: Rollout | None,
) -> bool:
    """A fresh scrape of a stale stats file means a wedged server: restart that pod.

    It fires at the first fresh scrape whose stats file or oldest heartbeat
    is older than `telemetry.wedgeAfterSeconds`, so the operator restarts the
    pod (event PodRestarted) before the kubelet's liveness probe would.
    """
    ages = [a for a in (sample.stats_age_seconds, sample.heartbeat_age_seconds) if a is not None]
    if not ages:
        return False
    age = max(ages)
    limit = spec.telemetry.wedge_after_seconds
    if age <= limit:
        # Loading torch and the model can starve the stats thread for seconds;
        # the kubelet's probes own start-up, so a pod counts only once loaded.
        if sample.model_loaded is not False:
            state.served_once.add(sample.pod)
        return False
    if sample.pod not in state.served_once and sample.model_loaded is not True:
        # Still starting: never wedged if it never ran. A pod whose last stats
        # say "loaded" did run, even if this operator (just restarted) never
        # saw it fresh: it is wedged now, not in a minute.
        return False
    key = f"{sample.pod}/wedge"
    ladder = state.ladders.setdefault(key, Ladder())
    kind = ActionKind.RESTART
    if ladder.last_action_at is not None or not _restart_allowed(state, spec, now):
        return True
    if not _may_act(rollout, sample.pod, kind):
        return True
    reason = f"server stats {age:.0f} s old (> {limit:g} s): event loop or worker wedged"
    actions.append(Action(next_action_id(state, kind), kind, sample.pod, reason, now))
    ladder.step, ladder.last_action_at = 1, now
    state.last_restart_at = now
    return True


def _latency_breaker(
    state: PolicyState,
    p99_millis: float | None,
    calls: RequestCounts,
    spec: InferenceServiceSpec,
    now: float,
    half_open_p99_millis: float | None = None,
) -> bool:
    """Advance the service's latency breaker; True when it tripped (-> OPEN) just now.

    `p99_millis` (the window's) opens it; `half_open_p99_millis`, of the requests
    admitted since it went half-open only (`_half_open_p99_millis`), closes or reopens it.
    """
    latency = spec.breaker.latency
    half = spec.breaker.half_open
    metric = latency.metric
    if state.breaker is BreakerState.CLOSED:
        if p99_millis is not None and p99_millis > latency.p99_threshold_millis:
            if state.slow_since is None:
                state.slow_since, state.slow_calls = now, 0.0
            state.slow_calls += calls.calls
            slow_for = now - state.slow_since
            if slow_for >= latency.for_seconds and state.slow_calls >= latency.min_requests:
                state.breaker, state.breaker_since = BreakerState.OPEN, now
                state.breaker_reason = (
                    f"p99 {metric} {p99_millis:.0f} ms > {latency.p99_threshold_millis:g} ms "
                    f"for {slow_for:.0f} s over {state.slow_calls:.0f} requests"
                )
                state.trips += 1
                state.slow_since, state.slow_calls = None, 0.0
                return True
        else:
            state.slow_since, state.slow_calls = None, 0.0
        return False
    if state.breaker is BreakerState.OPEN:
        if now - state.breaker_since >= spec.breaker.open_seconds:
            state.breaker, state.breaker_since = BreakerState.HALF_OPEN, now
            state.half_open_counts = RequestCounts()
            state.half_open_buckets = _latest_buckets(state)
            state.breaker_reason = (
                f"open for {spec.breaker.open_seconds:g} s: admitting {half.admit_percent}% "
                f"until {half.min_requests} requests decide"
            )
        return False
    # HALF_OPEN: only results seen while half-open decide.
    state.half_open_counts = state.half_open_counts.plus(calls)
    seen = state.half_open_counts
    if seen.calls < half.min_requests or half_open_p99_millis is None:
        return False
    success_rate = seen.succeeded / seen.calls
    summary = (
        f"{seen.calls:.0f} half-open requests: p99 {metric} {half_open_p99_millis:.0f} ms "
        f"(recovery < {half.p99_recovery_millis:g} ms), success {success_rate:.1%} "
        f"(need >= {half.min_success_rate:.1%})"
    )
    state.half_open_buckets = {}
    if half_open_p99_millis < half.p99_recovery_millis and success_rate >= half.min_success_rate:
        state.breaker, state.breaker_since = BreakerState.CLOSED, now
        state.breaker_reason = summary
        return False
    state.breaker, state.breaker_since = BreakerState.OPEN, now
    state.breaker_reason = summary
    state.trips += 1
    return True


def _step_level(state: PolicyState, levels: Sequence[int], up: bool) -> int | None:
    if up:
        return next((lv for lv in levels if lv > state.level), None)
    lower = [lv for lv in levels if lv < state.level]
    return lower[-1] if lower else (0 if state.level > 0 else None)


def _degradation(
    state: PolicyState,
    tripped: bool,
    quality_ratio: float | None,
    spec: InferenceServiceSpec,
    now: float,
) -> None:
    """Step the service's degradation level for the latency trip and the quality ratio.

    Quality failures ask for the fallback-model tier, the remedy for what the
    primary writes; without it in the tiers, for canned-answers (the prompts it
    knows get a known answer, not the primary's). With neither listed there is
    no quality remedy: quality steps nothing up (no-streaming alone changes
    nothing the model writes), and `quality_unremedied` says so, for the
    Degraded condition and one event.
    """
    levels = spec.degradation.levels
    max_rate = spec.breaker.quality.max_failure_rate
    quality_bad = quality_ratio is not None and quality_ratio > max_rate
    remedies = [level for level in QUALITY_REMEDY_LEVELS if level in levels]
    quality_target = remedies[0] if remedies else int(DegradationLevel.NONE)
    state.quality_unremedied = (
        f"quality failure ratio {quality_ratio:.1%} > {max_rate:.1%}, but degradation.tiers "
        "lists neither fallback-model nor canned-answers: no quality remedy configured"
        if quality_bad and not remedies
        else ""
    )
    step_spacing = spec.telemetry.scrape_interval_seconds
    target: int | None = None
    if tripped:
        target = _step_level(state, levels, up=True)
        reason = f"latency breaker tripped ({state.breaker_reason})"
    elif quality_bad and state.level < quality_target and now - state.level_since >= step_spacing:
        target = _step_level(state, levels, up=True)
        reason = f"quality failure ratio {quality_ratio:.1%} > {max_rate:.1%}"
    if target is not None:
        state.level, state.level_since, state.level_reason = target, now, reason
    healthy = state.breaker is BreakerState.CLOSED and not quality_bad
    if not healthy:
        state.healthy_since = None
        return
    if state.healthy_since is None:
        state.healthy_since = now
    cool_off = spec.degradation.cool_off_seconds
    if state.level > 0 and now - max(state.healthy_since, state.level_since) >= cool_off:
        lower = _step_level(state, levels, up=False)
        if lower is not None:
            state.level, state.level_since = lower, now
            state.level_reason = f"healthy for {cool_off:g} s: stepping down"


def _note_fallback(state: PolicyState, sample: PodSample, spec: InferenceServiceSpec) -> None:
    """Remember which pods cannot swap to the spec's fallback, and the server's reason."""
    if spec.fallback is not None and sample.cannot_swap:
        state.fallback_unavailable[sample.pod] = (
            sample.fallback_unavailable_reason or "the server reports no usable fallback"
        )
    elif sample.fallback_available is not None or spec.fallback is None:
        state.fallback_unavailable.pop(sample.pod, None)


def _service_p99_millis(state: PolicyState, fresh: Sequence[PodSample]) -> float | None:
    """The breaker's p99: of the configured latency's histogram increase over the window,
    summed over the pods, as Prometheus' histogram_quantile gives it. A pod whose sidecar
    exports no histogram (an image from before them) counts with its own p99 gauge."""
    gauges: list[float] = []
    for sample in fresh:
        if sample.latency_buckets is not None:
            state.latency_history[sample.pod] = remember(
                state.latency_history.get(sample.pod, ()),
                sample.sampled_at,
                sample.latency_buckets,
                LATENCY_WINDOW_SECONDS,
            )
        elif sample.latency_p99_seconds is not None:
            gauges.append(sample.latency_p99_seconds)
    histograms = [state.latency_history[s.pod] for s in fresh if s.pod in state.latency_history]
    p99s = [p for p in (window_quantile(0.99, histograms), *gauges) if p is not None]
    return max(p99s) * 1000 if p99s else None


def _latest_buckets(state: PolicyState) -> dict[str, Buckets]:
    """Each pod's last scraped histogram."""
    return {pod: history[-1][1] for pod, history in state.latency_history.items() if history}


def _half_open_p99_millis(state: PolicyState, fresh: Sequence[PodSample]) -> float | None:
    """The p99 of the half-open requests alone: each fresh pod's histogram increase since
    the breaker went half-open (`half_open_buckets`).

    Not the window's: it spans LATENCY_WINDOW_SECONDS (60 s), longer than the default
    breaker.openSeconds (30 s), so it still held the slow requests that opened the
    breaker, and a service that had recovered tripped again with a reason blaming
    half-open requests that were all fast. A pod with no baseline (new since, or an
    operator restart) counts from this scrape on; one without histograms counts with
    its own p99 gauge, as in `_service_p99_millis`.
    """
    scraped = {sample.pod for sample in fresh}
    latest = {pod: buckets for pod, buckets in _latest_buckets(state).items() if pod in scraped}
    for pod, buckets in latest.items():
        state.half_open_buckets.setdefault(pod, buckets)
    gauges = [
        sample.latency_p99_seconds
        for sample in fresh
        if sample.latency_buckets is None and sample.latency_p99_seconds is not None
    ]
    since = quantile_since(0.99, state.half_open_buckets, latest)
    p99s = [p for p in (since, *gauges) if p is not None]
    return max(p99s) * 1000 if p99s else None


def decide(
    state: PolicyState,
    samples: Iterable[PodSample],
    now: float,
    spec: InferenceServiceSpec,
    rollout: Rollout | None = None,
    pods: Iterable[str] | None = None,
) -> tuple[PolicyState, list[Action]]:
    """One control-loop step: new state and the actions to execute, in order.

    `samples` holds this tick's scrape of the pods that could be scraped
    (failed scrapes included, with ok=False). `pods` names every pod that
    exists (default: the sampled ones); what the state remembers of any other
    pod is forgotten. A pod that exists but was not scraped (its sidecar
    briefly unready) keeps its in-flight action, ladders and swapped variant.
    The input state is not modified. With a `rollout`, an action that takes a
    pod out of service is decided only when the rollout lets that pod go
    (and the grant is recorded there); otherwise the pod's ladder waits.
    A pod with an action in flight gets no new memory action.
    """
    state = copy.deepcopy(state)
    samples = list(samples)
    actions: list[Action] = []
    interval = spec.telemetry.scrape_interval_seconds
    present = {s.pod for s in samples}
    existing = present | set(pods or ())
    known = (
        set(state.first_seen)
        | set(state.last_counts)
        | {key.split("/", 1)[0] for key in state.ladders}
        | set(state.variants)
        | state.busy_pods()
    )
    for pod in known - existing:
        _forget_pod(state, pod)

    fresh: list[PodSample] = []
    for sample in samples:
        state.first_seen.setdefault(sample.pod, now)
        # An estimate belongs to this tick's figures: set again below from a fresh
        # reading, absent for a failed scrape, a stale or busy pod (its action moves them).
        state.time_to_oom.pop(sample.pod, None)
        if sample.ok and now - sample.sampled_at <= STALE_INTERVALS * interval:
            fresh.append(sample)
            state.last_fresh[sample.pod] = sample.sampled_at
    state.stale_pods = {
        pod
        for pod in present
        if now - max(state.last_fresh.get(pod, -1e18), state.first_seen[pod])
        > STALE_INTERVALS * interval
    }

    calls = RequestCounts()
    for sample in fresh:
        pod = sample.pod
        _note_fallback(state, sample, spec)
        if sample.requests is not None:
            calls = calls.plus(sample.requests.since(state.last_counts.get(pod)))
            state.last_counts[pod] = sample.requests
        if _wedge_check(state, sample, spec, now, actions, rollout):
            continue
        if pod in state.stale_pods:
            continue
        if not sample.stats_observed:
            # No valid stats file: the server's state is unknown (serving.StatsInvalid),
            # and a figure the sidecar still measures is no ground to act on it.
            continue
        if sample.model_loaded is False:
            # Loading its model: memory climbs with the weights, not with a leak (a new
            # pod showed OOM-IN 106s). The trend starts again from the loaded model.
            state.history.pop(pod, None)
        else:
            # Decide on the trend up to the previous scrape plus this one.
            history = state.history.setdefault(pod, [])
            history.append((sample.sampled_at, sample.rss_bytes, sample.gpu_memory_used_bytes))
            horizon = sample.sampled_at - spec.breaker.resource.window_seconds
            state.history[pod] = [p for p in history if p[0] >= horizon]
        if pod in state.busy_pods():
            continue  # its last action is still in flight: never a second one on top
        _memory_ladder(state, sample, spec, now, actions, rollout)
        _restore_primary(state, pod, spec, now, actions, rollout)

    if not fresh:
        return state, actions  # nothing fresh: no breaker moves on stale data

    state.p99_millis = _service_p99_millis(state, fresh)
    ratios = [s.quality_failure_ratio for s in fresh if s.quality_failure_ratio is not None]
    state.quality_ratio = max(ratios) if ratios else None
    half_open_p99 = (
        _half_open_p99_millis(state, fresh) if state.breaker is BreakerState.HALF_OPEN else None
    )
    tripped = _latency_breaker(state, state.p99_millis, calls, spec, now, half_open_p99)
    _degradation(state, tripped, state.quality_ratio, spec, now)
    return state, actions


def admit_percent(state: PolicyState, spec: InferenceServiceSpec) -> int:
    """Share of new requests each pod admits in the current breaker state."""
    if state.breaker is BreakerState.OPEN:
        return 0
    if state.breaker is BreakerState.HALF_OPEN:
        return spec.breaker.half_open.admit_percent
    return 100
