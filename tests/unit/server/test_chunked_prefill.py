"""Chunked prefill: a long prompt run a chunk at a time decodes what its whole prefill decodes,
and the worker decodes the running rows between its chunks.

The equality is checked on the tiny model and on the llama3 zoo model
(grouped-query attention, a 128k vocabulary), in float32 on the CPU, with
chunk sizes that do and do not divide the prompt, through both decode
batches (`DecodeBatch`, and the slot batch the CUDA graphs replay, run
eagerly), and for a prompt that starts from a prefix-cache hit and runs its
rest in chunks.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from fusebox_server.model.decode_settings import DecodeSettings
from fusebox_server.model.engine import DecodeBatch, Decoding, LoadedModel, load_model
from fusebox_server.model.faults import Faults
from fusebox_server.model.prefix_kv import leading, new_prefix_cache, prompt_kv
from fusebox_server.model.worker import Finished, GenerationJob, InferenceWorker
from fusebox_server.zoo.release import ensure_zoo_model

from ..greedy_decoding import BATCHES, GREEDY, chat_prompts, decode_greedily

SYSTEM = (
    "You are the on-call assistant of a platform team. Answer in short sentences, name the "
    "runbook section you rely on, and say so when you do not know. 你好，请用中文或英文回答。 "
    "def handler(event): return event['body']\n"
)
# Each question is longer than the largest chunk, so its rest after a cached prefix runs in
# more than one chunk too.
QUESTIONS = (
    "How do I drain a node safely before a kernel upgrade, and what should I check after it "
    "comes back: the daemon sets, the pods with local storage, the disruption budgets?",
    "Why did my pod get OOMKilled at night while its memory graph looked flat all day, and "
    "which of the cgroup's counters would have shown the page cache growing before it?",
)
# 7 and 50 do not divide the prompts; 16 is a prefix-cache block.
CHUNK_SIZES = (7, 16, 50)


@pytest.fixture(scope="module", params=["tiny", "llama3"])
def model(
    request: pytest.FixtureRequest, tiny_model_dir: Path, tiny_tokenizer: Any
) -> tuple[str, LoadedModel, list[tuple[int, ...]]]:
    if request.param == "tiny":
        directory, tokenizer = tiny_model_dir, tiny_tokenizer
    else:
        from transformers import AutoTokenizer

        directory = ensure_zoo_model(request.param)
        tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    loaded = load_model("primary", directory, "none", torch.device("cpu"), tokenizer)
    return request.param, loaded, chat_prompts(tokenizer, SYSTEM, QUESTIONS)


def _in_chunks(row: Decoding, chunk: int) -> int:
    """Prefill as the worker does with `--prefill-chunk-tokens chunk`; the chunks run."""
    chunks = 0
    while len(row.pending_prompt()) > chunk:
        row.prefill_chunk(chunk)
        chunks += 1
    return chunks


@pytest.mark.parametrize("batch_kind", sorted(BATCHES))
@pytest.mark.parametrize("chunk", CHUNK_SIZES)
def test_a_prompt_prefilled_in_chunks_decodes_the_tokens_of_its_whole_prefill(
    model: tuple[str, LoadedModel, list[tuple[int, ...]]], batch_kind: str, chunk: int
) -> None:
    name, loaded, (prompt, _) = model
    make_batch = BATCHES[batch_kind]
    whole = decode_greedily(make_batch(loaded), Decoding(loaded, prompt, GREEDY))

    chunked = Decoding(loaded, prompt, GREEDY)
    assert _in_chunks(chunked, chunk) == (len(prompt) - 1) // chunk  # it really ran in pieces
    assert decode_greedily(make_batch(loaded), chunked) == whole, f"{name}, chunks of {chunk}"


@pytest.mark.parametrize("chunk", CHUNK_SIZES)
def test_the_rest_after_a_prefix_cache_hit_prefilled_in_chunks_decodes_as_a_whole_prefill(
    model: tuple[str, LoadedModel, list[tuple[int, ...]]], chunk: int
) -> None:
    name, loaded, (first, second) = model
    whole = decode_greedily(DecodeBatch(loaded), Decoding(loaded, second, GREEDY))

    cache = new_prefix_cache(1 << 30)
    earlier = Decoding(loaded, first, GREEDY)
    _in_chunks(earlier, chunk)  # a prompt prefilled in chunks is cached as a whole one is
    earlier.step()
    cache.insert(first, prompt_kv(earlier))
    found = cache.match(second)
    assert found is not None, name
    reusing = Decoding(loaded, second, GREEDY)
    reusing.start_from_prefix(leading(found.value, found.length))
    assert _in_chunks(reusing, chunk) >= 1
    assert decode_greedily(DecodeBatch(loaded), reusing) == whole, f"{name}, chunks of {chunk}"


def test_a_chunk_must_leave_a_prompt_token_for_the_step_that_chooses(
    model: tuple[str, LoadedModel, list[tuple[int, ...]]],
) -> None:
    _, loaded, (prompt, _) = model
    row = Decoding(loaded, prompt, GREEDY)
    with pytest.raises(ValueError, match="pending prompt tokens"):
        row.prefill_chunk(len(prompt))
    with pytest.raises(ValueError, match="pending prompt tokens"):
        row.prefill_chunk(0)


def _job(tokenizer: Any, prompt_ids: tuple[int, ...], new_tokens: int, log: list[Any]) -> Any:
    settings = DecodeSettings(
        max_new_tokens=new_tokens, temperature=0.0, top_p=1.0, seed=None, stop=()
    )
    return GenerationJob(
        request_id=str(len(log)),
        variant="primary",
        prompt_ids=prompt_ids,
        settings=settings,
        deadline_monotonic=time.monotonic() + 60,
        tokenizer=tokenizer,
        deliver=log.append,
    )


def _turns_a_running_row_decodes_while_a_long_prompt_joins(
    model_dir: Path, tokenizer: Any, chunk_tokens: int
) -> tuple[int, int, list[Any]]:
    """A row runs; a 200-token prompt joins. The worker's turns are driven one at a time:
    how many of them gave the running row a token before the joiner had its first, and how
    many tokens the joiner then produced."""

    async def scenario() -> tuple[int, int, list[Any]]:
        worker = InferenceWorker(
            asyncio.get_running_loop(), Faults({}), inbox_size=8, prefill_chunk_tokens=chunk_tokens
        )
        worker.loaded = load_model("primary", model_dir, "none", torch.device("cpu"), tokenizer)
        log: list[Any] = []
        running = _job(tokenizer, (5, 6, 7), 64, log)
        worker.submit(running)
        worker._turn()
        assert running.completion_tokens >= 1
        joiner = _job(tokenizer, tuple(range(10, 210)), 4, log)
        worker.submit(joiner)
        interleaved = 0
        while joiner.completion_tokens == 0:
            before = running.completion_tokens
            worker._turn()
            if joiner.completion_tokens == 0 and running.completion_tokens > before:
                interleaved += 1
        while not joiner.ended.is_set():
            worker._turn()
        await asyncio.sleep(0)  # the posted events arrive
        return interleaved, joiner.completion_tokens, log

    return asyncio.run(scenario())


def test_the_worker_decodes_running_rows_between_the_chunks_of_a_joining_prompt(
    tiny_model_dir: Path, tiny_tokenizer: Any
) -> None:
    interleaved, tokens, log = _turns_a_running_row_decodes_while_a_long_prompt_joins(
        tiny_model_dir, tiny_tokenizer, chunk_tokens=32
    )
    # 200 tokens in chunks of 32: six chunks run before the turn that chooses its first token.
    assert interleaved == 6
    assert tokens == 4
    assert any(isinstance(event, Finished) and event.reason == "length" for event in log)


def test_without_chunks_a_joining_prompt_runs_whole_in_one_turn(
    tiny_model_dir: Path, tiny_tokenizer: Any
) -> None:
    interleaved, tokens, _ = _turns_a_running_row_decodes_while_a_long_prompt_joins(
        tiny_model_dir, tiny_tokenizer, chunk_tokens=0
    )
    assert interleaved == 0
    assert tokens == 4


def test_a_prompt_cancelled_between_its_chunks_ends_once_and_the_next_long_prompt_goes_on(
    tiny_model_dir: Path, tiny_tokenizer: Any
) -> None:
    async def scenario() -> tuple[list[Any], list[Any], int]:
        worker = InferenceWorker(
            asyncio.get_running_loop(), Faults({}), inbox_size=8, prefill_chunk_tokens=32
        )
        worker.loaded = load_model(
            "primary", tiny_model_dir, "none", torch.device("cpu"), tiny_tokenizer
        )
        first_log: list[Any] = []
        second_log: list[Any] = []
        first = _job(tiny_tokenizer, tuple(range(10, 210)), 4, first_log)
        second = _job(tiny_tokenizer, tuple(range(20, 220)), 4, second_log)
        worker.submit(first)
        worker.submit(second)
        worker._turn()
        worker._turn()  # two of the first prompt's chunks have run
        first.cancelled.set()
        turns = 0
        while not second.ended.is_set() and turns < 50:
            worker._turn()
            turns += 1
        await asyncio.sleep(0)  # the posted events arrive
        return first_log, second_log, second.completion_tokens

    first_log, second_log, second_tokens = asyncio.run(scenario())
    assert [type(event) for event in first_log] == [Finished]
    assert first_log[0].reason == "cancelled" and first_log[0].completion_tokens == 0
    assert second_tokens == 4
    assert isinstance(second_log[-1], Finished) and second_log[-1].reason == "length"
