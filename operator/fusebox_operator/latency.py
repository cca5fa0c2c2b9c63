"""The latency breaker's p99, taken from the sidecars' histograms as Prometheus takes it.

Why: a p99 each server computed over its own sliding window cannot be
combined across pods, and it disagreed with the dashboard, which takes
`histogram_quantile(0.99, sum by (le) (increase(..._bucket[1m])))`. Here the
operator does the same from the cumulative buckets it scrapes: each pod's
increase between its oldest and newest scrape in the window (a counter
reset counts from zero), summed by bucket bound over the service's pods,
and the quantile interpolated within its bucket exactly as Prometheus'
`histogram_quantile` does. Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

Buckets = tuple[tuple[float, float], ...]
"""(upper bound `le`, cumulative count) in ascending bound order, ending with +Inf."""
Snapshot = tuple[float, Buckets]  # (sampled at, buckets)

LATENCY_WINDOW_SECONDS: Final = 60.0  # as the dashboard's [1m] and the server's own window


def bucket_quantile(q: float, buckets: Buckets) -> float | None:
    """Prometheus' `histogram_quantile` over classic buckets; None where it gives NaN.

    The quantile's rank is found in the cumulative counts and interpolated
    linearly within its bucket (the first bucket starts at 0 when its bound
    is positive); a rank in the +Inf bucket gives the highest finite bound.
    """
    ordered = sorted(buckets)
    if len(ordered) < 2 or not math.isinf(ordered[-1][0]):
        return None
    observations = ordered[-1][1]
    if observations <= 0:
        return None
    rank = q * observations
    index = next(i for i, (_, count) in enumerate(ordered) if count >= rank)
    if index == len(ordered) - 1:
        return ordered[-2][0]
    upper, count = ordered[index]
    if index == 0 and upper <= 0:
        return upper
    lower = 0.0
    if index > 0:
        lower, below = ordered[index - 1]
        count -= below
        rank -= below
    return lower + (upper - lower) * (rank / count) if count > 0 else upper


def increase(earlier: Buckets, later: Buckets) -> Buckets:
    """What each bucket gained from `earlier` to `later`.

    A bucket that went down, or a different set of bounds, means the server
    restarted in between: its counts since then are the whole increase."""
    before = dict(earlier)
    if set(before) != {bound for bound, _ in later} or any(
        count < before[bound] for bound, count in later
    ):
        return later
    return tuple((bound, count - before[bound]) for bound, count in later)


def merge(histograms: Iterable[Buckets]) -> Buckets:
    """The sum by bucket bound (`sum by (le)`) of several pods' buckets."""
    totals: dict[float, float] = {}
    for buckets in histograms:
        for bound, count in buckets:
            totals[bound] = totals.get(bound, 0.0) + count
    return tuple(sorted(totals.items()))


def remember(
    history: Sequence[Snapshot], at: float, buckets: Buckets, window_seconds: float
) -> list[Snapshot]:
    """A pod's snapshots with this scrape added and those older than the window dropped."""
    return [s for s in history if s[0] >= at - window_seconds and s[0] < at] + [(at, buckets)]


def window_quantile(q: float, histories: Iterable[Sequence[Snapshot]]) -> float | None:
    """The quantile of every pod's increase over its window: None with no pod seen twice
    or nothing observed in between (no evidence, not a fast service)."""
    increases = [increase(h[0][1], h[-1][1]) for h in histories if len(h) >= 2]
    if not increases:
        return None
    return bucket_quantile(q, merge(increases))


def quantile_since(
    q: float, baselines: Mapping[str, Buckets], latest: Mapping[str, Buckets]
) -> float | None:
    """The quantile of what each pod's histogram gained since its baseline, summed over
    the pods: the requests of one stretch of time (the half-open ones), whatever the
    window still holds from before it. A pod without a baseline gained nothing yet;
    None with nothing observed since (no evidence, not a fast service)."""
    increases = [
        increase(baselines[pod], buckets) for pod, buckets in latest.items() if pod in baselines
    ]
    if not increases:
        return None
    return bucket_quantile(q, merge(increases))
