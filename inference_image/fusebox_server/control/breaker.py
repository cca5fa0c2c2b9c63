"""Breaker enforcement: the operator decides the state, the server applies it.

Why: the latency and quality breakers are computed by the operator across
pods; each server only enforces what it is told. OPEN refuses every new
request (queued and running ones finish); HALF_OPEN admits `admitPercent`
of new requests. Admission in HALF_OPEN is by an even spread over the
arrival count, not by coin flips, so 20% means 1 in 5, deterministically.
"""

from __future__ import annotations

import threading

from fusebox_contract.names import BreakerState


def admits(arrival_index: int, admit_percent: int) -> bool:
    """True for admit_percent of consecutive arrivals, spread evenly."""
    return (arrival_index + 1) * admit_percent // 100 > arrival_index * admit_percent // 100


class Breaker:
    def __init__(self) -> None:
        self.state = BreakerState.CLOSED
        self.admit_percent = 100
        self._arrivals = 0
        self._lock = threading.Lock()

    def set(self, state: BreakerState, admit_percent: int | None) -> None:
        with self._lock:
            self.state = state
            if admit_percent is not None:
                self.admit_percent = admit_percent
            elif state == BreakerState.CLOSED:
                self.admit_percent = 100
            self._arrivals = 0

    def admit(self) -> bool:
        with self._lock:
            if self.state == BreakerState.CLOSED:
                return True
            if self.state == BreakerState.OPEN:
                return False
            index = self._arrivals
            self._arrivals += 1
            return admits(index, self.admit_percent)
