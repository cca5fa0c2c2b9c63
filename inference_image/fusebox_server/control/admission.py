"""Admission: at most maxConcurrency running, maxQueue waiting, the rest refused now.

Why: an unbounded queue turns overload into memory growth and timeouts for
everyone. A request either gets a running slot, or a place in a bounded
FIFO of waiters, or an immediate 429. A slot is released only when the
worker is done with the generation, so `running` is what really runs.
A request for n choices decodes n rows: it takes n slots at once (and its
place in the queue counts n), and each of its generations gives one back.
The queue is strictly first in, first out: a waiter for n slots at the head
is not overtaken by later waiters for fewer. Everything here lives on the
event loop; no locks.
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
        self._waiters: deque[tuple[asyncio.Future[None], int]] = deque()

    @property
    def waiting(self) -> int:
        """Rows waiting: a waiter for n choices counts n."""
        return sum(count for waiter, count in self._waiters if not waiter.done())

    async def acquire(self, timeout_seconds: float, count: int = 1) -> None:
        """Take `count` running slots at once, waiting at most timeout_seconds; 429 when
        the queue cannot hold `count` more rows."""
        if count > self.max_running:
            # It could never run, and at the head of the queue it would hold up everyone
            # behind it until its deadline; the API refuses such an `n` with a 400 first.
            raise ValueError(f"{count} slots asked of an admission of {self.max_running}")
        if self.running + count <= self.max_running and not self._waiters:
            self.running += count
            return
        if self.waiting + count > self.max_waiting:
            raise QueueFull(
                f"{self.running} requests running and {self.waiting} waiting; retry later"
            )
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (waiter, count)
        self._waiters.append(entry)
        try:
            async with asyncio.timeout(max(0.0, timeout_seconds)):
                await waiter
        except BaseException as error:
            if waiter.done() and not waiter.cancelled():
                # The slots were handed over just as we gave up: pass them on.
                self.release(count)
            else:
                waiter.cancel()
                if entry in self._waiters:
                    self._waiters.remove(entry)
                self._admit_waiters()  # a smaller waiter behind this one may fit now
            if isinstance(error, TimeoutError):
                raise DeadlineExceeded(
                    "the request waited in the queue past its deadline"
                ) from None
            raise

    def release(self, count: int = 1) -> None:
        """Free running slots and hand them to the oldest live waiters that fit, in order."""
        self.running -= count
        self._admit_waiters()

    def _admit_waiters(self) -> None:
        while self._waiters:
            waiter, count = self._waiters[0]
            if waiter.done():
                self._waiters.popleft()
                continue
            if self.running + count > self.max_running:
                return
            self._waiters.popleft()
            self.running += count
            waiter.set_result(None)
