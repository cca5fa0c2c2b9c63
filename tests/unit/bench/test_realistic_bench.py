"""bench/realistic_bench.py's own judgements: how far two servers' greedy texts agree, and
each target's verdict from the figures measured against it."""

from __future__ import annotations

from typing import Any

from transformers import AutoTokenizer

from bench.realistic_bench import TARGETS, agreement, verdict
from bench.serving_metrics import ResponseRecord
from fusebox_server.zoo.release import ensure_zoo_model


def _responses(texts: list[str]) -> list[ResponseRecord]:
    return [ResponseRecord(index, scheduled=0.0, text=text) for index, text in enumerate(texts)]


def test_agreement_counts_identical_texts_and_the_shared_token_prefix() -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(ensure_zoo_model("llama3")))
    same = "The server loads the model once."
    ours = _responses([same, "The server loads the model once, then warms it up."])
    theirs = _responses([same, "The server loads the model twice, then warms it up."])
    theirs.append(ResponseRecord(2, scheduled=0.0, text="only one side has this"))
    ours.append(ResponseRecord(3, scheduled=0.0, text="the other side sent no text"))
    theirs.append(ResponseRecord(3, scheduled=0.0, text=""))
    result = agreement(tokenizer, ours, theirs)
    assert result["compared"] == 2 and result["identical"] == 1
    assert result["one_side_empty"] == 1
    assert result["identical_share"] == 0.5
    # The second pair agrees up to "once"/"twice": a share strictly between 0 and 1.
    assert 0.5 < result["mean_common_prefix_share"] < 1.0


def test_the_verdict_holds_each_measured_figure_to_its_target_and_skips_the_rest() -> None:
    result: dict[str, Any] = {
        "c16": {"tokens_per_second_ratio": 1.5, "ttft_p99_ratio": 0.9},
    }
    checks = verdict(result)
    assert checks["c16_tokens_per_second_ratio"] == {"value": 1.5, "met": True}
    assert checks["c16_ttft_p99_ratio"] == {"value": 0.9, "met": False}
    assert "c1_latency_ratio" not in checks
    at_target = {"c1": {"median_ratio": TARGETS["c1_latency_ratio_at_most"]}}
    assert verdict(at_target)["c1_latency_ratio"]["met"] is True


def test_ttft_is_compared_on_the_requests_both_servers_streamed() -> None:
    from bench.realistic_bench import paired_ttft_p99

    def record(index: int, chunks: list[float]) -> ResponseRecord:
        return ResponseRecord(
            index, scheduled=0.0, chunk_times=chunks, finished=10.0, completion_tokens=5
        )

    ours = [record(0, [1.0, 2.0]), record(1, [9.0])]  # 1: all text at the end
    theirs = [record(0, [3.0, 4.0]), record(1, [2.0, 3.0])]
    assert paired_ttft_p99(ours, theirs) == {"requests": 1, "fusebox": 1.0, "peer": 3.0}


def test_the_prefix_cache_verdict_holds_the_system_prompt_ttft_p99_to_its_target() -> None:
    checks = verdict({"prefix": {"ttft_p99_ratio_system_prompt": 0.25}})
    assert checks["prefix_cache_ttft_p99_ratio_system_prompt"] == {"value": 0.25, "met": True}
    missed = verdict({"prefix": {"ttft_p99_ratio_system_prompt": 0.5}})
    assert missed["prefix_cache_ttft_p99_ratio_system_prompt"]["met"] is False


def test_the_prefix_round_figures_split_ttft_by_the_shared_system_prompt() -> None:
    from bench.realistic_bench import ttft_figures

    def record(index: int, first: float) -> ResponseRecord:
        return ResponseRecord(
            index,
            scheduled=0.0,
            chunk_times=[first, first + 1.0],
            finished=first + 2.0,
            completion_tokens=3,
        )

    records = [record(0, 4.0), record(1, 1.0), record(2, 8.0), record(3, 2.0)]
    result = ttft_figures(records, shared={1, 3})
    assert result["system_prompt"] == {"p50": 1.0, "p99": 2.0, "n": 2}
    assert result["all"] == {"p50": 2.0, "p99": 8.0, "n": 4}


def test_each_prefix_round_keeps_its_own_prompts_under_the_one_system_prompt() -> None:
    from bench.realistic_bench import shared_indexes, with_system_prompt
    from bench.workload import WorkloadShape, build_workload

    def count(text: str) -> int:
        return len(text.split())

    shape = WorkloadShape().scaled(8)
    first = build_workload(10, count, shape, seed=1)
    other = with_system_prompt(build_workload(10, count, shape, seed=2), first.system_prompt)
    assert shared_indexes(other) == {r.index for r in other.requests if r.system is not None}
    assert shared_indexes(other)  # 30% of ten carry it
    assert {r.system for r in other.requests if r.system is not None} == {first.system_prompt}
    assert [r.user for r in other.requests] != [r.user for r in first.requests]
