"""Scrape every pod's sidecar concurrently and turn its metrics into PodSamples.

Why: the policy must see all pods of a service at one moment, and one hung
sidecar must not delay the others, so scrapes run concurrently with a short
timeout each; a failure becomes a sample with ok=False (the policy counts it
towards staleness) rather than an exception. Scrapes have a connection pool
of their own (`scrape_session`) with no limit over all pods and one connection
per pod: a shared pool of 100 made healthy pods' scrapes wait, inside their own
timeout, behind more than 100 hung sidecars (docs/decisions/fleet-simulator.md).
With no pool-wide limit, a pod's timeout covers connecting to it and reading its
own answer, nothing else. The text is parsed by
prometheus_client's own parser (the format has escapes, exemplars and
comments a hand-written one gets wrong), and every metric name and label
value comes from the contract the sidecar exports with.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterable, Sequence

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from fusebox_contract.metrics import (
    BUCKET_LABEL,
    GPU_LABEL,
    QUANTITY_LABEL,
    STALL_LABEL,
    LatencyHistogram,
    MeasuredQuantity,
    MemoryStall,
    Metric,
)
from fusebox_contract.model_fetch import MAX_BYTES
from fusebox_contract.names import (
    BreakerState,
    HeartbeatThread,
    LatencyMetric,
    RequestOutcome,
    Variant,
)
from fusebox_contract.wiring import Port
from fusebox_operator.latency import Buckets
from fusebox_operator.observations import FetchProgress, PodSample, PodView, RequestCounts
from fusebox_operator.operator_metrics import METRICS, ScrapeErrorKind

Labels = dict[str, str]
Samples = dict[str, list[tuple[Labels, float]]]
"""Exposed sample name -> [(labels, value)]: counters appear under `<name>_total`."""


SCRAPE_CONNECTIONS_PER_POD = 1
"""A sidecar is asked one scrape at a time: a new scrape of a pod whose previous one
is somehow still in flight waits for it, inside its own timeout, and no other pod's."""


def scrape_session() -> aiohttp.ClientSession:
    """The connection pool for scrapes alone, made once at operator startup.

    No limit over all pods (aiohttp's default is 100): a hung sidecar holds its
    connection for a whole scrape timeout, so hung pods need about
    hung x timeout / interval connections (124 for 309 hung pods at 2 s and 5 s),
    and any fixed bound below that turns their failures into every other pod's
    wait. What bounds the pool is the pods themselves: one connection each
    (SCRAPE_CONNECTIONS_PER_POD), so never more than the pods scraped. Admin calls
    have a pool of their own (actuator.admin_session), so a scrape storm never
    delays an action, nor an action a scrape.
    """
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=SCRAPE_CONNECTIONS_PER_POD)
    return aiohttp.ClientSession(connector=connector)


class ParseError(ValueError):
    pass


def parse_metrics(text: str) -> Samples:
    """Prometheus text exposition -> {sample name: [(labels, value)]}."""
    samples: Samples = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    except ValueError as error:
        raise ParseError(f"bad metrics text: {error}") from error
    return samples


def _one(samples: Samples, name: Metric, **match: str) -> float | None:
    """The first matching sample's value; None when absent, NaN or infinite: no figure
    the sidecar exports is infinite, so one that is was not measured."""
    for labels, value in samples.get(name.sample, []):
        if all(labels.get(k) == v for k, v in match.items()) and math.isfinite(value):
            return value
    return None


def _by_gpu(samples: Samples, name: Metric) -> dict[str, float]:
    return {
        labels.get(GPU_LABEL, ""): value
        for labels, value in samples.get(name.sample, [])
        if math.isfinite(value)
    }


class GpuDeviceCounts:
    """The most GPUs each pod's scrapes have shown. A pod keeps its devices for its
    life, so a scrape showing fewer lost one or could not read it; summing the rest
    would read as a memory drop (and a jump back when the read recovers)."""

    FORGET_AFTER_SECONDS = 3600.0
    PRUNE_EVERY_SECONDS = 60.0  # a fleet keeps thousands in view: not a sweep per scrape

    def __init__(self) -> None:
        self._most: dict[str, tuple[int, float]] = {}
        self._pruned_at = -math.inf

    def complete(self, pod_uid: str, devices: int, now: float) -> bool:
        """Whether `devices` is every device this pod has shown; remembers the count."""
        most = max(devices, self._most.get(pod_uid, (0, 0.0))[0])
        self._most[pod_uid] = (most, now)
        if len(self._most) > 1024 and now - self._pruned_at >= self.PRUNE_EVERY_SECONDS:
            # Pods come and go: forget the long-unseen ones.
            self._pruned_at = now
            cutoff = now - self.FORGET_AFTER_SECONDS
            self._most = {uid: seen for uid, seen in self._most.items() if seen[1] >= cutoff}
        return devices >= most


DEVICE_COUNTS = GpuDeviceCounts()
"""The operator process's memory of each pod's GPU count, for `scrape_pod`."""


def _gpu_memory(
    samples: Samples, pod_uid: str | None, now: float, counts: GpuDeviceCounts
) -> tuple[float | None, float | None]:
    """The pod's GPU memory used and total, summed over its devices; (None, None) when a
    device is missing from the scrape: reported lost, read for one figure and not the
    other, or fewer devices than the pod has shown before. A partial sum is no figure."""
    used = _by_gpu(samples, Metric.GPU_MEMORY_USED_BYTES)
    total = _by_gpu(samples, Metric.GPU_MEMORY_TOTAL_BYTES)
    if not used and not total:
        return None, None
    lost = _one(samples, Metric.GPU_LOST)
    devices = set(used) | set(total)
    incomplete = (
        (lost is not None and lost >= 1)
        or set(used) != set(total)
        or not set(_by_gpu(samples, Metric.GPU_PROCESS_MEMORY_USED_BYTES)) <= devices
    )
    if pod_uid is not None and not counts.complete(pod_uid, len(devices), now):
        incomplete = True
    if incomplete:
        return None, None
    return sum(used.values()), sum(total.values())


def _request_counts(samples: Samples) -> RequestCounts | None:
    """Every outcome's counter, or None: the server writes each from its start, so one
    missing (a field problem in its stats file) is unknown, not 0. Read as 0, the next
    good scrape would count every such request since the process started as new."""
    counts = {
        outcome: _one(samples, Metric.REQUESTS, outcome=outcome.value) for outcome in RequestOutcome
    }
    known = {outcome: value for outcome, value in counts.items() if value is not None}
    if len(known) != len(counts):
        return None
    return RequestCounts(
        succeeded=known[RequestOutcome.SUCCEEDED],
        failed=known[RequestOutcome.FAILED],
        rejected=known[RequestOutcome.REJECTED],
        timed_out=known[RequestOutcome.TIMED_OUT],
        cancelled=known[RequestOutcome.CANCELLED],
        invalid=known[RequestOutcome.INVALID],
    )


def _flag(value: float | None) -> bool | None:
    return None if value is None else value >= 1


def _whole(value: float | None) -> int | None:
    """A gauge that holds a whole number (a level, an enum's code); an infinite one is
    no number this operator knows, so "not measured", like an unknown code."""
    return int(value) if value is not None and math.isfinite(value) else None


def _bound(text: str) -> float | None:
    """A bucket's `le`, or None for one that is not a number (that bucket is skipped)."""
    try:
        bound = float(text)
    except ValueError:
        return None
    return None if math.isnan(bound) else bound


def _label(samples: Samples, name: Metric, label: str) -> str | None:
    """One label's value of an info gauge (value 1); None when it is absent."""
    for labels, value in samples.get(name.sample, []):
        if value == 1 and label in labels:
            return labels[label]
    return None


def _info(samples: Samples, name: Metric) -> Labels:
    """The labels of an info gauge (value 1); empty when it is absent."""
    for labels, value in samples.get(name.sample, []):
        if value == 1:
            return labels
    return {}


def _served_model(samples: Samples) -> tuple[str | None, str | None]:
    """fusebox_model_info's revision (of the primary, as the server is configured) and,
    while the primary serves, its dtype; an empty label is an unknown fact (None). The
    label names are the sidecar's MODEL_INFO_LABELS, which a test reads through the
    real sidecar (test_telemetry_parse)."""
    info = _info(samples, Metric.MODEL_INFO)
    revision = info.get("revision") or None
    primary = info.get("variant") == Variant.PRIMARY.value
    return revision, (info.get("dtype") or None) if primary else None


def _buckets(samples: Samples, metric: str) -> Buckets | None:
    """The cumulative buckets of the latency histogram behind `metric`; None when the
    sidecar exports none (or one without its +Inf bucket, which no quantile can use)."""
    try:
        histogram = LatencyHistogram.of(LatencyMetric(metric)).metric
    except ValueError:
        return None
    buckets = sorted(
        (bound, value)
        for labels, value in samples.get(histogram.bucket, [])
        if BUCKET_LABEL in labels
        and (bound := _bound(labels[BUCKET_LABEL])) is not None
        and not math.isnan(value)
    )
    if not buckets or not math.isinf(buckets[-1][0]):
        return None
    return tuple(buckets)


def _breaker(value: float | None) -> BreakerState | None:
    code = _whole(value)
    if code is None:
        return None
    try:
        return BreakerState.from_gauge_value(code)
    except ValueError:
        return None  # a state this operator does not know is "not measured"


def _measured(samples: Samples, quantity: MeasuredQuantity) -> bool | None:
    return _flag(_one(samples, Metric.SIDECAR_MEASURED, **{QUANTITY_LABEL: quantity.value}))


def sample_from_metrics(
    pod: str,
    samples: Samples,
    sampled_at: float,
    metric: str,
    pod_uid: str | None = None,
    device_counts: GpuDeviceCounts = DEVICE_COUNTS,
) -> PodSample:
    """The sidecar's samples -> one PodSample (absent metrics stay None). With the
    pod's uid, a scrape showing fewer GPUs than the pod has shown gives no GPU memory."""
    gpu_used, gpu_total = _gpu_memory(samples, pod_uid, sampled_at, device_counts)
    heartbeats = [
        v
        for thread in HeartbeatThread
        if (v := _one(samples, Metric.HEARTBEAT_AGE_SECONDS, thread=thread.value)) is not None
    ]
    level = _whole(_one(samples, Metric.DEGRADATION_LEVEL))
    loaded = _one(samples, Metric.MODEL_LOADED)
    fallback = _one(samples, Metric.FALLBACK_ACTIVE)
    moving = _one(samples, Metric.VARIANT_CONVERGING)
    revision, dtype = _served_model(samples)
    return PodSample(
        pod=pod,
        sampled_at=sampled_at,
        ok=True,
        rss_bytes=_one(samples, Metric.PROCESS_RESIDENT_MEMORY_BYTES),
        memory_limit_bytes=_one(samples, Metric.MEMORY_LIMIT_BYTES),
        gpu_memory_used_bytes=gpu_used,
        gpu_memory_total_bytes=gpu_total,
        latency_p99_seconds=_one(samples, Metric.LATENCY_P99_SECONDS, metric=metric),
        latency_buckets=_buckets(samples, metric),
        quality_failure_ratio=_one(samples, Metric.QUALITY_FAILURE_RATIO),
        stats_valid=_flag(_one(samples, Metric.STATS_VALID)),
        stats_age_seconds=_one(samples, Metric.SERVER_STATS_AGE_SECONDS),
        heartbeat_age_seconds=max(heartbeats) if heartbeats else None,
        requests=_request_counts(samples),
        breaker_state=_breaker(_one(samples, Metric.BREAKER_STATE)),
        degradation_level=level,
        model_loaded=None if loaded is None else loaded >= 1,
        memory_guard_active=_flag(_one(samples, Metric.MEMORY_GUARD_ACTIVE)),
        variant=None if fallback is None else (Variant.FALLBACK if fallback else Variant.PRIMARY),
        converging=None if moving is None else moving >= 1,
        model_revision=revision,
        model_dtype=dtype,
        queue_length=_one(samples, Metric.REQUEST_QUEUE_LENGTH),
        requests_running=_one(samples, Metric.REQUESTS_RUNNING),
        tokenizer_cache_entries=_one(samples, Metric.TOKENIZER_CACHE_ENTRIES),
        cuda_contexts=_one(samples, Metric.CUDA_CONTEXTS),
        fallback_configured=_flag(_one(samples, Metric.FALLBACK_CONFIGURED)),
        fallback_available=_flag(_one(samples, Metric.FALLBACK_AVAILABLE)),
        fallback_unavailable_reason=_label(samples, Metric.FALLBACK_UNAVAILABLE_INFO, "reason"),
        node_available_bytes=_one(samples, Metric.NODE_MEMORY_AVAILABLE_BYTES),
        node_total_bytes=_one(samples, Metric.NODE_MEMORY_TOTAL_BYTES),
        node_pressure_some=_one(
            samples, Metric.NODE_MEMORY_PRESSURE_RATIO, **_stall(MemoryStall.SOME)
        ),
        node_pressure_full=_one(
            samples, Metric.NODE_MEMORY_PRESSURE_RATIO, **_stall(MemoryStall.FULL)
        ),
        rss_measured=_measured(samples, MeasuredQuantity.RSS),
        gpu_memory_measured=_measured(samples, MeasuredQuantity.GPU_MEMORY),
        fetch=_fetch_progress(samples, sampled_at),
    )


def _byte_count(value: float | None) -> int | None:
    """A count of bytes a model can have; anything else (negative, beyond MAX_BYTES)
    is not a measurement."""
    count = _whole(value)
    return count if count is not None and 0 <= count <= MAX_BYTES else None


def _fetch_progress(samples: Samples, sampled_at: float) -> FetchProgress | None:
    """The fetcher's report as the sidecar exports it; None without its byte count."""
    done = _byte_count(_one(samples, Metric.MODEL_FETCH_DOWNLOADED_BYTES))
    if done is None:
        return None
    rate = _one(samples, Metric.MODEL_FETCH_RATE_BYTES_PER_SECOND)
    return FetchProgress(
        bytes_done=done,
        bytes_total=_byte_count(_one(samples, Metric.MODEL_FETCH_TOTAL_BYTES)),
        rate_bytes_per_second=rate if rate is not None and 0 <= rate <= MAX_BYTES else None,
        age_seconds=_one(samples, Metric.MODEL_FETCH_REPORT_AGE_SECONDS),
        read_at=sampled_at,
        waiting=_flag(_one(samples, Metric.MODEL_FETCH_WAITING)) is True,
    )


def _stall(kind: MemoryStall) -> dict[str, str]:
    """The label match of one PSI line of NODE_MEMORY_PRESSURE_RATIO."""
    return {STALL_LABEL: kind.value}


def scrapable(pods: Iterable[PodView]) -> list[PodView]:
    """Running pods whose sidecar answers; a wedged server's pod is not Ready but still counts."""
    return [p for p in pods if p.scrapable]


async def scrape_pod(
    session: aiohttp.ClientSession,
    pod: PodView,
    timeout_seconds: float,
    metric: str,
    port: int = Port.METRICS,
) -> PodSample:
    url = f"http://{pod.ip}:{port}/metrics"
    sampled_at = time.time()
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        async with session.get(url, timeout=timeout) as response:
            if response.status != 200:
                METRICS.scrape_error(ScrapeErrorKind.HTTP)
                return PodSample(pod.name, sampled_at, ok=False, error=f"HTTP {response.status}")
            text = await response.text()
    except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError) as error:
        return _failed(pod.name, sampled_at, error)
    try:
        return sample_from_metrics(pod.name, parse_metrics(text), sampled_at, metric, pod.uid)
    except (ValueError, ArithmeticError, KeyError, TypeError) as error:
        # Whatever answered is not a sidecar this operator can read (version skew,
        # something else on the pod IP): that pod's failed scrape, never the tick's.
        return _failed(pod.name, sampled_at, error)


def _failed(pod: str, sampled_at: float, error: Exception) -> PodSample:
    METRICS.scrape_error(scrape_error_kind(error))
    return PodSample(pod, sampled_at, ok=False, error=f"{type(error).__name__}: {error}")


def scrape_error_kind(error: Exception) -> ScrapeErrorKind:
    if isinstance(error, TimeoutError):
        return ScrapeErrorKind.TIMEOUT
    if isinstance(error, aiohttp.ClientError):
        return ScrapeErrorKind.UNREACHABLE
    return ScrapeErrorKind.BAD_METRICS  # answered, but not metrics this operator can read


async def scrape_all(
    session: aiohttp.ClientSession,
    pods: Sequence[PodView],
    timeout_seconds: float,
    metric: str,
    port: int = Port.METRICS,
) -> list[PodSample]:
    """Scrape every pod at once; each failure is a not-ok sample, never an exception."""
    scrapes = (scrape_pod(session, p, timeout_seconds, metric, port) for p in pods)
    return list(await asyncio.gather(*scrapes))
