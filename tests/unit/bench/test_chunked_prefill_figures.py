"""The chunk phase's figures: a running stream's gaps split by the joiners' prefills."""

from __future__ import annotations

import pytest

from bench.realistic_bench import joiner_figures, verdict
from bench.serving_metrics import ResponseRecord


def _record(sent: float, chunk_times: list[float], finished: float) -> ResponseRecord:
    record = ResponseRecord(0, scheduled=sent, sent=sent, finished=finished)
    record.chunk_times = chunk_times
    return record


def test_gaps_overlapping_a_prefill_are_during_and_gaps_clear_of_every_joiner_are_steady() -> None:
    # The joiner is sent at 10 and has its first text at 12, its last at 13.
    joiner = _record(10.0, [12.0, 12.5], 13.0)
    # Steady gaps of 0.1 before; one gap of 1.0 across the prefill (9.9 -> 10.9), then 0.2
    # and 0.3 inside it; the gap 12.9 -> 13.1 overlaps the joiner's decoding: neither.
    running = _record(9.0, [9.7, 9.8, 9.9, 10.9, 11.1, 11.4, 12.9, 13.1, 13.2], 13.2)
    figures = joiner_figures([running], [joiner])
    assert figures["steady_gaps"] == 3  # 9.7-9.8, 9.8-9.9, 13.1-13.2
    assert figures["during_prefill_gaps"] == 4  # 9.9-10.9, 10.9-11.1, 11.1-11.4, 11.4-12.9
    assert figures["during_prefill_itl_seconds"]["p99"] == pytest.approx(1.5)
    assert figures["stall_median_seconds"] == pytest.approx(1.5)
    assert figures["steady_itl_seconds"]["p99"] == pytest.approx(0.1)
    assert figures["itl_p99_ratio"] == pytest.approx(15.0)
    assert figures["running_text_chunks_during_each_prefill"] == [3]  # 10.9, 11.1, 11.4
    assert figures["joiner_ttft_p50_seconds"] == pytest.approx(2.0)


def test_the_verdict_holds_each_chunk_size_to_the_two_times_steady_target() -> None:
    result = {"chunk": {"settings": {"0": {"itl_p99_ratio": 40.0}, "64": {"itl_p99_ratio": 1.6}}}}
    checks = verdict(result)
    assert checks["chunked_prefill_itl_p99_ratio_chunk_0"]["met"] is False
    assert checks["chunked_prefill_itl_p99_ratio_chunk_64"]["met"] is True
