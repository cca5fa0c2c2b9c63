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
import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from fusebox_contract.names import BreakerState, Variant
from fusebox_operator.latency import (
    LATENCY_WINDOW_SECONDS,
    Buckets,
    Snapshot,
    remember,
    window_quantile,
)
from fusebox_operator.rollout import Rollout
from fusebox_operator.spec import InferenceServiceSpec

MIB = 1024**2
HARD_RATIO = 0.95
"""Above this share of a limit a pod is acted on whatever the slope."""
STALE_INTERVALS = 3
MIN_SLOPE_POINTS = 3


class ActionKind(enum.StrEnum):
    GC = "gc"
    EMPTY_CACHE = "empty_cache"
    GROW_LIMIT = "grow_limit"  # resize the server's memory limit in place (no restart)
    RELOAD = "reload"  # unload, then load the same variant
    SWAP_FALLBACK = "swap_fallback"
    RESTORE_PRIMARY = "restore_primary"
    RESTART = "restart"  # delete the pod; the Deployment replaces it
    DRAIN = "drain"  # delete a pod whose GPU went Unhealthy; its replacement gets a healthy one


DISRUPTIVE: frozenset[ActionKind] = frozenset(
    {ActionKind.RELOAD, ActionKind.SWAP_FALLBACK, ActionKind.RESTORE_PRIMARY, ActionKind.RESTART}
)
"""Actions that take a pod out of service: they roll through the pods one at a time."""
MAX_ATTEMPTS = 5
"""An action whose outcome stays unknown is retried (same id) at most this often."""

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


@dataclass(frozen=True)
class RequestCounts:
    """Monotonic request counters of one pod (fusebox_requests_total by outcome).

    The server counts each request once, under one outcome, so the sum of
    the calls below is the number of requests that ran.
    """

    succeeded: float = 0
    failed: float = 0
    rejected: float = 0
    timed_out: float = 0
    cancelled: float = 0
    invalid: float = 0

    @property
    def calls(self) -> float:
        """Requests that ran to a verdict, as resilience4j counts calls.

        Rejections (429/503: not permitted), invalid requests (the caller's
        4xx, never queued) and cancellations (the client left: neither a
        success nor a failure of the service) are not calls.
        """
        return self.succeeded + self.failed + self.timed_out

    def since(self, earlier: RequestCounts | None) -> RequestCounts:
        if earlier is None:
            return RequestCounts()
        values = []
        for now_value, then_value in zip(self.as_tuple(), earlier.as_tuple(), strict=True):
            # A counter that went down means the process restarted: count from zero.
            values.append(now_value - then_value if now_value >= then_value else now_value)
        return RequestCounts(*values)

    def plus(self, other: RequestCounts) -> RequestCounts:
        return RequestCounts(
            *(a + b for a, b in zip(self.as_tuple(), other.as_tuple(), strict=True))
        )

    def as_tuple(self) -> tuple[float, float, float, float, float, float]:
        return (
            self.succeeded,
            self.failed,
            self.rejected,
            self.timed_out,
            self.cancelled,
            self.invalid,
        )


@dataclass(frozen=True)
class PodSample:
    """One scrape of one pod's sidecar; None means "not measured", never zero."""

    pod: str
    sampled_at: float
    ok: bool = True
    rss_bytes: float | None = None
    memory_limit_bytes: float | None = None
    gpu_memory_used_bytes: float | None = None
    gpu_memory_total_bytes: float | None = None
    latency_p99_seconds: float | None = None  # the server's own window; shown per pod
    # The breaker's latency histogram, cumulative since the server started: what
    # the breaker's p99 comes from (latency.py). None from a sidecar without one.
    latency_buckets: Buckets | None = None
    quality_failure_ratio: float | None = None
    stats_age_seconds: float | None = None
    heartbeat_age_seconds: float | None = None
    requests: RequestCounts | None = None
    breaker_state: BreakerState | None = None
    degradation_level: int | None = None
    model_loaded: bool | None = None
    variant: Variant | None = None  # the variant the server reports serving
    converging: bool | None = None  # the server is still moving to its target variant
    queue_length: float | None = None
    requests_running: float | None = None  # generating now (queue_length waits for a slot)
    tokenizer_cache_entries: float | None = None
    cuda_contexts: float | None = None
    fallback_configured: bool | None = None  # a fallback is configured on the server
    # False: this server cannot swap to a fallback (none configured, or the
    # device cannot serve its quantization); None: not reported.
    fallback_available: bool | None = None
    fallback_unavailable_reason: str | None = None  # the server's words, when it gave them
    # The node's memory as the pod sees it (node_pressure): MemAvailable, MemTotal and
    # the share of the last 10 s with some / all tasks stalled on memory (PSI).
    node_available_bytes: float | None = None
    node_total_bytes: float | None = None
    node_pressure_some: float | None = None
    node_pressure_full: float | None = None
    error: str = ""

    @property
    def cannot_swap(self) -> bool:
        """The server said it cannot swap to a fallback: the fallback tier leaves it alone."""
        return self.ok and self.fallback_available is False


def swaps_to_fallback(spec: InferenceServiceSpec, sample: PodSample | None) -> bool:
    """Whether level 2 and the ladder's swap step move this pod to a fallback.

    Only with a fallback in the spec, and not on a pod whose server reported
    that it cannot load it (a device without CUDA for int4/fp8): that pod is
    a pod without a fallback. Not reported (an older sidecar, a failed
    scrape) counts as able, as before the server could say so.
    """
    return spec.fallback is not None and not (sample is not None and sample.cannot_swap)


@dataclass(frozen=True)
class Action:
    id: str
    kind: ActionKind
    pod: str
    reason: str
    at: float
    variant: Variant = Variant.PRIMARY  # the variant a reload loads / a swap targets
    attempts: int = 1  # how often it was sent; a retry reuses the id
    memory_limit_bytes: int | None = None  # the limit a grow-limit action resizes to

    def to_status(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "id": self.id,
            "kind": self.kind.value,
            "pod": self.pod,
            "reason": self.reason,
            "at": self.at,
            "variant": self.variant.value,
            "attempts": self.attempts,
        }
        if self.memory_limit_bytes is not None:
            entry["memoryLimitBytes"] = self.memory_limit_bytes
        return entry

    @classmethod
    def from_status(cls, raw: Mapping[str, Any]) -> Action:
        return cls(
            id=str(raw["id"]),
            kind=ActionKind(raw["kind"]),
            pod=str(raw["pod"]),
            reason=str(raw.get("reason", "")),
            at=float(raw.get("at", 0.0)),
            variant=Variant(raw.get("variant", Variant.PRIMARY)),
            attempts=int(raw.get("attempts", 1)),
            memory_limit_bytes=(
                int(raw["memoryLimitBytes"]) if raw.get("memoryLimitBytes") is not None else None
            ),
        )


@dataclass
class Ladder:
    """Where one pod stands on the ladder for one resource (rss, gpu, wedge)."""

    step: int = 0  # the next rung to try
    last_action_at: float | None = None
    calm_since: float | None = None
    acted_step: int | None = None  # the rung of the last action, until it is judged


@dataclass
class PolicyState:
    """Everything decide() remembers. `to_status` keeps what must survive a restart."""

    service_id: str
    memory_limit_bytes: float | None = None
    sequence: int = 0
    breaker: BreakerState = BreakerState.CLOSED
    breaker_since: float = 0.0
    breaker_reason: str = ""
    trips: int = 0
    slow_since: float | None = None
    slow_calls: float = 0.0
    half_open_counts: RequestCounts = RequestCounts()
    level: int = 0
    level_since: float = 0.0
    level_reason: str = ""
    healthy_since: float | None = None
    ladders: dict[str, Ladder] = field(default_factory=dict)  # key "pod/resource"
    variants: dict[str, Variant] = field(default_factory=dict)  # pods swapped by the ladder
    swapped_at: dict[str, float] = field(default_factory=dict)
    last_counts: dict[str, RequestCounts] = field(default_factory=dict)
    last_restart_at: float | None = None
    # Sent, outcome unknown (the call timed out): retried with the same id,
    # and the pod gets no other action until it settles.
    in_flight: dict[str, Action] = field(default_factory=dict)
    # In memory only: rebuilt after a restart by fresh scrapes.
    history: dict[str, list[tuple[float, float | None, float | None]]] = field(default_factory=dict)
    latency_history: dict[str, list[Snapshot]] = field(default_factory=dict)  # pod -> buckets
    first_seen: dict[str, float] = field(default_factory=dict)
    last_fresh: dict[str, float] = field(default_factory=dict)
    served_once: set[str] = field(default_factory=set)  # pods whose stats were fresh once
    stale_pods: set[str] = field(default_factory=set)
    quality_ratio: float | None = None
    p99_millis: float | None = None
    # Pods whose server cannot swap to the spec's fallback -> its reason. In memory
    # only: a new entry is one FallbackUnavailable event, so after an operator
    # restart each such pod is named once more.
    fallback_unavailable: dict[str, str] = field(default_factory=dict)
    # Pod -> the soonest its memory reaches a limit at the current growth, in seconds;
    # absent while nothing grows. In memory only (status shows it, refreshed each tick).
    time_to_oom: dict[str, float] = field(default_factory=dict)

    def to_status(self) -> dict[str, Any]:
        """The persisted part (status.policy), JSON-safe."""
        return {
            "sequence": self.sequence,
            "breakerSince": self.breaker_since,
            "slowSince": self.slow_since,
            "slowCalls": self.slow_calls,
            "halfOpenCounts": list(self.half_open_counts.as_tuple()),
            "levelSince": self.level_since,
            "healthySince": self.healthy_since,
            # Lists, not maps: a merge patch replaces a list whole, so an entry
            # dropped here is dropped from the stored status too.
            # An entry's absent value is an absent key, never null: the API server
            # prunes nulls from a list's entries, the stored status then differs from
            # the patch, and kopf warns "Merge-patching finished with inconsistencies".
            "ladders": [
                without_nulls(
                    {
                        "key": key,
                        "step": lad.step,
                        "lastActionAt": lad.last_action_at,
                        "calmSince": lad.calm_since,
                        "actedStep": lad.acted_step,
                    }
                )
                for key, lad in sorted(self.ladders.items())
            ],
            "pods": [
                without_nulls(
                    {
                        "pod": pod,
                        "variant": self.variants.get(pod),
                        "swappedAt": self.swapped_at.get(pod),
                        "counts": list(self.last_counts[pod].as_tuple())
                        if pod in self.last_counts
                        else None,
                    }
                )
                for pod in sorted(set(self.variants) | set(self.last_counts))
            ],
            "lastRestartAt": self.last_restart_at,
            "inFlight": [action.to_status() for _, action in sorted(self.in_flight.items())],
        }

    @classmethod
    def from_status(
        cls, service_id: str, status: Mapping[str, Any], memory_limit_bytes: float | None = None
    ) -> PolicyState:
        """Rebuild after an operator restart from the object's status (missing parts default)."""
        policy = status.get("policy") or {}
        pods = [p for p in policy.get("pods") or [] if isinstance(p, Mapping) and "pod" in p]
        breaker = status.get("breaker") or {}
        degradation = status.get("degradation") or {}
        try:
            breaker_state = BreakerState.from_status_name(
                breaker.get("state", BreakerState.CLOSED.status_name)
            )
        except ValueError:
            breaker_state = BreakerState.CLOSED
        in_flight = []
        for raw in policy.get("inFlight") or []:
            try:
                in_flight.append(Action.from_status(raw))
            except (KeyError, TypeError, ValueError):
                continue  # an entry this version cannot read is dropped, not fatal
        return cls(
            service_id=service_id,
            memory_limit_bytes=memory_limit_bytes,
            sequence=int(policy.get("sequence", 0)),
            breaker=breaker_state,
            breaker_since=float(policy.get("breakerSince", 0.0)),
            breaker_reason=str(breaker.get("reason", "")),
            trips=int(breaker.get("trips", 0)),
            slow_since=policy.get("slowSince"),
            slow_calls=float(policy.get("slowCalls", 0.0)),
            half_open_counts=RequestCounts(*policy.get("halfOpenCounts", (0, 0, 0, 0))),
            level=int(degradation.get("level", 0)),
            level_since=float(policy.get("levelSince", 0.0)),
            level_reason=str(degradation.get("reason", "")),
            healthy_since=policy.get("healthySince"),
            ladders={
                str(v["key"]): Ladder(
                    int(v.get("step", 0)),
                    v.get("lastActionAt"),
                    v.get("calmSince"),
                    v.get("actedStep"),
                )
                for v in (policy.get("ladders") or [])
                if isinstance(v, Mapping) and "key" in v
            },
            variants={
                str(p["pod"]): Variant(p["variant"])
                for p in pods
                if p.get("variant") in tuple(Variant)
            },
            swapped_at={
                str(p["pod"]): float(p["swappedAt"]) for p in pods if p.get("swappedAt") is not None
            },
            last_counts={
                str(p["pod"]): RequestCounts(*p["counts"])
                for p in pods
                if p.get("counts") is not None
            },
            last_restart_at=policy.get("lastRestartAt"),
            in_flight={action.id: action for action in in_flight},
        )

    def pod_variant(self, pod: str) -> Variant:
        """The variant the ladder left this pod on (primary unless it swapped it)."""
        return self.variants.get(pod, Variant.PRIMARY)

    def busy_pods(self) -> set[str]:
        """Pods with an action in flight: they get no other action until it settles."""
        return {action.pod for action in self.in_flight.values()}

    def settle(self, action: Action, settled: bool) -> bool:
        """Record an executed action: settled, or in flight for a retry with the same id.

        True when it is done with (settled, or given up after MAX_ATTEMPTS).
        """
        if settled and action.kind in (ActionKind.RESTART, ActionKind.DRAIN):
            # The pod is gone: whatever was in flight on it died with it.
            for action_id in [i for i, a in self.in_flight.items() if a.pod == action.pod]:
                del self.in_flight[action_id]
        if settled or action.attempts >= MAX_ATTEMPTS:
            self.in_flight.pop(action.id, None)
            return True
        self.in_flight[action.id] = replace(action, attempts=action.attempts + 1)
        return False


def least_squares_slope(points: Sequence[tuple[float, float]]) -> float | None:
    """Slope (units per second) of the least-squares line through (t, value) points."""
    if len(points) < 2:
        return None
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var_t = sum((t - mean_t) ** 2 for t, _ in points)
    if var_t == 0:
        return None
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / var_t


def time_to_limit_seconds(points: Sequence[tuple[float, float]], limit: float) -> float | None:
    """Seconds until memory reaches `limit` from its latest value at the least-squares growth
    of the (t, value) points: the sooner of the fit over all of them (a steady leak) and
    over the last MIN_SLOPE_POINTS (a leak that just sped up, which the whole window would
    average with the flat minutes before it). None with too few points or no growth."""
    if len(points) < MIN_SLOPE_POINTS:
        return None
    slopes = [least_squares_slope(points), least_squares_slope(points[-MIN_SLOPE_POINTS:])]
    growing = [slope for slope in slopes if slope is not None and slope > 0]
    if not growing:
        return None
    return max(0.0, (limit - points[-1][1]) / max(growing))


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


def _mib(value_bytes: float) -> str:
    return f"{value_bytes / MIB:.0f} MiB"


@dataclass(frozen=True)
class ResourceReading:
    resource: str  # "rss" | "gpu"
    ratio: float
    slope_mib_per_minute: float | None
    triggered: bool
    reason: str
    seconds_to_limit: float | None = None  # at the fitted growth; None when not growing
    over: bool = False  # above the ratio threshold, growing or not

    @property
    def judgeable(self) -> bool:
        """Whether "not triggered" means anything: back under the ratio, or a trend
        measured. Above the ratio with no trend yet (a restarted operator has no
        history) is neither a cure nor calm."""
        return not self.over or self.slope_mib_per_minute is not None


def read_resources(
    state: PolicyState, pod: str, sample: PodSample, spec: InferenceServiceSpec
) -> list[ResourceReading]:
    """RSS against the memory limit and GPU memory against VRAM, with their trends."""
    thresholds = spec.breaker.resource
    window_start = sample.sampled_at - thresholds.window_seconds
    history = [p for p in state.history.get(pod, []) if p[0] >= window_start]
    readings = []
    rss_limit = sample.memory_limit_bytes or state.memory_limit_bytes
    candidates = (
        ("rss", sample.rss_bytes, rss_limit, 1, thresholds.rss, "RSS", "of the memory limit"),
        (
            "gpu",
            sample.gpu_memory_used_bytes,
            sample.gpu_memory_total_bytes,
            2,
            thresholds.gpu_memory,
            "GPU memory",
            "of VRAM",
        ),
    )
    for resource, value, limit, column, threshold, label, of_what in candidates:
        if value is None or not limit:
            continue
        ratio = value / limit
        points = [(p[0], v) for p in history if (v := p[column]) is not None]
        slope_per_second = least_squares_slope(points) if len(points) >= MIN_SLOPE_POINTS else None
        slope = None if slope_per_second is None else slope_per_second * 60 / MIB
        over = ratio > threshold.ratio
        growing = slope is not None and slope > threshold.growth_mib_per_minute
        triggered = ratio > HARD_RATIO or (over and growing)
        trend = "" if slope is None else f", {slope:+.0f} MiB/min"
        reason = f"{label} {_mib(value)} = {ratio:.0%} {of_what}{trend}"
        seconds_to_limit = time_to_limit_seconds(points, limit)
        readings.append(
            ResourceReading(resource, ratio, slope, triggered, reason, seconds_to_limit, over)
        )
    return readings


def without_nulls(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The entry without its None values (a list entry of status.policy)."""
    return {key: value for key, value in entry.items() if value is not None}


def next_action_id(state: PolicyState, kind: ActionKind) -> str:
    """A new idempotency id for an action decided outside `decide` (gpu_health)."""
    return _next_id(state, kind)


def _next_id(state: PolicyState, kind: ActionKind) -> str:
    state.sequence += 1
    return f"{state.service_id}-{state.sequence:06d}-{kind.value.replace('_', '-')}"


def _forget_pod(state: PolicyState, pod: str) -> None:
    for key in [k for k in state.ladders if k.split("/", 1)[0] == pod]:
        del state.ladders[key]
    for mapping in (
        state.variants,
        state.swapped_at,
        state.last_counts,
        state.history,
        state.latency_history,
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
                _next_id(state, kind), kind, pod, reason, now, variant, memory_limit_bytes=grow_to
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
    actions.append(Action(_next_id(state, kind), kind, pod, reason, now, Variant.PRIMARY))
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
    actions.append(Action(_next_id(state, kind), kind, sample.pod, reason, now))
    ladder.step, ladder.last_action_at = 1, now
    state.last_restart_at = now
    return True


def _latency_breaker(
    state: PolicyState,
    p99_millis: float | None,
    calls: RequestCounts,
    spec: InferenceServiceSpec,
    now: float,
) -> bool:
    """Advance the service's latency breaker; True when it tripped (-> OPEN) just now."""
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
            state.breaker_reason = (
                f"open for {spec.breaker.open_seconds:g} s: admitting {half.admit_percent}% "
                f"until {half.min_requests} requests decide"
            )
        return False
    # HALF_OPEN: only results seen while half-open decide.
    state.half_open_counts = state.half_open_counts.plus(calls)
    seen = state.half_open_counts
    if seen.calls < half.min_requests or p99_millis is None:
        return False
    success_rate = seen.succeeded / seen.calls
    summary = (
        f"{seen.calls:.0f} half-open requests: p99 {metric} {p99_millis:.0f} ms "
        f"(recovery < {half.p99_recovery_millis:g} ms), success {success_rate:.1%} "
        f"(need >= {half.min_success_rate:.1%})"
    )
    if p99_millis < half.p99_recovery_millis and success_rate >= half.min_success_rate:
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
    levels = spec.degradation.levels
    max_rate = spec.breaker.quality.max_failure_rate
    quality_bad = quality_ratio is not None and quality_ratio > max_rate
    quality_target = 2 if 2 in levels else max(levels, default=0)
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


def decide(
    state: PolicyState,
    samples: Iterable[PodSample],
    now: float,
    spec: InferenceServiceSpec,
    rollout: Rollout | None = None,
) -> tuple[PolicyState, list[Action]]:
    """One control-loop step: new state and the actions to execute, in order.

    `samples` holds the latest scrape of every pod that currently exists
    (failed scrapes included, with ok=False); pods absent from it are gone.
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
    known = (
        set(state.first_seen)
        | set(state.last_counts)
        | {key.split("/", 1)[0] for key in state.ladders}
        | set(state.variants)
        | state.busy_pods()
    )
    for pod in known - present:
        _forget_pod(state, pod)

    fresh: list[PodSample] = []
    for sample in samples:
        state.first_seen.setdefault(sample.pod, now)
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
    tripped = _latency_breaker(state, state.p99_millis, calls, spec, now)
    _degradation(state, tripped, state.quality_ratio, spec, now)
    return state, actions


def admit_percent(state: PolicyState, spec: InferenceServiceSpec) -> int:
    """Share of new requests each pod admits in the current breaker state."""
    if state.breaker is BreakerState.OPEN:
        return 0
    if state.breaker is BreakerState.HALF_OPEN:
        return spec.breaker.half_open.admit_percent
    return 100
