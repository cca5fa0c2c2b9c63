"""The server's side of the stats file: atomic writes, sliding-window
percentiles, and the step from the runtime's raw figures to the contract's
document, which the sidecar's parser must read back whole."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fusebox_contract.metrics import LatencyHistogram
from fusebox_contract.names import (
    BreakerState,
    DegradationLevel,
    Dtype,
    HeartbeatThread,
    LatencyMetric,
    Quantization,
    RequestOutcome,
    Variant,
)
from fusebox_contract.stats import (
    HistogramCounts,
    LatencySummary,
    RuntimeState,
    StatsDocument,
    Tokens,
    dumps,
    parse,
)
from fusebox_server.config import QualitySettings
from fusebox_server.control.quality import QualitySampler, check_response
from fusebox_server.control.stats import (
    LatencyCounter,
    LatencyWindow,
    StatsThread,
    TokenCounter,
    compose_document,
    dtype_named,
    latency_counters,
    percentile,
    runtime_state,
    write_atomically,
)
from fusebox_server.model.prefix_cache import PrefixCacheFigures


def test_write_atomically_replaces_the_file_and_leaves_no_temporaries(tmp_path: Path) -> None:
    target = tmp_path / "run" / "stats.json"
    write_atomically(target, '{"n":1}')
    write_atomically(target, '{"n":2}')
    assert target.read_text() == '{"n":2}'
    assert [p.name for p in target.parent.iterdir()] == ["stats.json"]


def test_percentiles_use_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile([3.0], 0.99) == 3.0


def test_the_window_forgets_old_samples() -> None:
    window = LatencyWindow(window_seconds=60)
    assert window.summary(now=100) is None
    window.add(0.5, now=100)
    window.add_many([0.1, 0.2], now=130)
    assert window.summary(now=140) == LatencySummary(p99_seconds=0.5, count=3)
    assert window.summary(now=175) == LatencySummary(p99_seconds=0.2, count=2)
    assert window.summary(now=200) is None


class SteppingClocks:
    """The node's wall clock and the monotonic clock, as the process sees them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.wall, self.monotonic = 10_000.0, 500.0
        monkeypatch.setattr(time, "time", lambda: self.wall)
        monkeypatch.setattr(time, "monotonic", lambda: self.monotonic)

    def run(self, seconds: float) -> None:
        self.wall += seconds
        self.monotonic += seconds


def test_a_wall_clock_step_back_does_not_keep_old_samples_in_the_windows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clocks = SteppingClocks(monkeypatch)
    window = LatencyWindow(window_seconds=60)
    quality = QualitySampler(window_seconds=60)
    window.add(5.0)
    quality.record(check_response("", True, 1, 1, QualitySettings()))

    clocks.wall -= 3600  # NTP or a resumed VM steps the clock back an hour
    clocks.run(1)
    window.add_many([0.05] * 50)
    quality.record(check_response("fine", True, 1, 1, QualitySettings()))
    clocks.run(120)

    assert window.summary() is None
    assert quality.failure_ratio() is None


def test_a_latency_counts_into_the_first_bucket_whose_bound_holds_it() -> None:
    counter = LatencyCounter((0.1, 0.5, 1.0))
    counter.observe([0.05, 0.1, 0.3, 0.5, 0.7, 4.0])
    assert counter.counts() == HistogramCounts((2, 4, 5), 6, pytest.approx(5.65))


def test_the_window_s_samples_are_counted_into_its_histogram_too() -> None:
    counter = LatencyCounter((0.1, 1.0))
    window = LatencyWindow(window_seconds=60, counter=counter)
    window.add(0.05, now=100)
    window.add_many([0.2, 2.0], now=300)  # long after the window forgot the first
    assert window.summary(now=300) == LatencySummary(p99_seconds=2.0, count=2)
    assert counter.counts() == HistogramCounts((1, 2), 3, pytest.approx(2.25))


def test_every_histogram_starts_empty_on_the_contract_s_bounds() -> None:
    counters = latency_counters()
    assert set(counters) == set(LatencyHistogram)
    for name, counter in counters.items():
        assert counter.counts() == HistogramCounts((0,) * len(name.buckets), 0, 0.0)


def test_tokens_add_up_prompt_and_generated_apart() -> None:
    tokens = TokenCounter()
    assert tokens.totals() == Tokens(prompt_total=0, generation_total=0)
    tokens.add(12, 3)
    tokens.add(5, 0)
    assert tokens.totals() == Tokens(prompt_total=17, generation_total=3)


def _state(**changes: object) -> RuntimeState:
    values: dict[str, object] = {
        "breaker": BreakerState.HALF_OPEN,
        "admit_percent": 5,
        "degradation_level": DegradationLevel.FALLBACK_MODEL,
        "variant": Variant.FALLBACK,
        "model_loaded": True,
        "memory_guard_active": False,
        "model_revision": "v1.2",
        "dtype": "torch.float16",
        "quantization": Quantization.INT8,
        "fallback_configured": True,
        "fallback_unavailable_reason": None,
        "target_variant": Variant.PRIMARY,
        "converging": True,
    }
    values.update(changes)
    return runtime_state(**values)  # type: ignore[arg-type]


def _document(**changes: object) -> StatsDocument:
    values: dict[str, object] = {
        "written_at": 1796000000.5,
        "started_at": 1796000000.0,
        "pid": 77,
        "model_name": "chat",
        "rss_bytes": 1 << 30,
        "cgroup_usage_bytes": 2 << 30,
        "cgroup_limit_bytes": None,
        "cuda": {"allocated_bytes": None, "reserved_bytes": None, "num_alloc_retries": None},
        "nvml": [{"index": 0, "uuid": "GPU-1", "memory_used_bytes": 5, "memory_total_bytes": 9}],
        "queue_length": 3,
        "running": 2,
        "tokenizer_cache_entries": 40,
        "tokenizer_cache_hits_total": 12,
        "tokenizer_template_hits_total": 4,
        "requests": dict.fromkeys(RequestOutcome, 1),
        "latency": {
            LatencyMetric.TTFT: LatencySummary(0.2, 10),
            LatencyMetric.ITL: None,
            LatencyMetric.E2E: LatencySummary(1.0, 10),
        },
        "histograms": {name: c.counts() for name, c in latency_counters().items()},
        "tokens": Tokens(prompt_total=40, generation_total=20),
        "prefix_cache": PrefixCacheFigures(
            hits_total=6,
            misses_total=3,
            evictions_total=1,
            reused_tokens_total=960,
            entries=2,
            bytes=4096,
            capacity_bytes=1 << 20,
        ),
        "quality_sampled_total": 10,
        "quality_failed_total": 1,
        "quality_failure_ratio": 0.1,
        "heartbeats": {HeartbeatThread.LOOP: 1796000000.4, HeartbeatThread.WORKER: None},
        "state": _state(),
    }
    values.update(changes)
    return compose_document(**values)  # type: ignore[arg-type]


def test_the_runtime_s_figures_become_the_contract_document_the_sidecar_reads() -> None:
    document = _document()

    reading = parse(dumps(document))

    assert reading.valid, reading.problems
    assert reading.document == document
    assert document.requests[RequestOutcome.INVALID] == 1
    assert set(document.latency) == {LatencyMetric.TTFT, LatencyMetric.E2E}
    assert document.heartbeats == {HeartbeatThread.LOOP: 1796000000.4}
    assert document.nvml[0].memory_total_bytes == 9
    assert document.quality.failure_ratio == 0.1
    assert set(document.histograms) == set(LatencyHistogram)
    assert document.tokens.generation_total == 20
    assert (document.prefix_cache.hits_total, document.prefix_cache.bytes) == (6, 4096)


def test_a_worker_not_yet_started_leaves_the_prefix_cache_absent() -> None:
    reading = parse(dumps(_document(prefix_cache=None)))
    assert reading.valid, reading.problems
    assert reading.document is not None
    assert reading.document.prefix_cache.hits_total is None


def test_the_state_carries_the_loaded_variant_s_facts_in_the_contract_s_names() -> None:
    state = _state()

    assert (state.breaker, state.degradation_level, state.variant) == (
        BreakerState.HALF_OPEN,
        DegradationLevel.FALLBACK_MODEL,
        Variant.FALLBACK,
    )
    assert (state.dtype, state.quantization, state.model_revision) == (
        Dtype.FLOAT16,
        Quantization.INT8,
        "v1.2",
    )
    assert (state.target_variant, state.converging) == (Variant.PRIMARY, True)


def test_an_empty_revision_is_absent_not_an_empty_label() -> None:
    assert _state(model_revision="").model_revision is None


def test_a_refused_fallback_is_written_unavailable_with_its_reason_cut_to_what_is_read() -> None:
    assert _state().fallback_available is True
    assert _state().fallback_unavailable_reason is None
    reason = "the fallback is unavailable: " + "int4 needs CUDA; " * 40
    refused = _state(fallback_unavailable_reason=reason)
    assert refused.fallback_available is False
    document = parse(dumps(StatsDocument(state=refused)))
    assert document.valid and document.document is not None
    assert document.document.state.fallback_available is False
    assert document.document.state.fallback_unavailable_reason == reason[:256]


@pytest.mark.parametrize(
    ("engine_name", "contract"),
    [("bfloat16", Dtype.BFLOAT16), ("torch.float32", Dtype.FLOAT32), ("int8", None), (None, None)],
)
def test_the_loaded_dtype_is_named_as_the_contract_spells_it(
    engine_name: str | None, contract: Dtype | None
) -> None:
    assert dtype_named(engine_name) is contract


def test_the_stats_thread_writes_the_contract_document_every_interval(tmp_path: Path) -> None:
    path = tmp_path / "stats.json"
    writes: list[int] = []

    def snapshot() -> StatsDocument:
        writes.append(1)
        return _document(pid=len(writes))

    thread = StatsThread(path, snapshot, tick=lambda: None, interval_seconds=0.01)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while len(writes) < 3:
            assert time.monotonic() < deadline, "the stats thread never wrote three times"
            time.sleep(0.01)
    finally:
        thread.stop()
        thread.join()

    reading = parse(path.read_text())
    assert reading.valid and reading.document is not None
    assert reading.document.pid is not None and reading.document.pid >= 3
