"""The InferenceService spec as typed, defaulted, validated dataclasses.

Why: the CRD schema defaults and validates on the API server, but the
operator must not trust that (an old CRD, a hand-edited object, a unit test
feeding a dict). Parsing once into frozen dataclasses gives the builders and
the policy one typed view with the same defaults as crds/inferenceservice.yaml,
and turns a bad spec into one `SpecError` with a message a user can act on.
Pure: no Kubernetes client, no I/O.
"""

from __future__ import annotations

import enum
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from fusebox_contract.names import (
    ConditionType,
    DegradationTier,
    Dtype,
    LatencyMetric,
    Quantization,
)
from fusebox_contract.settings import RESERVED_ENV_NAMES

GIB = 1024**3

DEGRADATION_TIER_LEVELS: dict[str, int] = {tier.value: int(tier.level) for tier in DegradationTier}
"""Server degradation level (DESIGN §3) that each named tier switches on."""

TIERS_WITH_FALLBACK: tuple[DegradationTier, ...] = (
    DegradationTier.NO_STREAMING,
    DegradationTier.FALLBACK_MODEL,
    DegradationTier.CANNED_ANSWERS,
)
TIERS_WITHOUT_FALLBACK: tuple[DegradationTier, ...] = (
    DegradationTier.NO_STREAMING,
    DegradationTier.CANNED_ANSWERS,
)
"""The effective `degradation.tiers` when the spec leaves them out."""

MAX_REVISION_LENGTH = 256
MAX_GPU_COUNT = 1
"""The server places the model on one device; more GPUs would sit idle (docs/decisions)."""


# The same patterns are CEL rules in crds/inferenceservice.yaml (a test keeps
# them equal), so whatever the API server admits, this parser accepts.
# Whitespace is spelled out (ASCII), as RE2's \s is: Python's is Unicode-wide.
MEMORY_QUANTITY_PATTERN = r"^([0-9]+([.][0-9]+)?)(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$"
CPU_QUANTITY_PATTERN = r"^([0-9]+([.][0-9]+)?)(m)?$"
PVC_SOURCE_PATTERN = r"^pvc://([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)(/[^ \t\n\r\f\v]*)?$"
FILE_SOURCE_PATTERN = r"^file://(/[^/ \t\n\r\f\v][^ \t\n\r\f\v]*)$"
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
# A DeviceClass's name, a DNS subdomain of at most 253 characters; "" for none.
DEVICE_CLASS_NAME_PATTERN = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*)?$"
DEVICE_CLASS_NAME_MAX_LENGTH = 253
# metadata.name of an InferenceService: the Service is named after it (an RFC 1035
# label) and it is the value of the fusebox.dev/service label (at most 63). The
# longest suffix on a child's name, ResourceClaimTemplate's "-gpu-<8 hex>", still
# leaves the name far inside the 253 of a DNS subdomain.
SERVICE_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
SERVICE_NAME_MAX_LENGTH = 63
FP8_GPU_PATTERN = (
    r"(?:^|[^A-Z0-9])(L4|L40|L40S|L20|H20|H100|H200|H800|GH200|B100|B200|B300|GB200|GB300|"
    r"RTX-[45]0[5-9]0|ADA|BLACKWELL)(?![0-9A-Z])"
)
"""GPU Feature Discovery product names of compute capability >= 8.9 (Ada, Hopper,
Blackwell): the devices with fp8 tensor cores. An RTX number alone is no
generation: Turing's Quadro RTX 4000/5000 (sm_75) share the digits, so the
workstation cards match by their "Ada"/"Blackwell" marker and the GeForce ones
by their model numbers, RTX 4050-4090 and 5050-5090."""

_QUANTITY = re.compile(MEMORY_QUANTITY_PATTERN)
_CPU_QUANTITY = re.compile(CPU_QUANTITY_PATTERN)
_FP8_GPU = re.compile(FP8_GPU_PATTERN)
_QUANTITY_FACTORS = {
    None: 1,
    "k": 1000,
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
_PVC_SOURCE = re.compile(PVC_SOURCE_PATTERN)
_FILE_SOURCE = re.compile(FILE_SOURCE_PATTERN)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LABEL_VALUE = re.compile(LABEL_VALUE_PATTERN)
_DEVICE_CLASS_NAME = re.compile(DEVICE_CLASS_NAME_PATTERN)
_SERVICE_NAME = re.compile(SERVICE_NAME_PATTERN)
E = TypeVar("E", bound=enum.Enum)


class SpecError(ValueError):
    """The spec cannot be served as written (reported as condition InvalidSpec)."""


def check_service_name(name: str) -> None:
    """Refuse an object name its children cannot carry: the apiserver would refuse
    the Service (and the label values), and the reconcile would retry forever."""
    if len(name) > SERVICE_NAME_MAX_LENGTH or _SERVICE_NAME.fullmatch(name) is None:
        raise SpecError(
            f"metadata.name {name!r} must be a DNS-1035 label (lower-case letters, digits "
            f"and '-', a letter first, a letter or digit last, at most "
            f"{SERVICE_NAME_MAX_LENGTH} characters): the Service is named after it and it "
            "labels every child"
        )


def parse_quantity_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity ("4Gi", "1500M", "123") in bytes."""
    match = _QUANTITY.fullmatch(quantity)
    if match is None:
        raise SpecError(f"{quantity!r} is not a memory quantity like 4Gi or 4096Mi")
    number, _, suffix = match.groups()
    return int(float(number) * _QUANTITY_FACTORS[suffix])


def parse_cpu_quantity(quantity: str) -> float:
    """A CPU quantity ("500m", "2", "1.5") in cores; it must be above zero."""
    match = _CPU_QUANTITY.fullmatch(quantity)
    if match is None:
        raise SpecError(f"server.cpu {quantity!r} must be a CPU quantity such as 500m or 2")
    number, _, milli = match.groups()
    cores = float(number) / (1000 if milli else 1)
    if cores <= 0:
        raise SpecError(f"server.cpu {quantity!r} must be above zero")
    return cores


def torch_threads(cpu: str) -> int:
    """Torch intra-op threads for a CPU quantity: its whole cores, at least one."""
    return max(1, math.floor(parse_cpu_quantity(cpu)))


def fp8_capable(product: str) -> bool:
    """Whether a GPU product name is Ada, Hopper or Blackwell class (fp8 tensor cores)."""
    return _FP8_GPU.search(product.upper()) is not None


@dataclass(frozen=True)
class ModelSource:
    """Where a model's files live; `pvc://claim/path` is mounted read-only."""

    scheme: str
    claim: str = ""
    path: str = ""

    @classmethod
    def parse(cls, source: str) -> ModelSource:
        if source.startswith("pvc://"):
            match = _PVC_SOURCE.fullmatch(source)
            if match is None:
                raise SpecError(
                    f"model source {source!r}: pvc:// needs a claim name "
                    "(lowercase DNS label, at most 63 characters) and an optional /path "
                    "without whitespace"
                )
            return cls("pvc", match.group(1), (match.group(3) or "").strip("/"))
        if source.startswith("file://"):
            match = _FILE_SOURCE.fullmatch(source)
            if match is None:
                raise SpecError(
                    f"model source {source!r}: file:// needs an absolute path without "
                    "whitespace (file:///path)"
                )
            return cls("file", "", "/" + match.group(1).strip("/"))
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
    dtype: Dtype = Dtype.AUTO


@dataclass(frozen=True)
class FallbackSpec:
    """The swap target; `source is None` means the primary, quantized on load."""

    source: ModelSource | None
    quantization: Quantization = Quantization.INT8


@dataclass(frozen=True)
class GpuSpec:
    count: int = 1
    product: str = ""
    memory_gib: float | None = None
    # A DeviceClass: the GPUs come from a ResourceClaim (DRA), not nvidia.com/gpu.
    device_class_name: str = ""

    @property
    def through_claim(self) -> bool:
        """Whether the pod gets its GPUs through a ResourceClaim rather than the device plugin."""
        return self.count > 0 and bool(self.device_class_name)


@dataclass(frozen=True)
class MemorySpec:
    limit_bytes: int | None = None  # None = "auto"
    headroom_ratio: float = 1.25
    allow_swap: bool = False
    max_growth_ratio: float = 1.0  # the grow-limit rung's cap over the sized limit; 1 = off
    # Node MemAvailable below which the pods shed caches (node_pressure); None = auto.
    node_available_floor_bytes: int | None = None

    @property
    def grows_in_place(self) -> bool:
        """Whether the ladder may grow the limit in place (a swapping container cannot)."""
        return self.max_growth_ratio > 1 and not self.allow_swap


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
    metric: LatencyMetric = LatencyMetric.TTFT
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
    tiers: tuple[DegradationTier, ...] = TIERS_WITH_FALLBACK
    canned_answers: tuple[tuple[str, str], ...] = ()
    cool_off_seconds: float = 300

    @property
    def levels(self) -> tuple[int, ...]:
        """The server levels this service may use, ascending (level 0 is implicit)."""
        return tuple(sorted(int(tier.level) for tier in self.tiers))


@dataclass(frozen=True)
class TelemetrySpec:
    scrape_interval_seconds: float = 5
    scrape_timeout_seconds: float = 2
    wedge_after_seconds: float = 15


class AutoscalingMetric(enum.StrEnum):
    """What `autoscaling.targetPerReplica` counts, per ready replica."""

    QUEUE_LENGTH = "queueLength"  # requests admitted and waiting for a batch slot
    IN_FLIGHT = "inFlight"  # waiting plus generating


@dataclass(frozen=True)
class AutoscalingSpec:
    min_replicas: int = 1
    max_replicas: int = 1
    metric: AutoscalingMetric = AutoscalingMetric.QUEUE_LENGTH
    target_per_replica: float = 4
    scale_up_stabilization_seconds: float = 0
    scale_down_stabilization_seconds: float = 300

    def clamp(self, replicas: int) -> int:
        return max(self.min_replicas, min(self.max_replicas, replicas))


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
    autoscaling: AutoscalingSpec | None = None

    @property
    def degrades_to_fallback(self) -> bool:
        """Whether a degradation tier swaps the model: a fallback, and fallback-model listed.
        The memory ladder's swap step needs only the fallback."""
        return (
            self.fallback is not None and DegradationTier.FALLBACK_MODEL in self.degradation.tiers
        )

    def initial_replicas(self) -> int:
        """The count a new Deployment starts with: `replicas`, inside the autoscaler's range."""
        return self.autoscaling.clamp(self.replicas) if self.autoscaling else self.replicas


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


def _choice(raw: Mapping[str, Any], key: str, default: str, kind: type[E], where: str) -> E:
    value = raw.get(key, default)
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(member.value for member in kind)
        raise SpecError(f"{where}.{key} {value!r} must be one of {allowed}") from None


def _parse_model(raw: Mapping[str, Any]) -> ModelSpec:
    name = raw.get("name")
    source = raw.get("source")
    if not isinstance(name, str) or not _MODEL_NAME.fullmatch(name):
        raise SpecError(f"model.name {name!r} must be 1-63 letters, digits, '.', '_' or '-'")
    if not isinstance(source, str):
        raise SpecError("model.source is required (pvc://CLAIM/path or file:///path)")
    revision = raw.get("revision", "main")
    if not isinstance(revision, str) or len(revision) > MAX_REVISION_LENGTH:
        raise SpecError(
            f"model.revision must be a string of at most {MAX_REVISION_LENGTH} characters"
        )
    return ModelSpec(
        name,
        ModelSource.parse(source),
        source,
        revision,
        _choice(raw, "dtype", Dtype.AUTO, Dtype, "model"),
    )


def _parse_fallback(raw: Mapping[str, Any] | None) -> FallbackSpec | None:
    if raw is None:
        return None
    quantization = _choice(raw, "quantization", Quantization.INT8, Quantization, "fallback")
    source_text = raw.get("source") or ""
    source = ModelSource.parse(source_text) if source_text else None
    if source is None and quantization == Quantization.NONE:
        raise SpecError("fallback without its own source must be quantized (quantization != none)")
    return FallbackSpec(source, quantization)


def _is_device_class_name(value: object) -> bool:
    return (
        isinstance(value, str)
        and len(value) <= DEVICE_CLASS_NAME_MAX_LENGTH
        and _DEVICE_CLASS_NAME.fullmatch(value) is not None
    )


def _parse_gpu(raw: Mapping[str, Any]) -> GpuSpec:
    count = _integer(raw, "count", 1, "gpu")
    _in_range(count, 0, 16, "gpu.count")
    if count > MAX_GPU_COUNT:
        raise SpecError(
            f"gpu.count {count}: more than {MAX_GPU_COUNT} GPU per pod is not supported yet "
            "(the server places the model on one GPU; the others would sit idle)"
        )
    product = raw.get("product") or ""
    if not isinstance(product, str) or not _LABEL_VALUE.fullmatch(product):
        raise SpecError(
            f"gpu.product {product!r} must be a label value (at most 63 letters, digits, "
            "'-', '_' or '.'), as GPU Feature Discovery writes nvidia.com/gpu.product"
        )
    if product and count == 0:
        raise SpecError("gpu.product requires gpu.count > 0")
    memory_gib = raw.get("memoryGiB")
    if memory_gib is not None:
        memory_gib = _number(raw, "memoryGiB", 0, "gpu")
        _in_range(memory_gib, 0, 4096, "gpu.memoryGiB", low_open=True)
    device_class_name = raw.get("deviceClassName") or ""
    if not _is_device_class_name(device_class_name):
        raise SpecError(
            f"gpu.deviceClassName {device_class_name!r} must be a DeviceClass name "
            "(a DNS subdomain: lower-case letters, digits, '-' and '.', at most 253)"
        )
    if device_class_name and count == 0:
        raise SpecError("gpu.deviceClassName requires gpu.count > 0")
    return GpuSpec(count, product, memory_gib, device_class_name)


def check_quantization_device(fallback: FallbackSpec | None, gpu_count: int, product: str) -> None:
    """Refuse a fallback quantization the pod's device cannot run.

    `product` is the spec's gpu.product or, when that is empty, the product of
    the nodes the pod may land on (render's --gpu-product); "" means unknown.
    """
    if fallback is None or not fallback.quantization.needs_gpu:
        return
    if gpu_count < 1:
        raise SpecError(
            f"fallback.quantization {fallback.quantization.value} needs a GPU (gpu.count >= 1); "
            "on CPU use int8"
        )
    if fallback.quantization == Quantization.FP8 and product and not fp8_capable(product):
        raise SpecError(
            f"fallback.quantization fp8 needs an Ada, Hopper or Blackwell GPU (compute "
            f"capability >= 8.9, e.g. L4, L40S, H100, H200, B200); {product} has no fp8 "
            "support: use int8 or int4"
        )


def _parse_memory(raw: Mapping[str, Any]) -> MemorySpec:
    limit = raw.get("limit", "auto")
    limit_bytes = None if limit in (None, "auto") else parse_quantity_bytes(str(limit))
    headroom = _number(raw, "headroomRatio", 1.25, "memory")
    _in_range(headroom, 1.0, 4.0, "memory.headroomRatio")
    growth = _number(raw, "maxGrowthRatio", 1.0, "memory")
    _in_range(growth, 1.0, 4.0, "memory.maxGrowthRatio")
    floor = raw.get("nodeAvailableFloor", "auto")
    floor_bytes = None if floor in (None, "auto") else parse_quantity_bytes(str(floor))
    allow_swap = bool(raw.get("allowSwap", False))
    return MemorySpec(limit_bytes, headroom, allow_swap, growth, floor_bytes)


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
    parse_cpu_quantity(server.cpu)
    return server


def _parse_env(raw: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, list):
        raise SpecError("server.env must be a list of {name, value}")
    env: list[tuple[str, str]] = []
    for item in raw:
        name = item.get("name") if isinstance(item, Mapping) else None
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            raise SpecError(f"server.env entry {item!r} needs a valid variable name")
        if name in RESERVED_ENV_NAMES:
            raise SpecError(
                f"server.env may not set {name}: the operator wires it from the spec "
                "(reserved names are listed in docs/api.md)"
            )
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
    latency = LatencyBreakerSpec(
        _choice(latency_raw, "metric", LatencyMetric.TTFT, LatencyMetric, "breaker.latency"),
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
    _in_range(
        half_open.p99_recovery_millis, 0, 3_599_999, "breaker.halfOpen.p99RecoveryMillis", True
    )
    if not half_open.p99_recovery_millis < latency.p99_threshold_millis:
        raise SpecError(
            f"breaker.halfOpen.p99RecoveryMillis ({half_open.p99_recovery_millis:g}) must be below "
            f"breaker.latency.p99ThresholdMillis ({latency.p99_threshold_millis:g})"
        )
    open_seconds = _number(raw, "openSeconds", 30, "breaker")
    _in_range(open_seconds, 1, 86400, "breaker.openSeconds")
    return BreakerSpec(latency, quality, resource, open_seconds, half_open)


def _parse_degradation(raw: Mapping[str, Any], has_fallback: bool) -> DegradationSpec:
    listed = raw.get("tiers")
    if listed is None:
        tiers = TIERS_WITH_FALLBACK if has_fallback else TIERS_WITHOUT_FALLBACK
    elif not isinstance(listed, list):
        raise SpecError("degradation.tiers must be a list")
    else:
        try:
            tiers = tuple(DegradationTier(tier) for tier in listed)
        except ValueError as error:
            allowed = ", ".join(DEGRADATION_TIER_LEVELS)
            bad = next(t for t in listed if t not in DEGRADATION_TIER_LEVELS)
            raise SpecError(f"degradation tier {bad!r} must be one of {allowed}") from error
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
    _in_range(telemetry.wedge_after_seconds, 2, 3600, "telemetry.wedgeAfterSeconds")
    if telemetry.scrape_timeout_seconds > telemetry.scrape_interval_seconds:
        raise SpecError("telemetry.scrapeTimeoutSeconds must not exceed scrapeIntervalSeconds")
    if telemetry.wedge_after_seconds <= telemetry.scrape_interval_seconds:
        raise SpecError("telemetry.wedgeAfterSeconds must exceed scrapeIntervalSeconds")
    return telemetry


def _parse_autoscaling(raw: Mapping[str, Any] | None) -> AutoscalingSpec | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise SpecError("autoscaling must be an object")
    where = "autoscaling"
    if "maxReplicas" not in raw:
        raise SpecError("autoscaling.maxReplicas is required")
    autoscaling = AutoscalingSpec(
        min_replicas=_integer(raw, "minReplicas", 1, where),
        max_replicas=_integer(raw, "maxReplicas", 1, where),
        metric=_choice(raw, "metric", AutoscalingMetric.QUEUE_LENGTH, AutoscalingMetric, where),
        target_per_replica=_number(raw, "targetPerReplica", 4, where),
        scale_up_stabilization_seconds=_number(raw, "scaleUpStabilizationSeconds", 0, where),
        scale_down_stabilization_seconds=_number(raw, "scaleDownStabilizationSeconds", 300, where),
    )
    if autoscaling.min_replicas < 1:
        raise SpecError(
            "autoscaling.minReplicas must be at least 1: scale to zero is not offered "
            "(no request reaches a service without pods to wake it)"
        )
    _in_range(autoscaling.max_replicas, 1, 100, "autoscaling.maxReplicas")
    if autoscaling.min_replicas > autoscaling.max_replicas:
        raise SpecError("autoscaling.minReplicas must not exceed autoscaling.maxReplicas")
    _in_range(autoscaling.target_per_replica, 0, 10000, "autoscaling.targetPerReplica", True)
    _in_range(
        autoscaling.scale_up_stabilization_seconds, 0, 3600, f"{where}.scaleUpStabilizationSeconds"
    )
    _in_range(
        autoscaling.scale_down_stabilization_seconds,
        0,
        3600,
        f"{where}.scaleDownStabilizationSeconds",
    )
    return autoscaling


def parse_spec(raw: Mapping[str, Any]) -> InferenceServiceSpec:
    """Parse, default and validate `.spec` of an InferenceService.

    Absent `degradation.tiers` become the effective list: every tier with a
    fallback, no fallback-model tier without one. Raises SpecError with one
    actionable message for the first problem found.
    """
    if not isinstance(raw, Mapping):
        raise SpecError("spec must be an object")
    if "model" not in raw:
        raise SpecError("spec.model is required")
    fallback_raw = raw.get("fallback")
    if fallback_raw is not None and not isinstance(fallback_raw, Mapping):
        raise SpecError("fallback must be an object")
    fallback = _parse_fallback(fallback_raw)
    parsed = InferenceServiceSpec(
        model=_parse_model(_section(raw, "model")),
        fallback=fallback,
        replicas=_integer(raw, "replicas", 1, "spec"),
        gpu=_parse_gpu(_section(raw, "gpu")),
        memory=_parse_memory(_section(raw, "memory")),
        server=_parse_server(_section(raw, "server")),
        breaker=_parse_breaker(_section(raw, "breaker")),
        degradation=_parse_degradation(_section(raw, "degradation"), fallback is not None),
        telemetry=_parse_telemetry(_section(raw, "telemetry")),
        autoscaling=_parse_autoscaling(raw.get("autoscaling")),
    )
    _in_range(parsed.replicas, 0, 100, "spec.replicas")
    if DegradationTier.FALLBACK_MODEL in parsed.degradation.tiers and parsed.fallback is None:
        raise SpecError("spec.fallback is required when degradation.tiers lists fallback-model")
    check_quantization_device(parsed.fallback, parsed.gpu.count, parsed.gpu.product)
    return parsed


def applied_spec_text(raw: Mapping[str, Any]) -> str:
    """`status.appliedSpec`: the spec a reconcile applied, as JSON text.

    Text, not an object: kopf sends status as a merge patch, which would keep
    a field the new spec no longer has."""
    return json.dumps(dict(raw), sort_keys=True, separators=(",", ":"))


def watched_spec(
    raw: Mapping[str, Any], status: Mapping[str, Any], generation: int
) -> tuple[InferenceServiceSpec, int] | None:
    """The spec the telemetry loop protects the pods with, and its generation.

    The last one applied (`status.appliedSpec`), not `.spec`: the pods running
    are that spec's, and they keep their wedge restarts, ladder, breaker and
    autoscaling while a later edit is refused (InvalidSpec) or waits. None
    until a reconcile applied anything. A status from an operator that wrote no
    record falls back to the current spec once it was accepted (status.memory).
    """
    text = status.get("appliedSpec")
    if isinstance(text, str):
        try:
            applied = json.loads(text)
            return parse_spec(applied), int(status.get("appliedGeneration") or 0)
        except (TypeError, ValueError):  # SpecError included
            return None  # not ours to guess: the next reconcile writes it again
    invalid = any(
        c.get("type") == ConditionType.INVALID_SPEC and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    if invalid or "memory" not in status:
        return None
    try:
        return parse_spec(raw), generation
    except SpecError:
        return None
