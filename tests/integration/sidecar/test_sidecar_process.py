"""The sidecar process driven by stats files written here: a real HTTP
scrape checked by promtool, bad input, a deleted file, shutdown."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fusebox_contract.metrics import Metric
from fusebox_contract.names import HeartbeatThread, LatencyMetric, RequestOutcome
from fusebox_contract.stats import GpuMemory
from fusebox_sidecar.cardinality import MAX_RELAYED_GPUS

Sidecar = Any  # conftest's Sidecar: importlib mode cannot import it from here


def test_a_real_scrape_passes_promtool_and_carries_the_contract_names(
    start_sidecar: Callable[..., Sidecar],
    write_stats: Callable[..., Path],
    promtool: Callable[[str], subprocess.CompletedProcess[str]],
) -> None:
    sidecar = start_sidecar(write_stats())

    exposition = sidecar.scrape_text()
    check = promtool(exposition)

    assert check.returncode == 0, check.stdout + check.stderr
    for name in (
        Metric.PROCESS_RESIDENT_MEMORY_BYTES,
        Metric.MEMORY_LIMIT_BYTES,
        Metric.CGROUP_MEMORY_USAGE_BYTES,
        Metric.REQUEST_QUEUE_LENGTH,
        Metric.REQUESTS_RUNNING,
        Metric.TOKENIZER_CACHE_ENTRIES,
        Metric.TOKENIZER_CACHE_HITS.sample,
        Metric.TOKENIZER_TEMPLATE_HITS.sample,
        f'{Metric.LATENCY_P99_SECONDS}{{metric="{LatencyMetric.TTFT}"}}',
        f'{Metric.LATENCY_WINDOW_SAMPLES}{{metric="{LatencyMetric.ITL}"}} 3000.0',
        Metric.QUALITY_FAILURE_RATIO,
        Metric.QUALITY_SAMPLED.sample,
        Metric.QUALITY_FAILURES.sample,
        Metric.SERVER_STATS_AGE_SECONDS,
        f'{Metric.HEARTBEAT_AGE_SECONDS}{{thread="{HeartbeatThread.LOOP}"}}',
        f'{Metric.HEARTBEAT_AGE_SECONDS}{{thread="{HeartbeatThread.WORKER}"}}',
        Metric.BREAKER_STATE,
        Metric.BREAKER_ADMIT_RATIO,
        Metric.DEGRADATION_LEVEL,
        Metric.FALLBACK_CONFIGURED,
        Metric.FALLBACK_TARGET,
        Metric.VARIANT_CONVERGING,
        f'{Metric.MODEL_INFO}{{dtype="float32",model="chat",quantization="none",'
        f'revision="main",variant="primary"}} 1.0',
        f"{Metric.GPU_VISIBLE} 0.0",
        f"{Metric.STATS_VALID} 1.0",
    ):
        assert name in exposition, name
    for position, outcome in enumerate(RequestOutcome):
        assert f'{Metric.REQUESTS.sample}{{outcome="{outcome}"}} {10 + position}.0' in exposition


def test_rss_of_the_named_pid_is_measured_from_proc(
    start_sidecar: Callable[..., Sidecar], write_stats: Callable[..., Path]
) -> None:
    sidecar = start_sidecar(write_stats(pid=os.getpid()))

    samples = sidecar.scrape()
    own_rss = psutil.Process().memory_info().rss

    assert samples.value("fusebox_process_resident_memory_bytes") == pytest.approx(
        own_rss, rel=0.05
    )
    assert samples.value("fusebox_sidecar_measured", quantity="rss") == 1


def test_deleting_the_stats_file_makes_its_age_grow_and_the_sidecar_keeps_answering(
    start_sidecar: Callable[..., Sidecar],
    write_stats: Callable[..., Path],
    promtool: Callable[[str], subprocess.CompletedProcess[str]],
) -> None:
    stats_path = write_stats()
    sidecar = start_sidecar(stats_path)
    sidecar.scrape()

    stats_path.unlink()
    ages = []
    for _ in range(3):
        time.sleep(0.6)
        samples = sidecar.scrape()
        ages.append(samples.value("fusebox_server_stats_age_seconds"))

    assert ages == sorted(ages) and ages[0] < ages[-1]
    assert samples.value("fusebox_stats_valid") == 0
    assert sidecar.get("/healthz") == (200, "ok\n")
    assert promtool(sidecar.scrape_text()).returncode == 0
    warnings = [line for line in sidecar.log_lines() if line.get("level") == "warning"]
    assert any("missing" in str(line.get("problem")) for line in warnings)


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b'{"schema": 1, "written_at": 1796000000.1, "pid": 1, "rss_by',
        b"<html>not json</html>",
        b'{"schema": 1, "written_at": "yesterday", "pid": "one", "queue_length": [],'
        b' "state": {"breaker": 7}, "heartbeats": {"loop": "x"}}',
    ],
    ids=["empty", "truncated", "not-json", "wrong-types"],
)
def test_bad_stats_files_give_a_valid_scrape_and_a_warning(
    start_sidecar: Callable[..., Sidecar],
    tmp_path: Path,
    promtool: Callable[[str], subprocess.CompletedProcess[str]],
    content: bytes,
) -> None:
    stats_path = tmp_path / "stats.json"
    stats_path.write_bytes(content)
    sidecar = start_sidecar(stats_path)

    exposition = sidecar.scrape_text()

    assert "fusebox_stats_valid 0.0" in exposition
    assert promtool(exposition).returncode == 0
    assert any(line.get("event") == "stats file unusable" for line in sidecar.log_lines())


def test_a_stats_file_naming_thousands_of_gpus_gives_a_bounded_scrape_and_one_warning(
    start_sidecar: Callable[..., Sidecar],
    write_stats: Callable[..., Path],
    promtool: Callable[[str], subprocess.CompletedProcess[str]],
) -> None:
    broken = tuple(GpuMemory(index, 1.0, 2.0) for index in range(5000))
    sidecar = start_sidecar(write_stats(nvml=broken))

    scrapes = [sidecar.scrape_text() for _ in range(3)]

    gpus = {
        sample.labels["gpu"]
        for family in text_string_to_metric_families(scrapes[-1])
        for sample in family.samples
        if family.name == Metric.GPU_MEMORY_USED_BYTES.value
    }
    assert promtool(scrapes[-1]).returncode == 0
    if f"{Metric.GPU_VISIBLE} 1.0" in scrapes[-1]:  # a GPU machine: NVML names the labels
        assert len(gpus) <= MAX_RELAYED_GPUS
        return
    assert gpus == {str(index) for index in range(MAX_RELAYED_GPUS)}
    warned = [line for line in sidecar.log_lines() if "GPU indices" in str(line.get("event"))]
    assert len(warned) == 1 and warned[0]["level"] == "warning"
    assert str(warned[0]["problem"]).startswith("4984 nvml entries with an index outside 0..15")


def test_a_pid_that_does_not_exist_gives_a_valid_scrape_without_measured_rss(
    start_sidecar: Callable[..., Sidecar], write_stats: Callable[..., Path]
) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    sidecar = start_sidecar(write_stats(pid=gone.pid))

    samples = sidecar.scrape()

    assert samples.value("fusebox_sidecar_measured", quantity="rss") == 0
    assert samples.value("fusebox_process_resident_memory_bytes") == 123_456_789  # relayed
    assert any(f"no process {gone.pid}" in str(line.get("problem")) for line in sidecar.log_lines())


def test_unknown_paths_and_methods_get_clear_errors(
    start_sidecar: Callable[..., Sidecar], write_stats: Callable[..., Path]
) -> None:
    sidecar = start_sidecar(write_stats())

    assert sidecar.get("/nope")[0] == 404
    assert sidecar.get("/metrics", method="POST", data=b"x")[0] == 405


def test_sigterm_stops_the_sidecar_cleanly(
    start_sidecar: Callable[..., Sidecar], write_stats: Callable[..., Path]
) -> None:
    sidecar = start_sidecar(write_stats())

    sidecar.process.send_signal(signal.SIGTERM)

    assert sidecar.process.wait(timeout=10) == 0


def test_a_bad_flag_exits_2_with_a_message() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "fusebox_sidecar", "--port", "http"],
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode == 2
    assert "--port" in result.stderr and "'http' is not a port number" in result.stderr
