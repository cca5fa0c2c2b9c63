"""telemetry: the sidecar's Prometheus text becomes one PodSample.

The text is shaped as prometheus_client exposes it (HELP/TYPE lines, `_total`
counter samples, `_created` companions), with the contract's metric names.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from fusebox_contract.metrics import QUANTITY_LABEL, MeasuredQuantity, Metric
from fusebox_contract.names import BreakerState, Variant
from fusebox_operator.observations import FetchProgress, PodSample, PodView, RequestCounts
from fusebox_operator.operator_metrics import METRICS, OperatorMetric, ScrapeErrorKind
from fusebox_operator.telemetry import (
    GpuDeviceCounts,
    ParseError,
    parse_metrics,
    sample_from_metrics,
    scrape_all,
    scrape_pod,
)

TEXT = f"""\
# HELP {Metric.PROCESS_RESIDENT_MEMORY_BYTES} RSS
# TYPE {Metric.PROCESS_RESIDENT_MEMORY_BYTES} gauge
{Metric.PROCESS_RESIDENT_MEMORY_BYTES} 8.46204928e+08
{Metric.MEMORY_LIMIT_BYTES} 4294967296
{Metric.GPU_MEMORY_USED_BYTES}{{gpu="0"}} 1000
{Metric.GPU_MEMORY_USED_BYTES}{{gpu="1"}} 500
{Metric.GPU_MEMORY_TOTAL_BYTES}{{gpu="0"}} 4000
{Metric.GPU_MEMORY_TOTAL_BYTES}{{gpu="1"}} 4000
{Metric.LATENCY_P99_SECONDS}{{metric="ttft"}} 0.25
{Metric.LATENCY_P99_SECONDS}{{metric="e2e"}} 1.5
# HELP {Metric.REQUESTS.sample} Requests by outcome
# TYPE {Metric.REQUESTS.sample} counter
{Metric.REQUESTS.sample}{{outcome="succeeded"}} 40.0
{Metric.REQUESTS.sample}{{outcome="failed"}} 2.0
{Metric.REQUESTS.sample}{{outcome="rejected"}} 7.0
{Metric.REQUESTS.sample}{{outcome="timed_out"}} 1.0
{Metric.REQUESTS.sample}{{outcome="cancelled"}} 3.0
{Metric.REQUESTS.sample}{{outcome="invalid"}} 5.0
{Metric.REQUESTS}_created{{outcome="succeeded"}} 1.7e+09
{Metric.HEARTBEAT_AGE_SECONDS}{{thread="loop"}} 1.5
{Metric.HEARTBEAT_AGE_SECONDS}{{thread="worker"}} 30.0
{Metric.SERVER_STATS_AGE_SECONDS} 0.9
{Metric.BREAKER_STATE} 2.0
{Metric.DEGRADATION_LEVEL} 2.0
{Metric.MODEL_LOADED} 1.0
{Metric.FALLBACK_ACTIVE} 1.0
{Metric.VARIANT_CONVERGING} 0.0
{Metric.QUALITY_FAILURE_RATIO} 0.2
weird_label{{a="x\\"y,z",b="\\\\"}} 1
"""


def test_a_full_scrape_maps_to_a_sample() -> None:
    sample = sample_from_metrics("p", parse_metrics(TEXT), 100.0, "ttft")
    assert sample.rss_bytes == 846204928
    assert sample.memory_limit_bytes == 4294967296
    assert (sample.gpu_memory_used_bytes, sample.gpu_memory_total_bytes) == (1500, 8000)
    assert sample.latency_p99_seconds == 0.25
    assert sample.heartbeat_age_seconds == 30.0  # the oldest heartbeat
    assert sample.breaker_state is BreakerState.HALF_OPEN
    assert (sample.degradation_level, sample.model_loaded) == (2, True)
    assert (sample.variant, sample.converging) == (Variant.FALLBACK, False)
    assert sample.quality_failure_ratio == 0.2


def test_a_fallback_the_server_cannot_load_is_read_with_its_reason() -> None:
    reason = "the fallback is unavailable: int4 needs a CUDA device"
    text = (
        f"{Metric.FALLBACK_CONFIGURED} 1\n{Metric.FALLBACK_AVAILABLE} 0\n"
        f'{Metric.FALLBACK_UNAVAILABLE_INFO}{{reason="{reason}"}} 1\n'
    )
    sample = sample_from_metrics("p", parse_metrics(text), 1.0, "ttft")
    assert (sample.fallback_configured, sample.fallback_available) == (True, False)
    assert sample.fallback_unavailable_reason == reason and sample.cannot_swap
    unreported = sample_from_metrics("p", parse_metrics(TEXT), 1.0, "ttft")
    assert unreported.fallback_available is None and not unreported.cannot_swap


def _gpus(*lines: str) -> str:
    return "".join(f"{line}\n" for line in lines)


BOTH_GPUS = _gpus(
    f"{Metric.GPU_LOST} 0",
    f'{Metric.GPU_MEMORY_USED_BYTES}{{gpu="0"}} 7e10',
    f'{Metric.GPU_MEMORY_USED_BYTES}{{gpu="1"}} 7e10',
    f'{Metric.GPU_MEMORY_TOTAL_BYTES}{{gpu="0"}} 8e10',
    f'{Metric.GPU_MEMORY_TOTAL_BYTES}{{gpu="1"}} 8e10',
)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(
            _gpus(
                f"{Metric.GPU_LOST} 1",
                f'{Metric.GPU_MEMORY_USED_BYTES}{{gpu="0"}} 7e10',
                f'{Metric.GPU_MEMORY_TOTAL_BYTES}{{gpu="0"}} 8e10',
            ),
            id="device 1 reported lost",
        ),
        pytest.param(
            _gpus(
                f'{Metric.GPU_MEMORY_USED_BYTES}{{gpu="0"}} 7e10',
                f'{Metric.GPU_MEMORY_TOTAL_BYTES}{{gpu="0"}} 8e10',
                f'{Metric.GPU_MEMORY_TOTAL_BYTES}{{gpu="1"}} 8e10',
            ),
            id="device 1's use unreadable",
        ),
        pytest.param(
            _gpus(
                f'{Metric.GPU_MEMORY_USED_BYTES}{{gpu="0"}} 7e10',
                f'{Metric.GPU_MEMORY_TOTAL_BYTES}{{gpu="0"}} 8e10',
                f'{Metric.GPU_PROCESS_MEMORY_USED_BYTES}{{gpu="1"}} 6e10',
            ),
            id="device 1 seen but unreadable",
        ),
        pytest.param(
            _gpus(
                f'{Metric.GPU_MEMORY_USED_BYTES}{{gpu="0"}} 7e10',
                f'{Metric.GPU_MEMORY_TOTAL_BYTES}{{gpu="0"}} 8e10',
            ),
            id="device 1 gone from the scrape",
        ),
    ],
)
def test_a_scrape_missing_one_of_the_pods_gpus_gives_no_gpu_memory_not_a_drop(text: str) -> None:
    counts = GpuDeviceCounts()
    before = sample_from_metrics("p", parse_metrics(BOTH_GPUS), 100.0, "ttft", "uid-1", counts)
    assert (before.gpu_memory_used_bytes, before.gpu_memory_total_bytes) == (1.4e11, 1.6e11)

    after = sample_from_metrics("p", parse_metrics(text), 105.0, "ttft", "uid-1", counts)

    assert (after.gpu_memory_used_bytes, after.gpu_memory_total_bytes) == (None, None)
    again = sample_from_metrics("p", parse_metrics(BOTH_GPUS), 110.0, "ttft", "uid-1", counts)
    assert again.gpu_memory_used_bytes == 1.4e11


def test_a_one_gpu_pod_beside_a_two_gpu_pod_is_measured() -> None:
    counts = GpuDeviceCounts()
    sample_from_metrics("a", parse_metrics(BOTH_GPUS), 100.0, "ttft", "uid-a", counts)
    one = _gpus(
        f'{Metric.GPU_MEMORY_USED_BYTES}{{gpu="0"}} 7e10',
        f'{Metric.GPU_MEMORY_TOTAL_BYTES}{{gpu="0"}} 8e10',
    )
    sample = sample_from_metrics("b", parse_metrics(one), 100.0, "ttft", "uid-b", counts)
    assert sample.gpu_memory_used_bytes == 7e10


def test_every_request_outcome_is_read_and_each_counted_once() -> None:
    sample = sample_from_metrics("p", parse_metrics(TEXT), 100.0, "ttft")
    assert sample.requests == RequestCounts(
        succeeded=40, failed=2, rejected=7, timed_out=1, cancelled=3, invalid=5
    )
    assert sample.requests.calls == 43  # rejected, cancelled and invalid never ran to a verdict


def test_a_missing_outcome_counter_makes_the_request_counts_unknown_not_zero() -> None:
    text = "".join(
        line + "\n"
        for line in TEXT.splitlines()
        if not line.startswith(f'{Metric.REQUESTS.sample}{{outcome="failed"}}')
    )
    assert sample_from_metrics("p", parse_metrics(text), 100.0, "ttft").requests is None


def test_the_primary_and_a_convergence_in_progress() -> None:
    text = f"{Metric.FALLBACK_ACTIVE} 0\n{Metric.VARIANT_CONVERGING} 1\n{Metric.MODEL_LOADED} 0\n"
    sample = sample_from_metrics("p", parse_metrics(text), 1.0, "ttft")
    assert (sample.variant, sample.converging, sample.model_loaded) == (
        Variant.PRIMARY,
        True,
        False,
    )


def test_the_configured_latency_metric_is_used() -> None:
    sample = sample_from_metrics("p", parse_metrics(TEXT), 100.0, "e2e")
    assert sample.latency_p99_seconds == 1.5


def test_absent_metrics_stay_none_never_zero() -> None:
    sample = sample_from_metrics("p", parse_metrics(f"{Metric.STATS_VALID} 0\n"), 1.0, "ttft")
    assert sample.rss_bytes is None and sample.requests is None and sample.breaker_state is None
    assert sample.variant is None and sample.converging is None


def test_an_unknown_breaker_gauge_value_is_not_measured() -> None:
    sample = sample_from_metrics("p", parse_metrics(f"{Metric.BREAKER_STATE} 7\n"), 1.0, "ttft")
    assert sample.breaker_state is None


def test_escaped_label_values() -> None:
    samples = parse_metrics(TEXT)
    assert samples["weird_label"] == [({"a": 'x"y,z', "b": "\\"}, 1.0)]


def test_garbage_is_a_parse_error() -> None:
    with pytest.raises(ParseError):
        parse_metrics("fusebox_x{a=1} nope\n")


def test_a_scrape_slower_than_scrape_timeout_is_a_failed_sample() -> None:
    """A real HTTP sidecar stand-in that answers after 2 s; the scrape gives up at 0.3 s."""

    async def slow(_: web.Request) -> web.Response:
        await asyncio.sleep(2)
        return web.Response(text=TEXT)

    async def go() -> tuple[PodSample, PodSample]:
        app = web.Application()
        app.router.add_get("/metrics", slow)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        pod = PodView("p", "uid", "127.0.0.1", "Running", True, True, True, 0, False, False)
        try:
            async with aiohttp.ClientSession() as session:
                late = await scrape_pod(session, pod, 0.3, "ttft", port=port)
                in_time = await scrape_pod(session, pod, 5.0, "ttft", port=port)
        finally:
            await runner.cleanup()
        return late, in_time

    late, in_time = asyncio.run(go())
    assert not late.ok and late.error.startswith("TimeoutError")
    assert late.rss_bytes is None
    assert in_time.ok and in_time.rss_bytes == 846204928


def test_the_stats_files_validity_and_what_the_sidecar_measured_itself_are_read() -> None:
    text = (
        f"{Metric.STATS_VALID} 0\n"
        f'{Metric.SIDECAR_MEASURED}{{{QUANTITY_LABEL}="{MeasuredQuantity.RSS}"}} 1\n'
        f'{Metric.SIDECAR_MEASURED}{{{QUANTITY_LABEL}="{MeasuredQuantity.GPU_MEMORY}"}} 0\n'
    )
    sample = sample_from_metrics("p", parse_metrics(text), 1.0, "ttft")
    assert (sample.stats_valid, sample.rss_measured, sample.gpu_memory_measured) == (
        False,
        True,
        False,
    )
    assert not sample.stats_observed  # the server's own report was not seen
    assert sample_from_metrics("p", parse_metrics(TEXT), 1.0, "ttft").stats_observed


def test_the_sidecars_measured_quantities_are_the_contracts() -> None:
    """The quantity labels the real sidecar exports are the ones the operator reads."""
    from fusebox_sidecar.collectors import measured_families
    from fusebox_sidecar.nvml import GpuAccess, GpuReading
    from fusebox_sidecar.readings import ProcOutcome, ProcReading

    (family,) = measured_families(
        ProcReading(ProcOutcome.MEASURED, rss_bytes=1), GpuReading(GpuAccess.NO_GPU)
    )
    assert {s.labels[QUANTITY_LABEL] for s in family.samples} == {q.value for q in MeasuredQuantity}


def _sidecar_text(state: Any) -> str:
    """What the real sidecar exports for a stats file holding `state`."""
    from prometheus_client import generate_latest
    from prometheus_client.registry import Collector, CollectorRegistry

    from fusebox_contract.stats import StatsDocument
    from fusebox_sidecar.collectors import relayed_families

    class Relayed(Collector):
        def collect(self) -> Any:
            yield from relayed_families(StatsDocument(model_name="chat", state=state), 0.0)

    registry = CollectorRegistry()
    registry.register(Relayed())
    return generate_latest(registry).decode()


def test_the_revision_and_dtype_the_sidecar_exports_are_read_dtype_of_the_primary_only() -> None:
    from fusebox_contract.names import Dtype, Quantization
    from fusebox_contract.stats import RuntimeState

    primary = RuntimeState(variant=Variant.PRIMARY, model_revision="v2", dtype=Dtype.BFLOAT16)
    sample = sample_from_metrics("p", parse_metrics(_sidecar_text(primary)), 1.0, "ttft")
    assert (sample.model_revision, sample.model_dtype) == ("v2", "bfloat16")
    # The fallback's weights are not the primary's: its dtype is not reported as theirs.
    fallback = RuntimeState(
        variant=Variant.FALLBACK,
        model_revision="v2",
        dtype=Dtype.FLOAT16,
        quantization=Quantization.INT8,
    )
    sample = sample_from_metrics("p", parse_metrics(_sidecar_text(fallback)), 1.0, "ttft")
    assert (sample.model_revision, sample.model_dtype) == ("v2", None)
    # An s3:// copy has no revision (the label is empty), and nothing loaded says nothing.
    bucket = RuntimeState(variant=Variant.PRIMARY, model_revision="", dtype=Dtype.FLOAT32)
    sample = sample_from_metrics("p", parse_metrics(_sidecar_text(bucket)), 1.0, "ttft")
    assert (sample.model_revision, sample.model_dtype) == (None, "float32")
    sample = sample_from_metrics("p", parse_metrics(TEXT), 1.0, "ttft")
    assert (sample.model_revision, sample.model_dtype) == (None, None)


def test_infinite_gauges_are_not_measured_and_raise_nothing() -> None:
    text = (
        f"{Metric.DEGRADATION_LEVEL} +Inf\n{Metric.BREAKER_STATE} -Inf\n"
        f"{Metric.PROCESS_RESIDENT_MEMORY_BYTES} +Inf\n"
    )
    sample = sample_from_metrics("p", parse_metrics(text), 1.0, "ttft")
    assert (sample.degradation_level, sample.breaker_state, sample.rss_bytes) == (None, None, None)


def test_a_bucket_whose_bound_is_not_a_number_is_skipped() -> None:
    bucket = Metric.TIME_TO_FIRST_TOKEN_SECONDS.bucket
    text = f'{bucket}{{le="0.1"}} 3\n{bucket}{{le="abc"}} 4\n{bucket}{{le="+Inf"}} 5\n'
    sample = sample_from_metrics("p", parse_metrics(text), 1.0, "ttft")
    assert sample.latency_buckets == ((0.1, 3.0), (float("inf"), 5.0))


def _bad_metrics() -> float:
    value = METRICS.registry.get_sample_value(
        f"{OperatorMetric.SCRAPE_ERRORS.value}_total", {"kind": ScrapeErrorKind.BAD_METRICS.value}
    )
    return value or 0.0


def test_one_sidecar_answering_malformed_values_fails_alone() -> None:
    """Real HTTP: one pod answers values no sidecar exports, another garbage bytes, a
    third good metrics; every pod gets its sample and the good one is read."""
    odd = (
        f"{Metric.DEGRADATION_LEVEL} +Inf\n{Metric.SERVER_STATS_AGE_SECONDS} 1\n"
        f'{Metric.E2E_REQUEST_LATENCY_SECONDS.bucket}{{le="abc"}} 1\n'
    )
    answers = {  # by the loopback address the scrape reached
        "127.0.0.1": web.Response(text=odd),
        "127.0.0.2": web.Response(body=b"\xff\xfe\xfa", content_type="text/plain", charset="utf-8"),
        "127.0.0.3": web.Response(text=TEXT),
    }

    async def metrics(request: web.Request) -> web.Response:
        assert request.transport is not None
        return answers[request.transport.get_extra_info("sockname")[0]]

    async def go() -> list[PodSample]:
        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        first = web.TCPSite(runner, "127.0.0.1", 0)
        await first.start()
        port = runner.addresses[0][1]
        for address in ("127.0.0.2", "127.0.0.3"):
            await web.TCPSite(runner, address, port).start()
        pods = [
            PodView(f"p{n}", "uid", address, "Running", True, True, True, 0, False, False)
            for n, address in enumerate(answers)
        ]
        try:
            async with aiohttp.ClientSession() as session:
                return await scrape_all(session, pods, 5.0, "e2e", port=port)
        finally:
            await runner.cleanup()

    before = _bad_metrics()
    odd_sample, garbled, good = asyncio.run(go())
    assert (
        odd_sample.ok
        and odd_sample.degradation_level is None
        and odd_sample.latency_buckets is None
    )
    assert not garbled.ok and garbled.error.startswith("UnicodeDecodeError")
    assert good.ok and good.rss_bytes == 846204928
    assert _bad_metrics() == before + 1


def test_the_fetcher_s_figures_the_sidecar_exports_are_read_with_when_they_were_read() -> None:
    from prometheus_client import generate_latest
    from prometheus_client.registry import Collector, CollectorRegistry

    from fusebox_contract.model_fetch import FetchReason, FetchReport
    from fusebox_sidecar.collectors import FetchReading, fetch_families

    report = FetchReport(FetchReason.DOWNLOADING, "", 3 << 30, 8 << 30, 5e7)

    class Fetching(Collector):
        def collect(self) -> Any:
            yield from fetch_families(FetchReading(report, written_at=990.0), now_seconds=1000.0)

    registry = CollectorRegistry()
    registry.register(Fetching())
    text = generate_latest(registry).decode()
    sample = sample_from_metrics("p", parse_metrics(text), 1001.0, "ttft")
    assert sample.fetch == FetchProgress(3 << 30, 8 << 30, 5e7, 10.0, 1001.0)
    # Without a report file the sidecar exports none of it, and nothing is made up.
    assert sample_from_metrics("p", parse_metrics(TEXT), 1001.0, "ttft").fetch is None
    unsized = parse_metrics(f"{Metric.MODEL_FETCH_DOWNLOADED_BYTES} 0\n")
    assert sample_from_metrics("p", unsized, 5.0, "ttft").fetch == FetchProgress(
        0, None, None, None, 5.0
    )
    waiting = parse_metrics(
        f"{Metric.MODEL_FETCH_DOWNLOADED_BYTES} 0\n{Metric.MODEL_FETCH_WAITING} 1\n"
    )
    fetch = sample_from_metrics("p", waiting, 5.0, "ttft").fetch
    assert fetch is not None and fetch.waiting


@pytest.mark.parametrize("value", ["1e308", "-5", "NaN", "+Inf", "9.3e18"])
def test_fetch_figures_no_model_can_have_are_not_measured(value: str) -> None:
    text = f"{Metric.MODEL_FETCH_DOWNLOADED_BYTES} {value}\n{Metric.MODEL_FETCH_TOTAL_BYTES} 10\n"
    assert sample_from_metrics("p", parse_metrics(text), 1.0, "ttft").fetch is None
    beyond = f"{Metric.MODEL_FETCH_DOWNLOADED_BYTES} 5\n{Metric.MODEL_FETCH_TOTAL_BYTES} {value}\n"
    fetch = sample_from_metrics("p", parse_metrics(beyond), 1.0, "ttft").fetch
    assert fetch is not None and fetch.bytes_total is None


def test_device_counts_forget_long_unseen_pods_and_keep_the_recent_ones() -> None:
    counts = GpuDeviceCounts()
    for index in range(1100):
        counts.complete(f"uid-{index}", 2, 0.0)
    # An hour and more later a sweep forgets them: a pod new under an old uid starts over.
    counts.complete("uid-new", 1, 4000.0)
    assert counts.complete("uid-0", 1, 4000.5)
    # Past 1024 again within the minute (no second sweep): the recent counts stand.
    for index in range(1100):
        counts.complete(f"late-{index}", 2, 4001.0)
    assert not counts.complete("late-0", 1, 4030.0)
