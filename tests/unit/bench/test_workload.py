"""bench/workload.py: the realistic workload is the same for the same seed, its lengths stay
in their ranges, and the shared system prompt goes to its share of the requests.

Token counts are the llama3 zoo model's own tokenizer's, as in the benchmark."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from transformers import AutoTokenizer

from bench.workload import (
    KIND_WEIGHTS,
    WorkloadShape,
    build_workload,
    corpus_lines,
    poisson_arrivals,
)
from fusebox_server.zoo.release import ensure_zoo_model


@pytest.fixture(scope="module")
def count_tokens() -> Callable[[str], int]:
    tokenizer = AutoTokenizer.from_pretrained(str(ensure_zoo_model("llama3")))
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False))


def test_the_same_seed_gives_the_same_requests_and_another_seed_others(
    count_tokens: Callable[[str], int],
) -> None:
    first = build_workload(40, count_tokens, seed=7)
    again = build_workload(40, count_tokens, seed=7)
    other = build_workload(40, count_tokens, seed=8)
    assert first == again
    assert [r.user for r in first.requests] != [r.user for r in other.requests]


def test_prompt_and_output_lengths_stay_in_the_shapes_ranges(
    count_tokens: Callable[[str], int],
) -> None:
    workload = build_workload(200, count_tokens)
    prompts = [r.prompt_tokens for r in workload.requests]
    outputs = [r.max_tokens for r in workload.requests]
    assert min(prompts) >= 256 and max(prompts) <= 2048
    assert min(outputs) >= 64 and max(outputs) <= 512
    # Spread over the range, not bunched at one end (uniform: about a quarter per quarter).
    assert sum(p < 700 for p in prompts) > 20 and sum(p > 1600 for p in prompts) > 20
    assert sum(o < 170 for o in outputs) > 20 and sum(o > 400 for o in outputs) > 20
    # The recorded count is the tokenizer's count of what is sent.
    for request in workload.requests[:20]:
        system = count_tokens(request.system) if request.system else 0
        assert request.prompt_tokens == system + count_tokens(request.user)


def test_thirty_percent_of_requests_share_one_thousand_token_system_prompt(
    count_tokens: Callable[[str], int],
) -> None:
    workload = build_workload(100, count_tokens)
    shared = [r for r in workload.requests if r.system is not None]
    assert len(shared) == 30
    assert {r.system for r in shared} == {workload.system_prompt}
    assert count_tokens(workload.system_prompt) == 1000
    assert shared[0].messages()[0] == {"role": "system", "content": workload.system_prompt}
    assert workload.describe()["system_prompt_share"] == 0.3


def test_every_kind_of_text_is_drawn_chinese_and_code_included(
    count_tokens: Callable[[str], int],
) -> None:
    workload = build_workload(100, count_tokens)
    kinds = workload.describe()["kinds"]
    assert isinstance(kinds, dict) and set(kinds) == set(KIND_WEIGHTS)
    assert all(kinds[kind] >= 10 for kind in KIND_WEIGHTS)
    chinese = next(r for r in workload.requests if r.kind == "chinese")
    assert any("\u4e00" <= character <= "\u9fff" for character in chinese.user)
    code = next(r for r in workload.requests if r.kind == "code")
    assert set(code.user.splitlines()) <= set(corpus_lines()["code"]) | {code.user.splitlines()[-1]}


def test_a_scaled_shape_divides_every_length_and_says_by_how_much(
    count_tokens: Callable[[str], int],
) -> None:
    shape = WorkloadShape().scaled(4)
    assert shape.prompt_tokens == (64, 512) and shape.output_tokens == (16, 128)
    assert shape.system_prompt_tokens == 250 and shape.scale == 4
    workload = build_workload(50, count_tokens, shape)
    assert max(r.prompt_tokens for r in workload.requests) <= 512
    assert workload.describe()["scale"] == 4
    with pytest.raises(ValueError, match="positive integer"):
        WorkloadShape().scaled(0)


def test_poisson_arrivals_are_seeded_and_average_the_rate() -> None:
    times = poisson_arrivals(2000, rate_per_second=4.0, seed=3)
    assert times == poisson_arrivals(2000, rate_per_second=4.0, seed=3)
    assert times[0] == 0.0 and times == sorted(times)
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert 0.23 < sum(gaps) / len(gaps) < 0.27  # mean gap 1/rate
    # Exponential gaps: about e^-1 of them are longer than the mean.
    assert 0.33 < sum(gap > 0.25 for gap in gaps) / len(gaps) < 0.41
    with pytest.raises(ValueError, match="positive"):
        poisson_arrivals(3, rate_per_second=0)
