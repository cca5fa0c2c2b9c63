"""Each metric family, built from hand-written observations and read back
through a fresh CollectorRegistry, as Prometheus would see it."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from fusebox_sidecar.collectors import Observation, SidecarCollector
from fusebox_sidecar.nvml import GpuAccess, GpuDevice, GpuReading
from fusebox_sidecar.readings import (
    ProcOutcome,
    ProcReading,
    StatsReading,
    StatsSnapshot,
    parse_stats,
)

Document = Callable[[], dict[str, Any]]
NOW = 1796000010.0
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
    if last_written_at is None and stats.snapshot is not None:
        last_written_at = stats.snapshot.written_at
    observation = Observation(now, stats, last_written_at, proc, gpu)
    registry = CollectorRegistry()
    registry.register(SidecarCollector(lambda: observation))
    return registry


def _read(document: dict[str, Any]) -> StatsReading:
    return parse_stats(json.dumps(document).encode())


def test_relayed_server_values_appear_in_base_units(stats_document: Document) -> None:
    registry = _registry(_read(stats_document()))
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
    stats_document: Document,
) -> None:
    registry = _registry(_read(stats_document()))

    counts = {
        outcome: registry.get_sample_value("fusebox_requests_total", {"outcome": outcome})
        for outcome in ("succeeded", "failed", "rejected", "timed_out")
    }
    assert counts == {"succeeded": 1000, "failed": 3, "rejected": 40, "timed_out": 2}
    exposition = generate_latest(registry).decode()
    assert "# TYPE fusebox_requests_total counter" in exposition
    assert "# TYPE fusebox_cuda_alloc_retries_total counter" in exposition


def test_latency_p99s_are_labelled_by_metric_in_seconds(stats_document: Document) -> None:
    registry = _registry(_read(stats_document()))

    for metric, seconds in {"ttft": 0.05, "itl": 0.02, "e2e": 0.90}.items():
        assert (
            registry.get_sample_value("fusebox_latency_p99_seconds", {"metric": metric}) == seconds
        )


@pytest.mark.parametrize(("state", "code"), [("closed", 0), ("open", 1), ("half_open", 2)])
def test_breaker_state_is_encoded_closed_0_open_1_half_open_2(
    stats_document: Document, state: str, code: int
) -> None:
    document = stats_document()
    document["state"]["breaker"] = state

    assert _registry(_read(document)).get_sample_value("fusebox_breaker_state") == code


def test_primary_variant_means_fallback_inactive(stats_document: Document) -> None:
    document = stats_document()
    document["state"]["variant"] = "primary"

    assert _registry(_read(document)).get_sample_value("fusebox_fallback_active") == 0


def test_heartbeat_and_stats_ages_count_from_the_server_stamps(
    stats_document: Document,
) -> None:
    registry = _registry(_read(stats_document()), now=1796000004.10)
    value = registry.get_sample_value

    assert value("fusebox_heartbeat_age_seconds", {"thread": "loop"}) == pytest.approx(4.0)
    assert value("fusebox_heartbeat_age_seconds", {"thread": "worker"}) == pytest.approx(4.05)
    assert value("fusebox_server_stats_age_seconds") == pytest.approx(3.98)


def test_a_stamp_slightly_in_the_future_gives_age_zero_not_negative(
    stats_document: Document,
) -> None:
    registry = _registry(_read(stats_document()), now=1796000000.0)

    assert registry.get_sample_value("fusebox_heartbeat_age_seconds", {"thread": "loop"}) == 0
    assert registry.get_sample_value("fusebox_server_stats_age_seconds") == 0


def test_an_unmeasurable_value_is_absent_not_zero(stats_document: Document) -> None:
    document = stats_document()
    document["cuda"] = {key: None for key in document["cuda"]}
    document["latency_seconds"] = {"ttft": None, "itl": None, "e2e": None}
    document["quality"]["failure_ratio"] = None

    registry = _registry(_read(document))
    exposition = generate_latest(registry).decode()

    assert registry.get_sample_value("fusebox_cuda_memory_allocated_bytes") is None
    assert registry.get_sample_value("fusebox_quality_failure_ratio") is None
    for name in ("fusebox_cuda_", "fusebox_latency_p99_seconds", "fusebox_quality_failure_ratio"):
        assert name not in exposition
    # Valid nulls are not problems.
    assert registry.get_sample_value("fusebox_stats_valid") == 1


def test_a_wrong_typed_field_drops_its_metric_and_marks_the_stats_invalid(
    stats_document: Document,
) -> None:
    document = stats_document()
    document["queue_length"] = "five"

    registry = _registry(_read(document))

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


def test_rss_measured_from_proc_wins_over_the_server_report(stats_document: Document) -> None:
    registry = _registry(_read(stats_document()), proc=MEASURED)

    assert registry.get_sample_value("fusebox_process_resident_memory_bytes") == 2_000_000_000
    assert registry.get_sample_value("fusebox_sidecar_measured", {"quantity": "rss"}) == 1


@pytest.mark.parametrize("outcome", [ProcOutcome.GONE, ProcOutcome.UNREADABLE])
def test_rss_falls_back_to_the_server_report_when_proc_cannot_tell(
    stats_document: Document, outcome: ProcOutcome
) -> None:
    registry = _registry(_read(stats_document()), proc=ProcReading(outcome, detail="x"))

    assert registry.get_sample_value("fusebox_process_resident_memory_bytes") == 1_234_567_890
    assert registry.get_sample_value("fusebox_sidecar_measured", {"quantity": "rss"}) == 0


def test_gpu_memory_measured_by_the_sidecar_per_device(stats_document: Document) -> None:
    gpu = GpuReading(
        GpuAccess.OK,
        (
            GpuDevice(0, used_bytes=5e9, total_bytes=8e10, process_used_bytes=4e9),
            GpuDevice(1, used_bytes=1e9, total_bytes=8e10),
        ),
    )
    registry = _registry(_read(stats_document()), gpu=gpu)
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
    stats_document: Document,
) -> None:
    registry = _registry(_read(stats_document()), gpu=NO_GPU)
    value = registry.get_sample_value

    assert value("fusebox_gpu_visible") == 0
    assert value("fusebox_gpu_lost") is None
    assert value("fusebox_gpu_memory_used_bytes", {"gpu": "0"}) == 17 * 1024**3
    assert value("fusebox_gpu_memory_total_bytes", {"gpu": "0"}) == 80 * 1024**3
    assert value("fusebox_sidecar_measured", {"quantity": "gpu_memory"}) == 0


def test_no_gpu_anywhere_means_gpu_metrics_absent(stats_document: Document) -> None:
    document = stats_document()
    document["nvml"] = []

    exposition = generate_latest(_registry(_read(document), gpu=NO_GPU)).decode()

    assert "fusebox_gpu_visible 0.0" in exposition
    assert "fusebox_gpu_memory" not in exposition
    assert "fusebox_gpu_lost" not in exposition


def test_a_lost_gpu_is_flagged_and_its_numbers_left_out(stats_document: Document) -> None:
    gpu = GpuReading(
        GpuAccess.OK,
        (GpuDevice(0, None, None, lost=True), GpuDevice(1, used_bytes=1e9, total_bytes=8e10)),
    )
    registry = _registry(_read(stats_document()), gpu=gpu)

    assert registry.get_sample_value("fusebox_gpu_lost") == 1
    assert registry.get_sample_value("fusebox_gpu_memory_used_bytes", {"gpu": "0"}) is None
    assert registry.get_sample_value("fusebox_gpu_memory_used_bytes", {"gpu": "1"}) == 1e9


def test_every_family_has_help_text_and_a_fusebox_name(stats_document: Document) -> None:
    gpu = GpuReading(GpuAccess.OK, (GpuDevice(0, 1.0, 2.0, 1.0),))
    registry = _registry(_read(stats_document()), gpu=gpu)

    families = list(registry.collect())
    assert len(families) >= 25
    for family in families:
        assert family.name.startswith("fusebox_")
        assert family.documentation.strip()


def test_an_empty_snapshot_exports_only_sidecar_facts() -> None:
    registry = _registry(
        StatsReading(StatsSnapshot(written_at=NOW)), proc=ProcReading(ProcOutcome.NO_PID)
    )

    names = {family.name for family in registry.collect()}
    assert names == {
        "fusebox_stats_valid",
        "fusebox_server_stats_age_seconds",
        "fusebox_gpu_visible",
        "fusebox_sidecar_measured",
    }
