"""recorder: what each finished generation counts toward, decided in one place."""

from __future__ import annotations

from fusebox_contract.names import LatencyMetric
from fusebox_server.config import QualitySettings
from fusebox_server.control.live_files import LiveSettings
from fusebox_server.control.quality import QualitySampler
from fusebox_server.control.recorder import GenerationOutcome, Recorder
from fusebox_server.control.stats import LatencyWindow, TokenCounter

WINDOW_SECONDS = 60.0


def recorder(sample_rate: float = 1.0) -> Recorder:
    live = LiveSettings(quality=QualitySettings(sample_rate=sample_rate))
    latency = {metric: LatencyWindow(WINDOW_SECONDS) for metric in LatencyMetric}
    return Recorder(TokenCounter(), latency, QualitySampler(WINDOW_SECONDS), live)


def samples(record: Recorder, metric: LatencyMetric) -> int:
    summary = record.latency[metric].summary()
    return 0 if summary is None else summary.count


def test_a_success_counts_its_tokens_its_latencies_and_may_be_sampled() -> None:
    record = recorder()
    verdict = record.finished(
        GenerationOutcome(
            prompt_tokens=5,
            completion_tokens=3,
            succeeded=True,
            e2e_seconds=0.4,
            ttft_seconds=0.1,
            itl_seconds=(0.05, 0.05),
            text_parts=('{"a":', " 1}"),
            wants_json=True,
        )
    )
    assert verdict is not None and verdict.ok  # the pieces are judged as one text
    totals = record.tokens.totals()
    assert (totals.prompt_total, totals.generation_total) == (5, 3)
    counts = {metric: samples(record, metric) for metric in LatencyMetric}
    assert counts == {LatencyMetric.TTFT: 1, LatencyMetric.E2E: 1, LatencyMetric.ITL: 2}
    assert record.quality.failure_ratio() == 0.0


def test_a_sampled_answer_that_is_not_the_json_asked_for_fails_quality() -> None:
    record = recorder()
    outcome = GenerationOutcome(5, 3, True, 0.4, 0.1, (), ("not json",), wants_json=True)
    verdict = record.finished(outcome)
    assert verdict is not None and verdict.reasons == ("invalid_json",)
    assert record.quality.failure_ratio() == 1.0


def test_a_failed_generation_spends_its_tokens_but_no_latency_and_no_quality() -> None:
    record = recorder()
    assert record.finished(GenerationOutcome(5, 2, False, 9.0, 0.1, (0.1,), ("x",))) is None
    assert record.tokens.totals().generation_total == 2
    assert all(samples(record, metric) == 0 for metric in LatencyMetric)
    assert record.quality.failure_ratio() is None
    # Refused before the model read the prompt: nothing was spent.
    record.finished(GenerationOutcome(7, 0, False, 0.01))
    assert record.tokens.totals().prompt_total == 5


def test_only_the_sampled_share_is_checked() -> None:
    record = recorder(sample_rate=0.0)
    assert record.finished(GenerationOutcome(5, 3, True, 0.4, text_parts=("x",))) is None
    assert record.quality.failure_ratio() is None
