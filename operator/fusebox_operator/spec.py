"""The InferenceService spec as typed, defaulted, validated dataclasses.

Why: the CRD schema defaults and validates on the API server, but the
operator must not trust that (an old CRD, a hand-edited object, a unit test
feeding a dict). Parsing once into frozen dataclasses gives the builders and
the policy one typed view with the same defaults as crds/inferenceservice.yaml,
and turns a bad spec into one `SpecError` with a message a user can act on.
Pure: no Kubernetes client, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

GIB = 1024**3

DEGRADATION_TIER_LEVELS: dict[str, int] = {
    "no-streaming": 1,
    "fallback-model": 2,
    "canned-answers": 3,
}
"""Server degradation level (DESIGN §3) that each named tier switches on."""

RESERVED_ENV_NAMES = frozenset(
    {"FUSEBOX_ADMIN_TOKEN_FILE", "FUSEBOX_ADMIN_PORT", "FUSEBOX_PORT", "FUSEBOX_STATS_FILE"}
)
"""Env names `server.env` may not override: they wire the pod's security and telemetry."""

_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|k|K|M|G|T|P)?$")
_QUANTITY_FACTORS = {
    None: 1,
    "k": 1000,
    "K": 1000,
    "M": 1000**2,
    "G": 1000**3,
    "T": 1000**4,
    "P": 1000**5,
    "Ki": 1024,
    "Mi": 1024**2,
    "Gi": 1024**3,
    "Ti": 1024**4,
    "Pi": 1024**5,
}
_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_PVC_SOURCE = re.compile(r"^pvc://([a-z0-9]([-a-z0-9]*[a-z0-9])?)(/[^\s]*)?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class SpecError(ValueError):
    """The spec cannot be served as written (reported as condition InvalidSpec)."""


def parse_quantity_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity ("4Gi", "1500M", "123") in bytes."""
    match = _QUANTITY.match(quantity.strip())
    if match is None:
        raise SpecError(f"{quantity!r} is not a memory quantity like 4Gi or 4096Mi")
    number, suffix = match.groups()
    return int(float(number) * _QUANTITY_FACTORS[suffix])


@dataclass(frozen=True)
class ModelSource:
    """Where a model's files live; `pvc://claim/path` is mounted read-only."""

    scheme: str
    claim: str = ""
    path: str = ""

    @classmethod
    def parse(cls, source: str) -> ModelSource:
        if source.startswith("pvc://"):
            match = _PVC_SOURCE.match(source)
            if match is None:
                raise SpecError(
                    f"model source {source!r}: pvc:// needs a claim name "
                    "(lowercase DNS label) and an optional /path"
                )
            return cls("pvc", match.group(1), (match.group(3) or "").strip("/"))
        if source.startswith("file:///"):
            return cls("file", "", "/" + source[len("file:///") :].strip("/"))
        if source.startswith("hf://"):
            # The server loads with local_files_only (no hub at run time), so
            # an hf:// source would need a pre-populated cache we do not manage.
            raise SpecError(
                f"model source {source!r}: hf:// sources are not served in v1alpha1; "
                "copy the model into a PVC and use pvc://CLAIM/path"
            )
        raise SpecError(f"model source {source!r} must start with pvc:// or file:///")


@dataclass(frozen=True)
class ModelSpec:
    name: str
    source: ModelSource
    source_text: str
    revision: str = "main"
    dtype: str = "auto"


@dataclass(frozen=True)
class FallbackSpec:
    """The swap target; `source is None` means the primary, quantized on load."""

    source: ModelSource | None
    quantization: str = "int8"


@dataclass(frozen=True)
class GpuSpec:
    count: int = 1
    product: str = ""
    memory_gib: float | None = None


@dataclass(frozen=True)
class MemorySpec:
    limit_bytes: int | None = None  # None = "auto"
    headroom_ratio: float = 1.25
    allow_swap: bool = False


@dataclass(frozen=True)
class ServerSpec:
    max_concurrency: int = 8
    max_queue: int = 64
    max_input_tokens: int = 4096
    max_new_tokens: int = 1024
    request_timeout_seconds: int = 60
    tokenizer_cache_size: int = 10000
    templates: tuple[str, ...] = ()
    cpu: str = "1"
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class LatencyBreakerSpec:
    metric: str = "ttft"
    p99_threshold_millis: float = 200
    for_seconds: float = 180
    min_requests: int = 10


@dataclass(frozen=True)
class QualityBreakerSpec:
    sample_rate: float = 0.1
    max_failure_rate: float = 0.15
    max_output_input_ratio: float = 100
    blocked_terms: tuple[str, ...] = ()


@dataclass(frozen=True)
class ResourceThreshold:
    ratio: float
    growth_mib_per_minute: float


@dataclass(frozen=True)
class ResourceBreakerSpec:
    rss: ResourceThreshold = ResourceThreshold(0.75, 200)
    gpu_memory: ResourceThreshold = ResourceThreshold(0.875, 500)
    cooldown_seconds: float = 30
    window_seconds: float = 60


@dataclass(frozen=True)
class HalfOpenSpec:
    admit_percent: int = 5
    min_requests: int = 20
    p99_recovery_millis: float = 100
    min_success_rate: float = 0.995


@dataclass(frozen=True)
class BreakerSpec:
    latency: LatencyBreakerSpec = LatencyBreakerSpec()
    quality: QualityBreakerSpec = QualityBreakerSpec()
    resource: ResourceBreakerSpec = ResourceBreakerSpec()
    open_seconds: float = 30
    half_open: HalfOpenSpec = HalfOpenSpec()


@dataclass(frozen=True)
class DegradationSpec:
    tiers: tuple[str, ...] = ("no-streaming", "fallback-model", "canned-answers")
    canned_answers: tuple[tuple[str, str], ...] = ()
    cool_off_seconds: float = 300

    @property
    def levels(self) -> tuple[int, ...]:
        """The server levels this service may use, ascending (level 0 is implicit)."""
        return tuple(sorted(DEGRADATION_TIER_LEVELS[tier] for tier in self.tiers))


@dataclass(frozen=True)
class TelemetrySpec:
    scrape_interval_seconds: float = 5
    scrape_timeout_seconds: float = 2
    wedge_after_seconds: float = 15


@dataclass(frozen=True)
class InferenceServiceSpec:
    model: ModelSpec
    fallback: FallbackSpec | None = None
    replicas: int = 1
    gpu: GpuSpec = GpuSpec()
    memory: MemorySpec = MemorySpec()
    server: ServerSpec = ServerSpec()
    breaker: BreakerSpec = BreakerSpec()
    degradation: DegradationSpec = DegradationSpec()
    telemetry: TelemetrySpec = TelemetrySpec()


def _section(raw: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = raw.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SpecError(f"{key} must be an object")
    return value


def _number(raw: Mapping[str, Any], key: str, default: float, where: str) -> float:
    value = raw.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(f"{where}.{key} must be a number, got {value!r}")
    return float(value)


def _integer(raw: Mapping[str, Any], key: str, default: int, where: str) -> int:
    value = raw.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{where}.{key} must be an integer, got {value!r}")
    return value


def _in_range(value: float, low: float, high: float, name: str, low_open: bool = False) -> None:
    too_low = value <= low if low_open else value < low
    if too_low or value > high:
        bracket = "(" if low_open else "["
        raise SpecError(f"{name} must be in {bracket}{low:g}, {high:g}], got {value:g}")


def _strings(raw: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = raw.get(key) or []
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise SpecError(f"{where}.{key} must be a list of strings")
    return tuple(value)


def _parse_model(raw: Mapping[str, Any]) -> ModelSpec:
    name = raw.get("name")
    source = raw.get("source")
    if not isinstance(name, str) or not _MODEL_NAME.match(name):
        raise SpecError(f"model.name {name!r} must be 1-63 letters, digits, '.', '_' or '-'")
    if not isinstance(source, str):
        raise SpecError("model.source is required (pvc://CLAIM/path or file:///path)")
    dtype = raw.get("dtype", "auto")
    if dtype not in ("auto", "bfloat16", "float16", "float32"):
        raise SpecError(f"model.dtype {dtype!r} must be auto, bfloat16, float16 or float32")
    return ModelSpec(
        name, ModelSource.parse(source), source, str(raw.get("revision", "main")), dtype
    )


def _parse_fallback(raw: Mapping[str, Any] | None) -> FallbackSpec | None:
    if raw is None:
        return None
    quantization = raw.get("quantization", "int8")
    if quantization not in ("int8", "int4", "awq", "none"):
        raise SpecError(f"fallback.quantization {quantization!r} must be int8, int4, awq or none")
    source_text = raw.get("source") or ""
    source = ModelSource.parse(source_text) if source_text else None
    if source is None and quantization == "none":
        raise SpecError("fallback without its own source must be quantized (quantization != none)")
    return FallbackSpec(source, quantization)


def _parse_gpu(raw: Mapping[str, Any]) -> GpuSpec:
    count = _integer(raw, "count", 1, "gpu")
    _in_range(count, 0, 16, "gpu.count")
    product = str(raw.get("product") or "")
    if product and count == 0:
        raise SpecError("gpu.product requires gpu.count > 0")
    memory_gib = raw.get("memoryGiB")
    if memory_gib is not None:
        memory_gib = _number(raw, "memoryGiB", 0, "gpu")
        _in_range(memory_gib, 0, 4096, "gpu.memoryGiB", low_open=True)
    return GpuSpec(count, product, memory_gib)


def _parse_memory(raw: Mapping[str, Any]) -> MemorySpec:
    limit = raw.get("limit", "auto")
    limit_bytes = None if limit in (None, "auto") else parse_quantity_bytes(str(limit))
    headroom = _number(raw, "headroomRatio", 1.25, "memory")
    _in_range(headroom, 1.0, 4.0, "memory.headroomRatio")
    return MemorySpec(limit_bytes, headroom, bool(raw.get("allowSwap", False)))


def _parse_server(raw: Mapping[str, Any]) -> ServerSpec:
    server = ServerSpec(
        max_concurrency=_integer(raw, "maxConcurrency", 8, "server"),
        max_queue=_integer(raw, "maxQueue", 64, "server"),
        max_input_tokens=_integer(raw, "maxInputTokens", 4096, "server"),
        max_new_tokens=_integer(raw, "maxNewTokens", 1024, "server"),
        request_timeout_seconds=_integer(raw, "requestTimeoutSeconds", 60, "server"),
        tokenizer_cache_size=_integer(raw, "tokenizerCacheSize", 10000, "server"),
        templates=_strings(raw, "templates", "server"),
        cpu=str(raw.get("cpu") or "1"),
        env=_parse_env(raw.get("env") or []),
    )
    _in_range(server.max_concurrency, 1, 1024, "server.maxConcurrency")
    _in_range(server.max_queue, 0, 100000, "server.maxQueue")
    _in_range(server.max_input_tokens, 1, 1 << 20, "server.maxInputTokens")
    _in_range(server.max_new_tokens, 1, 1 << 20, "server.maxNewTokens")
    _in_range(server.request_timeout_seconds, 1, 3600, "server.requestTimeoutSeconds")
    _in_range(server.tokenizer_cache_size, 0, 10_000_000, "server.tokenizerCacheSize")
    return server


def _parse_env(raw: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, list):
        raise SpecError("server.env must be a list of {name, value}")
    env: list[tuple[str, str]] = []
    for item in raw:
        name = item.get("name") if isinstance(item, Mapping) else None
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise SpecError(f"server.env entry {item!r} needs a valid variable name")
        if name in RESERVED_ENV_NAMES:
            raise SpecError(f"server.env may not set {name}: the operator wires it")
        env.append((name, str(item.get("value", ""))))
    return tuple(env)


def _parse_threshold(
    raw: Mapping[str, Any], ratio_key: str, default: ResourceThreshold, where: str
) -> ResourceThreshold:
    ratio = _number(raw, ratio_key, default.ratio, where)
    _in_range(ratio, 0, 1, f"{where}.{ratio_key}", low_open=True)
    growth = _number(raw, "growthMiBPerMinute", default.growth_mib_per_minute, where)
    _in_range(growth, 0, 1 << 30, f"{where}.growthMiBPerMinute")
    return ResourceThreshold(ratio, growth)


def _parse_breaker(raw: Mapping[str, Any]) -> BreakerSpec:
    latency_raw = _section(raw, "latency")
    metric = latency_raw.get("metric", "ttft")
    if metric not in ("ttft", "itl", "e2e"):
        raise SpecError(f"breaker.latency.metric {metric!r} must be ttft, itl or e2e")
    latency = LatencyBreakerSpec(
        metric,
        _number(latency_raw, "p99ThresholdMillis", 200, "breaker.latency"),
        _number(latency_raw, "forSeconds", 180, "breaker.latency"),
        _integer(latency_raw, "minRequests", 10, "breaker.latency"),
    )
    _in_range(
        latency.p99_threshold_millis, 0, 3_600_000, "breaker.latency.p99ThresholdMillis", True
    )
    _in_range(latency.for_seconds, 0, 86400, "breaker.latency.forSeconds")
    _in_range(latency.min_requests, 1, 1_000_000, "breaker.latency.minRequests")

    quality_raw = _section(raw, "quality")
    quality = QualityBreakerSpec(
        _number(quality_raw, "sampleRate", 0.1, "breaker.quality"),
        _number(quality_raw, "maxFailureRate", 0.15, "breaker.quality"),
        _number(quality_raw, "maxOutputInputRatio", 100, "breaker.quality"),
        _strings(quality_raw, "blockedTerms", "breaker.quality"),
    )
    _in_range(quality.sample_rate, 0, 1, "breaker.quality.sampleRate", low_open=True)
    _in_range(quality.max_failure_rate, 0, 1, "breaker.quality.maxFailureRate", low_open=True)
    _in_range(quality.max_output_input_ratio, 0, 1e9, "breaker.quality.maxOutputInputRatio", True)

    resource_raw = _section(raw, "resource")
    defaults = ResourceBreakerSpec()
    resource = ResourceBreakerSpec(
        _parse_threshold(
            _section(resource_raw, "rss"), "ratioOfLimit", defaults.rss, "breaker.resource.rss"
        ),
        _parse_threshold(
            _section(resource_raw, "gpuMemory"),
            "ratioOfVRAM",
            defaults.gpu_memory,
            "breaker.resource.gpuMemory",
        ),
        _number(resource_raw, "cooldownSeconds", 30, "breaker.resource"),
        _number(resource_raw, "windowSeconds", 60, "breaker.resource"),
    )
    _in_range(resource.cooldown_seconds, 1, 86400, "breaker.resource.cooldownSeconds")
    _in_range(resource.window_seconds, 1, 86400, "breaker.resource.windowSeconds")

    half_raw = _section(raw, "halfOpen")
    half_open = HalfOpenSpec(
        _integer(half_raw, "admitPercent", 5, "breaker.halfOpen"),
        _integer(half_raw, "minRequests", 20, "breaker.halfOpen"),
        _number(half_raw, "p99RecoveryMillis", 100, "breaker.halfOpen"),
        _number(half_raw, "minSuccessRate", 0.995, "breaker.halfOpen"),
    )
    _in_range(half_open.admit_percent, 1, 100, "breaker.halfOpen.admitPercent")
    _in_range(half_open.min_requests, 1, 1_000_000, "breaker.halfOpen.minRequests")
    _in_range(half_open.min_success_rate, 0, 1, "breaker.halfOpen.minSuccessRate", low_open=True)
    if not half_open.p99_recovery_millis < latency.p99_threshold_millis:
        raise SpecError(
            f"breaker.halfOpen.p99RecoveryMillis ({half_open.p99_recovery_millis:g}) must be below "
            f"breaker.latency.p99ThresholdMillis ({latency.p99_threshold_millis:g})"
        )
    open_seconds = _number(raw, "openSeconds", 30, "breaker")
    _in_range(open_seconds, 1, 86400, "breaker.openSeconds")
    return BreakerSpec(latency, quality, resource, open_seconds, half_open)


def _parse_degradation(raw: Mapping[str, Any]) -> DegradationSpec:
    tiers = raw.get("tiers")
    tiers = DegradationSpec().tiers if tiers is None else tuple(tiers)
    for tier in tiers:
        if tier not in DEGRADATION_TIER_LEVELS:
            raise SpecError(
                f"degradation tier {tier!r} must be one of {', '.join(DEGRADATION_TIER_LEVELS)}"
            )
    if len(set(tiers)) != len(tiers):
        raise SpecError("degradation.tiers must not repeat a tier")
    canned = raw.get("cannedAnswers") or {}
    if not isinstance(canned, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in canned.items()
    ):
        raise SpecError("degradation.cannedAnswers must map prompt strings to answer strings")
    cool_off = _number(raw, "coolOffSeconds", 300, "degradation")
    _in_range(cool_off, 1, 86400, "degradation.coolOffSeconds")
    return DegradationSpec(tiers, tuple(sorted(canned.items())), cool_off)


def _parse_telemetry(raw: Mapping[str, Any]) -> TelemetrySpec:
    telemetry = TelemetrySpec(
        _number(raw, "scrapeIntervalSeconds", 5, "telemetry"),
        _number(raw, "scrapeTimeoutSeconds", 2, "telemetry"),
        _number(raw, "wedgeAfterSeconds", 15, "telemetry"),
    )
    _in_range(telemetry.scrape_interval_seconds, 1, 300, "telemetry.scrapeIntervalSeconds")
    _in_range(telemetry.scrape_timeout_seconds, 0.1, 60, "telemetry.scrapeTimeoutSeconds")
    if telemetry.scrape_timeout_seconds > telemetry.scrape_interval_seconds:
        raise SpecError("telemetry.scrapeTimeoutSeconds must not exceed scrapeIntervalSeconds")
    if telemetry.wedge_after_seconds <= telemetry.scrape_interval_seconds:
        raise SpecError("telemetry.wedgeAfterSeconds must exceed scrapeIntervalSeconds")
    return telemetry


def parse_spec(raw: Mapping[str, Any]) -> InferenceServiceSpec:
    """Parse, default and validate `.spec` of an InferenceService.

    Raises SpecError with one actionable message for the first problem found.
    """
    if not isinstance(raw, Mapping):
        raise SpecError("spec must be an object")
    if "model" not in raw:
        raise SpecError("spec.model is required")
    fallback_raw = raw.get("fallback")
    if fallback_raw is not None and not isinstance(fallback_raw, Mapping):
        raise SpecError("fallback must be an object")
    parsed = InferenceServiceSpec(
        model=_parse_model(_section(raw, "model")),
        fallback=_parse_fallback(fallback_raw),
        replicas=_integer(raw, "replicas", 1, "spec"),
        gpu=_parse_gpu(_section(raw, "gpu")),
        memory=_parse_memory(_section(raw, "memory")),
        server=_parse_server(_section(raw, "server")),
        breaker=_parse_breaker(_section(raw, "breaker")),
        degradation=_parse_degradation(_section(raw, "degradation")),
        telemetry=_parse_telemetry(_section(raw, "telemetry")),
    )
    _in_range(parsed.replicas, 0, 100, "spec.replicas")
    if "fallback-model" in parsed.degradation.tiers and parsed.fallback is None:
        raise SpecError("spec.fallback is required when degradation.tiers lists fallback-model")
    return parsed
