"""A request for n choices holds n running slots, queues as n rows, and a disconnect ends
all n generations; on a server with four slots and a queue of four.

Its own server: the `slow` fault keeps generations running long enough to look at.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from fusebox_server_harness import MODEL_NAME, ServerProcess

BODY: dict[str, Any] = {
    "model": MODEL_NAME,
    "messages": [{"role": "user", "content": "Tell me about the river"}],
    "max_tokens": 60,
    "temperature": 0,
}


@pytest.fixture(scope="module")
def slots(start_server: Any) -> Iterator[ServerProcess]:
    server = start_server(
        flags={"max-concurrency": 4, "max-queue": 4, "request-timeout": 30},
        env={"FUSEBOX_FAULTS": "slow:0"},
    )
    yield server
    server.stop()


def _idle(server: ServerProcess) -> None:
    server.wait_for(
        lambda: (lambda s: s.running == 0 and s.worker_active == 0)(server.state()),
        what="an idle server",
    )


def test_a_disconnect_ends_every_choice_and_frees_all_their_slots(slots: ServerProcess) -> None:
    server = slots
    server.set_faults(slow=100)
    try:
        with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0) as client:
            stream = client.chat.completions.create(**BODY, n=3, stream=True)
            seen: set[int] = set()
            for chunk in stream:
                seen.update(choice.index for choice in chunk.choices)
                if len(seen) == 3:
                    break
            state = server.state()
            assert (state.running, state.worker_active) == (3, 3)
            stream.close()
        _idle(server)
    finally:
        server.set_faults(slow=0)


def test_n_choices_wait_in_the_queue_as_n_rows_and_then_all_run(slots: ServerProcess) -> None:
    server = slots
    server.set_faults(slow=50)

    async def scenario() -> tuple[int, int, int]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            runner = asyncio.ensure_future(
                client.post("/v1/chat/completions", json={**BODY, "n": 2})
            )
            await asyncio.to_thread(
                server.wait_for, lambda: server.state().running == 2, what="the runner"
            )
            # Two slots are free, but three choices need three: all three wait.
            waiter = asyncio.ensure_future(
                client.post("/v1/chat/completions", json={**BODY, "n": 3, "max_tokens": 2})
            )
            await asyncio.to_thread(
                server.wait_for,
                lambda: (lambda s: s.queue_length == 3 and s.running == 2)(server.state()),
                what="three rows queued",
            )
            # The queue holds four rows: two more choices do not fit, one does not either.
            full = await client.post("/v1/chat/completions", json={**BODY, "n": 2})
            ran, waited = await runner, await waiter
            assert len(waited.json()["choices"]) == 3
            return ran.status_code, waited.status_code, full.status_code

    try:
        assert asyncio.run(scenario()) == (200, 200, 429)
    finally:
        server.set_faults(slow=0)
    _idle(server)
