"""Each metric family, built from hand-written observations and read back
through a fresh CollectorRegistry, as Prometheus would see it."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import fields, is_dataclass, replace

import pytest
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from fusebox_contract.metrics import LatencyHistogram, Metric
from fusebox_contract.names import (
    BreakerState,
    Dtype,
    HeartbeatThread,
    LatencyMetric,
    Quantization,
    RequestOutcome,
    Variant,
)
from fusebox_contract.stats import (
    CudaMemory,
    GpuMemory,
    HistogramCounts,
    LatencySummary,
    StatsDocument,
    StatsReading,
    Tokens,
    dumps,
    encode,
    parse,
)
from fusebox_sidecar.cardinality import MAX_RELAYED_GPUS
from fusebox_sidecar.collectors import Observation, SidecarCollector, StampAge
from fusebox_sidecar.nvml import GpuAccess, GpuDevice, GpuReading
from fusebox_sidecar.readings import ProcOutcome, ProcReading

NOW = 1796000010.0
GiB = 1024**3
NO_GPU = GpuReading(GpuAccess.NOT_INSTALLED, detail="not installed")
MEASURED = ProcReading(ProcOutcome.MEASURED, rss_bytes=2_000_000_000.0)


def _registry(
    stats: StatsReading,
    *,
    proc: ProcReading = MEASURED,
    gpu: GpuReading = NO_GPU,
    last_written_at: float | None = None,
    now: float = NOW,
) -> CollectorRegistry:
    if last_written_at is None and stats.document is not None:
        last_written_at = stats.document.written_at
    observation = Observation(now, stats, last_written_at, proc, gpu)
    registry = CollectorRegistry()
    registry.register(SidecarCollector(lambda: observation))
    return registry


def _read(document: StatsDocument) -> StatsReading:
    """What the sidecar reads after the server's writer wrote `document`."""
    return parse(dumps(document))


def _with_state(document: StatsDocument, **changes: object) -> StatsDocument:
    return replace(document, state=replace(document.state, **changes))


def test_relayed_server_values_appear_in_base_units(stats_document: StatsDocument) -> None:
    registry = _registry(_read(stats_document))
    value = registry.get_sample_value

    assert value("fusebox_memory_limit_bytes") == 107_374_182_400
    assert value("fusebox_cgroup_memory_usage_bytes") == 2_345_678_901
    assert value("fusebox_cuda_memory_allocated_bytes") == 14_000_000_000
    assert value("fusebox_cuda_memory_reserved_bytes") == 16_000_000_000
    assert value("fusebox_cuda_alloc_retries_total") == 2
    assert value("fusebox_cuda_ooms_total") == 1
    assert value("fusebox_cuda_contexts") == 1
    assert value("fusebox_request_queue_length") == 5
    assert value("fusebox_requests_running") == 8
    assert value("fusebox_tokenizer_cache_entries") == 812
    assert value("fusebox_quality_failure_ratio") == 0.1
    assert value("fusebox_degradation_level") == 2
    assert value("fusebox_fallback_active") == 1
    assert value("fusebox_model_loaded") == 1
    assert value("fusebox_memory_guard_active") == 0
    assert value("fusebox_stats_valid") == 1


def test_request_outcomes_are_one_counter_with_an_outcome_label(
    stats_document: StatsDocument,
) -> None:
    registry = _registry(_read(stats_document))

    counts = {
        outcome: registry.get_sample_value(Metric.REQUESTS.sample, {"outcome": outcome.value})
        for outcome in RequestOutcome
    }
    assert counts == stats_document.requests
    assert counts[RequestOutcome.CANCELLED] == 6 and counts[RequestOutcome.INVALID] == 9
    exposition = generate_latest(registry).decode()
    assert "# TYPE fusebox_requests_total counter" in exposition
    assert "# TYPE fusebox_cuda_alloc_retries_total counter" in exposition


def test_latency_p99s_are_labelled_by_metric_in_seconds(stats_document: StatsDocument) -> None:
    registry = _registry(_read(stats_document))

    for metric, seconds in {"ttft": 0.05, "itl": 0.02, "e2e": 0.90}.items():
        assert (
            registry.get_sample_value("fusebox_latency_p99_seconds", {"metric": metric}) == seconds
        )


@pytest.mark.parametrize(
    ("state", "code"),
    [(BreakerState.CLOSED, 0), (BreakerState.OPEN, 1), (BreakerState.HALF_OPEN, 2)],
)
def test_breaker_state_is_encoded_closed_0_open_1_half_open_2(
    stats_document: StatsDocument, state: BreakerState, code: int
) -> None:
    document = _with_state(stats_document, breaker=state)

    assert _registry(_read(document)).get_sample_value("fusebox_breaker_state") == code


def test_primary_variant_means_fallback_inactive(stats_document: StatsDocument) -> None:
    document = _with_state(stats_document, variant=Variant.PRIMARY)

    assert _registry(_read(document)).get_sample_value("fusebox_fallback_active") == 0


def test_heartbeat_and_stats_ages_count_from_the_server_stamps(
    stats_document: StatsDocument,
) -> None:
    registry = _registry(_read(stats_document), now=1796000004.10)
    value = registry.get_sample_value

    assert value("fusebox_heartbeat_age_seconds", {"thread": "loop"}) == pytest.approx(4.0)
    assert value("fusebox_heartbeat_age_seconds", {"thread": "worker"}) == pytest.approx(4.05)
    assert value("fusebox_server_stats_age_seconds") == pytest.approx(3.98)


def test_a_stamp_slightly_in_the_future_gives_age_zero_not_negative(
    stats_document: StatsDocument,
) -> None:
    registry = _registry(_read(stats_document), now=1796000000.0)

    assert registry.get_sample_value("fusebox_heartbeat_age_seconds", {"thread": "loop"}) == 0
    assert registry.get_sample_value("fusebox_server_stats_age_seconds") == 0


def test_an_unmeasurable_value_is_absent_not_zero(stats_document: StatsDocument) -> None:
    document = replace(
        stats_document,
        cuda=CudaMemory(),
        latency={},
        quality=replace(stats_document.quality, failure_ratio=None),
    )

    registry = _registry(_read(document))
    exposition = generate_latest(registry).decode()

    assert registry.get_sample_value("fusebox_cuda_memory_allocated_bytes") is None
    assert registry.get_sample_value("fusebox_quality_failure_ratio") is None
    for name in ("fusebox_cuda_", "fusebox_latency_p99_seconds", "fusebox_quality_failure_ratio"):
        assert name not in exposition
    # Valid nulls are not problems.
    assert registry.get_sample_value("fusebox_stats_valid") == 1


def test_a_wrong_typed_field_drops_its_metric_and_marks_the_stats_invalid(
    stats_document: StatsDocument,
) -> None:
    malformed = encode(stats_document)
    malformed["queue_length"] = "five"

    registry = _registry(parse(json.dumps(malformed)))

    assert registry.get_sample_value("fusebox_request_queue_length") is None
    assert registry.get_sample_value("fusebox_stats_valid") == 0
    assert registry.get_sample_value("fusebox_requests_running") == 8


def test_no_usable_stats_leaves_only_what_the_sidecar_measures_itself() -> None:
    registry = _registry(
        StatsReading(None, "stats file is empty"),
        last_written_at=NOW - 30,
        proc=MEASURED,
    )
    value = registry.get_sample_value

    assert value("fusebox_stats_valid") == 0
    assert value("fusebox_server_stats_age_seconds") == 30
    assert value("fusebox_process_resident_memory_bytes") == 2_000_000_000
    assert value("fusebox_request_queue_length") is None
    assert value("fusebox_breaker_state") is None


def test_stats_age_is_absent_until_a_valid_file_was_ever_seen() -> None:
    registry = _registry(StatsReading(None, "missing"), proc=ProcReading(ProcOutcome.NO_PID))

    assert registry.get_sample_value("fusebox_server_stats_age_seconds") is None
    assert registry.get_sample_value("fusebox_process_resident_memory_bytes") is None


def test_rss_measured_from_proc_wins_over_the_server_report(stats_document: StatsDocument) -> None:
    registry = _registry(_read(stats_document), proc=MEASURED)

    assert registry.get_sample_value("fusebox_process_resident_memory_bytes") == 2_000_000_000
    assert registry.get_sample_value("fusebox_sidecar_measured", {"quantity": "rss"}) == 1


@pytest.mark.parametrize("outcome", [ProcOutcome.GONE, ProcOutcome.UNREADABLE])
def test_rss_falls_back_to_the_server_report_when_proc_cannot_tell(
    stats_document: StatsDocument, outcome: ProcOutcome
) -> None:
    registry = _registry(_read(stats_document), proc=ProcReading(outcome, detail="x"))

    assert registry.get_sample_value("fusebox_process_resident_memory_bytes") == 1_234_567_890
    assert registry.get_sample_value("fusebox_sidecar_measured", {"quantity": "rss"}) == 0


def test_gpu_memory_measured_by_the_sidecar_per_device(stats_document: StatsDocument) -> None:
    gpu = GpuReading(
        GpuAccess.OK,
        (
            GpuDevice(0, used_bytes=5e9, total_bytes=8e10, process_used_bytes=4e9),
            GpuDevice(1, used_bytes=1e9, total_bytes=8e10),
        ),
    )
    registry = _registry(_read(stats_document), gpu=gpu)
    value = registry.get_sample_value

    assert value("fusebox_gpu_visible") == 1
    assert value("fusebox_gpu_lost") == 0
    assert value("fusebox_gpu_memory_used_bytes", {"gpu": "0"}) == 5e9
    assert value("fusebox_gpu_memory_used_bytes", {"gpu": "1"}) == 1e9
    assert value("fusebox_gpu_memory_total_bytes", {"gpu": "1"}) == 8e10
    assert value("fusebox_gpu_process_memory_used_bytes", {"gpu": "0"}) == 4e9
    assert value("fusebox_gpu_process_memory_used_bytes", {"gpu": "1"}) is None
    assert value("fusebox_sidecar_measured", {"quantity": "gpu_memory"}) == 1


def test_without_its_own_nvml_the_sidecar_relays_the_server_gpu_figures(
    stats_document: StatsDocument,
) -> None:
    registry = _registry(_read(stats_document), gpu=NO_GPU)
    value = registry.get_sample_value

    assert value("fusebox_gpu_visible") == 0
    assert value("fusebox_gpu_lost") is None
    assert value("fusebox_gpu_memory_used_bytes", {"gpu": "0"}) == 17 * 1024**3
    assert value("fusebox_gpu_memory_total_bytes", {"gpu": "0"}) == 80 * 1024**3
    assert value("fusebox_sidecar_measured", {"quantity": "gpu_memory"}) == 0


def _gpu_labels(registry: CollectorRegistry, metric: Metric) -> set[str]:
    return {
        sample.labels["gpu"]
        for family in registry.collect()
        if family.name == metric.value
        for sample in family.samples
    }


def test_without_its_own_nvml_the_sidecar_relays_only_gpu_indices_one_node_can_have(
    stats_document: StatsDocument,
) -> None:
    # A broken file naming ten thousand GPUs (and absurd indices) must not mint as many series.
    named = [*range(10_000), 2**62]
    document = replace(
        stats_document,
        nvml=tuple(GpuMemory(index, float(index + 1), 80.0 * GiB) for index in named),
    )
    registry = _registry(_read(document), gpu=NO_GPU)
    value = registry.get_sample_value

    expected = {str(index) for index in range(MAX_RELAYED_GPUS)}
    assert _gpu_labels(registry, Metric.GPU_MEMORY_USED_BYTES) == expected
    assert _gpu_labels(registry, Metric.GPU_MEMORY_TOTAL_BYTES) == expected
    assert value("fusebox_gpu_memory_used_bytes", {"gpu": "15"}) == 16
    assert value("fusebox_stats_valid") == 1  # the contract's file is well-formed
    assert value("fusebox_requests_total", {"outcome": "succeeded"}) == 1000


def test_nvml_s_own_gpus_are_the_labels_whatever_indices_the_stats_file_names(
    stats_document: StatsDocument,
) -> None:
    document = replace(
        stats_document, nvml=tuple(GpuMemory(index, 1.0, 2.0) for index in range(0, 5000, 7))
    )
    gpu = GpuReading(
        GpuAccess.OK, (GpuDevice(0, None, None, read_error="Not Supported"), GpuDevice(1, 5.0, 6.0))
    )
    registry = _registry(_read(document), gpu=gpu)

    assert _gpu_labels(registry, Metric.GPU_MEMORY_USED_BYTES) == {"0", "1"}
    assert registry.get_sample_value("fusebox_gpu_memory_used_bytes", {"gpu": "0"}) == 1.0


def test_no_gpu_anywhere_means_gpu_metrics_absent(stats_document: StatsDocument) -> None:
    document = replace(stats_document, nvml=())

    exposition = generate_latest(_registry(_read(document), gpu=NO_GPU)).decode()

    assert "fusebox_gpu_visible 0.0" in exposition
    assert "fusebox_gpu_memory" not in exposition
    assert "fusebox_gpu_lost" not in exposition


def test_a_gpu_the_sidecar_cannot_read_takes_the_server_figure_for_its_index(
    stats_document: StatsDocument,
) -> None:
    gpu = GpuReading(
        GpuAccess.OK,
        (
            GpuDevice(0, None, None, read_error="Not Supported"),
            GpuDevice(1, used_bytes=1e9, total_bytes=8e10),
        ),
    )
    registry = _registry(_read(stats_document), gpu=gpu)
    value = registry.get_sample_value

    assert value("fusebox_gpu_memory_used_bytes", {"gpu": "0"}) == 17 * 1024**3
    assert value("fusebox_gpu_memory_total_bytes", {"gpu": "0"}) == 80 * 1024**3
    assert value("fusebox_gpu_memory_used_bytes", {"gpu": "1"}) == 1e9
    assert value("fusebox_gpu_lost") == 0


def test_a_stats_stamp_in_the_future_ages_by_how_long_it_stayed_unchanged(
    stats_document: StatsDocument,
) -> None:
    # The clock stepped back an hour while the server stopped writing.
    assert stats_document.written_at is not None
    now = stats_document.written_at - 3600
    observation = Observation(
        now,
        _read(stats_document),
        stats_document.written_at,
        MEASURED,
        NO_GPU,
        stats_stamp_age=StampAge(at_least_seconds=90.0),
        heartbeat_stamp_ages={HeartbeatThread.LOOP: StampAge(at_least_seconds=90.0)},
    )
    registry = CollectorRegistry()
    registry.register(SidecarCollector(lambda: observation))
    value = registry.get_sample_value

    assert value("fusebox_server_stats_age_seconds") == 90
    assert value("fusebox_heartbeat_age_seconds", {"thread": "loop"}) == 90
    assert value("fusebox_heartbeat_age_seconds", {"thread": "worker"}) == 0


def test_a_lost_gpu_is_flagged_and_its_numbers_left_out(stats_document: StatsDocument) -> None:
    gpu = GpuReading(
        GpuAccess.OK,
        (GpuDevice(0, None, None, lost=True), GpuDevice(1, used_bytes=1e9, total_bytes=8e10)),
    )
    registry = _registry(_read(stats_document), gpu=gpu)

    assert registry.get_sample_value("fusebox_gpu_lost") == 1
    assert registry.get_sample_value("fusebox_gpu_memory_used_bytes", {"gpu": "0"}) is None
    assert registry.get_sample_value("fusebox_gpu_memory_used_bytes", {"gpu": "1"}) == 1e9


def test_every_family_has_help_text_and_a_fusebox_name(stats_document: StatsDocument) -> None:
    gpu = GpuReading(GpuAccess.OK, (GpuDevice(0, 1.0, 2.0, 1.0),))
    registry = _registry(_read(stats_document), gpu=gpu)

    families = list(registry.collect())
    assert len(families) >= 25
    for family in families:
        assert family.name.startswith("fusebox_")
        assert family.documentation.strip()


def test_an_empty_snapshot_exports_only_sidecar_facts() -> None:
    registry = _registry(
        StatsReading(StatsDocument(written_at=NOW)), proc=ProcReading(ProcOutcome.NO_PID)
    )

    names = {family.name for family in registry.collect()}
    assert names == {
        "fusebox_stats_valid",
        "fusebox_server_stats_age_seconds",
        "fusebox_gpu_visible",
        "fusebox_sidecar_measured",
    }


def test_the_serving_variant_is_described_by_an_info_gauge(stats_document: StatsDocument) -> None:
    registry = _registry(_read(stats_document))

    labels = {
        "model": "chat",
        "variant": Variant.FALLBACK.value,
        "quantization": Quantization.INT8.value,
        "dtype": Dtype.BFLOAT16.value,
        "revision": "main",
    }
    assert registry.get_sample_value(Metric.MODEL_INFO, labels) == 1


def test_model_info_leaves_unknown_facts_empty_and_is_absent_without_a_variant(
    stats_document: StatsDocument,
) -> None:
    unknown = _with_state(stats_document, dtype=None, quantization=None, model_revision=None)
    labels = {
        "model": "chat",
        "variant": "fallback",
        "quantization": "",
        "dtype": "",
        "revision": "",
    }

    assert _registry(_read(unknown)).get_sample_value(Metric.MODEL_INFO, labels) == 1
    no_variant = _registry(_read(_with_state(stats_document, variant=None)))
    assert Metric.MODEL_INFO.value not in generate_latest(no_variant).decode()


def test_the_fallback_plan_and_its_progress_are_gauges(stats_document: StatsDocument) -> None:
    converging = _with_state(
        stats_document, variant=Variant.PRIMARY, target_variant=Variant.FALLBACK, converging=True
    )
    value = _registry(_read(converging)).get_sample_value

    assert value(Metric.FALLBACK_CONFIGURED) == 1
    assert value(Metric.FALLBACK_ACTIVE) == 0
    assert value(Metric.FALLBACK_TARGET) == 1
    assert value(Metric.VARIANT_CONVERGING) == 1
    without = _with_state(stats_document, fallback_configured=False, target_variant=None)
    assert _registry(_read(without)).get_sample_value(Metric.FALLBACK_CONFIGURED) == 0
    assert _registry(_read(without)).get_sample_value(Metric.FALLBACK_TARGET) is None


def test_a_fallback_the_device_cannot_serve_is_a_0_gauge_with_its_reason(
    stats_document: StatsDocument,
) -> None:
    reason = "the fallback is unavailable: int4 needs a CUDA device"
    refused = _with_state(
        stats_document,
        fallback_configured=True,
        fallback_available=False,
        fallback_unavailable_reason=reason,
    )
    value = _registry(_read(refused)).get_sample_value

    assert value(Metric.FALLBACK_CONFIGURED) == 1
    assert value(Metric.FALLBACK_AVAILABLE) == 0
    assert value(Metric.FALLBACK_UNAVAILABLE_INFO, {"reason": reason}) == 1
    usable = _registry(
        _read(
            _with_state(stats_document, fallback_available=True, fallback_unavailable_reason=None)
        )
    )
    assert usable.get_sample_value(Metric.FALLBACK_AVAILABLE) == 1
    assert f"{Metric.FALLBACK_UNAVAILABLE_INFO.value}{{" not in generate_latest(usable).decode()


def test_tokenizer_and_quality_counters_window_samples_and_admit_ratio_are_relayed(
    stats_document: StatsDocument,
) -> None:
    registry = _registry(_read(stats_document))
    value = registry.get_sample_value

    assert value(Metric.TOKENIZER_CACHE_HITS.sample) == 10
    assert value(Metric.TOKENIZER_TEMPLATE_HITS.sample) == 3
    assert value(Metric.QUALITY_SAMPLED.sample) == 10
    assert value(Metric.QUALITY_FAILURES.sample) == 1
    assert value(Metric.BREAKER_ADMIT_RATIO) == 0.05
    for metric, summary in stats_document.latency.items():
        assert value(Metric.LATENCY_WINDOW_SAMPLES, {"metric": metric.value}) == summary.count
    exposition = generate_latest(registry).decode()
    for counter in (Metric.TOKENIZER_CACHE_HITS, Metric.QUALITY_SAMPLED, Metric.QUALITY_FAILURES):
        assert f"# TYPE {counter.sample} counter" in exposition


def test_the_prefix_cache_figures_are_relayed_as_counters_and_gauges(
    stats_document: StatsDocument,
) -> None:
    registry = _registry(_read(stats_document))
    value = registry.get_sample_value

    assert value(Metric.PREFIX_CACHE_HITS.sample) == 300
    assert value(Metric.PREFIX_CACHE_MISSES.sample) == 700
    assert value(Metric.PREFIX_CACHE_REUSED_TOKENS.sample) == 297_600
    assert value(Metric.PREFIX_CACHE_EVICTIONS.sample) == 12
    assert value(Metric.PREFIX_CACHE_ENTRIES) == 40
    assert value(Metric.PREFIX_CACHE_BYTES) == 805_306_368
    assert value(Metric.PREFIX_CACHE_CAPACITY_BYTES) == 1_073_741_824
    exposition = generate_latest(registry).decode()
    assert f"# TYPE {Metric.PREFIX_CACHE_HITS.sample} counter" in exposition


def _without_each_field(document: StatsDocument) -> Iterator[tuple[str, StatsDocument]]:
    """`document` with one written value made absent, for every value it holds."""
    for outer in fields(StatsDocument):
        value = getattr(document, outer.name)
        if is_dataclass(value) and not isinstance(value, type):
            for inner in fields(value):
                changed = replace(value, **{inner.name: None})
                yield f"{outer.name}.{inner.name}", replace(document, **{outer.name: changed})
        elif isinstance(value, Mapping):
            for key, entry in value.items():
                rest = {k: v for k, v in value.items() if k != key}
                yield f"{outer.name}[{key}]", replace(document, **{outer.name: rest})
                if isinstance(entry, LatencySummary):
                    for inner in fields(entry):
                        part = {**value, key: replace(entry, **{inner.name: None})}
                        yield (
                            f"{outer.name}[{key}].{inner.name}",
                            replace(document, **{outer.name: part}),
                        )
        elif isinstance(value, tuple):
            for position, gpu in enumerate(value):
                for inner in fields(gpu):
                    if inner.name != "index":
                        gpus = list(value)
                        gpus[position] = replace(gpu, **{inner.name: None})
                        yield (
                            f"{outer.name}[{position}].{inner.name}",
                            replace(document, **{outer.name: tuple(gpus)}),
                        )
        else:
            yield outer.name, replace(document, **{outer.name: None})


# The observer, not a collector, reads these (tests/unit/sidecar/test_observer.py).
READ_BY_THE_OBSERVER = {"pid"}


def test_every_field_the_server_writes_shows_in_the_scrape(stats_document: StatsDocument) -> None:
    """A written field nobody reads is a field that cannot be trusted to work."""
    relayed = ProcReading(ProcOutcome.GONE, detail="the server's RSS comes from its stats file")

    def scrape(document: StatsDocument) -> str:
        return generate_latest(_registry(_read(document), proc=relayed)).decode()

    full = scrape(stats_document)
    unread = [
        name
        for name, document in _without_each_field(stats_document)
        if name not in READ_BY_THE_OBSERVER and scrape(document) == full
    ]
    assert unread == []


def test_every_field_of_the_example_is_set(stats_document: StatsDocument) -> None:
    """The test above only covers what the example holds: it must hold everything."""
    assert None not in _leaf_values(encode(stats_document))
    assert set(stats_document.requests) == set(RequestOutcome)
    assert set(stats_document.latency) == set(LatencyMetric)


def _leaf_values(node: object) -> list[object]:
    if isinstance(node, dict):
        return [leaf for value in node.values() for leaf in _leaf_values(value)]
    if isinstance(node, list):
        return [leaf for value in node for leaf in _leaf_values(value)]
    return [node]


# --- histograms and token counters (issue 11) ----------------------------------------


def test_each_latency_is_a_histogram_on_the_contract_s_bounds(
    stats_document: StatsDocument,
) -> None:
    registry = _registry(_read(stats_document))
    value = registry.get_sample_value

    for name, counts in stats_document.histograms.items():
        metric = name.metric
        exposed = [value(metric.bucket, {"le": str(bound)}) for bound in name.buckets]
        assert exposed == list(counts.bucket_counts)
        assert value(metric.bucket, {"le": "+Inf"}) == counts.count
        assert value(f"{metric.value}_count") == counts.count
        assert value(f"{metric.value}_sum") == counts.sum_seconds


def test_the_ttft_histogram_holds_what_the_server_counted(stats_document: StatsDocument) -> None:
    """The example's first tokens: 60 in (0.01, 0.025], 39 in (0.025, 0.05], 1 in (0.05, 0.075]."""
    value = _registry(_read(stats_document)).get_sample_value
    bucket = Metric.TIME_TO_FIRST_TOKEN_SECONDS.bucket
    assert value(bucket, {"le": "0.01"}) == 0
    assert value(bucket, {"le": "0.025"}) == 60
    assert value(bucket, {"le": "0.05"}) == 99
    assert value(bucket, {"le": "0.075"}) == 100


def test_prompt_and_generated_tokens_are_counters(stats_document: StatsDocument) -> None:
    value = _registry(_read(stats_document)).get_sample_value
    assert value(Metric.PROMPT_TOKENS.sample) == 52_000
    assert value(Metric.GENERATION_TOKENS.sample) == 31_000


def test_an_idle_server_s_histograms_counters_and_queue_are_zero_not_absent() -> None:
    """What a freshly started server writes: every rate and quantile query has data."""
    idle = StatsDocument(
        written_at=NOW - 1,
        queue_length=0,
        running=0,
        histograms={
            name: HistogramCounts((0.0,) * len(name.buckets), 0.0, 0.0) for name in LatencyHistogram
        },
        tokens=Tokens(prompt_total=0, generation_total=0),
    )
    value = _registry(_read(idle)).get_sample_value
    for name in LatencyHistogram:
        assert value(f"{name.metric.value}_count") == 0
        assert value(name.metric.bucket, {"le": "+Inf"}) == 0
    assert value(Metric.PROMPT_TOKENS.sample) == 0
    assert value(Metric.GENERATION_TOKENS.sample) == 0
    assert value(Metric.REQUEST_QUEUE_LENGTH.sample) == 0
    assert value(Metric.REQUESTS_RUNNING.sample) == 0


def test_a_histogram_the_server_did_not_write_is_absent() -> None:
    value = _registry(_read(StatsDocument(written_at=NOW - 1))).get_sample_value
    assert value(f"{Metric.TIME_TO_FIRST_TOKEN_SECONDS.value}_count") is None
