"""Enumerated names shared across processes: the wire values are the enum values."""

from __future__ import annotations

import enum
from collections.abc import Iterable


class BreakerState(enum.StrEnum):
    """The circuit breaker's state as the admin API and the stats file spell it."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"

    @property
    def status_name(self) -> str:
        """The spelling of `status.breaker.state` and the printer column."""
        return {"closed": "Closed", "open": "Open", "half_open": "HalfOpen"}[self.value]

    @property
    def gauge_value(self) -> int:
        """`fusebox_breaker_state`: 0 closed, 1 open, 2 half-open."""
        return {"closed": 0, "open": 1, "half_open": 2}[self.value]

    @classmethod
    def from_status_name(cls, name: str) -> BreakerState:
        for state in cls:
            if state.status_name == name:
                return state
        raise ValueError(f"unknown breaker state {name!r}")

    @classmethod
    def from_gauge_value(cls, value: int) -> BreakerState:
        for state in cls:
            if state.gauge_value == value:
                return state
        raise ValueError(f"unknown breaker gauge value {value!r}")


class DegradationLevel(enum.IntEnum):
    """The server's degradation level: the highest tier switched on.

    A level switches on the service's tiers at or below it (`engaged_tiers`):
    every tier with the default list, only the listed ones when
    `spec.degradation.tiers` leaves some out.
    """

    NONE = 0
    NO_STREAMING = 1  # stream:true answered as one complete response
    FALLBACK_MODEL = 2  # the fallback variant serves
    CANNED_ANSWERS = 3  # exact template matches answered without the model


class DegradationTier(enum.StrEnum):
    """`spec.degradation.tiers` entries; each switches on one server level."""

    NO_STREAMING = "no-streaming"
    FALLBACK_MODEL = "fallback-model"
    CANNED_ANSWERS = "canned-answers"

    @property
    def level(self) -> DegradationLevel:
        return {
            "no-streaming": DegradationLevel.NO_STREAMING,
            "fallback-model": DegradationLevel.FALLBACK_MODEL,
            "canned-answers": DegradationLevel.CANNED_ANSWERS,
        }[self.value]


def engaged_tiers(
    level: int, tiers: Iterable[DegradationTier] | None = None
) -> frozenset[DegradationTier]:
    """The tiers a level switches on: those listed at or below it, every one up to it
    when none are listed. `[no-streaming, canned-answers]` at level 3 swaps no model."""
    listed = DegradationTier if tiers is None else tiers
    return frozenset(tier for tier in listed if tier.level <= level)


class Variant(enum.StrEnum):
    PRIMARY = "primary"
    FALLBACK = "fallback"


class Quantization(enum.StrEnum):
    """How the fallback variant is quantized on load.

    int8 is weight-only and runs on CPU and GPU; int4 (weight-only) and fp8
    need a CUDA device of the compute capability `min_compute_capability`
    names: the operator refuses them on a GPU product below it, the server
    on a device below it.
    """

    NONE = "none"
    INT8 = "int8"
    INT4 = "int4"
    FP8 = "fp8"

    @property
    def min_compute_capability(self) -> tuple[int, int] | None:
        """The least CUDA compute capability that runs it; None: any device, CPU included.

        int4 is torchao's tinygemm kernel, built for Ampere (8.0) and newer;
        fp8 needs the fp8 tensor cores of Ada, Hopper and Blackwell (8.9).
        """
        return {Quantization.INT4: (8, 0), Quantization.FP8: (8, 9)}.get(self)

    @property
    def needs_gpu(self) -> bool:
        return self.min_compute_capability is not None


class Dtype(enum.StrEnum):
    """`spec.model.dtype`: the dtype the weights are loaded in (auto: as saved)."""

    AUTO = "auto"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    FLOAT32 = "float32"


class ActionType(enum.StrEnum):
    """`POST /admin/v1/actions` types."""

    GC = "gc"
    EMPTY_CACHE = "empty_cache"
    UNLOAD = "unload"
    LOAD = "load"
    SWAP = "swap"


class RequestOutcome(enum.StrEnum):
    """`fusebox_requests_total{outcome}`: each request is counted once, with one of these."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    REJECTED = "rejected"  # 429 queue full, 503 breaker / unavailable / memory guard
    TIMED_OUT = "timed_out"  # 504
    CANCELLED = "cancelled"  # the client went away
    INVALID = "invalid"  # 4xx other than 429: the caller's mistake


class LatencyMetric(enum.StrEnum):
    TTFT = "ttft"
    ITL = "itl"
    E2E = "e2e"


class HeartbeatThread(enum.StrEnum):
    LOOP = "loop"
    WORKER = "worker"


class Fault(enum.StrEnum):
    """Faults `FUSEBOX_FAULTS` may arm at start."""

    LEAK = "leak"  # MiB per request held by the loaded model: only a reload frees it
    SLOW = "slow"
    WEDGE = "wedge"
    LOAD_DELAY = "load_delay"  # seconds added to every model load
    # The leak kinds a cheaper ladder step cures (MiB per request each):
    LEAK_CYCLES = "leak_cycles"  # cyclic garbage automatic gc misses: the gc step
    LEAK_ALLOCATOR = "leak_allocator"  # freed, kept by malloc / torch's cache: empty_cache
    LEAK_PROMPT_CACHE = "leak_prompt_cache"  # a prompt cache without its bound: empty_cache
    LEAK_PINNED = "leak_pinned"  # pinned host staging buffers (CUDA only): empty_cache


class ConditionType(enum.StrEnum):
    READY = "Ready"
    AVAILABLE = "Available"
    DEGRADED = "Degraded"
    TELEMETRY_FRESH = "TelemetryFresh"
    MEMORY_PRESSURE = "MemoryPressure"
    INVALID_SPEC = "InvalidSpec"
    SCALING_LIMITED = "ScalingLimited"  # autoscaling held back (pods Pending for GPUs)
    GPU_HEALTHY = "GPUHealthy"  # every pod's GPUs are Healthy (only with gpu.count > 0)
    NODE_MEMORY_PRESSURE = "NodeMemoryPressure"  # a pod's node is below its available floor
    MODEL_READY = "ModelReady"  # an s3:// or hf:// model is fetched and verified (model_readiness)


class EventReason(enum.StrEnum):
    """Reasons of the Events the operator posts on an InferenceService."""

    BREAKER_OPENED = "BreakerOpened"
    BREAKER_HALF_OPEN = "BreakerHalfOpen"
    BREAKER_CLOSED = "BreakerClosed"
    GARBAGE_COLLECTED = "GarbageCollected"
    CACHE_EMPTIED = "CacheEmptied"
    MODEL_UNLOADED = "ModelUnloaded"
    MODEL_RELOADED = "ModelReloaded"
    SWAPPED_TO_FALLBACK = "SwappedToFallback"
    RESTORED_PRIMARY = "RestoredPrimary"
    POD_RESTARTED = "PodRestarted"
    TELEMETRY_STALE = "TelemetryStale"
    ADMIN_UNREACHABLE = "AdminUnreachable"  # the operator's admin calls to a pod fail
    MEMORY_SIZED = "MemorySized"
    INVALID_SPEC = "InvalidSpec"
    DEGRADED = "Degraded"
    RECOVERED = "Recovered"
    FALLBACK_UNAVAILABLE = "FallbackUnavailable"
    MEMORY_LIMIT_GROWN = "MemoryLimitGrown"  # the ladder's in-place resize of the server
    # A ladder rung that takes a pod out of service waits: another pod is out of service.
    LADDER_STEP_HELD = "LadderStepHeld"
    GPU_UNHEALTHY = "GPUUnhealthy"  # a pod's GPU went Unhealthy: the pod is drained elsewhere
    SCALED_UP = "ScaledUp"
    SCALED_DOWN = "ScaledDown"
    SCALE_UP_BLOCKED = "ScaleUpBlocked"  # pods already Pending for lack of GPUs
    SCALE_DOWN_HELD = "ScaleDownHeld"  # the scale-down window keeps the count a while
    PODS_UNSCHEDULABLE = "PodsUnschedulable"  # the scheduler cannot place a pod
    PODS_FAILING = "PodsFailing"  # a pod's container cannot run (crash loop, image pull)
    # Ready pods the Service's EndpointSlices do not list as ready endpoints: no traffic
    # reaches them (also Ready's reason, and each such pod's status.pods[].serving).
    NO_READY_ENDPOINTS = "NoReadyEndpoints"
    # The Service's EndpointSlices could not be read: Ready cannot say traffic reaches the pods.
    ENDPOINTS_UNREAD = "EndpointsUnread"
    NODE_MEMORY_PRESSURE = "NodeMemoryPressure"  # a node fell below the available floor
    NODE_MEMORY_RECOVERED = "NodeMemoryRecovered"  # and came back above it
    SPEC_APPLIED = "SpecApplied"  # an edit's children applied: what it does to the pods
    CHILD_RESTORED = "ChildRestored"  # a child deleted or edited outside Fusebox, put back
    # No node tells the GPU memory yet (a pool scaling from zero): retried, not refused.
    WAITING_FOR_GPU_NODES = "WaitingForGPUNodes"
    # The Secret of the admin token's name is not one the operator wrote for the service.
    ADMIN_SECRET_REFUSED = "AdminSecretRefused"
    # spec.mode Observe: an action (or breaker, tier or scale change) decided and not taken.
    WOULD_ACT = "WouldAct"
    # Incident annotations (fusebox_operator.incident): set, removed, or refused.
    ACTIONS_PAUSED = "ActionsPaused"  # fusebox.dev/pause-actions seen: decide, never act
    ACTIONS_RESUMED = "ActionsResumed"
    BREAKER_RESET = "BreakerReset"  # fusebox.dev/reset-breaker: a new value closes the breaker
    TIER_PINNED = "TierPinned"  # fusebox.dev/pin-tier: the tier held while set
    TIER_UNPINNED = "TierUnpinned"
    INCIDENT_ANNOTATION_REMOVED = "IncidentAnnotationRemoved"
    INVALID_INCIDENT_ANNOTATION = "InvalidIncidentAnnotation"  # a bad value, or a misspelt name
    # s3:// and hf:// sources: the model-fetch init container's download (model_readiness).
    MODEL_DOWNLOADING = "ModelDownloading"
    MODEL_VERIFIED = "ModelVerified"
    MODEL_FETCH_FAILED = "ModelFetchFailed"  # the message names FetchReason and the pod
