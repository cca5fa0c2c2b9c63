"""The local last-resort memory guard, which works with no operator at all.

Why: the operator acts on trends every few seconds; a leak can outrun it.
When RSS or the cgroup working set passes `--memory-guard-ratio` (95%) of
the cgroup memory limit, or CUDA reserved memory passes it of the device's
memory, the server refuses new requests with 503 (so no new allocation
pushes it over), runs gc and empty_cache, and reports
`state.memory_guard_active` in the stats file. It lets requests in again
once pressure is 5 points under the ratio (hysteresis, so it does not
flap). Requests already running finish. Before it trips, memory within
`PREFIX_CACHE_SHED_MARGIN` of the ratio empties the prefix cache.
"""

from __future__ import annotations

from dataclasses import dataclass

HYSTERESIS = 0.05
# The prefix cache is emptied this far below the guard's ratio: it is memory the server
# holds only to go faster, so it goes before any request is refused. Twice the
# hysteresis, so shedding starts below where an engaged guard would let requests back.
PREFIX_CACHE_SHED_MARGIN = 2 * HYSTERESIS


@dataclass(frozen=True)
class MemoryReading:
    rss_bytes: int | None
    cgroup_usage_bytes: int | None
    cgroup_limit_bytes: int | None
    cuda_reserved_bytes: int | None
    cuda_total_bytes: int | None


def pressure_ratio(reading: MemoryReading) -> float | None:
    """The highest used/limit ratio among the measurable figures; None when none is."""
    ratios: list[float] = []
    if reading.cgroup_limit_bytes:
        for used in (reading.rss_bytes, reading.cgroup_usage_bytes):
            if used is not None:
                ratios.append(used / reading.cgroup_limit_bytes)
    if reading.cuda_total_bytes and reading.cuda_reserved_bytes is not None:
        ratios.append(reading.cuda_reserved_bytes / reading.cuda_total_bytes)
    return max(ratios) if ratios else None


def next_guard_state(active: bool, ratio: float | None, threshold: float) -> bool:
    if ratio is None:
        return False
    if active:
        return ratio >= threshold - HYSTERESIS
    return ratio >= threshold


def sheds_prefix_cache(ratio: float | None, threshold: float) -> bool:
    """Memory is close enough to the guard's threshold that the prefix cache must go."""
    return ratio is not None and ratio >= threshold - PREFIX_CACHE_SHED_MARGIN
