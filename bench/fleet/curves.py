"""Scripted memory curves of fake pods, and what an admin action does to them.

Why: the operator's loop at scale (scrape, decide, act) needs pods whose
memory moves as real servers' does, without a model in each. Three shapes
cover what the policy tells apart: steady (nothing to do), spike (a short
rise that falls back by itself, below the threshold's growth test for long)
and leak (a steady climb over the threshold that only a reload cures). An
action changes the curve as the real server would: gc and empty_cache free
the garbage a spike left, not a leak; unload/load (the ladder's reload) puts
the process back at its baseline. Pure: every figure is a function of the
time passed in, so a test checks the shapes without a clock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from fusebox_contract.names import ActionType

MIB = 1024**2
GIB = 1024**3


class Shape(enum.StrEnum):
    STEADY = "steady"
    SPIKE = "spike"
    LEAK = "leak"


@dataclass(frozen=True)
class CurveSettings:
    """Figures shared by every fake pod (the bench may change them)."""

    limit_bytes: int = 4 * GIB  # what the sidecar reports as the cgroup limit
    baseline_ratio: float = 0.5
    leak_mib_per_minute: float = 1024.0  # well over the default 200 MiB/min growth test
    spike_ratio: float = 0.15  # a spike adds this share of the limit...
    spike_seconds: float = 10.0  # ...for this long...
    spike_every_seconds: float = 120.0  # ...this often
    threshold_ratio: float = 0.75  # the default breaker.resource.rss.ratioOfLimit


@dataclass
class MemoryCurve:
    """One fake pod's resident memory over time, from `started_at` (Unix seconds)."""

    shape: Shape
    started_at: float
    settings: CurveSettings = field(default_factory=CurveSettings)
    leak_starts_after_seconds: float = 0.0
    # When the curve restarts from its baseline (a reload), and garbage gc freed.
    reset_at: float | None = None
    freed_bytes: float = 0.0
    loads: int = 1
    # Threshold crossings of leak cycles a reload ended (the first is the one measured).
    crossings: list[float] = field(default_factory=list)

    @property
    def baseline_bytes(self) -> float:
        return self.settings.limit_bytes * self.settings.baseline_ratio

    def _leak_origin(self) -> float:
        origin = self.started_at + self.leak_starts_after_seconds
        return max(origin, self.reset_at) if self.reset_at is not None else origin

    def rss_bytes(self, now: float) -> float:
        rss = self.baseline_bytes
        if self.shape is Shape.LEAK:
            grown = max(0.0, now - self._leak_origin()) * self.settings.leak_mib_per_minute / 60
            rss += grown * MIB
        elif self.shape is Shape.SPIKE:
            phase = (now - self.started_at) % self.settings.spike_every_seconds
            if phase < self.settings.spike_seconds:
                rss += self.settings.limit_bytes * self.settings.spike_ratio
        return max(self.baseline_bytes, rss - self.freed_bytes)

    def crosses_threshold_at(self) -> float | None:
        """When a leak passes the threshold ratio (None: this curve never does)."""
        if self.shape is not Shape.LEAK:
            return None
        room = self.settings.limit_bytes * self.settings.threshold_ratio - self.baseline_bytes
        rate_per_second = self.settings.leak_mib_per_minute * MIB / 60
        return self._leak_origin() + room / rate_per_second

    def act(self, action: ActionType, now: float) -> tuple[float, float]:
        """Apply an admin action; RSS before and after, as the server reports them."""
        before = self.rss_bytes(now)
        if action in (ActionType.GC, ActionType.EMPTY_CACHE) and self.shape is Shape.SPIKE:
            self.freed_bytes += before - self.baseline_bytes  # a spike's garbage only
        elif action in (ActionType.LOAD, ActionType.SWAP, ActionType.UNLOAD):
            crossed = self.crosses_threshold_at()
            if crossed is not None and crossed <= now:
                self.crossings.append(crossed)
            self.reset_at, self.freed_bytes = now, 0.0
            self.loads += action is not ActionType.UNLOAD
        return before, self.rss_bytes(now)

    def first_crossing(self, now: float) -> float | None:
        """The first time this pod's memory passed the threshold, if it has by `now`."""
        if self.crossings:
            return self.crossings[0]
        crossed = self.crosses_threshold_at()
        return crossed if crossed is not None and crossed <= now else None
