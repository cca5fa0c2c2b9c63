"""The CUDA decode path's slot cache, run eagerly on the CPU: rows decode as they would alone.

The graphs themselves need CUDA; bench/gpu_profile.py holds them to the eager
step on the H200. What the graphs replay is `SlotBatch._forward`, which these
tests run: the slots, the per-row scatter, the mask, joining, leaving, growth.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from fusebox_server.model import slot_batch
from fusebox_server.model.decode_settings import DecodeSettings
from fusebox_server.model.engine import DecodeBatch, Decoding, load_model, prefill
from fusebox_server.model.faults import Faults
from fusebox_server.model.slot_batch import MIN_COLUMNS, SlotBatch, bucket, new_batch, shrunk
from fusebox_server.model.worker import ControlJob, Finished, InferenceWorker

from .worker_jobs import GREEDY, cpu_worker, submit_job

TEXTS = ["Hello", "The quick brown fox jumps over", "你好，今天天气很好", "a", "Once upon"]


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path, tiny_tokenizer: Any) -> Any:
    return load_model("primary", tiny_model_dir, "none", torch.device("cpu"), tiny_tokenizer)


def _prompts(tokenizer: Any) -> list[tuple[int, ...]]:
    return [tuple(tokenizer.backend_tokenizer.encode(text).ids) for text in TEXTS]


def _alone(loaded: Any, prompt: tuple[int, ...], count: int) -> list[int]:
    decoding = Decoding(loaded, prompt, GREEDY)
    return [decoding.step() for _ in range(count)]


def _step(batch: SlotBatch, outputs: dict[int, list[int]]) -> None:
    for member, token in zip(list(batch.rows), batch.step(), strict=True):
        assert isinstance(token, int)
        outputs[id(member)].append(token)


def test_bucket_rounds_up_to_a_power_of_two_from_a_floor() -> None:
    assert [bucket(n) for n in (1, 2, 3, 5, 33, 64)] == [1, 2, 4, 8, 64, 64]
    assert bucket(3, MIN_COLUMNS) == MIN_COLUMNS and bucket(65, MIN_COLUMNS) == 128


def test_rows_joining_and_leaving_the_slots_decode_as_each_would_alone(
    loaded: Any, tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Four columns: the cache doubles its columns three times in this test (prompts of 1-6
    # tokens, 30 more each), and its slots once (3 rows, then 5), each growth keeping what
    # the rows already hold; it shrinks as soon as the rows need a quarter.
    monkeypatch.setattr(slot_batch, "MIN_COLUMNS", 4)
    monkeypatch.setattr(slot_batch, "SHRINK_AFTER_SECONDS", 0.0)
    prompts = _prompts(tiny_tokenizer)
    alone = [_alone(loaded, prompt, 30) for prompt in prompts]
    batch = SlotBatch(loaded, graphs=False)
    first = [Decoding(loaded, prompt, GREEDY) for prompt in prompts[:3]]  # different lengths
    outputs = {id(row): [token] for row, token in zip(first, prefill(loaded, first), strict=True)}
    batch.add(*first)
    assert batch.capacity == (4, 8)
    for _ in range(3):
        _step(batch, outputs)
    later = [Decoding(loaded, prompt, GREEDY) for prompt in prompts[3:]]  # join a running batch
    outputs |= {id(row): [token] for row, token in zip(later, prefill(loaded, later), strict=True)}
    batch.add(*later)
    assert batch.capacity[0] == 8
    while len(batch):
        _step(batch, outputs)
        for member in list(batch.rows):
            if len(outputs[id(member)]) == 30:
                batch.remove(member)
    # 8 slots until the first three left; two rows need a quarter of them, so the cache halved.
    assert batch.capacity == (4, 64)
    assert [outputs[id(row)] for row in [*first, *later]] == alone


def test_a_dimension_the_rows_use_a_quarter_of_is_halved_to_twice_their_need() -> None:
    assert [shrunk(64, need) for need in (1, 8, 16, 32, 64)] == [2, 16, 32, 64, 64]
    assert shrunk(8, 2) == 4 and shrunk(8, 4) == 8 and shrunk(0, 1) == 0


def test_the_cache_follows_the_running_rows_down_and_up_and_they_decode_as_alone(
    loaded: Any, tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(slot_batch, "MIN_COLUMNS", 4)
    monkeypatch.setattr(slot_batch, "SHRINK_AFTER_SECONDS", 0.0)
    long_prompt = tuple(tiny_tokenizer.backend_tokenizer.encode("Once upon a time " * 12).ids)
    prompts = [*_prompts(tiny_tokenizer), *_prompts(tiny_tokenizer)[:2], long_prompt]
    rows = [Decoding(loaded, prompt, GREEDY) for prompt in prompts]
    outputs = {id(row): [token] for row, token in zip(rows, prefill(loaded, rows), strict=True)}
    batch = SlotBatch(loaded, graphs=False)
    batch.add(*rows)
    for _ in range(3):
        _step(batch, outputs)
    assert len(long_prompt) == 132 and batch.capacity == (8, 256)
    full = batch.cache_bytes()
    for row in [*rows[1:6], rows[-1]]:  # the long row and five others leave; two stay
        batch.remove(row)
    _step(batch, outputs)
    # Two rows at positions up to 10 need 2 slots of 16 columns: both dimensions were 4x
    # that or more, so each is cut to twice the need, a sixteenth of the bytes.
    assert batch.capacity == (4, 32) and batch.cache_bytes() == full // 16
    later = [Decoding(loaded, prompt, GREEDY) for prompt in prompts[1:4]]
    outputs |= {id(row): [token] for row, token in zip(later, prefill(loaded, later), strict=True)}
    batch.add(*later)  # the shrunk cache grows again, keeping what the two rows hold
    assert batch.capacity == (8, 32)
    while len(batch):
        _step(batch, outputs)
        for member in list(batch.rows):
            if len(outputs[id(member)]) == 24:
                batch.remove(member)
    stayed_and_joined = [(rows[0], prompts[0]), (rows[6], prompts[6])]
    stayed_and_joined += list(zip(later, prompts[1:4], strict=True))
    for row, prompt in stayed_and_joined:
        assert outputs[id(row)] == _alone(loaded, prompt, 24)


def test_the_cache_shrinks_only_once_the_rows_have_needed_far_less_for_a_while(
    loaded: Any,
) -> None:
    now = [0.0]
    rows = [Decoding(loaded, (5, 6, 7), GREEDY) for _ in range(8)]
    prefill(loaded, rows)
    batch = SlotBatch(loaded, graphs=False, clock=lambda: now[0])
    batch.add(*rows)
    batch.step()
    for row in rows[2:]:
        batch.remove(row)
    wait = slot_batch.SHRINK_AFTER_SECONDS
    for moment in (0.0, wait / 2, wait * 0.99):  # two rows in 8 slots, not for long enough
        now[0] = moment
        batch.step()
        assert batch.capacity == (8, MIN_COLUMNS)
    joiner = Decoding(loaded, (5, 6, 7), GREEDY)
    prefill(loaded, [joiner])
    batch.add(joiner)  # 3 rows need 4 slots: half of 8, no longer a quarter
    now[0] = wait * 1.5
    batch.step()
    batch.remove(joiner)
    for moment in (wait * 2, wait * 2.99):  # the wait starts again from here
        now[0] = moment
        batch.step()
        assert batch.capacity == (8, MIN_COLUMNS)
    now[0] = wait * 3
    batch.step()
    assert batch.capacity == (4, MIN_COLUMNS)


def test_the_last_rows_fill_the_slots_of_rows_that_left(loaded: Any, tiny_tokenizer: Any) -> None:
    prompts = _prompts(tiny_tokenizer)
    rows = [Decoding(loaded, prompt, GREEDY) for prompt in prompts]
    outputs = {id(row): [token] for row, token in zip(rows, prefill(loaded, rows), strict=True)}
    batch = SlotBatch(loaded, graphs=False)
    batch.add(*rows)
    _step(batch, outputs)
    batch.remove(rows[0])
    batch.remove(rows[2])
    _step(batch, outputs)
    # Slots 0 and 2 were refilled by the rows of slots 3 and 4; the rows keep their order.
    assert batch.rows == [rows[1], rows[3], rows[4]]
    assert batch._slots == [rows[3], rows[1], rows[4]]
    while len(outputs[id(rows[1])]) < 10:
        _step(batch, outputs)
    for index in (1, 3, 4):
        assert outputs[id(rows[index])] == _alone(loaded, prompts[index], 10)


def test_the_slot_batch_decodes_what_the_cpu_batch_decodes(
    loaded: Any, tiny_tokenizer: Any
) -> None:
    prompts = _prompts(tiny_tokenizer)
    results = []
    for batch in (DecodeBatch(loaded), SlotBatch(loaded, graphs=False)):
        rows = [Decoding(loaded, prompt, GREEDY) for prompt in prompts]
        tokens = [[token] for token in prefill(loaded, rows)]
        batch.add(*rows)
        for _ in range(12):
            stepped = dict(zip(map(id, batch.rows), batch.step(), strict=True))
            for row, row_tokens in zip(rows, tokens, strict=True):
                row_tokens.append(stepped[id(row)])
        results.append(tokens)
    assert results[0] == results[1]


def test_a_row_whose_sampling_fails_gets_its_error_and_the_slots_decode_on(
    loaded: Any,
) -> None:
    sampled = DecodeSettings(max_new_tokens=6, temperature=0.8, top_p=0.9, seed=1, stop=())
    rows = [Decoding(loaded, (5, 6, 7), settings) for settings in (GREEDY, sampled, GREEDY)]
    prefill(loaded, rows)
    batch = SlotBatch(loaded, graphs=False)
    batch.add(*rows)
    rows[1].settings = DecodeSettings(
        max_new_tokens=6, temperature=float("nan"), top_p=0.9, seed=1, stop=()
    )
    first, failed, last = batch.step()
    assert isinstance(failed, RuntimeError)
    assert isinstance(first, int) and first == last  # same prompt, greedy: same token
    batch.remove(rows[1])
    assert all(isinstance(token, int) for token in batch.step())


def test_release_drops_the_cache_only_when_no_row_decodes(loaded: Any) -> None:
    rows = [Decoding(loaded, (5, 6, 7), GREEDY)]
    prefill(loaded, rows)
    batch = SlotBatch(loaded, graphs=False)
    batch.add(*rows)
    batch.step()
    batch.release()
    assert batch.cache_bytes() > 0 and batch.capacity == (1, MIN_COLUMNS)
    batch.remove(rows[0])
    batch.step() if len(batch) else None
    batch.release()
    assert batch.cache_bytes() == 0 and batch.capacity == (0, 0)


def test_cpu_models_keep_the_cpu_batch(loaded: Any) -> None:
    assert isinstance(new_batch(loaded), DecodeBatch)


def test_the_worker_releases_an_idle_slot_cache_when_memory_is_released(
    tiny_model_dir: Path, tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decode through the worker on slots (as on CUDA), then release: the cache goes."""
    from fusebox_server.model import worker as worker_module

    monkeypatch.setattr(worker_module, "new_batch", lambda loaded: SlotBatch(loaded, graphs=False))

    async def scenario() -> tuple[Any, str, int, int]:
        worker = cpu_worker(asyncio.get_running_loop(), tiny_model_dir, tiny_tokenizer)
        done, pieces = submit_job(worker, tiny_tokenizer, (5, 6, 7), max_new_tokens=6)
        worker.start()
        end = await done
        batch = worker._batch
        assert isinstance(batch, SlotBatch)
        held = batch.cache_bytes()
        worker.release_idle_batch()  # from this thread: at the worker's next turn
        for _ in range(100):
            if batch.cache_bytes() == 0:
                break
            await asyncio.sleep(0.05)
        released = batch.cache_bytes()
        worker.stop()
        return end, "".join(pieces), held, released

    end, text, held, released = asyncio.run(scenario())
    assert isinstance(end, Finished) and end.reason == "length" and text
    assert held > 0 and released == 0


def test_an_action_on_the_worker_releases_the_idle_slot_cache_before_it_returns(
    tiny_model_dir: Path, tiny_tokenizer: Any
) -> None:
    """The `empty_cache` action runs on the worker: the cache must be gone when it frees."""

    async def scenario() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        worker = InferenceWorker(loop, Faults({}), inbox_size=8)
        loaded = load_model("primary", tiny_model_dir, "none", torch.device("cpu"), tiny_tokenizer)
        rows = [Decoding(loaded, (5, 6, 7), GREEDY)]
        prefill(loaded, rows)
        batch = SlotBatch(loaded, graphs=False)
        batch.add(*rows)
        batch.remove(rows[0])
        worker._batch = batch
        held = batch.cache_bytes()
        answer: asyncio.Future[int] = loop.create_future()

        def release_then_measure() -> int:
            worker.release_idle_batch()
            return batch.cache_bytes()

        worker.submit(ControlJob(release_then_measure, lambda result, _: answer.set_result(result)))
        worker.start()
        after = await answer
        worker.stop()
        return held, after

    held, after = asyncio.run(scenario())
    assert held > 0 and after == 0
