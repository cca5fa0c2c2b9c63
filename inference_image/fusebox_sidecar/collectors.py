"""Metric families built at scrape time from one observation.

Every family here is a pure function of an `Observation` (the parsed stats
document, the `/proc` reading, the NVML reading and the clock), so each is
tested with hand-written inputs and a fresh `CollectorRegistry`. Nothing is
remembered between scrapes here: the little memory the sidecar needs (the
last valid stats file's time and pid, so its age keeps growing after it
disappears and the server's RSS is still measured, and the counters' totals
across server restarts and variant swaps, counters.py) lives in the
observer, which hands the document over with its counters already carried.

One collector builds every family from one observation, so a scrape is
consistent (every family from the same read of the stats file) and costs
one read, not one per family group.

A value that cannot be measured is left out, never exported as a fake 0.
Every name is a `fusebox_contract.metrics.Metric` and every label value a
contract enum's value, as the operator reads them; docs/metrics.md lists them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.core import Metric as Family
from prometheus_client.registry import Collector

from fusebox_contract.metrics import (
    FETCH_REASON_LABEL,
    GPU_LABEL,
    QUANTITY_LABEL,
    STALL_LABEL,
    LatencyHistogram,
    MeasuredQuantity,
    Metric,
)
from fusebox_contract.model_fetch import FetchReason, FetchReport
from fusebox_contract.names import HeartbeatThread, Variant
from fusebox_contract.stats import StatsDocument, StatsReading
from fusebox_sidecar.cardinality import relayable_gpus
from fusebox_sidecar.node_memory import NodeMemory
from fusebox_sidecar.nvml import GpuReading
from fusebox_sidecar.readings import ProcOutcome, ProcReading

# The labels' names; their values are the contract's enum values.
OUTCOME_LABEL = "outcome"
LATENCY_LABEL = "metric"
THREAD_LABEL = "thread"
REASON_LABEL = "reason"
MODEL_INFO_LABELS = ("model", "variant", "quantization", "dtype", "revision")
# A fetch report unchanged this long describes a download that no longer moves: the
# operator calls it stalled at the same age (model_readiness.STALLED_SECONDS).
FETCH_RATE_FRESH_SECONDS = 30.0


@dataclass(frozen=True)
class StampAge:
    """What the sidecar's own monotonic clock says of a stamp's age, whatever the wall
    clock did: at least as long as the stamp has kept its value, and, once the sidecar
    has seen it change, at most the time since the last read that still held the
    value before (the stamp was written between the two reads)."""

    at_least_seconds: float = 0.0
    at_most_seconds: float | None = None  # None: never seen changing (the first read)


@dataclass(frozen=True)
class FetchReading:
    """The model fetcher's last report (its file in the runtime volume) and the file's
    modification time: the fetcher rewrites it as bytes arrive, so its age is how long
    the download has not moved. `stamp_age` as for the stats file's stamp."""

    report: FetchReport
    written_at: float
    stamp_age: StampAge = StampAge()


@dataclass(frozen=True)
class Observation:
    """Everything one scrape saw, gathered by the observer's I/O."""

    now_seconds: float
    stats: StatsReading
    last_written_at: float | None
    proc: ProcReading
    gpu: GpuReading
    node: NodeMemory = NodeMemory()
    # What the sidecar's monotonic clock says of the age of `last_written_at`
    # and of each heartbeat stamp: bounds no clock step can move (see
    # `age_seconds`).
    stats_stamp_age: StampAge = StampAge()
    heartbeat_stamp_ages: Mapping[HeartbeatThread, StampAge] = field(default_factory=dict)
    fetch: FetchReading | None = None  # the model fetcher's report file, when there is one


def age_seconds(now_seconds: float, stamp: float, seen: StampAge) -> float:
    """Seconds since the server stamped `stamp`, kept within what the sidecar saw.

    The wall-clock difference alone is 0 for as long as a stamp lies in the
    future, so after the clock steps back (NTP, a resumed VM) a server that
    stopped writing would look fresh until the clock caught up: an hour's
    step hides a wedge for an hour. A stamp that stays the same while the
    sidecar's monotonic clock runs is that old whatever the wall clock says.
    The other way, a forward step makes a stamp written a moment ago look
    minutes old, and the operator would restart a healthy pod: a stamp the
    sidecar saw change since its previous read is at most that read's age.
    """
    age = max(0.0, now_seconds - stamp, seen.at_least_seconds)
    if seen.at_most_seconds is None:
        return age
    return min(age, max(seen.at_most_seconds, seen.at_least_seconds))


def _gauge(metric: Metric, documentation: str, value: float | None) -> Iterator[Family]:
    if value is not None:
        yield GaugeMetricFamily(metric.value, documentation, value=value)


def _labelled_gauge(
    metric: Metric, documentation: str, label: str, values: Mapping[str, float]
) -> Iterator[Family]:
    if not values:
        return
    family = GaugeMetricFamily(metric.value, documentation, labels=[label])
    for label_value, value in sorted(values.items()):
        family.add_metric([label_value], value)
    yield family


def _counter(metric: Metric, documentation: str, value: float | None) -> Iterator[Family]:
    if value is not None:
        yield CounterMetricFamily(metric.value, documentation, value=value)


def _flag(value: bool | None) -> float | None:
    return None if value is None else float(value)


def _is_fallback(variant: Variant | None) -> float | None:
    return None if variant is None else float(variant is Variant.FALLBACK)


def stats_families(
    reading: StatsReading,
    now_seconds: float,
    last_written_at: float | None,
    stamp_age: StampAge = StampAge(),
) -> Iterator[Family]:
    """Health of the stats file itself: validity and age."""
    yield from _gauge(
        Metric.STATS_VALID,
        "1 when the server's stats file was read and every field had the contracted type, else 0",
        float(reading.valid),
    )
    if last_written_at is not None:
        yield from _gauge(
            Metric.SERVER_STATS_AGE_SECONDS,
            "Seconds since the server last wrote a valid stats file (a stale file means a "
            "stuck server)",
            age_seconds(now_seconds, last_written_at, stamp_age),
        )


def relayed_families(
    document: StatsDocument | None,
    now_seconds: float,
    heartbeat_stamp_ages: Mapping[HeartbeatThread, StampAge] | None = None,
) -> Iterator[Family]:
    """Values only the server can know, relayed from its stats file."""
    if document is None:
        return
    d = document
    stamp_ages = heartbeat_stamp_ages or {}
    yield from _gauge(
        Metric.SERVER_START_TIME_SECONDS,
        "When the server process started, in Unix seconds (a change is a restart)",
        d.started_at,
    )
    yield from _gauge(
        Metric.MEMORY_LIMIT_BYTES,
        "Memory limit of the server's cgroup",
        d.cgroup_memory_limit_bytes,
    )
    yield from _gauge(
        Metric.CGROUP_MEMORY_USAGE_BYTES,
        "Working set of the server's cgroup (usage minus inactive file cache)",
        d.cgroup_memory_usage_bytes,
    )
    yield from _gauge(
        Metric.CUDA_MEMORY_ALLOCATED_BYTES,
        "Bytes held by tensors in the server's CUDA caching allocator",
        d.cuda.allocated_bytes,
    )
    yield from _gauge(
        Metric.CUDA_MEMORY_RESERVED_BYTES,
        "Bytes reserved from the GPU by the server's CUDA caching allocator",
        d.cuda.reserved_bytes,
    )
    yield from _counter(
        Metric.CUDA_ALLOC_RETRIES,
        "CUDA allocations the server retried after freeing its cache",
        d.cuda.num_alloc_retries,
    )
    yield from _counter(
        Metric.CUDA_OOMS, "CUDA out-of-memory errors the server's allocator raised", d.cuda.num_ooms
    )
    yield from _gauge(
        Metric.CUDA_CONTEXTS,
        "GPUs on which the server's torch allocator holds memory (at least 1 once CUDA is up; "
        "contexts created outside torch are not counted)",
        d.cuda.contexts,
    )
    yield from _gauge(
        Metric.REQUEST_QUEUE_LENGTH, "Requests waiting for a generation slot", d.queue_length
    )
    yield from _gauge(Metric.REQUESTS_RUNNING, "Generations running now", d.running)
    yield from _tokenizer_families(d)
    yield from _prefix_cache_families(d)
    if d.requests:
        requests = CounterMetricFamily(
            Metric.REQUESTS.value,
            "Requests the server finished, by outcome, each counted once (across its restarts)",
            labels=[OUTCOME_LABEL],
        )
        for outcome, count in sorted(d.requests.items()):
            requests.add_metric([outcome.value], count)
        yield requests
    yield from _latency_families(d)
    yield from _histogram_families(d)
    yield from _token_families(d)
    yield from _quality_families(d)
    yield from _labelled_gauge(
        Metric.HEARTBEAT_AGE_SECONDS,
        "Seconds since the server's event loop (loop) or inference thread (worker) last "
        "stamped its heartbeat",
        THREAD_LABEL,
        {
            thread.value: _heartbeat_age(
                now_seconds, stamp, stamp_ages.get(thread, StampAge()), d.written_at
            )
            for thread, stamp in d.heartbeats.items()
        },
    )
    yield from _state_families(d)


def _heartbeat_age(
    now_seconds: float, stamp: float, seen: StampAge, written_at: float | None
) -> float:
    """A heartbeat reaches the file at the server's next write, a moment after it was
    stamped: its upper bound is the file's plus that lag, as the server's clock measured
    it between two stamps of its own."""
    if seen.at_most_seconds is not None and written_at is not None:
        lag = max(0.0, written_at - stamp)
        seen = StampAge(seen.at_least_seconds, seen.at_most_seconds + lag)
    return age_seconds(now_seconds, stamp, seen)


def _tokenizer_families(d: StatsDocument) -> Iterator[Family]:
    yield from _gauge(
        Metric.TOKENIZER_CACHE_ENTRIES,
        "Entries in the server's bounded tokenizer cache",
        d.tokenizer_cache_entries,
    )
    yield from _counter(
        Metric.TOKENIZER_CACHE_HITS,
        "Prompt encodings the server's tokenizer caches answered (every variant, across restarts)",
        d.tokenizer_cache_hits_total,
    )
    yield from _counter(
        Metric.TOKENIZER_TEMPLATE_HITS,
        "Prompts that matched a pre-encoded template (every variant, across restarts)",
        d.tokenizer_template_hits_total,
    )


def _prefix_cache_families(d: StatsDocument) -> Iterator[Family]:
    cache = d.prefix_cache
    yield from _counter(
        Metric.PREFIX_CACHE_HITS,
        "Prompts whose prefill started from keys and values in the server's prefix cache",
        cache.hits_total,
    )
    yield from _counter(
        Metric.PREFIX_CACHE_MISSES,
        "Prompts that found no cached prefix of a whole block",
        cache.misses_total,
    )
    yield from _counter(
        Metric.PREFIX_CACHE_REUSED_TOKENS,
        "Prompt tokens whose keys and values came from the prefix cache instead of a prefill",
        cache.reused_tokens_total,
    )
    yield from _counter(
        Metric.PREFIX_CACHE_EVICTIONS,
        "Prefix cache entries evicted for its byte bound or for memory",
        cache.evictions_total,
    )
    yield from _gauge(Metric.PREFIX_CACHE_ENTRIES, "Entries in the prefix cache", cache.entries)
    yield from _gauge(
        Metric.PREFIX_CACHE_BYTES,
        "Bytes of keys and values the prefix cache holds, on the model's device",
        cache.bytes,
    )
    yield from _gauge(
        Metric.PREFIX_CACHE_CAPACITY_BYTES,
        "The prefix cache's bound in bytes (0: disabled)",
        cache.capacity_bytes,
    )


def _latency_families(d: StatsDocument) -> Iterator[Family]:
    yield from _labelled_gauge(
        Metric.LATENCY_P99_SECONDS,
        "99th percentile latency over the server's sliding window (ttft: time to first "
        "token, itl: inter-token, e2e: whole request)",
        LATENCY_LABEL,
        {m.value: s.p99_seconds for m, s in d.latency.items() if s.p99_seconds is not None},
    )
    yield from _labelled_gauge(
        Metric.LATENCY_WINDOW_SAMPLES,
        "Samples in the server's sliding window behind each latency p99",
        LATENCY_LABEL,
        {m.value: s.count for m, s in d.latency.items() if s.count is not None},
    )


_HISTOGRAM_HELP = {
    LatencyHistogram.TTFT: "Time from a request's arrival to its first generated token",
    LatencyHistogram.ITL: "Time between consecutive generated tokens of one response",
    LatencyHistogram.E2E: "Time from a request's arrival to the end of its successful response",
    LatencyHistogram.QUEUE: "Time a request waited for a generation slot",
}


def _histogram_families(d: StatsDocument) -> Iterator[Family]:
    """The server's latency histograms (carried across its restarts), in the contract's buckets."""
    for name, counts in sorted(d.histograms.items()):
        bounds = [str(bound) for bound in name.buckets]  # finite: 0.005, 1.0, 60.0
        buckets = [*zip(bounds, counts.bucket_counts, strict=True), ("+Inf", counts.count)]
        yield HistogramMetricFamily(
            name.metric.value,
            f"{_HISTOGRAM_HELP[name]}, in seconds (across the server's restarts)",
            buckets=buckets,
            sum_value=counts.sum_seconds,
        )


def _token_families(d: StatsDocument) -> Iterator[Family]:
    yield from _counter(
        Metric.PROMPT_TOKENS,
        "Prompt tokens of the generations the server ran (across its restarts)",
        d.tokens.prompt_total,
    )
    yield from _counter(
        Metric.GENERATION_TOKENS,
        "Tokens the server generated (across its restarts)",
        d.tokens.generation_total,
    )


def _quality_families(d: StatsDocument) -> Iterator[Family]:
    yield from _gauge(
        Metric.QUALITY_FAILURE_RATIO,
        "Share of sampled responses that failed the quality checks, over the sliding window",
        d.quality.failure_ratio,
    )
    yield from _counter(
        Metric.QUALITY_SAMPLED,
        "Responses the server checked for quality (across its restarts)",
        d.quality.sampled_total,
    )
    yield from _counter(
        Metric.QUALITY_FAILURES,
        "Sampled responses that failed a quality check (across the server's restarts)",
        d.quality.failed_total,
    )


def _state_families(d: StatsDocument) -> Iterator[Family]:
    state = d.state
    yield from _gauge(
        Metric.BREAKER_STATE,
        "Circuit breaker state the server enforces: 0 closed, 1 open, 2 half_open",
        None if state.breaker is None else float(state.breaker.gauge_value),
    )
    yield from _gauge(
        Metric.BREAKER_ADMIT_RATIO,
        "Share of new requests the server admits while the breaker is half open (0..1)",
        None if state.admit_percent is None else state.admit_percent / 100,
    )
    yield from _gauge(
        Metric.DEGRADATION_LEVEL,
        "Degradation level the server applies (0 none, 1 no streaming, 2 fallback model, "
        "3 canned answers)",
        None if state.degradation_level is None else float(state.degradation_level),
    )
    yield from _gauge(
        Metric.FALLBACK_ACTIVE,
        "1 when the fallback (quantized) variant serves, 0 when the primary does",
        _is_fallback(state.variant),
    )
    yield from _gauge(
        Metric.FALLBACK_TARGET,
        "1 when the server is set to serve the fallback variant, 0 for the primary",
        _is_fallback(state.target_variant),
    )
    yield from _gauge(
        Metric.VARIANT_CONVERGING,
        "1 while a load or swap towards the target variant is under way",
        _flag(state.converging),
    )
    yield from _gauge(
        Metric.FALLBACK_CONFIGURED,
        "1 when the server has a fallback variant to swap to",
        _flag(state.fallback_configured),
    )
    yield from _gauge(
        Metric.FALLBACK_AVAILABLE,
        "1 when the server can swap to its fallback; 0 when none is configured or the device "
        "cannot serve its quantization (the reason is fusebox_fallback_unavailable_info's)",
        _flag(state.fallback_available),
    )
    yield from _fallback_unavailable_info(d)
    yield from _gauge(
        Metric.MODEL_LOADED, "1 when the served model is loaded", _flag(state.model_loaded)
    )
    yield from _gauge(
        Metric.MEMORY_GUARD_ACTIVE,
        "1 while the server's last-resort memory guard refuses new requests",
        _flag(state.memory_guard_active),
    )
    yield from _model_info(d)


def _fallback_unavailable_info(d: StatsDocument) -> Iterator[Family]:
    """`fusebox_fallback_unavailable_info{reason="..."} 1`: why there is no fallback to swap to."""
    reason = d.state.fallback_unavailable_reason
    if reason is None:
        return
    family = GaugeMetricFamily(
        Metric.FALLBACK_UNAVAILABLE_INFO.value,
        "Why the server cannot swap to a fallback, as the reason label (value 1)",
        labels=[REASON_LABEL],
    )
    family.add_metric([reason], 1.0)
    yield family


def _model_info(d: StatsDocument) -> Iterator[Family]:
    """`fusebox_model_info{...} 1`: what serves, as labels; absent until something does."""
    state = d.state
    if state.variant is None:
        return
    labels = {
        "model": d.model_name,
        "variant": state.variant,
        "quantization": state.quantization,
        "dtype": state.dtype,
        "revision": state.model_revision,
    }
    family = GaugeMetricFamily(
        Metric.MODEL_INFO.value,
        "The model variant serving now, its quantization, weight dtype and revision (value 1)",
        labels=list(MODEL_INFO_LABELS),
    )
    family.add_metric(
        ["" if labels[name] is None else str(labels[name]) for name in MODEL_INFO_LABELS], 1.0
    )
    yield family


def process_families(proc: ProcReading, document: StatsDocument | None) -> Iterator[Family]:
    """The server's RSS: measured from /proc when possible, else relayed; absent once the
    sidecar saw the process exit (the file's figure is then a dead process's)."""
    rss_bytes = proc.rss_bytes if _rss_measured(proc) else None
    if rss_bytes is None and document is not None and proc.outcome is not ProcOutcome.EXITED:
        rss_bytes = document.rss_bytes
    yield from _gauge(
        Metric.PROCESS_RESIDENT_MEMORY_BYTES,
        "Resident memory of the server process (pinned host memory counts here, not on the GPU)",
        rss_bytes,
    )


def gpu_families(gpu: GpuReading, document: StatsDocument | None) -> Iterator[Family]:
    """GPU memory: the sidecar's own NVML reading, else the server's, per device.

    A device the sidecar sees but cannot read (NVML answers NotSupported or
    Unknown for its memory) takes the server's figure for the same index,
    so one failing call does not make the memory metrics vanish. A lost
    device does not: whatever the server last wrote describes a device
    that is gone. Without NVML the server's entries are relayed, but only
    those whose index one node can have (cardinality.py): a broken file must
    not mint a series per index it names.
    """
    yield from _gauge(
        Metric.GPU_VISIBLE,
        "1 when the sidecar itself can read GPUs through NVML",
        float(gpu.visible),
    )
    used: dict[str, float] = {}
    total: dict[str, float] = {}
    process_used: dict[str, float] = {}
    server_reported = (
        {entry.index: entry for entry in document.nvml} if document is not None else {}
    )
    if gpu.visible:
        yield from _gauge(
            Metric.GPU_LOST,
            "1 when NVML reports a visible GPU as lost (fell off the bus; needs a reset)",
            float(gpu.lost),
        )
        for device in gpu.devices:
            key = str(device.index)
            server = server_reported.get(device.index)
            if device.used_bytes is None and not device.lost and server is not None:
                _put(used, key, server.memory_used_bytes)
                _put(total, key, server.memory_total_bytes)
            else:
                _put(used, key, device.used_bytes)
                _put(total, key, device.total_bytes)
            _put(process_used, key, device.process_used_bytes)
    elif document is not None:
        # Nothing vouches for these indices: only those one node can have become labels.
        for entry in relayable_gpus(document.nvml).accepted:
            _put(used, str(entry.index), entry.memory_used_bytes)
            _put(total, str(entry.index), entry.memory_total_bytes)
    yield from _labelled_gauge(
        Metric.GPU_MEMORY_USED_BYTES,
        "Device memory in use on the GPU (all processes)",
        GPU_LABEL,
        used,
    )
    yield from _labelled_gauge(
        Metric.GPU_MEMORY_TOTAL_BYTES, "Device memory of the GPU", GPU_LABEL, total
    )
    yield from _labelled_gauge(
        Metric.GPU_PROCESS_MEMORY_USED_BYTES,
        "Device memory NVML attributes to the server process (absent when NVML cannot tell)",
        GPU_LABEL,
        process_used,
    )


def _put(values: dict[str, float], key: str, value: float | None) -> None:
    if value is not None:
        values[key] = value


def _rss_measured(proc: ProcReading) -> bool:
    return proc.outcome is ProcOutcome.MEASURED and proc.rss_bytes is not None


def measured_families(proc: ProcReading, gpu: GpuReading) -> Iterator[Family]:
    """Which figures the sidecar measured itself rather than relayed."""
    gpu_measured = gpu.visible and any(device.used_bytes is not None for device in gpu.devices)
    yield from _labelled_gauge(
        Metric.SIDECAR_MEASURED,
        "1 when the sidecar measured the quantity itself, 0 when it relays the server's figure "
        "or has none",
        QUANTITY_LABEL,
        {
            MeasuredQuantity.RSS: float(_rss_measured(proc)),
            MeasuredQuantity.GPU_MEMORY: float(gpu_measured),
        },
    )


def node_memory_families(node: NodeMemory) -> Iterator[Family]:
    """The node's memory as every pod on it sees it: what another tenant's growth moves."""
    yield from _gauge(
        Metric.NODE_MEMORY_AVAILABLE_BYTES,
        "MemAvailable of the node (/proc/meminfo): what can be allocated without swapping",
        node.available_bytes,
    )
    yield from _gauge(
        Metric.NODE_MEMORY_TOTAL_BYTES, "MemTotal of the node (/proc/meminfo)", node.total_bytes
    )
    yield from _labelled_gauge(
        Metric.NODE_MEMORY_PRESSURE_RATIO,
        "Share of the last 10 s in which some (or all non-idle) tasks on the node stalled "
        "waiting for memory (PSI avg10, /proc/pressure/memory)",
        STALL_LABEL,
        {stall.value: share for stall, share in node.pressure},
    )


def fetch_families(fetch: FetchReading | None, now_seconds: float) -> Iterator[Family]:
    """The model download as the fetcher last reported it; nothing without a report."""
    if fetch is None:
        return
    report = fetch.report
    age = age_seconds(now_seconds, fetch.written_at, fetch.stamp_age)
    yield from _labelled_gauge(
        Metric.MODEL_FETCH_INFO,
        "The model fetcher's last report: Downloading, Verified or the failure's name",
        FETCH_REASON_LABEL,
        {report.reason.value: 1.0},
    )
    yield from _gauge(
        Metric.MODEL_FETCH_DOWNLOADED_BYTES,
        "Bytes of the model the fetcher has (resumed bytes included)",
        float(report.bytes_done),
    )
    yield from _gauge(
        Metric.MODEL_FETCH_TOTAL_BYTES,
        "The model's size as its source lists it (absent until listed)",
        None if report.bytes_total is None else float(report.bytes_total),
    )
    yield from _gauge(
        Metric.MODEL_FETCH_RATE_BYTES_PER_SECOND,
        "Bytes per second the fetcher's current run has downloaded (absent before any, once "
        "the download ended, and while no bytes arrived for FETCH_RATE_FRESH_SECONDS)",
        _fetch_rate(report, age),
    )
    yield from _gauge(
        Metric.MODEL_FETCH_WAITING,
        "1 while the fetcher waits for another pod's download of the same model (a shared "
        "cache), 0 otherwise",
        float(report.waiting),
    )
    yield from _gauge(
        Metric.MODEL_FETCH_REPORT_AGE_SECONDS,
        "Seconds since the fetcher last wrote its report: it writes as bytes arrive, so a "
        "stalled download's age grows",
        age,
    )


def _fetch_rate(report: FetchReport, age: float) -> float | None:
    """The report's rate while it says something about now: the fetcher rewrites it as
    bytes arrive, so a report that stopped changing (a stalled or killed fetcher) or
    that ended the download holds the rate of a moment long gone."""
    if report.reason is not FetchReason.DOWNLOADING or age >= FETCH_RATE_FRESH_SECONDS:
        return None
    return report.rate_bytes_per_second


def build_families(observation: Observation) -> list[Family]:
    """All families for one scrape."""
    document = observation.stats.document
    return [
        *stats_families(
            observation.stats,
            observation.now_seconds,
            observation.last_written_at,
            observation.stats_stamp_age,
        ),
        *relayed_families(document, observation.now_seconds, observation.heartbeat_stamp_ages),
        *process_families(observation.proc, document),
        *gpu_families(observation.gpu, document),
        *measured_families(observation.proc, observation.gpu),
        *node_memory_families(observation.node),
        *fetch_families(observation.fetch, observation.now_seconds),
    ]


class SidecarCollector(Collector):
    """Builds every family from a fresh observation on each scrape."""

    def __init__(self, observe: Callable[[], Observation]) -> None:
        self._observe = observe

    def collect(self) -> Iterator[Family]:
        yield from build_families(self._observe())

    def describe(self) -> Iterator[Family]:
        # Names vary with what can be measured; registering must not scrape.
        return iter(())
