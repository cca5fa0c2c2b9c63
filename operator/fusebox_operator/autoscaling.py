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
from fusebox_operator.spec import AutoscalingMetric, AutoscalingSpec

# |load / target - 1| within this: hold (the HPA's default tolerance).
# What the scheduler says of a pod it cannot place for want of a GPU: through
# the device plugin, and through a ResourceClaim (spec.gpu.deviceClassName).
GPU_SHORTAGE_MESSAGES = (f"Insufficient {GPU_RESOURCE}", "cannot allocate all claims")
TOLERANCE = 0.1


@dataclass(frozen=True)
class Recommendation:
    at: float
    replicas: int


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
    keep = max(spec.scale_up_stabilization_seconds, spec.scale_down_stabilization_seconds)
    remembered = (
        *(r for r in history if now - r.at <= keep),
        Recommendation(now, recommended),
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
