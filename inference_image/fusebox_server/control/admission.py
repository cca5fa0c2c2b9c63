"""Admission: at most maxConcurrency running, maxQueue waiting, the rest refused now.

Why: an unbounded queue turns overload into memory growth and timeouts for
everyone. A request either gets a running slot, or a place in a bounded
FIFO of waiters, or an immediate 429. A slot is released only when the
worker is done with the generation, so `running` is what really runs.
Everything here lives on the event loop; no locks.
"""

from __future__ import annotations

import asyncio
from collections import deque

from fusebox_server.errors import DeadlineExceeded, QueueFull


class Admission:
    def __init__(self, max_running: int, max_waiting: int) -> None:
        self.max_running = max_running
        self.max_waiting = max_waiting
        self.running = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def acquire(self, timeout_seconds: float) -> None:
        """Take a running slot, waiting at most timeout_seconds; 429 when the queue is full."""
        if self.running < self.max_running and not self._waiters:
            self.running += 1
            return
        if len(self._waiters) >= self.max_waiting:
            raise QueueFull(
                f"{self.running} requests running and {len(self._waiters)} waiting; retry later"
            )
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(max(0.0, timeout_seconds)):
                await waiter
        except BaseException as error:
            if waiter.done() and not waiter.cancelled():
                # The slot was handed over just as we gave up: pass it on.
                self.release()
            else:
                waiter.cancel()
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
            if isinstance(error, TimeoutError):
                raise DeadlineExceeded(
                    "the request waited in the queue past its deadline"
                ) from None
            raise

    def release(self) -> None:
        """Free a running slot and hand it to the oldest live waiter."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.running -= 1
