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
scale-down the highest of the down window (load must stay low). Pods that
report no load (not ready, or not measured) count as the HPA counts them: at
the target when the load would scale down, idle when it would scale up. Every
change is a decision with a reason and a message, which the tick turns into
an event.

Beyond the HPA: a saturated service is never scaled down. A pod's queue
cannot exceed server.maxQueue, so its load reads low exactly when it is full;
while every pod's queue and slots are full, or any pod refused a request
(429) since the last tick, the recommendation is at least the current count.
(The spec check makes the metric able to pass the target, so the load itself
asks for the scale-up.)

Pure: a function of the spec, this tick's samples, the pods and the
recommendations remembered from earlier ticks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from fusebox_contract.names import EventReason
from fusebox_contract.wiring import GPU_RESOURCE
from fusebox_operator.observations import PodSample
from fusebox_operator.spec import AUTOSCALING_TOLERANCE, AutoscalingMetric, AutoscalingSpec

# What the scheduler says of a pod it cannot place for want of a GPU: through
# the device plugin, and through a ResourceClaim (spec.gpu.deviceClassName).
GPU_SHORTAGE_MESSAGES = (f"Insufficient {GPU_RESOURCE}", "cannot allocate all claims")
TOLERANCE = AUTOSCALING_TOLERANCE  # |load / target - 1| within this: hold


@dataclass(frozen=True)
class Recommendation:
    at: float
    replicas: int
    # Each pod's count of refused requests (429) as that tick saw it: the next tick
    # tells a pod refusing work by its count going up.
    rejected: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class ScaleDecision:
    replicas: int  # what the Deployment should run
    recommended: int  # this tick's raw recommendation
    load: float | None  # the total load it came from; None when nothing was measured
    history: tuple[Recommendation, ...]
    reason: EventReason | None = None  # set when this tick changes the count or is held back
    message: str = ""
    blocked: bool = False  # scale-up held back: pods already Pending for lack of GPUs


def pod_load(sample: PodSample, metric: AutoscalingMetric) -> float | None:
    """The pod's load in the target's unit; None when its sidecar did not say."""
    if not sample.ok or sample.queue_length is None:
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
    """The pods that refused a request (429) since the last tick saw them."""
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


def queues_full(samples: Sequence[PodSample], spec: AutoscalingSpec) -> bool:
    """Whether every measured pod's queue and slots are full: its next request gets a 429."""
    if spec.pod_max_queue is None or spec.pod_max_concurrency is None:
        return False
    measured = [
        s for s in samples if s.ok and s.queue_length is not None and s.requests_running is not None
    ]
    return bool(measured) and all(
        s.queue_length is not None
        and s.requests_running is not None
        and s.queue_length >= spec.pod_max_queue
        and s.requests_running >= spec.pod_max_concurrency
        for s in measured
    )


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


def decide_scale(
    spec: AutoscalingSpec,
    current: int,
    samples: Sequence[PodSample],
    pending_for_gpu: Sequence[str],
    history: Sequence[Recommendation],
    now: float,
) -> ScaleDecision:
    """The count for this tick: the recommendation through the stabilization windows."""
    measured = [load for s in samples if (load := pod_load(s, spec.metric)) is not None]
    recommended = recommend(current, measured, spec)
    if recommended < current and (
        queues_full(samples, spec) or refusing_pods(samples, history[-1] if history else None)
    ):
        recommended = current  # saturated: the load reads low because requests are refused
    keep = max(spec.scale_up_stabilization_seconds, spec.scale_down_stabilization_seconds)
    remembered = (
        *(r for r in history if now - r.at <= keep),
        Recommendation(now, recommended, rejected_counts(samples)),
    )
    load = sum(measured) if measured else None
    unit = spec.metric.value
    if recommended > current:
        window = [
            r.replicas for r in remembered if now - r.at <= spec.scale_up_stabilization_seconds
        ]
        wanted = max(current, min(window))
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
        window = [
            r.replicas for r in remembered if now - r.at <= spec.scale_down_stabilization_seconds
        ]
        wanted = min(current, max(window))
    else:
        wanted = current
    if wanted == current:
        return ScaleDecision(current, recommended, load, remembered)
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
        f"{current} -> {wanted} replicas: {measured_text}, target {per_replica:g} per replica",
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
