"""Penalties, token bias and scores inside continuous batching, on the real tiny model.

Rows with these settings decode in the same step as plain greedy rows, in
both batches (`DecodeBatch`, and `SlotBatch` run eagerly: what its CUDA
graph replays), and each row decodes as it would alone.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from fusebox_server.model.decode_settings import DecodeSettings, RepeatPenalties
from fusebox_server.model.engine import DecodeBatch, Decoding, load_model, prefill
from fusebox_server.model.slot_batch import SlotBatch
from fusebox_server.model.worker import Finished, GenerationJob, Piece

from .worker_jobs import GREEDY, cpu_worker

STEPS = 12
PROMPT_TEXTS = ["Once upon", "The river", "Hello there, how", "a"]


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path, tiny_tokenizer: Any) -> Any:
    return load_model("primary", tiny_model_dir, "none", torch.device("cpu"), tiny_tokenizer)


@pytest.fixture(scope="module")
def prompts(tiny_tokenizer: Any) -> list[tuple[int, ...]]:
    return [tuple(tiny_tokenizer.backend_tokenizer.encode(t).ids) for t in PROMPT_TEXTS]


def _settings() -> list[DecodeSettings]:
    return [
        GREEDY,  # takes the batch's shared argmax
        replace(GREEDY, repeat_penalties=RepeatPenalties(presence=1.0, frequency=2.0)),
        replace(GREEDY, token_bias=((7, 5.0), (11, -100.0))),
        replace(GREEDY, top_alternatives=3),
    ]


def _alone(loaded: Any, prompt: tuple[int, ...], settings: DecodeSettings) -> list[Any]:
    row = Decoding(loaded, prompt, settings)
    return [(row.step(), row.last_score) for _ in range(STEPS)]


@pytest.mark.parametrize("kind", ["decode_batch", "slot_batch"])
def test_rows_with_penalties_bias_and_scores_decode_in_one_batch_as_each_would_alone(
    kind: str, loaded: Any, prompts: list[tuple[int, ...]]
) -> None:
    settings = _settings()
    alone = [_alone(loaded, p, s) for p, s in zip(prompts, settings, strict=True)]
    batch = DecodeBatch(loaded) if kind == "decode_batch" else SlotBatch(loaded, graphs=False)
    rows = [Decoding(loaded, p, s) for p, s in zip(prompts, settings, strict=True)]
    first = prefill(loaded, rows)
    together: list[list[Any]] = [[(t, row.last_score)] for t, row in zip(first, rows, strict=True)]
    batch.add(*rows)
    for _ in range(STEPS - 1):
        for index, token in enumerate(batch.step()):
            together[index].append((token, rows[index].last_score))
    for index, (expected, got) in enumerate(zip(alone, together, strict=True)):
        assert [t for t, _ in got] == [t for t, _ in expected], index
    scored = [(a, b) for (_, a), (_, b) in zip(alone[3], together[3], strict=True)]
    for by_itself, batched in scored:
        assert by_itself is not None and batched is not None
        assert math.isclose(by_itself.logprob, batched.logprob, abs_tol=1e-3)
        assert [t for t, _ in by_itself.alternatives] == [t for t, _ in batched.alternatives]
    assert all(score is None for _, score in together[0])  # unscored rows carry no score


def test_each_setting_changes_greedy_output_the_way_it_says(
    loaded: Any, prompts: list[tuple[int, ...]]
) -> None:
    prompt = prompts[0]
    plain = [t for t, _ in _alone(loaded, prompt, GREEDY)]
    forced = [t for t, _ in _alone(loaded, prompt, replace(GREEDY, token_bias=((42, 100.0),)))]
    assert forced == [42] * STEPS
    banned = plain[0]
    without = _alone(loaded, prompt, replace(GREEDY, token_bias=((banned, -100.0),)))
    assert banned not in [t for t, _ in without]
    penalised = [
        t
        for t, _ in _alone(
            loaded, prompt, replace(GREEDY, repeat_penalties=RepeatPenalties(frequency=2.0))
        )
    ]
    assert penalised != plain
    assert max(Counter(penalised).values()) <= max(Counter(plain).values())
    scored = _alone(loaded, prompt, replace(GREEDY, top_alternatives=2))
    for token, score in scored:
        # Greedy: the chosen token is the most likely one, and its score is that alternative's.
        assert score.token_id == token == score.alternatives[0][0]
        assert score.logprob == score.alternatives[0][1] <= 0.0


def test_the_worker_sends_one_score_per_token_with_the_pieces(
    tiny_model_dir: Path, tiny_tokenizer: Any, prompts: list[tuple[int, ...]]
) -> None:
    async def scenario() -> tuple[list[Piece], Any]:
        worker = cpu_worker(asyncio.get_running_loop(), tiny_model_dir, tiny_tokenizer)
        worker.start()
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        pieces: list[Piece] = []

        def deliver(event: Any) -> None:
            if isinstance(event, Piece):
                pieces.append(event)
            elif not done.done():
                done.set_result(event)

        worker.submit(
            GenerationJob(
                request_id="scores",
                variant="primary",
                prompt_ids=prompts[1],
                settings=replace(GREEDY, max_new_tokens=10, top_alternatives=1),
                deadline_monotonic=asyncio.get_running_loop().time() + 1e9,
                tokenizer=tiny_tokenizer,
                deliver=deliver,
            )
        )
        final = await done
        worker.stop()
        return pieces, final

    pieces, final = asyncio.run(scenario())
    assert isinstance(final, Finished)
    scores = [score for piece in pieces for score in piece.scores]
    assert len(scores) == final.completion_tokens
    text = b"".join(score.raw for score in scores).decode(errors="replace")
    assert text == "".join(piece.text for piece in pieces)
    assert all(len(score.alternatives) == 1 for score in scores)
