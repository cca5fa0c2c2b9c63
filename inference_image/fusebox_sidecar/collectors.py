"""Metric families built at scrape time from one observation.

Every family here is a pure function of an `Observation` (the stats
snapshot, the `/proc` reading, the NVML reading and the clock), so each is
tested with hand-written inputs and a fresh `CollectorRegistry`. Nothing is
remembered between scrapes: the relayed counters are the server's own, and
the little memory the sidecar needs (the last valid stats file's time and
pid, so its age keeps growing after it disappears and the server's RSS is
still measured) lives in the observer, not here.

One collector builds every family from one observation, so a scrape is
consistent (every family from the same read of the stats file) and costs
one read, not one per family group.

A value that cannot be measured is left out, never exported as a fake 0.
Names and units follow docs/metrics.md (DESIGN §4 plus agreed additions).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fusebox_sidecar.nvml import GpuReading
from fusebox_sidecar.readings import (
    BREAKER_STATES,
    ProcOutcome,
    ProcReading,
    StatsReading,
    StatsSnapshot,
)

# closed=0, open=1, half_open=2: the order of BREAKER_STATES is the contract.
BREAKER_STATE_CODES: Mapping[str, int] = {state: code for code, state in enumerate(BREAKER_STATES)}


@dataclass(frozen=True)
class Observation:
    """Everything one scrape saw, gathered by the observer's I/O."""

    now_seconds: float
    stats: StatsReading
    last_written_at: float | None
    proc: ProcReading
    gpu: GpuReading


def _gauge(name: str, documentation: str, value: float | None) -> Iterator[Metric]:
    if value is not None:
        yield GaugeMetricFamily(name, documentation, value=value)


def _labelled_gauge(
    name: str, documentation: str, label: str, values: Mapping[str, float]
) -> Iterator[Metric]:
    if not values:
        return
    family = GaugeMetricFamily(name, documentation, labels=[label])
    for label_value, value in sorted(values.items()):
        family.add_metric([label_value], value)
    yield family


def _counter(name: str, documentation: str, value: float | None) -> Iterator[Metric]:
    if value is not None:
        yield CounterMetricFamily(name, documentation, value=value)


def _flag(value: bool | None) -> float | None:
    return None if value is None else float(value)


def stats_families(
    reading: StatsReading, now_seconds: float, last_written_at: float | None
) -> Iterator[Metric]:
    """Health of the stats file itself: validity and age."""
    yield from _gauge(
        "fusebox_stats_valid",
        "1 when the server's stats file was read and every field had the contracted type, else 0",
        float(reading.valid),
    )
    if last_written_at is not None:
        yield from _gauge(
            "fusebox_server_stats_age_seconds",
            "Seconds since the server last wrote a valid stats file (a stale file means a "
            "stuck server)",
            max(0.0, now_seconds - last_written_at),
        )


def relayed_families(snapshot: StatsSnapshot | None, now_seconds: float) -> Iterator[Metric]:
    """Values only the server can know, relayed from its stats file."""
    if snapshot is None:
        return
    s = snapshot
    yield from _gauge(
        "fusebox_memory_limit_bytes",
        "Memory limit of the server's cgroup",
        s.cgroup_memory_limit_bytes,
    )
    yield from _gauge(
        "fusebox_cgroup_memory_usage_bytes",
        "Memory usage of the server's cgroup as the server reads it",
        s.cgroup_memory_usage_bytes,
    )
    yield from _gauge(
        "fusebox_cuda_memory_allocated_bytes",
        "Bytes held by tensors in the server's CUDA caching allocator",
        s.cuda_allocated_bytes,
    )
    yield from _gauge(
        "fusebox_cuda_memory_reserved_bytes",
        "Bytes reserved from the GPU by the server's CUDA caching allocator",
        s.cuda_reserved_bytes,
    )
    yield from _counter(
        "fusebox_cuda_alloc_retries_total",
        "CUDA allocations the server retried after freeing its cache",
        s.cuda_alloc_retries_total,
    )
    yield from _counter(
        "fusebox_cuda_ooms_total",
        "CUDA out-of-memory errors the server's allocator raised",
        s.cuda_ooms_total,
    )
    yield from _gauge("fusebox_cuda_contexts", "CUDA contexts the server holds", s.cuda_contexts)
    yield from _gauge(
        "fusebox_request_queue_length", "Requests waiting for a generation slot", s.queue_length
    )
    yield from _gauge("fusebox_requests_running", "Generations running now", s.running)
    yield from _gauge(
        "fusebox_tokenizer_cache_entries",
        "Entries in the server's bounded tokenizer cache",
        s.tokenizer_cache_entries,
    )
    if s.requests_total:
        requests = CounterMetricFamily(
            "fusebox_requests",
            "Requests the server finished, by outcome, since it started",
            labels=["outcome"],
        )
        for outcome, count in sorted(s.requests_total.items()):
            requests.add_metric([outcome], count)
        yield requests
    yield from _labelled_gauge(
        "fusebox_latency_p99_seconds",
        "99th percentile latency over the server's sliding window (ttft: time to first "
        "token, itl: inter-token, e2e: whole request)",
        "metric",
        s.latency_p99_seconds,
    )
    yield from _gauge(
        "fusebox_quality_failure_ratio",
        "Share of sampled responses that failed the quality checks, over the sliding window",
        s.quality_failure_ratio,
    )
    yield from _labelled_gauge(
        "fusebox_heartbeat_age_seconds",
        "Seconds since the server's event loop (loop) or inference thread (worker) last "
        "stamped its heartbeat",
        "thread",
        {thread: max(0.0, now_seconds - stamp) for thread, stamp in s.heartbeats.items()},
    )
    yield from _gauge(
        "fusebox_breaker_state",
        "Circuit breaker state the server enforces: 0 closed, 1 open, 2 half_open",
        None if s.breaker is None else float(BREAKER_STATE_CODES[s.breaker]),
    )
    yield from _gauge(
        "fusebox_degradation_level",
        "Degradation level the server applies (0 none, 1 no streaming, 2 fallback model, "
        "3 canned answers)",
        None if s.degradation_level is None else float(s.degradation_level),
    )
    yield from _gauge(
        "fusebox_fallback_active",
        "1 when the fallback (quantized) variant serves, 0 when the primary does",
        None if s.variant is None else float(s.variant == "fallback"),
    )
    yield from _gauge(
        "fusebox_model_loaded", "1 when the served model is loaded", _flag(s.model_loaded)
    )
    yield from _gauge(
        "fusebox_memory_guard_active",
        "1 while the server's last-resort memory guard refuses new requests",
        _flag(s.memory_guard_active),
    )


def process_families(proc: ProcReading, snapshot: StatsSnapshot | None) -> Iterator[Metric]:
    """The server's RSS: measured from /proc when possible, else relayed."""
    rss_bytes = proc.rss_bytes if _rss_measured(proc) else None
    if rss_bytes is None and snapshot is not None:
        rss_bytes = snapshot.rss_bytes
    yield from _gauge(
        "fusebox_process_resident_memory_bytes",
        "Resident memory of the server process (pinned host memory counts here, not on the GPU)",
        rss_bytes,
    )


def gpu_families(gpu: GpuReading, snapshot: StatsSnapshot | None) -> Iterator[Metric]:
    """GPU memory: the sidecar's own NVML reading, else the server's."""
    yield from _gauge(
        "fusebox_gpu_visible",
        "1 when the sidecar itself can read GPUs through NVML",
        float(gpu.visible),
    )
    used: dict[str, float] = {}
    total: dict[str, float] = {}
    process_used: dict[str, float] = {}
    if gpu.visible:
        yield from _gauge(
            "fusebox_gpu_lost",
            "1 when NVML reports a visible GPU as lost (fell off the bus; needs a reset)",
            float(gpu.lost),
        )
        for device in gpu.devices:
            _put(used, str(device.index), device.used_bytes)
            _put(total, str(device.index), device.total_bytes)
            _put(process_used, str(device.index), device.process_used_bytes)
    elif snapshot is not None:
        for entry in snapshot.nvml:
            _put(used, str(entry.index), entry.used_bytes)
            _put(total, str(entry.index), entry.total_bytes)
    yield from _labelled_gauge(
        "fusebox_gpu_memory_used_bytes",
        "Device memory in use on the GPU (all processes)",
        "gpu",
        used,
    )
    yield from _labelled_gauge(
        "fusebox_gpu_memory_total_bytes", "Device memory of the GPU", "gpu", total
    )
    yield from _labelled_gauge(
        "fusebox_gpu_process_memory_used_bytes",
        "Device memory NVML attributes to the server process (absent when NVML cannot tell)",
        "gpu",
        process_used,
    )


def _put(values: dict[str, float], key: str, value: float | None) -> None:
    if value is not None:
        values[key] = value


def _rss_measured(proc: ProcReading) -> bool:
    return proc.outcome is ProcOutcome.MEASURED and proc.rss_bytes is not None


def measured_families(proc: ProcReading, gpu: GpuReading) -> Iterator[Metric]:
    """Which figures the sidecar measured itself rather than relayed."""
    gpu_measured = gpu.visible and any(device.used_bytes is not None for device in gpu.devices)
    yield from _labelled_gauge(
        "fusebox_sidecar_measured",
        "1 when the sidecar measured the quantity itself, 0 when it relays the server's figure "
        "or has none",
        "quantity",
        {"rss": float(_rss_measured(proc)), "gpu_memory": float(gpu_measured)},
    )


def build_families(observation: Observation) -> list[Metric]:
    """All families for one scrape."""
    snapshot = observation.stats.snapshot
    return [
        *stats_families(observation.stats, observation.now_seconds, observation.last_written_at),
        *relayed_families(snapshot, observation.now_seconds),
        *process_families(observation.proc, snapshot),
        *gpu_families(observation.gpu, snapshot),
        *measured_families(observation.proc, observation.gpu),
    ]


class SidecarCollector(Collector):
    """Builds every family from a fresh observation on each scrape."""

    def __init__(self, observe: Callable[[], Observation]) -> None:
        self._observe = observe

    def collect(self) -> Iterator[Metric]:
        yield from build_families(self._observe())

    def describe(self) -> Iterator[Metric]:
        # Names vary with what can be measured; registering must not scrape.
        return iter(())
