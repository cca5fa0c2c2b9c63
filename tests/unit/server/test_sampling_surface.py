"""n, penalties, token bias and log-probabilities: parsing, seeds, the pure logit rules,
the response shapes (parsed by the official client's own types), and admission of n rows."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
import torch
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from fusebox_server.control.admission import Admission
from fusebox_server.errors import InvalidRequest, QueueFull, SchemaError
from fusebox_server.http.app import choice_settings
from fusebox_server.http.openai_schema import (
    check_logit_bias,
    parse_chat_request,
    parse_completion_request,
)
from fusebox_server.http.rendering import (
    Choice,
    Kind,
    Reply,
    chat_logprobs,
    choices_body,
    chunk_body,
    completion_logprobs,
    whole_choices_events,
)
from fusebox_server.model.decode_settings import (
    SEED_HIGHEST,
    DecodeSettings,
    RepeatPenalties,
    choice_seed,
)
from fusebox_server.model.token_choice import (
    LOGPROB_FLOOR,
    RowAdjustments,
    bias_tensors,
    penalised,
    score_token,
)
from fusebox_server.model.worker import ScoredToken

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "m", "prompt": "hi"}


# ----- parsing -----
def test_the_sampling_fields_reach_the_parsed_request() -> None:
    sampling = parse_chat_request(
        {
            **CHAT,
            "n": 3,
            "presence_penalty": 0.5,
            "frequency_penalty": -1.5,
            "logit_bias": {"17": 100, "4": -2.5},
            "logprobs": True,
            "top_logprobs": 4,
        }
    ).sampling
    assert (sampling.n, sampling.presence_penalty, sampling.frequency_penalty) == (3, 0.5, -1.5)
    assert sampling.logit_bias == ((17, 100.0), (4, -2.5))
    assert sampling.logprobs == 4
    assert parse_chat_request({**CHAT, "logprobs": True}).sampling.logprobs == 0
    assert parse_chat_request({**CHAT, "logprobs": False}).sampling.logprobs is None
    assert parse_completion_request({**COMPLETION, "logprobs": 0}).sampling.logprobs == 0
    assert parse_completion_request(COMPLETION).sampling.logprobs is None


@pytest.mark.parametrize(
    ("kind", "field", "value"),
    [
        (Kind.CHAT, "n", 0),
        (Kind.CHAT, "n", 129),
        (Kind.COMPLETION, "presence_penalty", 2.5),
        (Kind.CHAT, "frequency_penalty", -2.01),
        (Kind.CHAT, "logit_bias", {"5": 101}),
        (Kind.CHAT, "logit_bias", {"-5": 1}),
        (Kind.CHAT, "logit_bias", {"five": 1}),
        (Kind.CHAT, "logit_bias", {"٣": 1}),  # a digit, but not an ASCII one
        (Kind.CHAT, "top_logprobs", 21),
        (Kind.CHAT, "top_logprobs", 2),  # without logprobs: true
        (Kind.COMPLETION, "logprobs", 6),
        (Kind.COMPLETION, "logprobs", -1),
    ],
)
def test_an_out_of_range_sampling_value_is_a_400_naming_it(
    kind: Kind, field: str, value: object
) -> None:
    parse = parse_chat_request if kind == Kind.CHAT else parse_completion_request
    body = {**(CHAT if kind == Kind.CHAT else COMPLETION), field: value}
    with pytest.raises(InvalidRequest) as caught:
        parse(body)
    assert caught.value.status == 400 and caught.value.param == field


@pytest.mark.parametrize(
    ("kind", "field", "value"),
    [
        (Kind.CHAT, "logprobs", 1),  # chat's is a boolean
        (Kind.COMPLETION, "logprobs", True),  # completions' is a count
        (Kind.CHAT, "logit_bias", [1, 2]),
        (Kind.CHAT, "logit_bias", {"5": "up"}),
        (Kind.CHAT, "n", 2.0),
    ],
)
def test_a_sampling_value_of_the_wrong_type_is_a_422_naming_it(
    kind: Kind, field: str, value: object
) -> None:
    parse = parse_chat_request if kind == Kind.CHAT else parse_completion_request
    with pytest.raises(SchemaError) as caught:
        parse({**(CHAT if kind == Kind.CHAT else COMPLETION), field: value})
    assert caught.value.param == field


def test_a_bias_on_a_token_outside_the_vocabulary_is_a_400_naming_logit_bias() -> None:
    check_logit_bias(((0, 1.0), (99, -1.0)), vocabulary_size=100)
    with pytest.raises(InvalidRequest) as caught:
        check_logit_bias(((5, 1.0), (100, 1.0)), vocabulary_size=100)
    assert caught.value.param == "logit_bias" and "100" in caught.value.message


# ----- seeds per choice -----
def test_choice_i_samples_with_seed_plus_i_wrapping_past_the_largest_seed() -> None:
    assert [choice_seed(41, index) for index in range(3)] == [41, 42, 43]
    assert choice_seed(SEED_HIGHEST, 0) == SEED_HIGHEST
    assert choice_seed(SEED_HIGHEST, 1) == 0
    seeded = parse_chat_request({**CHAT, "n": 3, "seed": 7, "logit_bias": {"3": 1}}).sampling
    settings = choice_settings(seeded, max_new_tokens=5)
    assert [s.seed for s in settings] == [7, 8, 9]
    assert all(s.token_bias == ((3, 1.0),) and s.max_new_tokens == 5 for s in settings)
    unseeded = choice_settings(parse_chat_request({**CHAT, "n": 2}).sampling, 5)
    assert [s.seed for s in unseeded] == [None, None]


# ----- the logit rules -----
def test_penalties_subtract_presence_once_and_frequency_per_generated_occurrence() -> None:
    logits = torch.tensor([1.0, 2.0, 3.0, 4.0])
    counts = torch.tensor([0.0, 1.0, 3.0, 0.0])
    adjusted = penalised(logits, counts, RepeatPenalties(presence=0.5, frequency=0.25))
    assert adjusted.tolist() == [1.0, 2.0 - 0.5 - 0.25, 3.0 - 0.5 - 0.75, 4.0]


def test_a_row_counts_its_tokens_and_applies_penalties_then_bias() -> None:
    settings = DecodeSettings(
        8,
        0.0,
        1.0,
        None,
        (),
        repeat_penalties=RepeatPenalties(frequency=1.0),
        token_bias=((0, 10.0),),
    )
    row = RowAdjustments(settings)
    logits = torch.zeros(4)
    assert row.apply(logits).tolist() == [10.0, 0.0, 0.0, 0.0]
    for token in (2, 2, 3):
        row.took(token, 4, logits.device)
    assert row.apply(logits).tolist() == [10.0, 0.0, -2.0, -1.0]


def test_a_bias_outside_the_logits_never_reaches_the_index() -> None:
    with pytest.raises(ValueError, match="outside the vocabulary"):
        bias_tensors(((3, 1.0), (4, 1.0)), vocabulary=4, device=torch.device("cpu"))


def test_a_score_is_the_raw_log_softmax_with_the_most_likely_alternatives() -> None:
    logits = torch.tensor([0.0, 2.0, 1.0, -200.0])
    expected = torch.log_softmax(logits, dim=-1).tolist()
    score = score_token(logits, 2, alternatives=2)
    assert score.token_id == 2 and math.isclose(score.logprob, expected[2], rel_tol=1e-6)
    assert [token for token, _ in score.alternatives] == [1, 2]
    assert math.isclose(score.alternatives[0][1], expected[1], rel_tol=1e-6)
    assert score_token(logits, 1, alternatives=0).alternatives == ()
    assert math.isclose(sum(math.exp(lp) for lp in expected), 1.0, rel_tol=1e-6)
    assert score_token(torch.tensor([0.0, -1e30]), 1, 1).logprob == LOGPROB_FLOOR


# ----- response shapes, parsed by the client's own types -----
REPLY_CHAT = Reply(Kind.CHAT, "r1", 1700000000, "m")
REPLY_COMPLETION = Reply(Kind.COMPLETION, "r2", 1700000000, "m")


def _scored(text: str, logprob: float, *alternatives: tuple[str, float]) -> ScoredToken:
    return ScoredToken(
        text,
        text.encode(),
        logprob,
        tuple(ScoredToken(alt, alt.encode(), lp) for alt, lp in alternatives),
    )


SCORES = [_scored("Hel", -0.5, ("Hel", -0.5), ("He", -1.5)), _scored("ló", -0.25, ("ló", -0.25))]


def test_chat_logprobs_parse_as_the_client_reads_them_for_every_choice() -> None:
    choices = [Choice(i, "Helló", "stop", chat_logprobs(SCORES)) for i in range(2)]
    body = ChatCompletion.model_validate(choices_body(REPLY_CHAT, choices, 3, 4))
    assert [choice.index for choice in body.choices] == [0, 1]
    content = body.choices[1].logprobs.content  # type: ignore[union-attr]
    assert content is not None
    assert [entry.token for entry in content] == ["Hel", "ló"]
    assert content[1].bytes == list("ló".encode())
    assert content[0].top_logprobs[1].token == "He"
    chunk = ChatCompletionChunk.model_validate(
        chunk_body(REPLY_CHAT, "Hel", None, True, 1, chat_logprobs(SCORES[:1]))
    )
    assert chunk.choices[0].index == 1
    assert chunk.choices[0].logprobs.content[0].logprob == -0.5  # type: ignore[union-attr,index]


def test_completion_logprobs_are_the_legacy_lists_with_offsets_and_the_chosen_token() -> None:
    logprobs = completion_logprobs(SCORES, text_offset=10)
    body = Completion.model_validate(
        choices_body(REPLY_COMPLETION, [Choice(0, "Helló", "length", logprobs)], 3, 2)
    )
    parsed = body.choices[0].logprobs
    assert parsed is not None
    assert parsed.tokens == ["Hel", "ló"] and parsed.token_logprobs == [-0.5, -0.25]
    assert parsed.text_offset == [10, 13]
    assert parsed.top_logprobs == [{"Hel": -0.5, "He": -1.5}, {"ló": -0.25}]
    chosen_only = completion_logprobs([_scored("x", -3.0)], 0)
    assert chosen_only["top_logprobs"] == [{"x": -3.0}]


# ----- admission of n rows -----
def test_a_request_for_n_choices_takes_n_slots_and_waits_in_order() -> None:
    async def scenario() -> None:
        admission = Admission(max_running=4, max_waiting=4)
        await admission.acquire(1, count=3)
        assert admission.running == 3
        big = asyncio.ensure_future(admission.acquire(5, count=2))
        await asyncio.sleep(0)
        small = asyncio.ensure_future(admission.acquire(5, count=1))
        await asyncio.sleep(0)
        # One slot is free, but the head of the queue wants two: first in, first out.
        assert admission.waiting == 3 and not big.done() and not small.done()
        with pytest.raises(QueueFull):
            await admission.acquire(5, count=2)  # 3 rows wait; the queue holds 4
        admission.release()
        await asyncio.sleep(0)
        assert big.done() and admission.running == 4 and not small.done()
        for _ in range(2):
            admission.release()
        await asyncio.gather(big, small)
        assert (admission.running, admission.waiting) == (3, 0)

    asyncio.run(scenario())


def test_more_slots_than_exist_are_refused_rather_than_queued_forever() -> None:
    async def scenario() -> None:
        admission = Admission(max_running=2, max_waiting=8)
        with pytest.raises(ValueError, match="3 slots"):
            await admission.acquire(5, count=3)
        assert (admission.running, admission.waiting) == (0, 0)

    asyncio.run(scenario())


def test_a_large_waiter_that_gives_up_lets_the_one_behind_it_in() -> None:
    async def scenario() -> None:
        admission = Admission(max_running=2, max_waiting=4)
        await admission.acquire(1, count=1)
        big: Any = asyncio.ensure_future(admission.acquire(0.05, count=2))
        await asyncio.sleep(0)
        small = asyncio.ensure_future(admission.acquire(5, count=1))
        await asyncio.sleep(0)
        assert not small.done()
        with pytest.raises(Exception, match="deadline"):
            await big
        await asyncio.sleep(0)
        assert small.done() and admission.running == 2

    asyncio.run(scenario())


def test_the_whole_answer_stream_carries_every_choice_and_its_logprobs() -> None:
    choices = [Choice(i, f"text {i}", "length", chat_logprobs(SCORES)) for i in range(2)]
    events = whole_choices_events(REPLY_CHAT, choices, (3, 8)).decode().split("\n\n")
    payloads = [event.removeprefix("data: ") for event in events if event]
    assert payloads[-1] == "[DONE]"
    chunks = [ChatCompletionChunk.model_validate_json(payload) for payload in payloads[:-1]]
    texts = [(c.choices[0].index, c.choices[0].delta.content) for c in chunks if c.choices]
    assert [text for text in texts if text[1]] == [(0, "text 0"), (1, "text 1")]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes == [None, "length", None, "length"]
    scored = [c for c in chunks if c.choices and c.choices[0].logprobs is not None]
    assert [c.choices[0].index for c in scored] == [0, 1]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8
