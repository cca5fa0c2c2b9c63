"""The tiny model generator, the engine's quantized variant, and the worker thread's resilience."""

from __future__ import annotations

import asyncio
import filecmp
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fusebox_server.errors import GenerationFailed, ModelUnavailable
from fusebox_server.model.decode_settings import DecodeSettings
from fusebox_server.model.engine import Decoding, load_model
from fusebox_server.model.faults import Faults
from fusebox_server.model.tiny_model import write_model
from fusebox_server.model.tokenization import load_tokenizer
from fusebox_server.model.worker import Failed, Finished, GenerationJob, InferenceWorker

from .worker_jobs import GREEDY, cpu_worker, submit_job


def test_the_generator_writes_the_same_files_byte_for_byte(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    again = write_model(tmp_path / "again", "tiny")
    names = sorted(p.name for p in tiny_model_dir.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    assert "model.safetensors" in names and "tokenizer.json" in names
    match, mismatch, errors = filecmp.cmpfiles(tiny_model_dir, again, names, shallow=False)
    assert mismatch == [] and errors == []


def test_greedy_decoding_produces_text_and_the_int8_variant_is_smaller(
    tiny_model_dir: Path, tiny_tokenizer: Any
) -> None:
    prompt = tuple(tiny_tokenizer.backend_tokenizer.encode("Hello, world.").ids)
    cpu = torch.device("cpu")
    primary = load_model("primary", tiny_model_dir, "none", cpu, tiny_tokenizer)
    fallback = load_model("fallback", tiny_model_dir, "int8", cpu, tiny_tokenizer)
    assert fallback.parameter_bytes < 0.5 * primary.parameter_bytes
    for loaded in (primary, fallback):
        decoding = Decoding(loaded, prompt, GREEDY)
        ids = [decoding.step() for _ in range(8)]
        assert not any(decoding.is_end(i) for i in ids)
        assert tiny_tokenizer.decode(ids, skip_special_tokens=True).strip()


def test_a_failing_request_reaches_its_caller_in_general_words_and_the_worker_carries_on(
    tiny_model_dir: Path, tiny_tokenizer: Any
) -> None:
    async def scenario() -> list[Any]:
        worker = cpu_worker(asyncio.get_running_loop(), tiny_model_dir, tiny_tokenizer)
        worker.start()
        outcomes: list[Any] = []

        async def run(
            prompt_ids: tuple[int, ...], variant: str = "primary", tokenizer: Any = tiny_tokenizer
        ) -> Any:
            done, pieces = submit_job(worker, tokenizer, prompt_ids, variant=variant)
            event = await done
            return event, "".join(pieces)

        outcomes.append(await run((10**9,)))  # an id outside the vocabulary: the model raises
        # Encoded for a variant not loaded, with a tokenizer the loaded one does not share.
        other = load_tokenizer(tiny_model_dir)
        other.add_tokens(["<another-vocabulary>"])
        outcomes.append(await run((5, 6, 7), variant="fallback", tokenizer=other))
        outcomes.append(await run((5, 6, 7)))
        assert worker.is_alive()
        worker.stop()
        return outcomes

    (bad, _), (wrong, _), (good, text) = asyncio.run(scenario())
    assert isinstance(bad, Failed) and isinstance(bad.error, GenerationFailed)
    # A library's words (torch's IndexError here) stay in the server log, never the answer.
    assert "Error" not in bad.error.message and "index out of range" not in bad.error.message
    assert isinstance(wrong, Failed) and isinstance(wrong.error, ModelUnavailable)
    assert isinstance(good, Finished) and good.reason == "length" and text


def test_rows_decoded_in_a_batch_match_decoding_alone(
    tiny_model_dir: Path, tiny_tokenizer: Any
) -> None:
    from fusebox_server.model.engine import DecodeBatch

    loaded = load_model("primary", tiny_model_dir, "none", torch.device("cpu"), tiny_tokenizer)
    texts = ["Hello", "The quick brown fox jumps over", "你好，今天天气很好", "a"]
    prompts = [tuple(tiny_tokenizer.backend_tokenizer.encode(t).ids) for t in texts]
    alone = []
    for prompt in prompts:
        decoding = Decoding(loaded, prompt, GREEDY)
        alone.append([decoding.step() for _ in range(10)])

    batch = DecodeBatch(loaded)
    rows: list[Decoding] = []
    outputs: list[list[int]] = []
    for index, prompt in enumerate(prompts):  # rows join at different steps...
        row = Decoding(loaded, prompt, GREEDY)
        outputs.append([row.step()])
        rows.append(row)
        batch.add(row)
        if index == 1:
            for member, token in zip(list(batch.rows), batch.step(), strict=True):
                outputs[rows.index(member)].append(token)
    while len(batch):  # ...and leave when they have their ten tokens
        for member, token in zip(list(batch.rows), batch.step(), strict=True):
            outputs[rows.index(member)].append(token)
        for member in list(batch.rows):
            if len(outputs[rows.index(member)]) == 10:
                batch.remove(member)
    assert outputs == alone


def test_a_model_load_in_progress_counts_as_a_live_worker_up_to_a_limit() -> None:
    from fusebox_server.model.worker import CONTROL_ACTION_GRACE_SECONDS

    worker = InferenceWorker(loop=None, faults=Faults({}), inbox_size=1)
    worker.heartbeat = 1000.0
    assert worker.effective_heartbeat(now=1100.0) == 1000.0
    worker.control_started_at = 1050.0
    assert worker.effective_heartbeat(now=1100.0) == 1100.0
    later = 1050.0 + CONTROL_ACTION_GRACE_SECONDS + 1
    assert worker.effective_heartbeat(now=later) == 1000.0


def _alone(loaded: Any, prompt: tuple[int, ...], count: int) -> list[int]:
    decoding = Decoding(loaded, prompt, GREEDY)
    return [decoding.step() for _ in range(count)]


def test_prompts_prefilled_together_decode_as_each_would_alone(
    tiny_model_dir: Path, tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fusebox_server.model import engine

    # Two spare columns: the cache's buffers fill and grow several times in this test.
    monkeypatch.setattr(engine, "SPARE_COLUMNS", 2)
    loaded = load_model("primary", tiny_model_dir, "none", torch.device("cpu"), tiny_tokenizer)
    texts = ["Hello", "The quick brown fox jumps over", "你好，今天天气很好", "a", "Once upon"]
    prompts = [tuple(tiny_tokenizer.backend_tokenizer.encode(t).ids) for t in texts]
    alone = [_alone(loaded, prompt, 12) for prompt in prompts]

    batch = engine.DecodeBatch(loaded)
    first = [Decoding(loaded, prompt, GREEDY) for prompt in prompts[:3]]  # different lengths
    outputs = {
        id(row): [token] for row, token in zip(first, engine.prefill(loaded, first), strict=True)
    }
    batch.add(*first)
    for _ in range(3):
        for member, token in zip(list(batch.rows), batch.step(), strict=True):
            outputs[id(member)].append(token)
    later = [Decoding(loaded, prompt, GREEDY) for prompt in prompts[3:]]  # join a running batch
    outputs |= {
        id(row): [token] for row, token in zip(later, engine.prefill(loaded, later), strict=True)
    }
    batch.add(*later)
    while len(batch):
        for member, token in zip(list(batch.rows), batch.step(), strict=True):
            outputs[id(member)].append(token)
        for member in list(batch.rows):
            if len(outputs[id(member)]) == 12:
                batch.remove(member)
    assert [outputs[id(row)] for row in [*first, *later]] == alone


def test_rows_that_leave_together_are_dropped_in_one_step_and_the_rest_decode_on(
    tiny_model_dir: Path, tiny_tokenizer: Any
) -> None:
    from fusebox_server.model.engine import DecodeBatch, prefill

    loaded = load_model("primary", tiny_model_dir, "none", torch.device("cpu"), tiny_tokenizer)
    texts = ["Hello there", "a", "The quick brown fox jumps over the lazy dog", "Once"]
    prompts = [tuple(tiny_tokenizer.backend_tokenizer.encode(t).ids) for t in texts]
    expected = _alone(loaded, prompts[1], 8)
    rows = [Decoding(loaded, prompt, GREEDY) for prompt in prompts]
    tokens = prefill(loaded, rows)
    batch = DecodeBatch(loaded)
    batch.add(*rows)
    kept = [tokens[1]]
    kept.append(batch.step()[1])
    for leaving in (rows[0], rows[2], rows[3]):  # the longest leaves: its columns go too
        batch.remove(leaving)
    assert batch.rows == [rows[1]]
    while len(kept) < 8:
        kept += batch.step()
    assert kept == expected
    batch.remove(rows[1])
    assert len(batch) == 0


def test_prompts_are_grouped_shortest_first_within_the_token_budget() -> None:
    from fusebox_server.model.engine import prefill_groups

    assert prefill_groups([5, 3, 4, 9], token_budget=15) == [[1, 2, 0], [3]]
    assert prefill_groups([5, 3, 4, 9], token_budget=12) == [[1, 2], [0], [3]]
    assert prefill_groups([40, 2], token_budget=16) == [[1], [0]]  # too long: alone
    assert prefill_groups([], token_budget=16) == []


def test_a_prompt_that_fails_in_a_group_fails_alone_and_the_others_start(
    tiny_model_dir: Path, tiny_tokenizer: Any
) -> None:
    async def scenario() -> list[Any]:
        worker = cpu_worker(asyncio.get_running_loop(), tiny_model_dir, tiny_tokenizer)
        # All three wait in the inbox before the thread starts: one turn, one prefill group.
        futures = [
            submit_job(worker, tiny_tokenizer, prompt_ids)[0]
            for prompt_ids in ((5, 6, 7), (10**9, 5), (8, 9))
        ]
        worker.start()
        outcomes = [await future for future in futures]
        worker.stop()
        return outcomes

    good, bad, other = asyncio.run(scenario())
    assert isinstance(bad, Failed) and isinstance(bad.error, GenerationFailed)
    for event in (good, other):
        assert isinstance(event, Finished) and event.reason == "length"
        assert event.completion_tokens == 4


def _run_together(
    tiny_model_dir: Path, tiny_tokenizer: Any, settings: list[DecodeSettings], max_new_tokens: int
) -> list[tuple[Any, str]]:
    """Run one job per settings on a fresh worker, all in one batch; each job's end and text."""

    async def scenario() -> list[tuple[Any, str]]:
        worker = cpu_worker(asyncio.get_running_loop(), tiny_model_dir, tiny_tokenizer)
        # All wait in the inbox before the thread starts: one prefill group, one batch.
        jobs = [
            submit_job(
                worker, tiny_tokenizer, (5, 6, 7), settings=row, max_new_tokens=max_new_tokens
            )
            for row in settings
        ]
        futures = [future for future, _ in jobs]
        texts = [pieces for _, pieces in jobs]
        worker.start()
        ends = [await future for future in futures]
        worker.stop()
        return [(end, "".join(pieces)) for end, pieces in zip(ends, texts, strict=True)]

    return asyncio.run(scenario())


def test_a_vanishing_temperature_or_top_p_decodes_greedily_beside_other_rows(
    tiny_model_dir: Path, tiny_tokenizer: Any
) -> None:
    """Valid values too small for float32 (1e-39 makes every logit inf) never fail a row."""
    tiny_temperature = DecodeSettings(
        max_new_tokens=6, temperature=1e-39, top_p=1.0, seed=1, stop=()
    )
    tiny_top_p = DecodeSettings(max_new_tokens=6, temperature=1.0, top_p=1e-46, seed=1, stop=())
    results = _run_together(
        tiny_model_dir,
        tiny_tokenizer,
        [GREEDY, tiny_temperature, tiny_top_p, replace(tiny_temperature, temperature=1e-300)],
        max_new_tokens=6,
    )
    for end, _ in results:
        assert isinstance(end, Finished) and end.reason == "length", end
    greedy_text = results[0][1]
    assert greedy_text and all(text == greedy_text for _, text in results)


def test_a_row_whose_sampling_fails_gets_its_error_and_the_batch_decodes_on(
    tiny_model_dir: Path, tiny_tokenizer: Any
) -> None:
    from fusebox_server.model.engine import DecodeBatch

    loaded = load_model("primary", tiny_model_dir, "none", torch.device("cpu"), tiny_tokenizer)
    sampled = DecodeSettings(max_new_tokens=6, temperature=0.8, top_p=0.9, seed=1, stop=())
    rows = [Decoding(loaded, (5, 6, 7), settings) for settings in (GREEDY, sampled, GREEDY)]
    batch = DecodeBatch(loaded)
    for row in rows:
        row.step()
        batch.add(row)
    # Validation refuses NaN; here it stands for any sampler fault (NaN logits, a bug).
    rows[1].settings = replace(sampled, temperature=float("nan"))
    first, failed, last = batch.step()
    assert isinstance(failed, RuntimeError)
    assert isinstance(first, int) and isinstance(last, int)
    batch.remove(rows[1])
    assert all(isinstance(token, int) for token in batch.step())


def test_the_worker_fails_only_the_row_whose_sampling_fails_mid_batch(
    tiny_model_dir: Path, tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fusebox_server.model import engine

    real_choose_token = engine.choose_token
    draws: list[int] = []

    def choose_token(logits: Any, settings: DecodeSettings, generator: Any) -> int:
        if settings.seed == 13:  # the doomed row: its sampler breaks on its third token
            draws.append(1)
            if len(draws) >= 3:
                raise RuntimeError("sampler fault")
        return real_choose_token(logits, settings, generator)

    monkeypatch.setattr(engine, "choose_token", choose_token)
    doomed = DecodeSettings(max_new_tokens=6, temperature=0.8, top_p=1.0, seed=13, stop=())
    sampled = DecodeSettings(max_new_tokens=6, temperature=0.8, top_p=0.9, seed=1, stop=())
    greedy, failing, other = _run_together(
        tiny_model_dir, tiny_tokenizer, [GREEDY, doomed, sampled], max_new_tokens=6
    )
    assert isinstance(failing[0], Failed) and isinstance(failing[0].error, GenerationFailed)
    assert failing[0].completion_tokens == 2
    for end, text in (greedy, other):
        assert isinstance(end, Finished) and end.reason == "length" and text


def _held_back_by_brute_force(text: str, stops: tuple[str, ...]) -> int:
    return max(
        (
            size
            for stop in stops
            for size in range(1, min(len(stop) - 1, len(text)) + 1)
            if text.endswith(stop[:size])
        ),
        default=0,
    )


@settings(max_examples=300, derandomize=True)
@given(
    text=st.text(alphabet="ab你", max_size=12),
    stops=st.lists(st.text(alphabet="ab你", min_size=1, max_size=8), max_size=4),
)
def test_the_text_held_back_is_the_longest_tail_that_could_start_a_stop(
    text: str, stops: list[str]
) -> None:
    from fusebox_server.model.worker import _held_back_chars

    assert _held_back_chars(text, tuple(stops)) == _held_back_by_brute_force(text, tuple(stops))


def test_a_final_event_lost_to_failed_allocations_frees_its_slot_when_the_caller_gives_up(
    tiny_model_dir: Path, tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker drops an event it could not hand over; the job is marked ended all the
    same, so the request's give-up at its deadline frees the admission slot, once."""
    from fusebox_server.control.runtime import Generation
    from fusebox_server.model import worker as worker_module

    class LoopWithoutMemory:  # every hand-over to the event loop fails to allocate
        def call_soon_threadsafe(self, *args: Any) -> None:
            raise MemoryError

    monkeypatch.setattr(worker_module, "POST_ATTEMPTS", 2)
    worker = cpu_worker(LoopWithoutMemory(), tiny_model_dir, tiny_tokenizer)  # type: ignore[arg-type]
    releases: list[str] = []

    def generation(request_id: str) -> Generation:
        job = GenerationJob(
            request_id=request_id,
            variant="primary",
            prompt_ids=(5, 6, 7),
            settings=replace(GREEDY, max_new_tokens=2),
            deadline_monotonic=time.monotonic() + 60,
            tokenizer=tiny_tokenizer,
            deliver=lambda event: None,
        )
        return Generation(job=job, release_slot=partial(releases.append, request_id))

    lost, held = generation("lost"), generation("held")
    worker.submit(lost.job)
    worker.start()
    assert lost.job.ended.wait(timeout=60)
    worker.stop()
    lost.give_up()
    lost.give_up()
    assert releases == ["lost"]

    held.give_up()  # the worker never let go of this one: its slot waits for the report
    assert held.job.cancelled.is_set() and releases == ["lost"]
    held.end()
    assert releases == ["lost", "held"]


def test_a_piece_holding_two_stops_ends_at_the_earlier_one_in_the_text() -> None:
    from fusebox_server.model.decode_settings import earliest_stop

    text = "Hello" + ".\n"  # one token's text ".\n" after "Hello"
    assert earliest_stop(text, ("\n", "."), searched_to=5) == 5
    assert earliest_stop(text, (".", "\n"), searched_to=5) == 5
    assert earliest_stop("Hello", ("\n", "."), searched_to=5) is None


@settings(max_examples=300, derandomize=True)
@given(
    text=st.text(alphabet="ab.\n", max_size=12),
    stops=st.lists(st.text(alphabet="ab.\n", min_size=1, max_size=3), max_size=4),
)
def test_the_text_ends_at_the_earliest_stop_of_any_in_the_list(text: str, stops: list[str]) -> None:
    from fusebox_server.model.decode_settings import earliest_stop

    found = [text.find(stop) for stop in stops if stop in text]
    assert earliest_stop(text, tuple(stops)) == (min(found) if found else None)
