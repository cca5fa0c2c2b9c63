"""The stats file (docs/stats-file.md): the server writes it, the sidecar reads it.

Why one module: the file crosses a process boundary, and when its writer, its
reader and the reader's test fixtures each spelled it, they drifted (fields
written and never read, fixtures that no server wrote). Here the document is
declared once as frozen dataclasses; `encode`/`dumps` is the only writer and
`parse` the only reader, so a field added to the dataclass is written and
read by the same code, and `parse(dumps(document))` gives the document back.

The reader is careful because the file comes from another process and may be
missing, truncated, from another schema or simply wrong: `parse` never
raises. A field that is `null` or missing is absent (None: "cannot be
measured"); a field of the wrong type or out of its range is absent *and* a
named problem, so a bad field costs one metric, not a scrape.

Stdlib only: the server, the sidecar and the operator all install this.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Final, TypeVar

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

SCHEMA_VERSION: Final = 1
PID_MAX: Final = 4_194_304  # the kernel's ceiling for /proc/sys/kernel/pid_max
MAX_TEXT_CHARS: Final = 256  # model names and revisions; anything longer is not ours

_E = TypeVar("_E", bound=enum.Enum)


@dataclass(frozen=True)
class CudaMemory:
    """The server's CUDA caching allocator; every field None on a CPU-only process."""

    allocated_bytes: float | None = None
    reserved_bytes: float | None = None
    num_alloc_retries: float | None = None  # counter since start
    num_ooms: float | None = None  # counter since start
    contexts: float | None = None  # devices on which the process holds CUDA memory


@dataclass(frozen=True)
class GpuMemory:
    """One GPU's memory as the server's NVML saw it (all processes on the device)."""

    index: int
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None


@dataclass(frozen=True)
class LatencySummary:
    """One latency over the server's sliding window (absent while it is empty)."""

    p99_seconds: float | None = None
    count: float | None = None  # samples behind the p99


@dataclass(frozen=True)
class HistogramCounts:
    """One latency histogram since the server started, in Prometheus' shape.

    `bucket_counts[i]` counts observations <= `LatencyHistogram.buckets[i]`
    (cumulative, so never decreasing); `count` is every observation (the +Inf
    bucket) and `sum` their total in seconds.
    """

    bucket_counts: tuple[float, ...]
    count: float
    sum_seconds: float


@dataclass(frozen=True)
class Tokens:
    """Tokens the server processed since it started (counters)."""

    prompt_total: float | None = None
    generation_total: float | None = None


@dataclass(frozen=True)
class PrefixCacheStats:
    """The server's prefix cache: prompts that reused cached keys and values (hits), those
    that found none (misses), entries evicted (for the byte bound or for memory) and tokens
    reused, counted since start; its entries, bytes and bound now."""

    hits_total: float | None = None
    misses_total: float | None = None
    evictions_total: float | None = None
    reused_tokens_total: float | None = None
    entries: float | None = None
    bytes: float | None = None
    capacity_bytes: float | None = None


PREFIX_CACHE_FIELDS: Final = tuple(f.name for f in fields(PrefixCacheStats))


@dataclass(frozen=True)
class Quality:
    sampled_total: float | None = None  # counter since start
    failed_total: float | None = None  # counter since start
    failure_ratio: float | None = None  # over the sliding window, 0..1


@dataclass(frozen=True)
class RuntimeState:
    """What the operator sets through the admin API, and what it brought about."""

    breaker: BreakerState | None = None
    admit_percent: float | None = None  # 0..100, what HALF_OPEN admits
    degradation_level: DegradationLevel | None = None
    variant: Variant | None = None  # the variant serving now
    model_loaded: bool | None = None
    memory_guard_active: bool | None = None
    model_revision: str | None = None  # of the primary model, as configured
    dtype: Dtype | None = None  # of the loaded variant's weights
    quantization: Quantization | None = None  # of the loaded variant
    fallback_configured: bool | None = None
    # Whether this server can swap to its fallback: False when none is configured
    # or the device cannot serve its quantization, and then the reason why.
    fallback_available: bool | None = None
    fallback_unavailable_reason: str | None = None
    target_variant: Variant | None = None  # the variant the server is moving to
    converging: bool | None = None  # a load or swap towards target_variant is under way


def _frozen(mapping: Mapping[Any, Any]) -> Mapping[Any, Any]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class StatsDocument:
    """The whole file. Every value is optional: None means absent."""

    written_at: float | None = None
    started_at: float | None = None  # when the server process started: a change is a restart
    pid: int | None = None
    model_name: str | None = None
    rss_bytes: float | None = None
    cgroup_memory_usage_bytes: float | None = None  # working set (usage minus inactive file)
    cgroup_memory_limit_bytes: float | None = None
    cuda: CudaMemory = CudaMemory()
    nvml: tuple[GpuMemory, ...] = ()
    queue_length: float | None = None
    running: float | None = None
    tokenizer_cache_entries: float | None = None
    tokenizer_cache_hits_total: float | None = None
    tokenizer_template_hits_total: float | None = None
    requests: Mapping[RequestOutcome, float] = field(default_factory=dict)
    latency: Mapping[LatencyMetric, LatencySummary] = field(default_factory=dict)
    histograms: Mapping[LatencyHistogram, HistogramCounts] = field(default_factory=dict)
    tokens: Tokens = Tokens()
    prefix_cache: PrefixCacheStats = PrefixCacheStats()
    quality: Quality = Quality()
    heartbeats: Mapping[HeartbeatThread, float] = field(default_factory=dict)
    state: RuntimeState = RuntimeState()

    def __post_init__(self) -> None:
        # Read-only views: a frozen document must not change through its mappings.
        for name in ("requests", "latency", "histograms", "heartbeats"):
            object.__setattr__(self, name, _frozen(getattr(self, name)))


@dataclass(frozen=True)
class StatsReading:
    """The outcome of reading the stats file once.

    `document` is None when nothing usable was read, and `problem` says why
    (missing, empty, not JSON, another schema). A document whose fields had
    problems names them in `field_problems`; those fields are None.
    """

    document: StatsDocument | None
    problem: str | None = None
    field_problems: tuple[str, ...] = ()

    @property
    def valid(self) -> bool:
        return self.document is not None and not self.field_problems

    @property
    def problems(self) -> tuple[str, ...]:
        """Every problem of this reading, for a log line."""
        return ((self.problem,) if self.problem else ()) + self.field_problems


# ----- the writer -----


def _wire(value: object) -> object:
    return value.value if isinstance(value, enum.Enum) else value


def encode(document: StatsDocument) -> dict[str, Any]:
    """The JSON object of the file (docs/stats-file.md): the only writer."""
    cuda = document.cuda
    quality = document.quality
    state = document.state
    return {
        "schema": SCHEMA_VERSION,
        "written_at": document.written_at,
        "started_at": document.started_at,
        "pid": document.pid,
        "model_name": document.model_name,
        "rss_bytes": document.rss_bytes,
        "cgroup_memory_usage_bytes": document.cgroup_memory_usage_bytes,
        "cgroup_memory_limit_bytes": document.cgroup_memory_limit_bytes,
        "cuda": {
            "allocated_bytes": cuda.allocated_bytes,
            "reserved_bytes": cuda.reserved_bytes,
            "num_alloc_retries": cuda.num_alloc_retries,
            "num_ooms": cuda.num_ooms,
            "contexts": cuda.contexts,
        },
        "nvml": [
            {
                "index": gpu.index,
                "memory_used_bytes": gpu.memory_used_bytes,
                "memory_total_bytes": gpu.memory_total_bytes,
            }
            for gpu in document.nvml
        ],
        "queue_length": document.queue_length,
        "running": document.running,
        "tokenizer_cache_entries": document.tokenizer_cache_entries,
        "tokenizer_cache_hits_total": document.tokenizer_cache_hits_total,
        "tokenizer_template_hits_total": document.tokenizer_template_hits_total,
        "requests": {_request_key(outcome): count for outcome, count in document.requests.items()},
        "latency_seconds": {
            metric.value: _encode_latency(document.latency.get(metric)) for metric in LatencyMetric
        },
        "latency_histograms": {
            name.value: _encode_histogram(counts) for name, counts in document.histograms.items()
        },
        "tokens": {
            "prompt_total": document.tokens.prompt_total,
            "generation_total": document.tokens.generation_total,
        },
        "prefix_cache": {
            name: getattr(document.prefix_cache, name) for name in PREFIX_CACHE_FIELDS
        },
        "quality": {
            "sampled_total": quality.sampled_total,
            "failed_total": quality.failed_total,
            "failure_ratio": quality.failure_ratio,
        },
        "heartbeats": {thread.value: stamp for thread, stamp in document.heartbeats.items()},
        "state": {
            "breaker": _wire(state.breaker),
            "admit_percent": state.admit_percent,
            "degradation_level": _wire(state.degradation_level),
            "variant": _wire(state.variant),
            "model_loaded": state.model_loaded,
            "memory_guard_active": state.memory_guard_active,
            "model_revision": state.model_revision,
            "dtype": _wire(state.dtype),
            "quantization": _wire(state.quantization),
            "fallback_configured": state.fallback_configured,
            "fallback_available": state.fallback_available,
            "fallback_unavailable_reason": state.fallback_unavailable_reason,
            "target_variant": _wire(state.target_variant),
            "converging": state.converging,
        },
    }


def dumps(document: StatsDocument) -> str:
    """The file's text: compact JSON; a non-finite number is a bug, not a value."""
    return json.dumps(encode(document), separators=(",", ":"), allow_nan=False)


def _request_key(outcome: RequestOutcome) -> str:
    return f"{outcome.value}_total"


def _encode_latency(summary: LatencySummary | None) -> dict[str, float | None] | None:
    if summary is None:
        return None
    return {"p99": summary.p99_seconds, "count": summary.count}


def _encode_histogram(counts: HistogramCounts) -> dict[str, object]:
    return {"buckets": list(counts.bucket_counts), "count": counts.count, "sum": counts.sum_seconds}


# ----- the reader -----


class _Fields:
    """Typed access to a decoded JSON document, collecting problems."""

    def __init__(self, document: dict[str, object], prefix: str = "") -> None:
        self._document = document
        self._prefix = prefix
        self.problems: list[str] = []

    def raw(self, path: str) -> object:
        node: object = self._document
        for key in path.split("."):
            if node is None:  # a null parent: everything under it is absent
                return None
            if not isinstance(node, dict):  # JSON objects decode to dict
                self._problem(path, "parent is not an object")
                return None
            node = node.get(key)
        return node

    def _problem(self, path: str, text: str) -> None:
        self.problems.append(f"{self._prefix}{path}: {text}")

    def number(self, path: str, *, minimum: float = 0.0, maximum: float = math.inf) -> float | None:
        value = self.raw(path)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            self._problem(path, f"expected a number, got {type(value).__name__}")
            return None
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number) or not minimum <= number <= maximum:
            self._problem(path, f"{str(value)[:40]} is out of range [{minimum}, {maximum}]")
            return None
        return number

    def integer(self, path: str, *, minimum: int = 0, maximum: int = 2**63 - 1) -> int | None:
        value = self.raw(path)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self._problem(path, f"expected an integer, got {type(value).__name__}")
            return None
        if not minimum <= value <= maximum:
            self._problem(path, f"{str(value)[:40]} is out of range [{minimum}, {maximum}]")
            return None
        return value

    def boolean(self, path: str) -> bool | None:
        value = self.raw(path)
        if value is None or isinstance(value, bool):
            return value
        self._problem(path, f"expected true or false, got {type(value).__name__}")
        return None

    def text(self, path: str) -> str | None:
        value = self.raw(path)
        if value is None:
            return None
        if not isinstance(value, str) or len(value) > MAX_TEXT_CHARS:
            self._problem(path, f"expected a string of at most {MAX_TEXT_CHARS} characters")
            return None
        try:
            # A lone surrogate (JSON "\ud800") decodes to a str that cannot be
            # written as UTF-8: as a label it would make every scrape fail.
            value.encode("utf-8")
        except UnicodeEncodeError:
            self._problem(path, "holds a lone surrogate, not UTF-8 text")
            return None
        return value

    def choice(self, path: str, allowed: type[_E]) -> _E | None:
        value = self.raw(path)
        if value is None:
            return None
        for member in allowed:
            if isinstance(value, str) and member.value == value:
                return member
        spelled = ", ".join(str(member.value) for member in allowed)
        self._problem(path, f"expected one of {spelled}, got {str(value)[:40]!r}")
        return None

    def level(self, path: str) -> DegradationLevel | None:
        value = self.integer(path, maximum=max(DegradationLevel))
        return None if value is None else DegradationLevel(value)

    def numbers(self, paths: Mapping[_E, str]) -> dict[_E, float]:
        """Numbers under several paths, keyed by name; absent ones left out."""
        found = {name: self.number(path) for name, path in paths.items()}
        return {name: value for name, value in found.items() if value is not None}

    def latencies(self, path: str) -> dict[LatencyMetric, LatencySummary]:
        found: dict[LatencyMetric, LatencySummary] = {}
        for metric in LatencyMetric:
            entry = f"{path}.{metric.value}"
            if self.raw(entry) is None:
                continue
            p99 = self.number(f"{entry}.p99")
            count = self.number(f"{entry}.count")
            if p99 is not None or count is not None:
                found[metric] = LatencySummary(p99_seconds=p99, count=count)
        return found

    def histograms(self, path: str) -> dict[LatencyHistogram, HistogramCounts]:
        """Each histogram whole or not at all: a bucket list that does not fit the
        contract's bounds, or counts that are not cumulative, is a problem."""
        found: dict[LatencyHistogram, HistogramCounts] = {}
        for name in LatencyHistogram:
            entry = f"{path}.{name.value}"
            if self.raw(entry) is None:
                continue
            count = self.number(f"{entry}.count")
            total = self.number(f"{entry}.sum")
            buckets = self.raw(f"{entry}.buckets")
            if count is None or total is None:
                if buckets is not None:
                    self._problem(entry, "a histogram needs its count and sum")
                continue
            cumulative = self._cumulative(f"{entry}.buckets", buckets, len(name.buckets), count)
            if cumulative is not None:
                found[name] = HistogramCounts(cumulative, count, total)
        return found

    def _cumulative(
        self, path: str, value: object, length: int, count: float
    ) -> tuple[float, ...] | None:
        if not isinstance(value, list) or len(value) != length:
            self._problem(path, f"expected a list of {length} cumulative counts")
            return None
        numbers: list[float] = []
        for item in value:
            if isinstance(item, bool) or not isinstance(item, int | float):
                self._problem(path, "expected numbers")
                return None
            numbers.append(float(item))
        bounded = [0.0, *numbers, count]
        if not all(math.isfinite(n) for n in numbers) or any(
            later < earlier for earlier, later in zip(bounded, bounded[1:], strict=False)
        ):
            self._problem(path, "counts must rise from 0 to the histogram's count")
            return None
        return tuple(numbers)

    def gpus(self, path: str) -> tuple[GpuMemory, ...]:
        value = self.raw(path)
        if value is None:
            return ()
        if not isinstance(value, list):
            self._problem(path, f"expected a list, got {type(value).__name__}")
            return ()
        gpus = []
        for position, entry in enumerate(value):
            where = f"{self._prefix}{path}[{position}]"
            if not isinstance(entry, dict):
                self.problems.append(f"{where}: expected an object")
                continue
            inner = _Fields(entry, prefix=f"{where}.")
            index = inner.integer("index")
            used = inner.number("memory_used_bytes")
            total = inner.number("memory_total_bytes")
            self.problems.extend(inner.problems)
            if index is None:
                if not inner.problems:
                    self.problems.append(f"{where}.index: missing")
                continue
            gpus.append(GpuMemory(index=index, memory_used_bytes=used, memory_total_bytes=total))
        return tuple(gpus)


def parse(text: str | bytes) -> StatsReading:
    """Turn the stats file's text into a typed reading: the only reader; never raises."""
    if not text.strip():
        return StatsReading(None, "stats file is empty")
    try:
        decoded = json.loads(text)
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError
        return StatsReading(None, f"stats file is not JSON: {str(error)[:200]}")
    if not isinstance(decoded, dict):
        return StatsReading(None, f"stats file holds a {type(decoded).__name__}, not an object")
    schema = decoded.get("schema")
    if isinstance(schema, bool) or schema != SCHEMA_VERSION:
        return StatsReading(None, f"stats schema {schema!r} is not {SCHEMA_VERSION}")

    f = _Fields(decoded)
    document = StatsDocument(
        written_at=f.number("written_at", minimum=1e-9),
        started_at=f.number("started_at", minimum=1e-9),
        pid=f.integer("pid", minimum=1, maximum=PID_MAX),
        model_name=f.text("model_name"),
        rss_bytes=f.number("rss_bytes"),
        cgroup_memory_usage_bytes=f.number("cgroup_memory_usage_bytes"),
        cgroup_memory_limit_bytes=f.number("cgroup_memory_limit_bytes"),
        cuda=CudaMemory(
            allocated_bytes=f.number("cuda.allocated_bytes"),
            reserved_bytes=f.number("cuda.reserved_bytes"),
            num_alloc_retries=f.number("cuda.num_alloc_retries"),
            num_ooms=f.number("cuda.num_ooms"),
            contexts=f.number("cuda.contexts"),
        ),
        nvml=f.gpus("nvml"),
        queue_length=f.number("queue_length"),
        running=f.number("running"),
        tokenizer_cache_entries=f.number("tokenizer_cache_entries"),
        tokenizer_cache_hits_total=f.number("tokenizer_cache_hits_total"),
        tokenizer_template_hits_total=f.number("tokenizer_template_hits_total"),
        requests=f.numbers(
            {outcome: f"requests.{_request_key(outcome)}" for outcome in RequestOutcome}
        ),
        latency=f.latencies("latency_seconds"),
        histograms=f.histograms("latency_histograms"),
        tokens=Tokens(
            prompt_total=f.number("tokens.prompt_total"),
            generation_total=f.number("tokens.generation_total"),
        ),
        prefix_cache=PrefixCacheStats(
            **{name: f.number(f"prefix_cache.{name}") for name in PREFIX_CACHE_FIELDS}
        ),
        quality=Quality(
            sampled_total=f.number("quality.sampled_total"),
            failed_total=f.number("quality.failed_total"),
            failure_ratio=f.number("quality.failure_ratio", maximum=1.0),
        ),
        heartbeats=f.numbers({thread: f"heartbeats.{thread.value}" for thread in HeartbeatThread}),
        state=RuntimeState(
            breaker=f.choice("state.breaker", BreakerState),
            admit_percent=f.number("state.admit_percent", maximum=100.0),
            degradation_level=f.level("state.degradation_level"),
            variant=f.choice("state.variant", Variant),
            model_loaded=f.boolean("state.model_loaded"),
            memory_guard_active=f.boolean("state.memory_guard_active"),
            model_revision=f.text("state.model_revision"),
            dtype=f.choice("state.dtype", Dtype),
            quantization=f.choice("state.quantization", Quantization),
            fallback_configured=f.boolean("state.fallback_configured"),
            fallback_available=f.boolean("state.fallback_available"),
            fallback_unavailable_reason=f.text("state.fallback_unavailable_reason"),
            target_variant=f.choice("state.target_variant", Variant),
            converging=f.boolean("state.converging"),
        ),
    )
    return StatsReading(document, field_problems=tuple(f.problems))
