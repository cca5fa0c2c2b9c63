"""A pod's RSS and GPU memory against their limits: the ratio, the trend, the time left.

Why: the resource ladder acts on a reading, not on a raw figure: how full a
limit is, how fast it fills (a least-squares slope over the window, so one
noisy scrape moves nothing) and when it would be full at that pace. The
arithmetic is kept apart from the decisions so each is tested on its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fusebox_operator.observations import PodSample
from fusebox_operator.policy_state import PolicyState
from fusebox_operator.spec import InferenceServiceSpec

MIB = 1024**2
HARD_RATIO = 0.95
"""Above this share of a limit a pod is acted on whatever the slope."""
MIN_SLOPE_POINTS = 3
NOISE_BYTES = 32 * MIB
"""A fitted rise smaller than this across its points is jitter, not growth: a serving
process's RSS moves by a few MiB with its batches and CUDA's allocator reserves in
20 MiB blocks. Without it a flat pod showed OOM-IN 52h, 9h, 1009h from tick to tick."""


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


def time_to_limit_seconds(
    points: Sequence[tuple[float, float]], limit: float, noise: float = 0.0
) -> float | None:
    """Seconds until memory reaches `limit` from its latest value at the least-squares growth
    of the (t, value) points: the sooner of the fit over all of them (a steady leak) and
    over the last MIN_SLOPE_POINTS (a leak that just sped up, which the whole window would
    average with the flat minutes before it). A fit whose rise across its points is below
    `noise` is no growth. None with too few points or no growth."""
    if len(points) < MIN_SLOPE_POINTS:
        return None
    growing = []
    for fitted in (points, points[-MIN_SLOPE_POINTS:]):
        slope = least_squares_slope(fitted)
        if slope is not None and slope > 0 and slope * (fitted[-1][0] - fitted[0][0]) > noise:
            growing.append(slope)
    if not growing:
        return None
    return max(0.0, (limit - points[-1][1]) / max(growing))


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
        seconds_to_limit = time_to_limit_seconds(points, limit, NOISE_BYTES)
        readings.append(
            ResourceReading(resource, ratio, slope, triggered, reason, seconds_to_limit, over)
        )
    return readings
