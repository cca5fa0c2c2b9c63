"""telemetry: the sidecar's Prometheus text becomes one PodSample."""

from __future__ import annotations

import pytest

from fusebox_operator.policy import RequestCounts
from fusebox_operator.telemetry import ParseError, parse_metrics, sample_from_metrics

TEXT = """\
# HELP fusebox_process_resident_memory_bytes RSS
# TYPE fusebox_process_resident_memory_bytes gauge
fusebox_process_resident_memory_bytes 8.46204928e+08
fusebox_memory_limit_bytes 4294967296
fusebox_gpu_memory_used_bytes{gpu="0"} 1000
fusebox_gpu_memory_used_bytes{gpu="1"} 500
fusebox_gpu_memory_total_bytes{gpu="0"} 4000
fusebox_gpu_memory_total_bytes{gpu="1"} 4000
fusebox_latency_p99_seconds{metric="ttft"} 0.25
fusebox_latency_p99_seconds{metric="e2e"} 1.5
fusebox_requests_total{outcome="succeeded"} 40.0
fusebox_requests_total{outcome="failed"} 2.0
fusebox_requests_total{outcome="rejected"} 7.0
fusebox_requests_total{outcome="timed_out"} 1.0
fusebox_heartbeat_age_seconds{thread="loop"} 1.5
fusebox_heartbeat_age_seconds{thread="worker"} 30.0
fusebox_server_stats_age_seconds 0.9
fusebox_breaker_state 2.0
fusebox_degradation_level 1.0
fusebox_model_loaded 1.0
fusebox_quality_failure_ratio 0.2
weird_label{a="x\\"y,z",b="\\\\"} 1
"""


def test_a_full_scrape_maps_to_a_sample() -> None:
    sample = sample_from_metrics("p", parse_metrics(TEXT), 100.0, "ttft")
    assert sample.rss_bytes == 846204928
    assert sample.memory_limit_bytes == 4294967296
    assert (sample.gpu_memory_used_bytes, sample.gpu_memory_total_bytes) == (1500, 8000)
    assert sample.latency_p99_seconds == 0.25
    assert sample.requests == RequestCounts(40, 2, 7, 1)
    assert sample.heartbeat_age_seconds == 30.0  # the oldest heartbeat
    assert (sample.breaker_state, sample.degradation_level, sample.model_loaded) == (
        "half_open",
        1,
        True,
    )
    assert sample.quality_failure_ratio == 0.2


def test_the_configured_latency_metric_is_used() -> None:
    sample = sample_from_metrics("p", parse_metrics(TEXT), 100.0, "e2e")
    assert sample.latency_p99_seconds == 1.5


def test_absent_metrics_stay_none_never_zero() -> None:
    sample = sample_from_metrics("p", parse_metrics("fusebox_stats_valid 0\n"), 1.0, "ttft")
    assert sample.rss_bytes is None and sample.requests is None and sample.breaker_state is None


def test_escaped_label_values() -> None:
    families = parse_metrics(TEXT)
    assert families["weird_label"] == [({"a": 'x"y,z', "b": "\\"}, 1.0)]


def test_garbage_is_a_parse_error() -> None:
    with pytest.raises(ParseError):
        parse_metrics("fusebox_x{a=1} nope\n")
