"""Admission on a real event loop: running slots, a bounded queue, deadlines."""

from __future__ import annotations

import asyncio

import pytest

from fusebox_server.control.admission import Admission
from fusebox_server.errors import DeadlineExceeded, QueueFull


async def settle() -> None:
    """Let the loop run the callbacks a hand-over schedules."""
    for _ in range(10):
        await asyncio.sleep(0)


def test_beyond_running_and_waiting_is_refused_at_once() -> None:
    async def scenario() -> None:
        admission = Admission(max_running=1, max_waiting=2)
        await admission.acquire(1)
        waiters = [asyncio.ensure_future(admission.acquire(5)) for _ in range(2)]
        await settle()
        assert (admission.running, admission.waiting) == (1, 2)
        with pytest.raises(QueueFull):
            await admission.acquire(5)
        admission.release()
        await settle()
        assert waiters[0].done() and not waiters[1].done()
        assert (admission.running, admission.waiting) == (1, 1)
        admission.release()
        admission.release()
        await asyncio.gather(*waiters)
        assert (admission.running, admission.waiting) == (0, 0)

    asyncio.run(scenario())


def test_a_waiter_past_its_deadline_leaves_the_queue() -> None:
    async def scenario() -> None:
        admission = Admission(max_running=1, max_waiting=1)
        await admission.acquire(1)
        with pytest.raises(DeadlineExceeded):
            await admission.acquire(0.01)
        assert admission.waiting == 0
        admission.release()
        assert admission.running == 0

    asyncio.run(scenario())


def test_a_cancelled_waiter_does_not_leak_its_slot() -> None:
    async def scenario() -> None:
        admission = Admission(max_running=1, max_waiting=4)
        await admission.acquire(1)
        waiter = asyncio.ensure_future(admission.acquire(5))
        await settle()
        admission.release()  # hands the slot to the waiter...
        waiter.cancel()  # ...which is cancelled before it runs
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert (admission.running, admission.waiting) == (0, 0)

    asyncio.run(scenario())
