"""Autoscaling: how many replicas a service wants, from what its pods report.

Why the operator and not a HorizontalPodAutoscaler: the operator already
scrapes every pod each telemetry interval, so the load it needs (queue length,
requests in flight) is in hand without a metrics adapter and a Prometheus in
the path; and it alone knows what an HPA cannot: that pods already asked for
are Pending for lack of a GPU (asking for more only queues more), and that a
pod being reloaded by the ladder is busy, not idle.

The rule is the HPA's, so it behaves as platform teams expect: the wanted
count is the total load over the target per replica, rounded up, clamped to
[min, max]; within a tolerance of the target nothing moves; a scale-up takes
the lowest recommendation of the up window (load must stay high) and a
scale-down the highest of the down window (load must stay low); one step up
adds at most max(2 x current, current + 4) pods (the HPA's default policy), so
one spiky scrape never jumps to maxReplicas. Pods that report no current load
(not ready, not measured, or their server's stats invalid or older than
telemetry.wedgeAfterSeconds: a frozen figure is no load) count as the HPA
counts them: at the target when the load would scale down, idle when it would
scale up. Every change is a decision with a reason and a message, which the
tick turns into an event; so is a scale-down the down window holds back
(`WindowHold`), told once a hold (status.scale_down_held_events).

The windows live in the operator's memory. A restarted operator (or one that
took the service over) has seen no window, so its first tick counts the count
in place as asked for now: neither window moves it before a full window of
load has been seen, rather than one idle scrape scaling down at once.

Beyond the HPA: a saturated service is never scaled down. A pod's queue
cannot exceed server.maxQueue, so its load reads low exactly when it is full;
while every pod's queue and slots are full, or any pod refused a request
(429 or 503: queue full, breaker open, memory guard) since the last tick, the
recommendation is at least the current count, and the hold is told
(`ScaleHold`). (The spec check makes the metric able to pass the target, so
the load itself asks for the scale-up.) And with the queueLength metric, which
reads a pod with every slot generating and nothing waiting as idle, a
scale-down keeps the pods the running generations fill: at least
ceil(running / server.maxConcurrency), each pod not measured counted as one.

Pure: a function of the spec, this tick's samples, the pods and the
recommendations remembered from earlier ticks.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

from fusebox_contract.names import BreakerState, EventReason
from fusebox_contract.wiring import GPU_RESOURCE
from fusebox_operator.crd_schema import crd_default
from fusebox_operator.observations import PodSample
from fusebox_operator.spec import AUTOSCALING_TOLERANCE, AutoscalingMetric, AutoscalingSpec

# What the scheduler says of a pod it cannot place for want of a GPU: through
# the device plugin, and through a ResourceClaim (spec.gpu.deviceClassName).
GPU_SHORTAGE_MESSAGES = (f"Insufficient {GPU_RESOURCE}", "cannot allocate all claims")
TOLERANCE = AUTOSCALING_TOLERANCE  # |load / target - 1| within this: hold
# A pod's stats older than this are frozen, not load (the spec's telemetry.wedgeAfterSeconds;
# this default only for a caller that has no spec).
STALE_AFTER_SECONDS: float = crd_default("telemetry.wedgeAfterSeconds")
SCALE_UP_STEP_PODS = 4  # one step up adds at most max(2 x current, current + this)


class ScaleHold(enum.StrEnum):
    """Why a scale-down the load asked for was held: ScalingLimited's reason."""

    QUEUES_FULL = "QueuesFull"  # every measured pod's queue and slots are full
    PODS_REFUSING = "PodsRefusingRequests"  # a pod refused requests (429/503) lately


@dataclass(frozen=True)
class Recommendation:
    at: float
    replicas: int
    # Each pod's count of refused requests (429) as that tick saw it: the next tick
    # tells a pod refusing work by its count going up.
    rejected: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class WindowHold:
    """A scale-down the scale-down window holds back: the count stays the highest asked
    for within the window, and a count at least the current one is still in it."""

    replicas: int  # the count held
    # What the count goes to once the window lets go, the load staying as it is: the
    # highest count asked for since a count at least `replicas` was last asked for.
    # None on a tick whose load asks for `replicas` or more again: the hold goes on
    # while the window still holds lower counts, and its time moves on.
    wanted: int | None
    allowed_after: float  # when that last count at least `replicas` leaves the window
    window_seconds: float


@dataclass(frozen=True)
class ScaleDecision:
    replicas: int  # what the Deployment should run
    recommended: int  # this tick's raw recommendation
    load: float | None  # the total load it came from; None when nothing was measured
    history: tuple[Recommendation, ...]
    reason: EventReason | None = None  # set when this tick changes the count or is held back
    message: str = ""  # the event's words; with `hold`, why the count was held
    blocked: bool = False  # scale-up held back: pods already Pending for lack of GPUs
    hold: ScaleHold | None = None  # a scale-down the load asked for, held: the service refuses
    window_hold: WindowHold | None = None  # a scale-down the scale-down window holds back


def current_sample(sample: PodSample, stale_after_seconds: float) -> bool:
    """Whether the pod's figures are this scrape's: scraped, its server's stats valid and
    younger than `stale_after_seconds`. A frozen file's queue is no load, high or low."""
    return (
        sample.stats_observed
        and sample.stats_age_seconds is not None
        and sample.stats_age_seconds <= stale_after_seconds
    )


def pod_load(
    sample: PodSample, metric: AutoscalingMetric, stale_after_seconds: float = STALE_AFTER_SECONDS
) -> float | None:
    """The pod's load in the target's unit; None when its sidecar did not say, or said
    it from stats that are invalid or stale."""
    if not current_sample(sample, stale_after_seconds) or sample.queue_length is None:
        return None
    if metric is AutoscalingMetric.QUEUE_LENGTH:
        return sample.queue_length
    if sample.requests_running is None:
        return None
    return sample.queue_length + sample.requests_running


def rejected_counts(samples: Sequence[PodSample]) -> tuple[tuple[str, float], ...]:
    """Each measured pod's cumulative count of refused requests."""
    return tuple((s.pod, s.requests.rejected) for s in samples if s.ok and s.requests is not None)


def refusing_pods(samples: Sequence[PodSample], last: Recommendation | None) -> list[str]:
    """The pods that refused a request (429 or 503) since the last tick saw them."""
    if last is None:
        return []
    before = dict(last.rejected)
    refusing = []
    for pod, now_count in rejected_counts(samples):
        then = before.get(pod)
        # A count that went down means the server restarted: it counts from zero.
        if then is not None and (now_count > then or (now_count < then and now_count > 0)):
            refusing.append(pod)
    return sorted(refusing)


def refusal_cause(sample: PodSample, spec: AutoscalingSpec) -> str:
    """Why a pod refuses, as its report says ("" when it does not): a 503 of its breaker
    or memory guard, a 429 of its full queue. The count it rose in holds both."""
    if sample.breaker_state in (BreakerState.OPEN, BreakerState.HALF_OPEN):
        return f"breaker {sample.breaker_state.status_name}, 503"
    if sample.memory_guard_active:
        return "memory guard, 503"
    if (
        spec.pod_max_queue is not None
        and sample.queue_length is not None
        and sample.queue_length >= spec.pod_max_queue
    ):
        return "queue full, 429"
    return ""


def queues_full(
    samples: Sequence[PodSample],
    spec: AutoscalingSpec,
    stale_after_seconds: float = STALE_AFTER_SECONDS,
) -> bool:
    """Whether every measured pod's queue and slots are full: its next request gets a 429."""
    if spec.pod_max_queue is None or spec.pod_max_concurrency is None:
        return False
    measured = [
        s
        for s in samples
        if current_sample(s, stale_after_seconds)
        and s.queue_length is not None
        and s.requests_running is not None
    ]
    return bool(measured) and all(
        s.queue_length is not None
        and s.requests_running is not None
        and s.queue_length >= spec.pod_max_queue
        and s.requests_running >= spec.pod_max_concurrency
        for s in measured
    )


def slots_in_use_floor(
    current: int,
    samples: Sequence[PodSample],
    spec: AutoscalingSpec,
    stale_after_seconds: float = STALE_AFTER_SECONDS,
) -> int:
    """The fewest pods a scale-down may leave with the queueLength metric: those the
    running generations fill, ceil(running / server.maxConcurrency), each pod not
    measured counted as one (as a scale-down counts it at the target).

    queueLength reads a pod with every slot generating and nothing waiting as idle:
    scaled down on that, the load comes back as queue and asks for more pods, and
    steady load flaps. With inFlight the running requests are in the load already.
    """
    if spec.metric is not AutoscalingMetric.QUEUE_LENGTH or not spec.pod_max_concurrency:
        return 0
    measured = _measured(samples, stale_after_seconds)
    running = sum(s.requests_running or 0.0 for s in measured)
    return math.ceil(running / spec.pod_max_concurrency) + max(0, current - len(measured))


def _measured(samples: Sequence[PodSample], stale_after_seconds: float) -> list[PodSample]:
    """The pods whose queue is current: those `pod_load` counts with queueLength."""
    return [
        s for s in samples if current_sample(s, stale_after_seconds) and s.queue_length is not None
    ]


def recommend(current: int, loads: Sequence[float], spec: AutoscalingSpec) -> int:
    """The replica count the measured load asks for, clamped to [min, max].

    `loads` are the pods that reported one; the rest of the `current` pods
    (not ready: starting, rolling, reloading, crash-looping; or not measured)
    are counted as the HPA counts them. The measured pods' average decides
    the direction. Going down, an unmeasured pod counts as carrying the
    target: a pod out of service for a moment is not idle, and its requests
    come back with it. Going up, it counts as carrying nothing: only load
    actually seen asks for more pods. A direction the unmeasured pods
    would reverse holds the count.
    """
    if not loads:
        return max(spec.min_replicas, min(spec.max_replicas, current))
    target = spec.target_per_replica
    total = sum(loads)
    unmeasured = max(0, current - len(loads))
    ratio = total / len(loads) / target
    if current >= 1 and abs(ratio - 1) <= TOLERANCE:
        wanted = current
    elif ratio > 1:
        wanted = max(current, math.ceil(total / target))
    else:
        wanted = min(current, math.ceil((total + unmeasured * target) / target))
    return max(spec.min_replicas, min(spec.max_replicas, wanted))


def scale_up_step_limit(current: int) -> int:
    """The most pods one step up may reach: the HPA's default scale-up policy (double, or
    four more, whichever is more), so one spiky scrape never jumps to maxReplicas."""
    return max(2 * current, current + SCALE_UP_STEP_PODS)


def _held_down(
    current: int,
    samples: Sequence[PodSample],
    spec: AutoscalingSpec,
    last: Recommendation | None,
    stale_after_seconds: float,
) -> tuple[ScaleHold, str] | None:
    """Why the scale-down the load asks for is held: the service refuses work. The words
    hold no figure that moves each scrape, so ScalingLimited is rewritten once a spell."""
    refusing = refusing_pods(samples, last)
    if refusing:
        by_pod = {s.pod: s for s in samples}
        causes = {pod: refusal_cause(by_pod[pod], spec) for pod in refusing}
        named = ", ".join(f"{pod} ({why})" if why else pod for pod, why in causes.items())
        return ScaleHold.PODS_REFUSING, (
            f"scale-down held at {current}: pods refused requests since the last interval "
            f"({named}); their load reads low while they refuse"
        )
    if queues_full(samples, spec, stale_after_seconds):
        return ScaleHold.QUEUES_FULL, (
            f"scale-down held at {current}: every measured pod's queue ({spec.pod_max_queue}) "
            f"and slots ({spec.pod_max_concurrency}) are full; its load reads low"
        )
    return None


def _window(
    remembered: Sequence[Recommendation], recommended: int, now: float, seconds: float
) -> list[int]:
    """The counts asked for over the last `seconds`: this tick's alone for a window of 0."""
    if seconds <= 0:
        return [recommended]
    return [r.replicas for r in remembered if now - r.at <= seconds]


def window_hold(
    remembered: Sequence[Recommendation], current: int, now: float, seconds: float
) -> WindowHold | None:
    """The scale-down the down window holds back at `current`, if any: one while a count
    below `current` asked for is still in the window (None with no window)."""
    if seconds <= 0:
        return None
    window = [r for r in remembered if now - r.at <= seconds]
    if not any(r.replicas < current for r in window):
        return None
    last_high = max((i for i, r in enumerate(window) if r.replicas >= current), default=None)
    if last_high is None:
        return None  # nothing holds the count: the window lets it go this tick
    since = [r.replicas for r in window[last_high + 1 :]]
    return WindowHold(
        current, max(since) if since else None, window[last_high].at + seconds, seconds
    )


def decide_scale(
    spec: AutoscalingSpec,
    current: int,
    samples: Sequence[PodSample],
    pending_for_gpu: Sequence[str],
    history: Sequence[Recommendation],
    now: float,
    *,
    stale_after_seconds: float = STALE_AFTER_SECONDS,
) -> ScaleDecision:
    """The count for this tick: the recommendation through the stabilization windows.

    `history` empty (a restarted operator, a handover, a new service): the count in
    place counts as asked for now, so the windows hold it for a full window.
    """
    if not history:
        history = (Recommendation(now, current),)
    measured = [
        load for s in samples if (load := pod_load(s, spec.metric, stale_after_seconds)) is not None
    ]
    recommended = recommend(current, measured, spec)
    filled = ""
    if recommended < current:
        floor = slots_in_use_floor(current, samples, spec, stale_after_seconds)
        if floor > recommended:
            recommended = min(current, floor)
            running = sum(
                s.requests_running or 0.0 for s in _measured(samples, stale_after_seconds)
            )
            filled = f"; the {running:g} requests generating keep {floor} pod(s)"
    held = None
    if recommended < current:
        held = _held_down(current, samples, spec, history[-1], stale_after_seconds)
        if held is not None:
            recommended = current  # saturated: the load reads low because requests are refused
    keep = max(spec.scale_up_stabilization_seconds, spec.scale_down_stabilization_seconds)
    remembered = (
        *(r for r in history if now - r.at <= keep),
        Recommendation(now, recommended, rejected_counts(samples)),
    )
    load = sum(measured) if measured else None
    unit = spec.metric.value
    capped = ""
    if recommended > current:
        window = _window(remembered, recommended, now, spec.scale_up_stabilization_seconds)
        wanted = max(current, min(window))
        step = scale_up_step_limit(current)
        if wanted > step:
            capped = (
                f"; load asks for {wanted}, one step adds at most max(2 x {current}, "
                f"{current} + {SCALE_UP_STEP_PODS})"
            )
            wanted = step
        if wanted > current and pending_for_gpu:
            pods = ", ".join(sorted(pending_for_gpu))
            return ScaleDecision(
                current,
                recommended,
                load,
                remembered,
                EventReason.SCALE_UP_BLOCKED,
                f"load {load:g} ({unit}) asks for {recommended} replicas; holding at {current}: "
                f"pods Pending for lack of GPUs ({pods})",
                blocked=True,
            )
    elif recommended < current:
        window = _window(remembered, recommended, now, spec.scale_down_stabilization_seconds)
        wanted = min(current, max(window))
    else:
        wanted = current
    if wanted == current:
        if held is not None:
            return ScaleDecision(
                current, recommended, load, remembered, message=held[1], hold=held[0]
            )
        delayed = window_hold(remembered, current, now, spec.scale_down_stabilization_seconds)
        return ScaleDecision(current, recommended, load, remembered, window_hold=delayed)
    reason = EventReason.SCALED_UP if wanted > current else EventReason.SCALED_DOWN
    per_replica = spec.target_per_replica
    measured_text = f"load {load:g} ({unit})" if load is not None else "no load measured"
    unmeasured = current - len(measured)
    if measured and unmeasured > 0:
        counted = "at the target" if wanted < current else "idle"
        measured_text += (
            f" from {len(measured)} pod(s), {unmeasured} not measured counted {counted}"
        )
    return ScaleDecision(
        wanted,
        recommended,
        load,
        remembered,
        reason,
        f"{current} -> {wanted} replicas: {measured_text}, target {per_replica:g} per replica"
        + capped
        + filled,
    )


def pending_for_gpu(unschedulable: dict[str, str]) -> list[str]:
    """The pods the scheduler left Pending because no node has a free GPU.

    The device plugin's GPUs: "Insufficient nvidia.com/gpu"; a ResourceClaim's
    (the only claim the operator's pods make): "cannot allocate all claims".
    """
    return sorted(
        pod
        for pod, message in unschedulable.items()
        if any(sign in message for sign in GPU_SHORTAGE_MESSAGES)
    )
