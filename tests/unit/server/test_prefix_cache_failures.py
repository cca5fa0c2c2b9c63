"""The prefix cache is an optimisation, never a request's error: a copy that fails, to keep
an entry or to reuse one, leaves the request on the uncached path and its answer unchanged.

On the real tiny model in a worker driven one turn at a time. The failures are the ones
torch raises when an allocation fails: on the CPU a plain RuntimeError from its allocator,
on CUDA `torch.OutOfMemoryError`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from fusebox_server.model.engine import Decoding, load_model
from fusebox_server.model.faults import Faults
from fusebox_server.model.prefix_cache import BLOCK_TOKENS
from fusebox_server.model.worker import InferenceWorker

from .worker_jobs import submit_job

CPU_ALLOCATION_FAILED = RuntimeError(
    "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
    "memory: you tried to allocate 1048576 bytes."
)
CUDA_ALLOCATION_FAILED = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")

RUNNING = (5, 6, 7)
SHARED = tuple(range(5, 5 + 2 * BLOCK_TOKENS))
CACHED = (*SHARED, *range(300, 320))  # primes the cache
JOINERS = (tuple(range(50, 90)), tuple(range(100, 140)), (*SHARED, *range(500, 520)))


def _fail(error: Exception) -> Callable[..., Any]:
    def failing(*args: Any, **kwargs: Any) -> Any:
        raise error

    return failing


Break = Callable[[InferenceWorker, pytest.MonkeyPatch], None]


def _answers(
    model_dir: Path,
    tokenizer: Any,
    joiners: tuple[tuple[int, ...], ...],
    break_cache: Break | None,
    monkeypatch: pytest.MonkeyPatch,
) -> list[tuple[Any, str]]:
    """The cache is primed with one prompt and a row runs; the cache breaks (`break_cache`)
    and the joiners join while the row decodes. Each job's final event and text, the
    running row's first."""

    async def scenario() -> list[tuple[Any, str]]:
        worker = InferenceWorker(
            asyncio.get_running_loop(), Faults({}), inbox_size=8, prefix_cache_bytes=1 << 30
        )
        worker.loaded = load_model("primary", model_dir, "none", torch.device("cpu"), tokenizer)
        primed, _ = submit_job(worker, tokenizer, CACHED)
        while not primed.done():
            worker._turn()
            await asyncio.sleep(0)
        assert len(worker.prefix_cache) == 1
        running = submit_job(worker, tokenizer, RUNNING, max_new_tokens=12)
        worker._turn()
        worker._turn()
        with monkeypatch.context() as patch:
            if break_cache is not None:
                break_cache(worker, patch)
            jobs = [running, *(submit_job(worker, tokenizer, ids) for ids in joiners)]
            while not all(done.done() for done, _ in jobs):
                worker._turn()
                await asyncio.sleep(0)
        return [(done.result(), "".join(pieces)) for done, pieces in jobs]

    return asyncio.run(scenario())


def _outcomes(answers: list[tuple[Any, str]]) -> list[tuple[str, int, str]]:
    return [(type(event).__name__, event.completion_tokens, text) for event, text in answers]


def _keep_fails(worker: InferenceWorker, patch: pytest.MonkeyPatch) -> None:
    """Copying a prefilled prompt into the cache fails (`PrefixCache.insert`)."""
    patch.setattr(worker.prefix_cache, "_cut", _fail(CPU_ALLOCATION_FAILED))


@pytest.mark.parametrize(
    "joiners",
    [
        pytest.param(JOINERS[:1], id="a-lone-prefill"),
        pytest.param(JOINERS[:2], id="a-grouped-prefill"),
    ],
)
def test_a_prompt_that_cannot_be_cached_is_answered_and_the_running_rows_decode_on(
    tiny_model_dir: Path,
    tiny_tokenizer: Any,
    monkeypatch: pytest.MonkeyPatch,
    joiners: tuple[tuple[int, ...], ...],
) -> None:
    intact = _answers(tiny_model_dir, tiny_tokenizer, joiners, None, monkeypatch)
    broken = _answers(tiny_model_dir, tiny_tokenizer, joiners, _keep_fails, monkeypatch)
    assert [event for event, _, _ in _outcomes(broken)] == ["Finished"] * (1 + len(joiners))
    assert _outcomes(broken) == _outcomes(intact)


def _split_fails(worker: InferenceWorker, patch: pytest.MonkeyPatch) -> None:
    """A partial match's copy of the shared part fails (inside `PrefixCache.match`)."""
    patch.setattr(worker.prefix_cache, "_cut", _fail(CUDA_ALLOCATION_FAILED))


def _start_fails(worker: InferenceWorker, patch: pytest.MonkeyPatch) -> None:
    """The copy a hit starts from fails (`Decoding.start_from_prefix`)."""
    patch.setattr(Decoding, "start_from_prefix", _fail(CPU_ALLOCATION_FAILED))


@pytest.mark.parametrize(
    "break_cache",
    [
        pytest.param(_split_fails, id="the-copy-of-a-partial-match"),
        pytest.param(_start_fails, id="the-copy-a-hit-starts-from"),
    ],
)
def test_a_prompt_whose_cached_prefix_cannot_be_copied_runs_whole_with_the_same_answer(
    tiny_model_dir: Path,
    tiny_tokenizer: Any,
    monkeypatch: pytest.MonkeyPatch,
    break_cache: Break,
) -> None:
    joiners = JOINERS[2:]  # shares its first two blocks with the cached prompt
    intact = _answers(tiny_model_dir, tiny_tokenizer, joiners, None, monkeypatch)
    broken = _answers(tiny_model_dir, tiny_tokenizer, joiners, break_cache, monkeypatch)
    assert [event for event, _, _ in _outcomes(broken)] == ["Finished", "Finished"]
    assert _outcomes(broken) == _outcomes(intact)
