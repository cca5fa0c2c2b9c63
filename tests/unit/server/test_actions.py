"""Admin action ids: one id acts once, replays get the record, duplicates in flight wait."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fusebox_contract.admin import ActionResult, MemoryFigures
from fusebox_contract.names import ActionType, Variant
from fusebox_server.control.actions import ActionLog
from fusebox_server.errors import Conflict


def result(n: int) -> ActionResult:
    """A gc that took `n` seconds: a result told apart by its figure."""
    figures = MemoryFigures(rss_bytes=1)
    primary = Variant.PRIMARY
    return ActionResult(str(n), ActionType.GC, primary, primary, True, figures, figures, n)


def test_the_same_id_acts_once_and_replays_the_result() -> None:
    async def scenario() -> tuple[Any, Any, int]:
        log = ActionLog()
        acted = 0

        async def act() -> ActionResult:
            nonlocal acted
            acted += 1
            return result(acted)

        first = await log.run_once("a", "gc", act)
        again = await log.run_once("a", "gc", act)
        return first, again, acted

    first, again, acted = asyncio.run(scenario())
    assert acted == 1
    assert (first.duration_seconds, first.replayed) == (1, False)
    assert (again.duration_seconds, again.replayed) == (1, True)


def test_a_duplicate_in_flight_waits_for_the_first() -> None:
    async def scenario() -> tuple[list[Any], int]:
        log = ActionLog()
        acted = 0
        release = asyncio.Event()

        async def act() -> ActionResult:
            nonlocal acted
            acted += 1
            await release.wait()
            return result(acted)

        first = asyncio.create_task(log.run_once("swap-1", "swap", act))
        second = asyncio.create_task(log.run_once("swap-1", "swap", act))
        await asyncio.sleep(0)
        release.set()
        return list(await asyncio.gather(first, second)), acted

    results, acted = asyncio.run(scenario())
    assert acted == 1
    assert sorted(r.replayed for r in results) == [False, True]


def test_a_recorded_error_is_replayed_without_acting_again() -> None:
    async def scenario() -> int:
        log = ActionLog()
        acted = 0

        async def act() -> ActionResult:
            nonlocal acted
            acted += 1
            raise Conflict("no fallback")

        for _ in range(3):
            with pytest.raises(Conflict):
                await log.run_once("x", "load", act)
        return acted

    assert asyncio.run(scenario()) == 1


def test_only_the_last_ids_are_remembered() -> None:
    async def scenario() -> int:
        log = ActionLog(capacity=2)

        async def act() -> ActionResult:
            return result(0)

        for name in ("a", "b", "c"):
            await log.run_once(name, "gc", act)
        return len(log)

    assert asyncio.run(scenario()) == 2


def test_an_id_reused_for_another_action_is_refused_not_replayed() -> None:
    async def scenario() -> tuple[str, int]:
        log = ActionLog()
        acted = 0

        async def act() -> ActionResult:
            nonlocal acted
            acted += 1
            return result(acted)

        await log.run_once("x1", "load fallback", act)
        with pytest.raises(Conflict) as refused:
            await log.run_once("x1", "gc", act)
        return str(refused.value), acted

    message, acted = asyncio.run(scenario())
    assert acted == 1
    assert "'x1' was used for load fallback" in message and "(gc)" in message
