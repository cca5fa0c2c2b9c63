"""bench/serving_metrics.py: the load figures, held to hand-computed values."""

from __future__ import annotations

import math

import pytest

from bench.serving_metrics import MissingUsage, ResponseRecord, percentile, summarize


def _record(
    index: int, scheduled: float, chunks: list[float], finished: float, tokens: int | None
) -> ResponseRecord:
    return ResponseRecord(
        index,
        scheduled=scheduled,
        sent=scheduled,
        chunk_times=chunks,
        finished=finished,
        text="x" * len(chunks),
        finish_reason="length",
        completion_tokens=tokens,
    )


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 11)]  # 1..10
    assert percentile(values, 0.5) == 5.0
    assert percentile(values, 0.99) == 10.0
    assert percentile(list(reversed(values)), 0.1) == 1.0
    assert math.isnan(percentile([], 0.5))


def test_figures_from_two_streamed_responses() -> None:
    records = [
        # Due at 0, first text at 1, then 1.5 and 2.5, done at 3; 3 tokens.
        _record(0, 0.0, [1.0, 1.5, 2.5], 3.0, 3),
        # Due at 1 (open loop: it may be sent later), first text at 4, done at 5; 2 tokens.
        _record(1, 1.0, [4.0, 5.0], 5.0, 2),
    ]
    figures = summarize(records)
    assert figures["completion_tokens"] == 5
    assert figures["seconds"] == 5.0 and figures["tokens_per_second"] == 1.0
    # TTFT from the scheduled time: 1 and 3.
    assert figures["ttft_seconds"] == {"p50": 1.0, "p99": 3.0}
    # Gaps 0.5, 1.0, 1.0.
    assert figures["itl_seconds"] == {"p50": 1.0, "p99": 1.0}
    # TPOT: (3 - 1) / 2 = 1.0 and (5 - 4) / 1 = 1.0.
    assert figures["tpot_seconds"] == {"p50": 1.0, "p99": 1.0}
    assert figures["latency_seconds"] == {"p50": 3.0, "p99": 4.0}
    assert figures["finish_reasons"] == {"length": 2}


def test_a_response_without_usage_fails_the_run_instead_of_counting_max_tokens() -> None:
    records = [_record(0, 0.0, [1.0], 2.0, 1), _record(1, 0.0, [1.0], 2.0, None)]
    with pytest.raises(MissingUsage, match=r"\[1\]"):
        summarize(records)


def test_failed_requests_are_counted_apart_and_add_no_tokens() -> None:
    failed = ResponseRecord(1, scheduled=0.0, finished=0.5, error="HTTP 429: queue full")
    figures = summarize([_record(0, 0.0, [1.0, 2.0], 2.0, 2), failed])
    assert figures["errors"] == 1 and figures["first_error"] == "HTTP 429: queue full"
    assert figures["completion_tokens"] == 2 and figures["tokens_per_second"] == 1.0


def test_a_response_whose_text_all_came_at_its_end_has_no_observable_first_token() -> None:
    held_back = _record(1, 0.0, [9.0], 9.0, 40)  # 40 tokens, one text chunk at the end
    one_token = _record(2, 0.0, [2.0], 2.0, 1)  # a one-token answer: its chunk is its first
    figures = summarize([_record(0, 0.0, [1.0, 2.0], 2.0, 2), held_back, one_token])
    assert figures["ttft_seconds"] == {"p50": 1.0, "p99": 2.0}
    assert figures["ttft_unobserved"] == 1
    # Its tokens and latency still count.
    assert figures["completion_tokens"] == 43 and figures["latency_seconds"]["p99"] == 9.0
