"""The InferenceService spec as typed, defaulted, validated dataclasses.

Why: the CRD schema defaults and validates on the API server, but the
operator must not trust that (an old CRD, a hand-edited object, a unit test
feeding a dict). Parsing once into frozen dataclasses gives the builders and
the policy one typed view, and turns a bad spec into one `SpecError` with a
message a user can act on. Each field's default and bounds are the CRD's own
(crd_schema.py reads them): the parser names a field by its path and never
repeats a number the schema declares. Pure: no Kubernetes client, no I/O.
"""

from __future__ import annotations

import enum
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from fusebox_contract.model_fetch import HF_SOURCE_PATTERN, S3_SOURCE_PATTERN
from fusebox_contract.names import (
    ConditionType,
    DegradationTier,
    Dtype,
    LatencyMetric,
    Quantization,
)
from fusebox_contract.settings import RESERVED_ENV_NAMES
from fusebox_operator.crd_schema import FieldSchema, SpecSchema, crd_default, spec_schema
from fusebox_operator.gpu_products import GPU_GENERATIONS, PRODUCT_LABEL, gpu_generation
from fusebox_operator.pod_placement import (
    PlacementError,
    PodPlacement,
    check_gpu_selector,
    parse_placement,
)
from fusebox_operator.spec_size import spec_size_problem

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
CANNED_WITHOUT_TIER = (
    "degradation.cannedAnswers has no effect unless degradation.tiers lists canned-answers"
)

MAX_PREFIX_CACHE_BYTES = 1024**4
"""server.prefixCache.maxBytes's bound, 1 TiB: more than any GPU holds and than a pod's
memory limit would sensibly carry, so a slip (512Ti for 512Mi) is refused, not sized."""
MAX_CPU_CORES = 1024
"""server.cpu's bound: more cores than the largest nodes offered today have (896 vCPUs),
so a typo (100000) is refused instead of asking torch for that many threads."""
AUTOSCALING_TOLERANCE = 0.1
"""|load / target - 1| within this, the autoscaler holds (the HPA's default tolerance)."""


# The same patterns are CEL rules in crds/inferenceservice.yaml (a test keeps
# them equal), so whatever the API server admits, this parser accepts.
# Whitespace is spelled out (ASCII), as RE2's \s is: Python's is Unicode-wide.
MEMORY_QUANTITY_PATTERN = r"^([0-9]+([.][0-9]+)?)(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$"
CPU_QUANTITY_PATTERN = r"^([0-9]+([.][0-9]+)?)(m)?$"
PVC_SOURCE_PATTERN = r"^pvc://([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)(/[^ \t\n\r\f\v]*)?$"
FILE_SOURCE_PATTERN = r"^file://(/[^/ \t\n\r\f\v][^ \t\n\r\f\v]*)$"
# A ".." segment anywhere in a source's path (searched, as CEL's matches() searches):
# FUSEBOX_MODEL_DIR would leave the claim's mount, or reach anywhere in the image.
PARENT_SEGMENT_PATTERN = r"/[.][.](/|$)"
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
# A DeviceClass's name, a DNS subdomain of at most 253 characters; "" for none.
DEVICE_CLASS_NAME_PATTERN = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*)?$"
DEVICE_CLASS_NAME_MAX_LENGTH = spec_schema().field("gpu.deviceClassName").max_length
"""The CRD's maxLength, which the parser applies to gpu.deviceClassName."""
# metadata.name of an InferenceService: the Service is named after it (an RFC 1035
# label) and it is the value of the fusebox.dev/service label (at most 63). The
# longest suffix on a child's name, ResourceClaimTemplate's "-gpu-<8 hex>", still
# leaves the name far inside the 253 of a DNS subdomain.
SERVICE_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
SERVICE_NAME_MAX_LENGTH = 63
_QUANTITY = re.compile(MEMORY_QUANTITY_PATTERN)
_CPU_QUANTITY = re.compile(CPU_QUANTITY_PATTERN)
_PARENT_SEGMENT = re.compile(PARENT_SEGMENT_PATTERN)
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
# A Secret's or a claim's name: a DNS subdomain (at most 253 characters), "" for none.
OBJECT_NAME_PATTERN = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*)?$"
# host[:port][/path]; the port a TCP port (at most 65535), so no client refuses it later.
ENDPOINT_PATTERN = (
    r"^(https?://)?[A-Za-z0-9.-]+"
    r"(:([0-9]{1,4}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5]))?"
    r"(/[^ \t\n\r\f\v]*)?$"
)
# An S3 endpoint is a host: S3 clients address buckets at its root (a path is refused
# by the fetcher's client), so at most a trailing "/".
S3_ENDPOINT_WITH_PATH_PATTERN = r"^(https?://)?[A-Za-z0-9.-]+(:[0-9]+)?/.+$"
FETCHED_SCHEMES = ("s3", "hf")
"""Sources an init container downloads into the pod's model cache (fusebox_server.fetch)."""
_S3_SOURCE = re.compile(S3_SOURCE_PATTERN)
_HF_SOURCE = re.compile(HF_SOURCE_PATTERN)
_OBJECT_NAME = re.compile(OBJECT_NAME_PATTERN)
_ENDPOINT = re.compile(ENDPOINT_PATTERN)
_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_PVC_SOURCE = re.compile(PVC_SOURCE_PATTERN)
_FILE_SOURCE = re.compile(FILE_SOURCE_PATTERN)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LABEL_VALUE = re.compile(LABEL_VALUE_PATTERN)
_DEVICE_CLASS_NAME = re.compile(DEVICE_CLASS_NAME_PATTERN)
_SERVICE_NAME = re.compile(SERVICE_NAME_PATTERN)
E = TypeVar("E", bound=enum.Enum)


CANNED_PROMPT_MAX_CHARS = 256
"""A canned answer's prompt (a map key, which a CRD schema cannot bound): the CRD's
rule on degradation.cannedAnswers holds the same number, and with its other bounds
keeps the largest spec far below the 256 KiB that kopf's copy of it in an annotation
must fit (test_spec_bounds.py computes it)."""


class SpecError(ValueError):
    """The spec cannot be served as written (reported as condition InvalidSpec)."""


def _capability_text(capability: tuple[int, int]) -> str:
    return f"{capability[0]}.{capability[1]}"


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
    if cores > MAX_CPU_CORES:
        raise SpecError(
            f"server.cpu {quantity!r} must be at most {MAX_CPU_CORES} cores: no node has more "
            "(torch would start that many threads)"
        )
    return cores


def torch_threads(cpu: str) -> int:
    """Torch intra-op threads for a CPU quantity: its whole cores, at least one."""
    return max(1, math.floor(parse_cpu_quantity(cpu)))


def _check_inside_mount(source: str, field: str) -> None:
    if _PARENT_SEGMENT.search(source) is not None:
        raise SpecError(
            f"{field} {source!r} must not have a '..' path segment: the model directory must "
            "stay inside the claim (or the image path) it names"
        )


@dataclass(frozen=True)
class ModelSource:
    """Where a model's files live.

    `pvc://claim/path` is mounted read-only; `file:///path` is in the image;
    `s3://bucket/prefix` and `hf://org/name[@revision]` are fetched by an init
    container into the pod's model cache (`repository` is the bucket or org/name,
    `path` the key prefix, `revision` the one pinned in the source, "" if none).
    """

    scheme: str
    claim: str = ""
    path: str = ""
    repository: str = ""
    revision: str = ""

    @property
    def fetched(self) -> bool:
        return self.scheme in FETCHED_SCHEMES

    @classmethod
    def parse(cls, source: str, field: str = "model.source") -> ModelSource:
        """`field` names the spec field in a refusal (model.source, fallback.source)."""
        if source.startswith("pvc://"):
            match = _PVC_SOURCE.fullmatch(source)
            if match is None:
                raise SpecError(
                    f"{field} {source!r}: pvc:// needs a claim name "
                    "(lowercase DNS label, at most 63 characters) and an optional /path "
                    "without whitespace"
                )
            _check_inside_mount(source, field)
            return cls("pvc", match.group(1), (match.group(3) or "").strip("/"))
        if source.startswith("file://"):
            match = _FILE_SOURCE.fullmatch(source)
            if match is None:
                raise SpecError(
                    f"{field} {source!r}: file:// needs an absolute path without "
                    "whitespace (file:///path)"
                )
            _check_inside_mount(source, field)
            return cls("file", "", "/" + match.group(1).strip("/"))
        if source.startswith("s3://"):
            match = _S3_SOURCE.fullmatch(source)
            if match is None:
                raise SpecError(
                    f"{field} {source!r}: s3:// needs a bucket name (3-63 lower-case letters, "
                    "digits, '.' and '-') and an optional /prefix without whitespace"
                )
            _check_inside_mount(source, field)
            return cls("s3", path=(match.group(2) or "").strip("/"), repository=match.group(1))
        if source.startswith("hf://"):
            match = _HF_SOURCE.fullmatch(source)
            if match is None:
                raise SpecError(
                    f"{field} {source!r}: hf:// needs ORG/NAME (letters, digits, '.', '_' "
                    "and '-') and an optional @REVISION"
                )
            return cls(
                "hf",
                repository=f"{match.group(1)}/{match.group(2)}",
                revision=(match.group(3) or "").removeprefix("@"),
            )
        raise SpecError(f"{field} {source!r} must start with pvc://, file:///, s3:// or hf://")


@dataclass(frozen=True)
class ModelFetchSpec:
    """How an s3:// or hf:// source is fetched (spec.model's endpoint, credentials, cache).

    `cache_claim`: a PersistentVolumeClaim the replicas share, so one download
    serves every pod that mounts it; "" gives each pod an emptyDir of
    `cache_size_bytes`.
    """

    endpoint: str
    region: str
    secret_name: str
    cache_claim: str
    cache_size_bytes: int


# The sections below are what parse_spec returns; their defaults are the CRD's, applied
# by the parser. Only GpuSpec and AutoscalingSpec keep defaults of their own (the CRD's,
# read from it), for the tests that build them without a spec.


@dataclass(frozen=True)
class ModelSpec:
    name: str
    source: ModelSource
    source_text: str
    revision: str
    dtype: Dtype
    fetch: ModelFetchSpec | None = None  # set exactly when the source is fetched

    @property
    def fetch_revision(self) -> str:
        """The revision the fetcher asks for: the source's @REVISION, else model.revision."""
        return self.source.revision or self.revision

    @property
    def reported_revision(self) -> str:
        """The revision the pods serve, as the server (and from its report status.model)
        and the pod annotation tell it: for hf:// the one fetched (@REVISION, else
        model.revision); for s3:// none
        ("": a bucket has no revisions, the copy is named by its ETags in
        status.modelRevision); for a local source model.revision, the user's label."""
        if self.source.scheme == "hf":
            return self.fetch_revision
        if self.source.scheme == "s3":
            return ""
        return self.revision


@dataclass(frozen=True)
class FallbackSpec:
    """The swap target; `source is None` means the primary, quantized on load."""

    source: ModelSource | None
    quantization: Quantization


@dataclass(frozen=True)
class GpuSpec:
    count: int = crd_default("gpu.count")
    product: str = crd_default("gpu.product")
    memory_gib: float | None = None
    # A DeviceClass: the GPUs come from a ResourceClaim (DRA), not nvidia.com/gpu.
    device_class_name: str = crd_default("gpu.deviceClassName")

    @property
    def through_claim(self) -> bool:
        """Whether the pod gets its GPUs through a ResourceClaim rather than the device plugin."""
        return self.count > 0 and bool(self.device_class_name)


@dataclass(frozen=True)
class MemorySpec:
    limit_bytes: int | None  # None = "auto"
    headroom_ratio: float
    allow_swap: bool
    max_growth_ratio: float  # the grow-limit rung's cap over the sized limit; 1 = off
    # Node MemAvailable below which the pods shed caches (node_pressure); None = auto.
    node_available_floor_bytes: int | None

    @property
    def grows_in_place(self) -> bool:
        """Whether the ladder may grow the limit in place (a swapping container cannot)."""
        return self.max_growth_ratio > 1 and not self.allow_swap


@dataclass(frozen=True)
class ServerSpec:
    max_concurrency: int
    max_queue: int
    max_input_tokens: int
    max_new_tokens: int
    request_timeout_seconds: int
    tokenizer_cache_size: int
    # Bytes of prompt-prefix keys and values the server may keep; 0 disables (sizing.py).
    prefix_cache_bytes: int
    templates: tuple[str, ...]
    cpu: str
    env: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class LatencyBreakerSpec:
    metric: LatencyMetric
    p99_threshold_millis: float
    for_seconds: float
    min_requests: int


@dataclass(frozen=True)
class QualityBreakerSpec:
    sample_rate: float
    max_failure_rate: float
    max_output_input_ratio: float
    blocked_terms: tuple[str, ...]


@dataclass(frozen=True)
class ResourceThreshold:
    ratio: float
    growth_mib_per_minute: float


@dataclass(frozen=True)
class ResourceBreakerSpec:
    rss: ResourceThreshold
    gpu_memory: ResourceThreshold
    cooldown_seconds: float
    window_seconds: float


@dataclass(frozen=True)
class HalfOpenSpec:
    admit_percent: int
    min_requests: int
    p99_recovery_millis: float
    min_success_rate: float


@dataclass(frozen=True)
class BreakerSpec:
    latency: LatencyBreakerSpec
    quality: QualityBreakerSpec
    resource: ResourceBreakerSpec
    open_seconds: float
    half_open: HalfOpenSpec


@dataclass(frozen=True)
class DegradationSpec:
    tiers: tuple[DegradationTier, ...]
    canned_answers: tuple[tuple[str, str], ...]
    cool_off_seconds: float

    @property
    def levels(self) -> tuple[int, ...]:
        """The server levels this service may use, ascending (level 0 is implicit)."""
        return tuple(sorted(int(tier.level) for tier in self.tiers))


@dataclass(frozen=True)
class TelemetrySpec:
    scrape_interval_seconds: float
    scrape_timeout_seconds: float
    wedge_after_seconds: float


class AutoscalingMetric(enum.StrEnum):
    """What `autoscaling.targetPerReplica` counts, per ready replica."""

    QUEUE_LENGTH = "queueLength"  # requests admitted and waiting for a batch slot
    IN_FLIGHT = "inFlight"  # waiting plus generating


class Mode(enum.StrEnum):
    """`spec.mode`: whether the operator acts on its decisions or only records them."""

    OBSERVE = "Observe"  # scrape, decide, record WouldAct; never act (a trial run)
    ENFORCE = "Enforce"


@dataclass(frozen=True)
class AutoscalingSpec:
    min_replicas: int = crd_default("autoscaling.minReplicas")
    max_replicas: int = 1  # required in a spec: no CRD default
    metric: AutoscalingMetric = AutoscalingMetric(crd_default("autoscaling.metric"))
    target_per_replica: float = crd_default("autoscaling.targetPerReplica")
    scale_up_stabilization_seconds: float = crd_default("autoscaling.scaleUpStabilizationSeconds")
    scale_down_stabilization_seconds: float = crd_default(
        "autoscaling.scaleDownStabilizationSeconds"
    )
    # server.maxQueue and server.maxConcurrency: a pod with its queue and its slots
    # full is saturated (its next request gets a 429). None: not told.
    pod_max_queue: int | None = None
    pod_max_concurrency: int | None = None

    def clamp(self, replicas: int) -> int:
        return max(self.min_replicas, min(self.max_replicas, replicas))


@dataclass(frozen=True)
class InferenceServiceSpec:
    model: ModelSpec
    fallback: FallbackSpec | None
    replicas: int
    gpu: GpuSpec
    memory: MemorySpec
    server: ServerSpec
    breaker: BreakerSpec
    degradation: DegradationSpec
    telemetry: TelemetrySpec
    autoscaling: AutoscalingSpec | None
    pod: PodPlacement = PodPlacement()  # the service's own; the chart's defaults merge in later
    mode: Mode = Mode(crd_default("mode"))

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


# The readers below refuse what the API server's schema refuses: a value of another
# type (a boolean is no number, though Python's True is an int), and what YAML can say
# but JSON cannot (NaN, infinities), so `render` reports them as the InvalidSpec they are.
# Unknown fields and the schema's size bounds (maxLength, maxItems, maxProperties) are
# checked once for the whole spec, by SpecSchema.violations, before the readers run.


def _field(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _section(raw: Mapping[str, Any], key: str, where: str = "") -> Mapping[str, Any]:
    value = raw.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SpecError(f"{_field(where, key)} must be an object, got {_show(value)}")
    return value


def _show(value: object) -> str:
    """A value for a message; an integer too large for a float is shown by its size."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**18:
        return f"an integer of {len(str(abs(value)))} digits"
    if isinstance(value, float):
        return f"{value:g}"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _name(path: str) -> str:
    """A field in a message: its path below .spec, `spec.` before a top-level one."""
    return path if "." in path else f"spec.{path}"


def _given(raw: Mapping[str, Any], field: FieldSchema) -> Any:
    """The field's value in its section `raw`, else the CRD's default (None: neither)."""
    value = raw.get(field.path.rpartition(".")[2])
    return field.default if value is None else value


def _required(raw: Mapping[str, Any], field: FieldSchema) -> Any:
    value = _given(raw, field)
    if value is None:
        raise SpecError(f"{_name(field.path)} is required")
    return value


def _in_bounds(value: float, field: FieldSchema) -> None:
    """Refuse a number outside the CRD's minimum (exclusive or not) and maximum."""
    if field.minimum is None and field.maximum is None:
        return
    low = -math.inf if field.minimum is None else field.minimum
    high = math.inf if field.maximum is None else field.maximum
    _in_range(value, low, high, _name(field.path), field.exclusive_minimum)


def _as_number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(f"{name} must be a number, got {_show(value)}")
    try:
        number = float(value)
    except OverflowError:  # an integer beyond any float
        number = math.inf
    if not math.isfinite(number):
        raise SpecError(f"{name} must be a finite number, got {_show(value)}")
    return number


def _number(raw: Mapping[str, Any], path: str, schema: SpecSchema) -> float:
    field = schema.field(path)
    number = _as_number(_required(raw, field), _name(path))
    _in_bounds(number, field)
    return number


def _optional_number(raw: Mapping[str, Any], path: str, schema: SpecSchema) -> float | None:
    """A number without a CRD default: None when the spec leaves it out."""
    field = schema.field(path)
    value = _given(raw, field)
    if value is None:
        return None
    number = _as_number(value, _name(path))
    _in_bounds(number, field)
    return number


def _integer(raw: Mapping[str, Any], path: str, schema: SpecSchema, *, bounded: bool = True) -> int:
    """`bounded=False`: the caller checks the bounds, with a reason of its own first."""
    field = schema.field(path)
    value = _required(raw, field)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{_name(path)} must be an integer, got {_show(value)}")
    if bounded:
        _in_bounds(value, field)
    return value


def _as_string(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise SpecError(f"{name} must be a string, got {_show(value)}")
    return value


def _optional_string(raw: Mapping[str, Any], path: str, schema: SpecSchema) -> str | None:
    field = schema.field(path)
    value = _given(raw, field)
    if value is None:
        return None
    text = _as_string(value, _name(path))
    if field.max_length is not None and len(text) > field.max_length:
        raise SpecError(
            f"{_name(path)} must be at most {field.max_length} characters, got {len(text)}"
        )
    return text


def _string(raw: Mapping[str, Any], path: str, schema: SpecSchema) -> str:
    text = _optional_string(raw, path, schema)
    if text is None:
        raise SpecError(f"{_name(path)} is required")
    return text


def _boolean(raw: Mapping[str, Any], path: str, schema: SpecSchema) -> bool:
    value = _required(raw, schema.field(path))
    if not isinstance(value, bool):
        # YAML's "false" in quotes is a string, and a non-empty string is true in Python.
        raise SpecError(f"{_name(path)} must be true or false, got {_show(value)}")
    return value


def _in_range(value: float, low: float, high: float, name: str, low_open: bool = False) -> None:
    too_low = value <= low if low_open else value < low
    if too_low or value > high:
        bracket = "(" if low_open else "["
        raise SpecError(f"{name} must be in {bracket}{low:g}, {high:g}], got {_show(value)}")


def _strings(raw: Mapping[str, Any], path: str) -> tuple[str, ...]:
    value = raw.get(path.rpartition(".")[2]) or []
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise SpecError(f"{path} must be a list of strings")
    return tuple(value)


def _choice(raw: Mapping[str, Any], path: str, kind: type[E], schema: SpecSchema) -> E:
    """One of a contract enum's values (the CRD's enum is the same list, a test keeps it)."""
    value = _given(raw, schema.field(path))
    if isinstance(value, str):
        try:
            return kind(value)
        except ValueError:
            pass
    allowed = ", ".join(member.value for member in kind)
    raise SpecError(f"{path} {_show(value)} must be one of {allowed}")


def _parse_model(raw: Mapping[str, Any], schema: SpecSchema) -> ModelSpec:
    name = raw.get("name")
    source_text = raw.get("source")
    if not isinstance(name, str) or not _MODEL_NAME.fullmatch(name):
        raise SpecError(f"model.name {name!r} must be 1-63 letters, digits, '.', '_' or '-'")
    if not isinstance(source_text, str):
        raise SpecError(
            "model.source is required (pvc://CLAIM/path, file:///path, s3://BUCKET/PREFIX or "
            f"hf://ORG/NAME), got {_show(source_text)}"
        )
    source = ModelSource.parse(source_text)
    revision = _string(raw, "model.revision", schema)
    if source.scheme == "s3" and revision != schema.field("model.revision").default:
        # The fetcher takes every object under the prefix as it is now: the revision
        # would change nothing fetched, yet be reported as the one served.
        raise SpecError(
            f"model.revision {revision!r} has no effect on an s3:// source (every object "
            "under the prefix is fetched as it is; status.modelRevision names the copy by "
            "its ETags): leave model.revision unset"
        )
    if source.revision and revision != schema.field("model.revision").default:
        # hf://ORG/NAME@REVISION fetches that revision: model.revision would be overridden.
        raise SpecError(
            f"model.revision {revision!r} has no effect on an hf:// source with @REVISION "
            "(the source's revision is the one fetched): leave model.revision unset, or drop "
            "@REVISION from model.source"
        )
    return ModelSpec(
        name,
        source,
        source_text,
        revision,
        _choice(raw, "model.dtype", Dtype, schema),
        _parse_model_fetch(raw, source, schema),
    )


def _object_name(raw: Mapping[str, Any], path: str, schema: SpecSchema) -> str:
    name = _string(raw, path, schema)
    if _OBJECT_NAME.fullmatch(name) is None:
        raise SpecError(
            f"{path} {name!r} must be an object name (a DNS subdomain: lower-case letters, "
            "digits, '-' and '.')"
        )
    return name


def _parse_model_fetch(
    raw: Mapping[str, Any], source: ModelSource, schema: SpecSchema
) -> ModelFetchSpec | None:
    """spec.model's fetch fields; refused with a source that is not fetched (they would
    be silently ignored)."""
    credentials = _section(raw, "credentials", "model")
    cache = _section(raw, "cache", "model")
    endpoint = _string(raw, "model.endpoint", schema)
    if endpoint and _ENDPOINT.fullmatch(endpoint) is None:
        raise SpecError(
            f"model.endpoint {endpoint!r} must be host[:port] or http(s)://host[:port][/path], "
            "the port at most 65535"
        )
    region = _string(raw, "model.region", schema)
    secret_name = _object_name(credentials, "model.credentials.secretName", schema)
    claim = _object_name(cache, "model.cache.claimName", schema)
    size_text = _string(cache, "model.cache.sizeLimit", schema)
    size_bytes = _quantity(size_text, "model.cache.sizeLimit")
    if not source.fetched:
        given = [
            field
            for field, value in (
                ("model.endpoint", endpoint),
                ("model.region", region),
                ("model.credentials", "credentials" in raw),
                ("model.cache", "cache" in raw),
            )
            if value
        ]
        if given:
            raise SpecError(
                f"{given[0]} applies to s3:// and hf:// sources only; model.source is "
                f"{source.scheme}://"
            )
        return None
    if region and source.scheme != "s3":
        raise SpecError("model.region applies to s3:// sources only")
    if source.scheme == "s3" and re.fullmatch(S3_ENDPOINT_WITH_PATH_PATTERN, endpoint):
        raise SpecError(
            f"model.endpoint {endpoint!r} of an s3:// source is host[:port] or "
            "http(s)://host[:port], without a path (buckets are addressed at its root)"
        )
    if size_bytes <= 0:
        raise SpecError("model.cache.sizeLimit must be above zero")
    if claim and size_text != schema.field("model.cache.sizeLimit").default:
        # The sizeLimit sizes the emptyDir used without a claim: with one it changes nothing.
        raise SpecError(
            f"model.cache.sizeLimit {size_text!r} has no effect with model.cache.claimName "
            "(it sizes the emptyDir used without a claim; the claim's own size bounds the "
            "copy): leave model.cache.sizeLimit unset"
        )
    return ModelFetchSpec(endpoint, region, secret_name, claim, size_bytes)


def _parse_fallback(raw: Mapping[str, Any] | None, schema: SpecSchema) -> FallbackSpec | None:
    if raw is None:
        return None
    quantization = _choice(raw, "fallback.quantization", Quantization, schema)
    source_text = _optional_string(raw, "fallback.source", schema) or ""
    source = ModelSource.parse(source_text, "fallback.source") if source_text else None
    if source is not None and source.fetched:
        raise SpecError(
            f"fallback.source {source_text!r}: s3:// and hf:// are fetched for model.source "
            "only; put the fallback in a PVC (pvc://) or leave fallback.source empty to "
            "quantize the primary on load"
        )
    if source is None and quantization == Quantization.NONE:
        raise SpecError("fallback without its own source must be quantized (quantization != none)")
    return FallbackSpec(source, quantization)


def _parse_gpu(raw: Mapping[str, Any], schema: SpecSchema) -> GpuSpec:
    count = _integer(raw, "gpu.count", schema, bounded=False)
    most = schema.field("gpu.count").maximum
    if most is not None and count > most:
        raise SpecError(
            f"gpu.count {count}: more than {most:g} GPU per pod is not supported yet "
            "(the server places the model on one GPU; the others would sit idle)"
        )
    _in_bounds(count, schema.field("gpu.count"))
    product = _string(raw, "gpu.product", schema)
    if not _LABEL_VALUE.fullmatch(product):
        raise SpecError(
            f"gpu.product {product!r} must be a label value (at most 63 letters, digits, "
            "'-', '_' or '.'), as GPU Feature Discovery writes nvidia.com/gpu.product"
        )
    if product and count == 0:
        raise SpecError("gpu.product requires gpu.count > 0")
    memory_gib = _optional_number(raw, "gpu.memoryGiB", schema)
    device_class_name = _string(raw, "gpu.deviceClassName", schema)
    if _DEVICE_CLASS_NAME.fullmatch(device_class_name) is None:
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
    if fallback is None:
        return
    quantization = fallback.quantization
    needed = quantization.min_compute_capability
    if needed is None:
        return
    if gpu_count < 1:
        raise SpecError(
            f"fallback.quantization {quantization.value} needs a GPU (gpu.count >= 1); "
            "on CPU use int8"
        )
    generation = gpu_generation(product) if product else None
    if not product or (generation is not None and generation.compute_capability >= needed):
        return
    capable = ", ".join(g.examples for g in GPU_GENERATIONS if g.compute_capability >= needed)
    instead = " or ".join(
        q.value
        for q in Quantization
        if q is not Quantization.NONE
        and (
            q.min_compute_capability is None
            or (
                generation is not None and generation.compute_capability >= q.min_compute_capability
            )
        )
    )
    if generation is None:
        found = (
            f"{product} is not a GPU whose compute capability Fusebox knows, so it has no known "
            f"{quantization.value} support: use {instead}, or leave gpu.product empty (the "
            "server then checks its device at start)"
        )
    else:
        found = (
            f"{product} is {generation.name} ({_capability_text(generation.compute_capability)})"
            f" and has no {quantization.value} support: use {instead}"
        )
    raise SpecError(
        f"fallback.quantization {quantization.value} needs compute capability >= "
        f"{_capability_text(needed)} (e.g. {capable}); {found}"
    )


def _quantity(text: str, field: str) -> int:
    try:
        return parse_quantity_bytes(text)
    except SpecError as error:
        raise SpecError(f"{field}: {error}") from None


def _parse_memory(raw: Mapping[str, Any], schema: SpecSchema) -> MemorySpec:
    limit = _string(raw, "memory.limit", schema)
    limit_bytes = None if limit == "auto" else _quantity(limit, "memory.limit")
    headroom = _number(raw, "memory.headroomRatio", schema)
    growth = _number(raw, "memory.maxGrowthRatio", schema)
    floor = _string(raw, "memory.nodeAvailableFloor", schema)
    floor_bytes = None if floor == "auto" else _quantity(floor, "memory.nodeAvailableFloor")
    allow_swap = _boolean(raw, "memory.allowSwap", schema)
    return MemorySpec(limit_bytes, headroom, allow_swap, growth, floor_bytes)


def _parse_server(raw: Mapping[str, Any], schema: SpecSchema) -> ServerSpec:
    server = ServerSpec(
        max_concurrency=_integer(raw, "server.maxConcurrency", schema),
        max_queue=_integer(raw, "server.maxQueue", schema),
        max_input_tokens=_integer(raw, "server.maxInputTokens", schema),
        max_new_tokens=_integer(raw, "server.maxNewTokens", schema),
        request_timeout_seconds=_integer(raw, "server.requestTimeoutSeconds", schema),
        tokenizer_cache_size=_integer(raw, "server.tokenizerCacheSize", schema),
        prefix_cache_bytes=_parse_prefix_cache_bytes(
            _section(raw, "prefixCache", "server"), schema
        ),
        templates=_strings(raw, "server.templates"),
        cpu=_string(raw, "server.cpu", schema),
        env=_parse_env(raw.get("env") or []),
    )
    parse_cpu_quantity(server.cpu)
    return server


def _parse_prefix_cache_bytes(raw: Mapping[str, Any], schema: SpecSchema) -> int:
    """server.prefixCache.maxBytes in bytes: a memory quantity or a whole number of bytes
    (int-or-string, as a container's resources are); 0 disables the cache."""
    path = "server.prefixCache.maxBytes"
    field = schema.field(path)
    value = _required(raw, field)
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise SpecError(f"{path} must be 0 or more bytes, got {_show(value)}")
        size_bytes = value
    elif isinstance(value, str):
        if field.max_length is not None and len(value) > field.max_length:
            raise SpecError(f"{path} must be at most {field.max_length} characters")
        size_bytes = _quantity(value, path)
    else:
        raise SpecError(
            f"{path} must be a memory quantity such as 512Mi or a whole number of bytes, "
            f"got {_show(value)}"
        )
    if size_bytes > MAX_PREFIX_CACHE_BYTES:
        raise SpecError(f"{path} must be at most 1Ti (1099511627776 bytes), got {_show(value)}")
    return size_bytes


def _parse_env(raw: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, list):
        raise SpecError("server.env must be a list of {name, value}")
    env: list[tuple[str, str]] = []
    for item in raw:
        name = item.get("name") if isinstance(item, Mapping) else None
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            raise SpecError(f"server.env entry {_show(item)} needs a valid variable name")
        if name in RESERVED_ENV_NAMES:
            raise SpecError(
                f"server.env may not set {name}: the operator wires it from the spec "
                "(reserved names are listed in docs/api.md)"
            )
        if any(name == seen for seen, _ in env):
            raise SpecError(f"server.env sets {name} twice")
        value = item.get("value")
        env.append((name, "" if value is None else _as_string(value, f"server.env {name}.value")))
    return tuple(env)


def _parse_threshold(
    raw: Mapping[str, Any], where: str, ratio_key: str, schema: SpecSchema
) -> ResourceThreshold:
    return ResourceThreshold(
        _number(raw, f"{where}.{ratio_key}", schema),
        _number(raw, f"{where}.growthMiBPerMinute", schema),
    )


def _parse_breaker(raw: Mapping[str, Any], schema: SpecSchema) -> BreakerSpec:
    latency_raw = _section(raw, "latency", "breaker")
    latency = LatencyBreakerSpec(
        _choice(latency_raw, "breaker.latency.metric", LatencyMetric, schema),
        _number(latency_raw, "breaker.latency.p99ThresholdMillis", schema),
        _number(latency_raw, "breaker.latency.forSeconds", schema),
        _integer(latency_raw, "breaker.latency.minRequests", schema),
    )

    quality_raw = _section(raw, "quality", "breaker")
    quality = QualityBreakerSpec(
        _number(quality_raw, "breaker.quality.sampleRate", schema),
        _number(quality_raw, "breaker.quality.maxFailureRate", schema),
        _number(quality_raw, "breaker.quality.maxOutputInputRatio", schema),
        _strings(quality_raw, "breaker.quality.blockedTerms"),
    )

    resource_raw = _section(raw, "resource", "breaker")
    resource = ResourceBreakerSpec(
        _parse_threshold(
            _section(resource_raw, "rss", "breaker.resource"),
            "breaker.resource.rss",
            "ratioOfLimit",
            schema,
        ),
        _parse_threshold(
            _section(resource_raw, "gpuMemory", "breaker.resource"),
            "breaker.resource.gpuMemory",
            "ratioOfVRAM",
            schema,
        ),
        _number(resource_raw, "breaker.resource.cooldownSeconds", schema),
        _number(resource_raw, "breaker.resource.windowSeconds", schema),
    )

    half_raw = _section(raw, "halfOpen", "breaker")
    half_open = HalfOpenSpec(
        _integer(half_raw, "breaker.halfOpen.admitPercent", schema),
        _integer(half_raw, "breaker.halfOpen.minRequests", schema),
        _number(half_raw, "breaker.halfOpen.p99RecoveryMillis", schema),
        _number(half_raw, "breaker.halfOpen.minSuccessRate", schema),
    )
    if not half_open.p99_recovery_millis < latency.p99_threshold_millis:
        raise SpecError(
            f"breaker.halfOpen.p99RecoveryMillis ({half_open.p99_recovery_millis:g}) must be below "
            f"breaker.latency.p99ThresholdMillis ({latency.p99_threshold_millis:g})"
        )
    open_seconds = _number(raw, "breaker.openSeconds", schema)
    return BreakerSpec(latency, quality, resource, open_seconds, half_open)


def _parse_degradation(
    raw: Mapping[str, Any], has_fallback: bool, schema: SpecSchema
) -> DegradationSpec:
    listed = raw.get("tiers")
    if listed is None:
        tiers = TIERS_WITH_FALLBACK if has_fallback else TIERS_WITHOUT_FALLBACK
    elif not isinstance(listed, list):
        raise SpecError("degradation.tiers must be a list")
    else:
        bad = [t for t in listed if not isinstance(t, str) or t not in DEGRADATION_TIER_LEVELS]
        if bad:
            allowed = ", ".join(DEGRADATION_TIER_LEVELS)
            raise SpecError(f"degradation.tiers: tier {_show(bad[0])} must be one of {allowed}")
        tiers = tuple(DegradationTier(tier) for tier in listed)
    if len(set(tiers)) != len(tiers):
        raise SpecError("degradation.tiers must not repeat a tier")
    canned = raw.get("cannedAnswers") or {}
    if not isinstance(canned, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in canned.items()
    ):
        raise SpecError("degradation.cannedAnswers must map prompt strings to answer strings")
    for prompt in canned:
        if len(prompt) > CANNED_PROMPT_MAX_CHARS:
            raise SpecError(
                f"spec.degradation.cannedAnswers keys must be at most {CANNED_PROMPT_MAX_CHARS}"
                f" characters, got {len(prompt)} ({prompt[:32]!r}...)"
            )
    if canned and DegradationTier.CANNED_ANSWERS not in tiers:
        raise SpecError(CANNED_WITHOUT_TIER)
    cool_off = _number(raw, "degradation.coolOffSeconds", schema)
    return DegradationSpec(tiers, tuple(sorted(canned.items())), cool_off)


def _parse_telemetry(raw: Mapping[str, Any], schema: SpecSchema) -> TelemetrySpec:
    telemetry = TelemetrySpec(
        _number(raw, "telemetry.scrapeIntervalSeconds", schema),
        _number(raw, "telemetry.scrapeTimeoutSeconds", schema),
        _number(raw, "telemetry.wedgeAfterSeconds", schema),
    )
    if telemetry.scrape_timeout_seconds > telemetry.scrape_interval_seconds:
        raise SpecError("telemetry.scrapeTimeoutSeconds must not exceed scrapeIntervalSeconds")
    if telemetry.wedge_after_seconds <= telemetry.scrape_interval_seconds:
        raise SpecError("telemetry.wedgeAfterSeconds must exceed scrapeIntervalSeconds")
    return telemetry


def _parse_autoscaling(raw: Any, server: ServerSpec, schema: SpecSchema) -> AutoscalingSpec | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise SpecError(f"autoscaling must be an object, got {_show(raw)}")
    max_replicas = _integer(raw, "autoscaling.maxReplicas", schema)
    min_replicas = _integer(raw, "autoscaling.minReplicas", schema, bounded=False)
    fewest = schema.field("autoscaling.minReplicas")
    if fewest.minimum is not None and min_replicas < fewest.minimum:
        raise SpecError(
            f"autoscaling.minReplicas must be at least {fewest.minimum:g}: scale to zero is not "
            "offered (no request reaches a service without pods to wake it)"
        )
    _in_bounds(min_replicas, fewest)
    if min_replicas > max_replicas:
        raise SpecError("autoscaling.minReplicas must not exceed autoscaling.maxReplicas")
    return AutoscalingSpec(
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        metric=_choice(raw, "autoscaling.metric", AutoscalingMetric, schema),
        target_per_replica=_number(raw, "autoscaling.targetPerReplica", schema),
        scale_up_stabilization_seconds=_number(
            raw, "autoscaling.scaleUpStabilizationSeconds", schema
        ),
        scale_down_stabilization_seconds=_number(
            raw, "autoscaling.scaleDownStabilizationSeconds", schema
        ),
        pod_max_queue=server.max_queue,
        pod_max_concurrency=server.max_concurrency,
    )


def check_load_can_pass_target(autoscaling: AutoscalingSpec, server: ServerSpec) -> None:
    """Refuse a target the metric can never exceed by more than the tolerance.

    A pod's queue never holds more than server.maxQueue (the next request gets a
    429), and in flight it never has more than maxQueue + maxConcurrency. A target
    at or above that (times 1 + tolerance) reads a saturated service as at or
    under its target: it would never scale up, and could scale down.
    """
    most = server.max_queue
    fields = "server.maxQueue"
    if autoscaling.metric is AutoscalingMetric.IN_FLIGHT:
        most += server.max_concurrency
        fields = "server.maxQueue + server.maxConcurrency"
    if most > autoscaling.target_per_replica * (1 + AUTOSCALING_TOLERANCE):
        return
    raise SpecError(
        f"{fields} ({most}) must exceed autoscaling.targetPerReplica "
        f"({autoscaling.target_per_replica:g}) by more than {AUTOSCALING_TOLERANCE:.0%}: a pod "
        f"never reports more {autoscaling.metric.value} than that, so a saturated service "
        "would never scale up; raise the server's limits or lower the target"
    )


def parse_spec(
    raw: Mapping[str, Any], *, running: bool = False, schema: SpecSchema | None = None
) -> InferenceServiceSpec:
    """Parse, default and validate `.spec` of an InferenceService.

    Absent `degradation.tiers` become the effective list: every tier with a
    fallback, no fallback-model tier without one. Raises SpecError with one
    actionable message for the first problem found. `running`: the spec the
    pods already run (status.appliedSpec), which skips `check_servable`.
    `schema`: whose defaults and bounds apply; the CRD the operator ships with
    unless a test gives another.
    """
    schema = schema or spec_schema()
    if not isinstance(raw, Mapping):
        raise SpecError(f"spec must be an object, got {_show(raw)}")
    # spec.pod first: its refusals say which pod fields Fusebox owns, where the schema
    # would only call them unknown.
    pod = _parse_pod(raw.get("pod"), running=running)
    if not running:
        # Before the sections, so a typo is named rather than a check its default fails.
        # Not of a running spec: one applied before a field was dropped or a bound
        # tightened keeps being watched, as with check_servable.
        problem = next(schema.violations(raw), None) or spec_size_problem(raw)
        if problem is not None:
            raise SpecError(problem)
    if "model" not in raw:
        raise SpecError("spec.model is required")
    fallback_raw = raw.get("fallback")
    if fallback_raw is not None and not isinstance(fallback_raw, Mapping):
        raise SpecError(f"fallback must be an object, got {_show(fallback_raw)}")
    fallback = _parse_fallback(fallback_raw, schema)
    server = _parse_server(_section(raw, "server"), schema)
    parsed = InferenceServiceSpec(
        model=_parse_model(_section(raw, "model"), schema),
        fallback=fallback,
        replicas=_integer(raw, "replicas", schema),
        gpu=_parse_gpu(_section(raw, "gpu"), schema),
        memory=_parse_memory(_section(raw, "memory"), schema),
        server=server,
        breaker=_parse_breaker(_section(raw, "breaker"), schema),
        degradation=_parse_degradation(_section(raw, "degradation"), fallback is not None, schema),
        telemetry=_parse_telemetry(_section(raw, "telemetry"), schema),
        autoscaling=_parse_autoscaling(raw.get("autoscaling"), server, schema),
        pod=pod,
        mode=_choice(raw, "mode", Mode, schema),
    )
    if DegradationTier.FALLBACK_MODEL in parsed.degradation.tiers and parsed.fallback is None:
        raise SpecError("spec.fallback is required when degradation.tiers lists fallback-model")
    if not running:
        check_servable(parsed)
    return parsed


def _parse_pod(raw: Any, *, running: bool = False) -> PodPlacement:
    try:
        return parse_placement(raw)
    except PlacementError as error:
        if running:
            return placement_as_applied(raw)
        raise SpecError(str(error)) from None


def placement_as_applied(raw: Any) -> PodPlacement:
    """`spec.pod` of a spec whose pods already run, taken as written, for a record that
    a check added since it was applied refuses (an AppArmor `unconfined` annotation,
    refused since commit a8dbe98).

    Refused, the record stopped the service's ticks: no wedge restart, ladder, breaker
    or status. Taken without its placement, a resync would render a template the pods
    do not run and roll them. Its pods run this placement, so it is watched and
    rendered as they run it, as with check_servable; the next edit is still refused
    (parse_spec without `running`). Only the shape is read, as `parse_placement` keeps
    a section it accepts (a test holds the two equal).
    """
    try:
        section: Mapping[str, Any] = dict(raw or {})

        def listed(key: str) -> tuple[dict[str, Any], ...] | None:
            items = section.get(key)
            return None if items is None else tuple(dict(item) for item in items)

        def pairs(key: str) -> tuple[tuple[str, str], ...]:
            return tuple(sorted((str(k), str(v)) for k, v in dict(section.get(key) or {}).items()))

        def text(key: str) -> str | None:
            value = section.get(key)
            return None if value is None else str(value)

        secrets = section.get("imagePullSecrets")
        affinity = section.get("affinity")
        return PodPlacement(
            tolerations=listed("tolerations"),
            affinity=None if affinity is None else dict(affinity),
            node_selector=pairs("nodeSelector"),
            topology_spread_constraints=listed("topologySpreadConstraints"),
            image_pull_secrets=None
            if secrets is None
            else tuple(str(entry["name"]) for entry in secrets),
            runtime_class_name=text("runtimeClassName"),
            priority_class_name=text("priorityClassName"),
            service_account_name=text("serviceAccountName"),
            labels=pairs("labels"),
            annotations=pairs("annotations"),
            image=text("image"),
        )
    except (TypeError, ValueError, KeyError) as error:
        raise SpecError(f"spec.pod cannot be read as applied: {error!r}") from None


def check_servable(spec: InferenceServiceSpec) -> None:
    """Refuse what would start pods that cannot do what the spec asks.

    Not checked of a spec whose pods already run (`parse_spec(running=True)`):
    one applied before a check was added keeps being watched (wedge restarts,
    ladder, breaker, autoscaling) while its next edit is refused.
    """
    if spec.gpu.memory_gib is not None and spec.gpu.count == 0:
        raise SpecError("gpu.memoryGiB requires gpu.count > 0 (it sizes the memory for VRAM)")
    check_quantization_device(spec.fallback, spec.gpu.count, spec.gpu.product)
    try:
        check_gpu_selector(spec.pod, PRODUCT_LABEL, spec.gpu.product)
    except PlacementError as error:
        raise SpecError(str(error)) from None
    if spec.autoscaling is not None:
        check_load_can_pass_target(spec.autoscaling, spec.server)


def applied_spec_text(raw: Mapping[str, Any]) -> str:
    """`status.appliedSpec`: the spec a reconcile applied, as JSON text.

    Text, not an object: kopf sends status as a merge patch, which would keep
    a field the new spec no longer has."""
    return json.dumps(dict(raw), sort_keys=True, separators=(",", ":"))


def parse_applied(text: str) -> InferenceServiceSpec:
    """status.appliedSpec, parsed as the spec of running pods (SpecError, ValueError)."""
    return parse_spec(json.loads(text), running=True)


def applied_record_problem(
    status: Mapping[str, Any], parse_text: Callable[[str], InferenceServiceSpec] = parse_applied
) -> str | None:
    """Why `status.appliedSpec` cannot be read, or None when it can (or there is none):
    what `watched_spec` gives up on, for the status to say so."""
    text = status.get("appliedSpec")
    if not isinstance(text, str):
        return None
    try:
        parse_text(text)
    except (TypeError, ValueError) as error:  # SpecError included
        return str(error) or type(error).__name__
    return None


def watched_spec(
    raw: Mapping[str, Any],
    status: Mapping[str, Any],
    generation: int,
    parse_text: Callable[[str], InferenceServiceSpec] = parse_applied,
) -> tuple[InferenceServiceSpec, int] | None:
    """The spec the telemetry loop protects the pods with, and its generation.

    The last one applied (`status.appliedSpec`), not `.spec`: the pods running
    are that spec's, and they keep their wedge restarts, ladder, breaker and
    autoscaling while a later edit is refused (InvalidSpec) or waits. None
    until a reconcile applied anything. A status from an operator that wrote no
    record falls back to the current spec once it was accepted (status.memory).
    `parse_text` parses the record (a caller that ticks may remember the last one).
    """
    text = status.get("appliedSpec")
    if isinstance(text, str):
        try:
            return parse_text(text), int(status.get("appliedGeneration") or 0)
        except (TypeError, ValueError):  # SpecError included
            return None  # not ours to guess: the next reconcile writes it again
    invalid = any(
        c.get("type") == ConditionType.INVALID_SPEC and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    if invalid or "memory" not in status:
        return None
    try:
        return parse_spec(raw, running=True), generation
    except SpecError:
        return None
