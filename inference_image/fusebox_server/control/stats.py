"""The stats file (docs/stats-file.md): figures the sidecar relays as metrics.

The document's shape, its writer and its reader are the contract's
(`fusebox_contract.stats`); this module keeps what only the server does:
the thread, the atomic write, the latency window, and `compose_document`,
the pure step from the runtime's raw figures to the contract's document.

Why a file and a thread: the sidecar must see a wedged server as such. The
file is written every second by a dedicated thread (not the event loop, not
the inference worker), atomically (temporary file + rename), and carries
both threads' heartbeats, so a stale file or a stale heartbeat tells the
operator which part is stuck. The same thread runs the memory guard check.

Latency percentiles and the quality failure ratio are over a sliding window
of the last `--latency-window` seconds (default 60), capped at 10,000 samples
per metric so the window itself cannot grow without bound. Every latency is
also counted into a histogram since start (`LatencyCounter`, the contract's
bucket bounds): fixed memory, and what Prometheus and the operator's breaker
take quantiles from, over any range, across pods.
"""

from __future__ import annotations

import bisect
import logging
import os
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

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
    MAX_TEXT_CHARS,
    CudaMemory,
    GpuMemory,
    HistogramCounts,
    LatencySummary,
    PrefixCacheStats,
    Quality,
    RuntimeState,
    Tokens,
    dumps,
)
from fusebox_contract.stats import StatsDocument as StatsDocument
from fusebox_server.model.prefix_cache import PrefixCacheFigures

MAX_WINDOW_SAMPLES = 10_000

log = logging.getLogger(__name__)


def percentile(sorted_values: list[float], share: float) -> float:
    """Nearest-rank percentile of sorted, non-empty values."""
    rank = max(1, int(-(-share * len(sorted_values) // 1)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


class LatencyCounter:
    """One latency counted into the contract's buckets since start; thread-safe.

    A bucket holds observations at most its bound (Prometheus' `le`), so a value
    exactly on a bound counts there."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self._per_bucket = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, values: Iterable[float]) -> None:
        with self._lock:
            for seconds in values:
                self._per_bucket[bisect.bisect_left(self.bounds, seconds)] += 1
                self._sum += seconds

    def counts(self) -> HistogramCounts:
        with self._lock:
            per_bucket, total = list(self._per_bucket), self._sum
        cumulative, running = [], 0
        for count in per_bucket[:-1]:
            running += count
            cumulative.append(running)
        return HistogramCounts(tuple(cumulative), running + per_bucket[-1], total)


def latency_counters() -> dict[LatencyHistogram, LatencyCounter]:
    return {name: LatencyCounter(name.buckets) for name in LatencyHistogram}


class TokenCounter:
    """Prompt and generated tokens since start; thread-safe."""

    def __init__(self) -> None:
        self._prompt = 0
        self._generated = 0
        self._lock = threading.Lock()

    def add(self, prompt_tokens: int, generated_tokens: int) -> None:
        with self._lock:
            self._prompt += prompt_tokens
            self._generated += generated_tokens

    def totals(self) -> Tokens:
        with self._lock:
            return Tokens(prompt_total=self._prompt, generation_total=self._generated)


class LatencyWindow:
    """Recent samples of one latency (seconds) for the p99; thread-safe.

    Each sample is also counted into `counter`, the latency's histogram, so a
    latency recorded once shows in both. Samples are stamped on the monotonic
    clock (`now`, where given, is on that clock too): on the wall clock a step
    back would leave samples stamped in the future at the head of the window,
    where they and every sample behind them outlive it by the size of the step."""

    def __init__(self, window_seconds: float, counter: LatencyCounter | None = None) -> None:
        self.window_seconds = window_seconds
        self.counter = counter
        self._samples: deque[tuple[float, float]] = deque(maxlen=MAX_WINDOW_SAMPLES)
        self._lock = threading.Lock()

    def add(self, seconds: float, now: float | None = None) -> None:
        self.add_many([seconds], now)

    def add_many(self, values: list[float], now: float | None = None) -> None:
        stamp = time.monotonic() if now is None else now
        with self._lock:
            self._samples.extend((stamp, value) for value in values)
        if self.counter is not None:
            self.counter.observe(values)

    def summary(self, now: float | None = None) -> LatencySummary | None:
        """The p99 and the sample count over the window; None while it is empty."""
        cutoff = (time.monotonic() if now is None else now) - self.window_seconds
        with self._lock:
            while self._samples and self._samples[0][0] < cutoff:
                self._samples.popleft()
            values = sorted(value for _, value in self._samples)
        if not values:
            return None
        return LatencySummary(p99_seconds=percentile(values, 0.99), count=len(values))


def write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise


class StatsThread(threading.Thread):
    """Calls `tick()` (guard check) and writes `snapshot()` to the file every interval,
    through the contract's one writer."""

    def __init__(
        self,
        path: Path,
        snapshot: Callable[[], StatsDocument],
        tick: Callable[[], None],
        interval_seconds: float = 1.0,
    ) -> None:
        super().__init__(name="fusebox-stats", daemon=True)
        self.path = path
        self._snapshot = snapshot
        self._tick = tick
        self._interval = interval_seconds
        self._stopping = threading.Event()
        self.write_errors_total = 0

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                self._tick()
                write_atomically(self.path, dumps(self._snapshot()))
            except Exception as error:  # the thread must outlive a full disk
                self.write_errors_total += 1
                if self.write_errors_total in (1, 10, 100) or self.write_errors_total % 1000 == 0:
                    log.warning("stats write failed: %r", error)
            self._stopping.wait(max(0.0, self._interval - (time.monotonic() - started)))


def dtype_named(value: str | None) -> Dtype | None:
    """The engine's dtype (`bfloat16`, `torch.bfloat16`) as the contract's Dtype;
    None for a storage type the contract does not name (int8 weights)."""
    if value is None:
        return None
    try:
        return Dtype(value.removeprefix("torch."))
    except ValueError:
        return None


def runtime_state(
    *,
    breaker: BreakerState,
    admit_percent: float,
    degradation_level: DegradationLevel,
    variant: Variant,
    model_loaded: bool,
    memory_guard_active: bool,
    model_revision: str,
    dtype: str | None,
    quantization: Quantization | None,
    fallback_configured: bool,
    fallback_unavailable_reason: str | None,
    target_variant: Variant,
    converging: bool,
) -> RuntimeState:
    """The contract's runtime state; an empty revision is absent, not an empty label.

    The fallback is available exactly when nothing refuses it; the reason is cut
    to what the reader accepts, so a long one costs its tail, not the field."""
    return RuntimeState(
        breaker=breaker,
        admit_percent=admit_percent,
        degradation_level=degradation_level,
        variant=variant,
        model_loaded=model_loaded,
        memory_guard_active=memory_guard_active,
        model_revision=model_revision or None,
        dtype=dtype_named(dtype),
        quantization=quantization,
        fallback_configured=fallback_configured,
        fallback_available=fallback_unavailable_reason is None,
        fallback_unavailable_reason=None
        if fallback_unavailable_reason is None
        else fallback_unavailable_reason[:MAX_TEXT_CHARS],
        target_variant=target_variant,
        converging=converging,
    )


def compose_document(
    *,
    written_at: float,
    started_at: float,
    pid: int,
    model_name: str,
    rss_bytes: int | None,
    cgroup_usage_bytes: int | None,
    cgroup_limit_bytes: int | None,
    cuda: Mapping[str, int | None],
    nvml: Sequence[Mapping[str, Any]],
    queue_length: int,
    running: int,
    tokenizer_cache_entries: int,
    tokenizer_cache_hits_total: int,
    tokenizer_template_hits_total: int,
    requests: Mapping[RequestOutcome, int],
    latency: Mapping[LatencyMetric, LatencySummary | None],
    histograms: Mapping[LatencyHistogram, HistogramCounts],
    tokens: Tokens,
    prefix_cache: PrefixCacheFigures | None,
    quality_sampled_total: int,
    quality_failed_total: int,
    quality_failure_ratio: float | None,
    heartbeats: Mapping[HeartbeatThread, float | None],
    state: RuntimeState,
) -> StatsDocument:
    """The stats document from the runtime's raw figures: pure, so tested without a model.

    `cuda` and `nvml` are `fusebox_server.model.memory`'s readings; an empty
    latency window, a heartbeat not yet stamped and the prefix cache of a worker
    not yet started are absent.
    """
    return StatsDocument(
        written_at=written_at,
        started_at=started_at,
        pid=pid,
        model_name=model_name,
        rss_bytes=rss_bytes,
        cgroup_memory_usage_bytes=cgroup_usage_bytes,
        cgroup_memory_limit_bytes=cgroup_limit_bytes,
        cuda=CudaMemory(
            allocated_bytes=cuda.get("allocated_bytes"),
            reserved_bytes=cuda.get("reserved_bytes"),
            num_alloc_retries=cuda.get("num_alloc_retries"),
            num_ooms=cuda.get("num_ooms"),
            contexts=cuda.get("contexts"),
        ),
        nvml=tuple(
            GpuMemory(
                index=int(device["index"]),
                memory_used_bytes=device.get("memory_used_bytes"),
                memory_total_bytes=device.get("memory_total_bytes"),
            )
            for device in nvml
        ),
        queue_length=queue_length,
        running=running,
        tokenizer_cache_entries=tokenizer_cache_entries,
        tokenizer_cache_hits_total=tokenizer_cache_hits_total,
        tokenizer_template_hits_total=tokenizer_template_hits_total,
        requests=requests,
        latency={metric: summary for metric, summary in latency.items() if summary is not None},
        histograms=histograms,
        tokens=tokens,
        prefix_cache=PrefixCacheStats()
        if prefix_cache is None
        else PrefixCacheStats(
            hits_total=prefix_cache.hits_total,
            misses_total=prefix_cache.misses_total,
            evictions_total=prefix_cache.evictions_total,
            reused_tokens_total=prefix_cache.reused_tokens_total,
            entries=prefix_cache.entries,
            bytes=prefix_cache.bytes,
            capacity_bytes=prefix_cache.capacity_bytes,
        ),
        quality=Quality(
            sampled_total=quality_sampled_total,
            failed_total=quality_failed_total,
            failure_ratio=quality_failure_ratio,
        ),
        heartbeats={thread: stamp for thread, stamp in heartbeats.items() if stamp is not None},
        state=state,
    )
