"""A failed allocation is a 503 with Retry-After at the edge, whenever it happens, never a 500;
and a merge into the decode batch that fails half-way leaves the batch as it was.
"""

from __future__ import annotations

import errno
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import torch
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from fusebox_contract.names import RequestOutcome
from fusebox_server.control.accounting import RequestAccounting, outcome_of
from fusebox_server.errors import MemoryExhausted, memory_exhausted
from fusebox_server.http.edge import EXCEPTION_HANDLERS, CountRequests
from fusebox_server.model.decode_settings import DecodeSettings
from fusebox_server.model.engine import DecodeBatch, Decoding, load_model


@pytest.mark.parametrize(
    "error",
    [
        MemoryError(),
        RuntimeError(
            "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
            "memory: you tried to allocate 1125899906842624 bytes. Error code 12"
        ),
        RuntimeError("std::bad_alloc"),
        RuntimeError("can't allocate lock"),
        RuntimeError("can't allocate read lock"),
        OSError(errno.ENOMEM, "Cannot allocate memory"),
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB"),
    ],
)
def test_an_allocation_failure_in_any_wording_is_memory_exhausted(error: BaseException) -> None:
    exhausted = memory_exhausted(error)
    assert isinstance(exhausted, MemoryExhausted)
    assert (exhausted.status, exhausted.code) == (503, "out_of_memory")
    assert exhausted.retry_after_seconds


@pytest.mark.parametrize(
    "error", [RuntimeError("shape mismatch"), ValueError("no"), OSError(errno.EPIPE, "pipe")]
)
def test_other_errors_are_not_memory_exhausted(error: BaseException) -> None:
    assert memory_exhausted(error) is None


def test_memory_exhausted_counts_as_failed_not_rejected() -> None:
    # The server took the request on and could not finish it: the breaker must see a failure.
    assert outcome_of(MemoryExhausted("x")) is RequestOutcome.FAILED


async def _pieces_then(error: BaseException) -> AsyncIterator[bytes]:
    yield b'data: {"piece": 1}\n\n'
    raise error


def _app(accounting: RequestAccounting) -> Starlette:
    async def generate(request: Request) -> Response:
        where = request.query_params["where"]
        if where == "route":
            raise MemoryError()
        if where == "stream":
            return StreamingResponse(
                _pieces_then(MemoryError()), media_type="text/event-stream; charset=utf-8"
            )

        class CompleteThenFail(JSONResponse):
            async def __call__(self, scope, receive, send):  # type: ignore[no-untyped-def]
                await super().__call__(scope, receive, send)
                raise MemoryError()  # bookkeeping after the answer went out

        return CompleteThenFail({"ok": True})

    return Starlette(
        routes=[Route("/gen", generate, methods=["POST"])],
        middleware=[Middleware(CountRequests, accounting=accounting, paths=("/gen",))],
        exception_handlers=dict(EXCEPTION_HANDLERS),
    )


def test_memory_error_in_a_route_is_a_503_with_retry_after_counted_failed() -> None:
    accounting = RequestAccounting()
    with TestClient(_app(accounting), raise_server_exceptions=False) as client:
        response = client.post("/gen?where=route", headers={"X-Request-Id": "oom-1"})
    assert response.status_code == 503
    assert int(response.headers["retry-after"]) > 0
    assert response.headers["x-request-id"] == "oom-1"
    error = response.json()["error"]
    assert error["code"] == "out_of_memory" and error["type"] == "service_unavailable"
    assert "memory" in error["message"]
    assert accounting.totals()[RequestOutcome.FAILED] == 1


def test_memory_error_mid_stream_ends_the_stream_with_an_error_event() -> None:
    accounting = RequestAccounting()
    with TestClient(_app(accounting), raise_server_exceptions=False) as client:
        response = client.post("/gen?where=stream")
    assert response.status_code == 200
    events = [line.removeprefix("data: ") for line in response.text.split("\n\n") if line]
    assert json.loads(events[0]) == {"piece": 1}
    assert json.loads(events[-1])["error"]["code"] == "out_of_memory"
    assert accounting.totals()[RequestOutcome.FAILED] == 1


def test_memory_error_after_a_complete_answer_leaves_the_answer_and_its_success() -> None:
    accounting = RequestAccounting()
    with TestClient(_app(accounting), raise_server_exceptions=True) as client:
        response = client.post("/gen?where=after")
    assert response.status_code == 200 and response.json() == {"ok": True}
    assert accounting.totals()[RequestOutcome.SUCCEEDED] == 1


def test_a_merge_that_fails_half_way_leaves_the_batch_decoding_as_before(
    tiny_model_dir: Path, tiny_tokenizer: Any
) -> None:
    greedy = DecodeSettings(max_new_tokens=8, temperature=0.0, top_p=1.0, seed=None, stop=())
    loaded = load_model("primary", tiny_model_dir, "none", torch.device("cpu"), tiny_tokenizer)

    def encode(text: str) -> tuple[int, ...]:
        return tuple(tiny_tokenizer.backend_tokenizer.encode(text).ids)

    alone = Decoding(loaded, encode("Hello"), greedy)
    expected = [alone.step() for _ in range(6)]

    batch = DecodeBatch(loaded)
    row = Decoding(loaded, encode("Hello"), greedy)
    tokens = [row.step()]
    batch.add(row)
    # A row whose merge fails after the first layer (as an allocation failing there would).
    broken = Decoding(loaded, encode("The quick brown fox"), greedy)
    broken.step()
    broken.cache.layers = broken.cache.layers[:1]
    with pytest.raises(ValueError):
        batch.add(broken)

    assert batch.rows == [row]
    for _ in range(5):
        tokens += batch.step()
    assert tokens == expected
