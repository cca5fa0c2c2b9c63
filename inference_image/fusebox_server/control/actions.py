"""Idempotent admin actions: an action id acts once, whoever asks and however often.

Why: the operator retries an action whose answer it did not get (a timeout
while a large model loads) and, after a restart, replays ids it had issued.
Acting twice would unload or swap twice. The first call with an id runs the
action; a later call gets the recorded result (`replayed: true`) or the
recorded error, and a call that arrives while the first is still running
waits for that one instead of starting a second. An id comes back only
with the request it was first used for: the same id naming another action
is a caller's bug, answered 409, never the other action's result. The last
`MAX_RECORDED_ACTIONS` ids are remembered. Event-loop only.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Final

from fusebox_contract.admin import ActionResult
from fusebox_server.errors import ActionIdReused

MAX_RECORDED_ACTIONS: Final = 1000


class ActionLog:
    def __init__(self, capacity: int = MAX_RECORDED_ACTIONS) -> None:
        self.capacity = capacity
        # id -> (what the first call asked for, its result)
        self._recorded: OrderedDict[str, tuple[Hashable, asyncio.Future[ActionResult]]] = (
            OrderedDict()
        )

    def __len__(self) -> int:
        return len(self._recorded)

    async def run_once(
        self, action_id: str, asked: Hashable, act: Callable[[], Awaitable[ActionResult]]
    ) -> ActionResult:
        recorded = self._recorded.get(action_id)
        if recorded is not None:
            first_asked, first = recorded
            if first_asked != asked:
                raise ActionIdReused(
                    f"action id {action_id!r} was used for {first_asked}; "
                    f"a new action ({asked}) needs a new id"
                )
            return (await asyncio.shield(first)).replay()
        future: asyncio.Future[ActionResult] = asyncio.get_running_loop().create_future()
        self._recorded[action_id] = (asked, future)
        while len(self._recorded) > self.capacity:
            self._recorded.popitem(last=False)
        try:
            result = await act()
        except asyncio.CancelledError:
            # Nobody waited for the end (shutdown): forget the id, a retry may act.
            future.cancel()
            self._recorded.pop(action_id, None)
            raise
        except BaseException as error:
            future.set_exception(error)
            future.exception()  # retrieved here: only replays re-raise it
            raise
        future.set_result(result)
        return result
