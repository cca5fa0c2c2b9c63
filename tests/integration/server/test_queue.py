"""Clients that leave the queue, and what a request that does not succeed leaves out of the
latency windows, on a server with one slot and two places in the queue.

Its own server (not `test_limits.py`'s), so this file runs with one server process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fusebox_server_harness import MODEL_NAME, ServerProcess

from fusebox_contract.names import RequestOutcome


@pytest.fixture(scope="module")
def queued(start_server: Any) -> Iterator[ServerProcess]:
    server = start_server(
        flags={"max-concurrency": 1, "max-queue": 2, "request-timeout": 10},
        env={"FUSEBOX_FAULTS": "slow:0"},
    )
    yield server
    server.stop()


def test_clients_that_leave_the_queue_give_their_place_to_live_ones(
    queued: ServerProcess,
) -> None:
    server = queued
    server.set_faults(slow=100)  # the runner holds the one slot for about 6 seconds
    before = server.state().requests
    body = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 60,
        "temperature": 0,
    }

    async def scenario() -> tuple[int, int]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            runner = asyncio.ensure_future(client.post("/v1/chat/completions", json=body))
            await asyncio.to_thread(
                server.wait_for, lambda: server.state().running == 1, what="the runner"
            )
            for _ in range(2):  # fill the queue of two, then give up
                with pytest.raises(httpx.TimeoutException):
                    await client.post("/v1/chat/completions", json=body, timeout=0.5)
            await asyncio.to_thread(
                server.wait_for,
                lambda: server.state().queue_length == 0,
                timeout=2.0,  # long before the runner ends: they leave at once
                what="the places of the clients that left",
            )
            live = await client.post("/v1/chat/completions", json={**body, "max_tokens": 1})
            return (await runner).status_code, live.status_code

    assert asyncio.run(scenario()) == (200, 200)
    server.set_faults(slow=0)
    after = server.wait_for(
        lambda: (lambda s: s.requests if s.running == 0 else None)(server.state()),
        what="an idle server",
    )
    counted = {outcome: after[outcome] - before[outcome] for outcome in after}
    assert counted == {
        "succeeded": 2,
        "cancelled": 2,
        "invalid": 0,
        "rejected": 0,
        "timed_out": 0,
        "failed": 0,
    }


def test_time_to_first_token_counts_only_requests_that_succeed(queued: ServerProcess) -> None:
    server = queued

    def ttft_count() -> int:
        window = server.stats()["latency_seconds"]["ttft"]  # null while the window is empty
        return int(window["count"]) if window else 0

    before_requests = server.state().requests
    server.wait_for(  # the stats file (rewritten each second) has caught up with earlier tests
        lambda: (
            server.stats()["requests"]["succeeded_total"]
            == before_requests[RequestOutcome.SUCCEEDED]
        ),
        what="the stats file to catch up",
    )
    before = ttft_count()
    server.set_faults(slow=100)
    body = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 40,
        "stream": True,
    }
    with server.client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200  # the client leaves after the first piece
        next(line for line in response.iter_lines() if line.startswith("data: {"))
    server.set_faults(slow=0)
    server.wait_for(
        lambda: (
            server.state().requests[RequestOutcome.CANCELLED]
            == before_requests[RequestOutcome.CANCELLED] + 1
        ),
        what="the cancel to be counted",
    )
    assert server.chat("hi", max_tokens=2).status_code == 200
    # The stats file is rewritten every second: wait for the success to show.
    server.wait_for(lambda: ttft_count() > before, what="the success's time to first token")
    assert ttft_count() == before + 1
