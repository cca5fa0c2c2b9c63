"""One helper for the server tests that drive a whole Runtime on the CPU."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from fusebox_server.config import ServerConfig
from fusebox_server.control.runtime import Runtime
from fusebox_server.model.faults import Faults
from fusebox_server.model.load_order import MemoryRoom

T = TypeVar("T")


def run_with_runtime(
    config: ServerConfig,
    scenario: Callable[[Runtime], Awaitable[T]],
    rooms: Sequence[MemoryRoom] | None = None,
) -> T:
    """Start a Runtime with the primary loaded, run `scenario` on its loop, stop it.

    `rooms`: the memory the load order sees (default: what the machine measures).
    """

    async def main() -> T:
        runtime = Runtime(config, Faults({}))
        if rooms is not None:
            runtime.variants.memory_rooms = lambda: list(rooms)
        runtime.start(asyncio.get_running_loop())
        try:
            await runtime.load_primary()
            return await scenario(runtime)
        finally:
            runtime.stop()

    return asyncio.run(main())


async def settled(runtime: Runtime) -> None:
    """Until the runtime's variant change (load, swap) has finished."""
    while runtime.variants.converging:
        await asyncio.sleep(0.05)
