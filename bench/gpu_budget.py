"""The wall-clock budget every GPU bench script keeps to.

Why a module of its own: a lent device gives one call of a fixed length, and
a script that overruns it returns nothing, so each script (gpu_bench.py,
gpu_realistic.py) cuts its phases by the time left. The budget is pure, with
an injectable clock, so each script's trimming rules are testable without
waiting.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Budget:
    """A wall-clock budget; `clock` is injectable so the trimming rules are testable."""

    total_seconds: float
    clock: Callable[[], float] = time.monotonic
    started: float = field(init=False)

    def __post_init__(self) -> None:
        self.started = self.clock()

    def elapsed(self) -> float:
        return self.clock() - self.started

    def left(self) -> float:
        return self.total_seconds - self.elapsed()
