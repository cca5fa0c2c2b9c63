"""The stats file (docs/stats-file.md): figures the sidecar relays as metrics.

Why a file and a thread: the sidecar must see a wedged server as such. The
file is written every second by a dedicated thread (not the event loop, not
the inference worker), atomically (temporary file + rename), and carries
both threads' heartbeats, so a stale file or a stale heartbeat tells the
operator which part is stuck. The same thread runs the memory guard check.

Latency percentiles and the quality failure ratio are over a sliding window
of the last `--latency-window` seconds (default 60), capped at 10,000 samples
per metric so the window itself cannot grow without bound.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
MAX_WINDOW_SAMPLES = 10_000

log = logging.getLogger(__name__)


def percentile(sorted_values: list[float], share: float) -> float:
    """Nearest-rank percentile of sorted, non-empty values."""
    rank = max(1, int(-(-share * len(sorted_values) // 1)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


class LatencyWindow:
    """Recent samples of one latency (seconds) for p50/p99; thread-safe."""

    def __init__(self, window_seconds: float) -> None:
        self.window_seconds = window_seconds
        self._samples: deque[tuple[float, float]] = deque(maxlen=MAX_WINDOW_SAMPLES)
        self._lock = threading.Lock()

    def add(self, seconds: float, now: float | None = None) -> None:
        with self._lock:
            self._samples.append((time.time() if now is None else now, seconds))

    def add_many(self, values: list[float], now: float | None = None) -> None:
        stamp = time.time() if now is None else now
        with self._lock:
            self._samples.extend((stamp, value) for value in values)

    def summary(self, now: float | None = None) -> dict[str, float | int] | None:
        cutoff = (time.time() if now is None else now) - self.window_seconds
        with self._lock:
            while self._samples and self._samples[0][0] < cutoff:
                self._samples.popleft()
            values = sorted(value for _, value in self._samples)
        if not values:
            return None
        return {
            "p50": percentile(values, 0.5),
            "p99": percentile(values, 0.99),
            "count": len(values),
        }


def write_atomically(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            json.dump(document, handle, separators=(",", ":"))
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise


class StatsThread(threading.Thread):
    """Calls `tick()` (guard check) and writes `snapshot()` to the file every interval."""

    def __init__(
        self,
        path: Path,
        snapshot: Callable[[], dict[str, Any]],
        tick: Callable[[], None],
        interval_seconds: float = 1.0,
    ) -> None:
        super().__init__(name="fusebox-stats", daemon=True)
        self.path = path
        self._snapshot = snapshot
        self._tick = tick
        self._interval = interval_seconds
        self._stopping = threading.Event()
        self.write_errors_total = 0

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                self._tick()
                write_atomically(self.path, self._snapshot())
            except Exception as error:  # the thread must outlive a full disk
                self.write_errors_total += 1
                if self.write_errors_total in (1, 10, 100) or self.write_errors_total % 1000 == 0:
                    log.warning("stats write failed: %r", error)
            self._stopping.wait(max(0.0, self._interval - (time.monotonic() - started)))
