"""What reaches a caller when the inference thread cannot hand a result to the event loop.

Under a malloc fault `loop.call_soon_threadsafe` itself can fail to allocate; the worker
offers a result again for a while, then gives up. A piece of text given up on must fail
its request (a hole in an answer reported as a success is worse than an error), and an
admin action whose answer is given up on must end with an error, not wait forever.

A whole Runtime on the tiny model, its API driven through httpx in process; only the
loop's hand-over is made to fail.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from fusebox_contract.names import ActionType, RequestOutcome
from fusebox_server.config import ServerConfig
from fusebox_server.control.runtime import Runtime
from fusebox_server.errors import MemoryExhausted
from fusebox_server.http.app import COMPLETIONS_PATH, build_api_app
from fusebox_server.model import worker as worker_module
from fusebox_server.model.worker import Piece

from .runtime_runs import run_with_runtime

ATTEMPTS = 3  # the worker's tries per hand-over, fewer than in production to keep this quick


class LoopThatLosesHandOvers:
    """The event loop, except that chosen hand-overs from the worker fail to allocate on
    every attempt: the `lose_piece`-th piece of text, or the next admin answer."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._pieces_seen = 0
        self._piece_to_lose = 0  # 0: none
        self._answers_to_lose = 0

    def lose_piece(self, number: int) -> None:
        self._pieces_seen, self._piece_to_lose = 0, number

    def lose_next_answer(self) -> None:
        self._answers_to_lose = ATTEMPTS

    def call_soon_threadsafe(self, callback: Any, *args: Any) -> Any:
        if len(args) == 1 and isinstance(args[0], Piece) and self._piece_to_lose:
            self._pieces_seen += 1
            if self._pieces_seen == self._piece_to_lose:
                self._pieces_seen -= 1  # the same piece is offered again
                raise MemoryError
        if len(args) == 2 and self._answers_to_lose:  # an admin action's (result, error)
            self._answers_to_lose -= 1
            raise MemoryError
        return self._loop.call_soon_threadsafe(callback, *args)


def _losing_runtime(runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> LoopThatLosesHandOvers:
    monkeypatch.setattr(worker_module, "POST_ATTEMPTS", ATTEMPTS)
    monkeypatch.setattr(worker_module, "POST_RETRY_SECONDS", 0.001)
    loop = LoopThatLosesHandOvers(asyncio.get_running_loop())
    assert runtime.worker is not None
    monkeypatch.setattr(runtime.worker, "_loop", loop)
    return loop


def _sse_data(body: str) -> list[str]:
    return [line[len("data: ") :] for line in body.splitlines() if line.startswith("data: ")]


def test_a_piece_the_loop_cannot_take_fails_the_request_instead_of_leaving_a_hole(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = ServerConfig(model_dir=tiny_model_dir, torch_threads=1)
    body = {
        "model": config.model_name,
        "prompt": "Hello there, how are you",
        "max_tokens": 12,
        "temperature": 0,
    }

    async def scenario(
        runtime: Runtime,
    ) -> tuple[httpx.Response, httpx.Response, httpx.Response, dict[RequestOutcome, int]]:
        loop = _losing_runtime(runtime, monkeypatch)
        transport = httpx.ASGITransport(app=build_api_app(runtime))
        async with httpx.AsyncClient(transport=transport, base_url="http://fusebox") as client:
            whole = await client.post(COMPLETIONS_PATH, json=body)  # nothing lost
            loop.lose_piece(2)
            streamed = await client.post(COMPLETIONS_PATH, json={**body, "stream": True})
            loop.lose_piece(2)
            unstreamed = await client.post(COMPLETIONS_PATH, json=body)
        return whole, streamed, unstreamed, runtime.accounting.totals()

    whole, streamed, unstreamed, outcomes = run_with_runtime(config, scenario)
    assert whole.status_code == 200
    assert whole.json()["choices"][0]["finish_reason"] == "length"  # 12 tokens: pieces to lose

    assert streamed.status_code == 200  # sent before the loss
    events = _sse_data(streamed.text)
    assert "[DONE]" not in events
    last = json.loads(events[-1])
    assert last["error"]["code"] == "out_of_memory"
    assert len(events) == 2  # the first piece, then the error: nothing after the hole

    assert unstreamed.status_code == 503
    assert unstreamed.json()["error"]["code"] == "out_of_memory"
    assert unstreamed.headers["retry-after"]

    assert outcomes[RequestOutcome.SUCCEEDED] == 1
    assert outcomes[RequestOutcome.FAILED] == 2


def test_an_admin_action_whose_answer_the_loop_cannot_take_ends_with_an_error_and_so_does_its_retry(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = ServerConfig(model_dir=tiny_model_dir, torch_threads=1)

    async def outcome(runtime: Runtime) -> BaseException | None:
        try:
            await asyncio.wait_for(runtime.run_action("gc-1", ActionType.GC, None), timeout=10)
        except BaseException as error:
            return error
        return None

    async def scenario(runtime: Runtime) -> tuple[BaseException | None, ...]:
        _losing_runtime(runtime, monkeypatch).lose_next_answer()
        first = await outcome(runtime)
        retried = await outcome(runtime)  # the same id: the recorded answer, at once
        fresh = await asyncio.wait_for(runtime.run_action("gc-2", ActionType.GC, None), 10)
        return first, retried, fresh.type

    first, retried, fresh_type = run_with_runtime(config, scenario)
    assert isinstance(first, MemoryExhausted), repr(first)
    assert isinstance(retried, MemoryExhausted), repr(retried)
    assert fresh_type == ActionType.GC
