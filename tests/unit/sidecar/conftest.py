"""Fixtures for the sidecar's unit tests.

`fake_pynvml` is the only fake in the test suite: there is no GPU on the
development machine, so NVML is replaced at the hardware edge by a module
object with the same names (nvmlInit, nvmlDeviceGetMemoryInfo, NVMLError
subclasses with the real error codes). It is handed to `NvmlReader`
directly; nothing is patched into `sys.modules`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType, SimpleNamespace

import pytest

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
    CudaMemory,
    GpuMemory,
    HistogramCounts,
    LatencySummary,
    PrefixCacheStats,
    Quality,
    RuntimeState,
    StatsDocument,
    Tokens,
)

# Real NVML return codes (nvml.h), so the fake classifies like the library.
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999
_ERROR_NAMES = {
    NVML_ERROR_NOT_SUPPORTED: ("NVMLError_NotSupported", "Not Supported"),
    NVML_ERROR_DRIVER_NOT_LOADED: ("NVMLError_DriverNotLoaded", "Driver Not Loaded"),
    NVML_ERROR_LIBRARY_NOT_FOUND: ("NVMLError_LibraryNotFound", "NVML Shared Library Not Found"),
    NVML_ERROR_GPU_IS_LOST: ("NVMLError_GpuIsLost", "GPU is lost"),
    NVML_ERROR_UNKNOWN: ("NVMLError_Unknown", "Unknown Error"),
}

MiB = 1024 * 1024
GiB = 1024 * MiB


@dataclass
class FakeDevice:
    """One simulated GPU. `processes` None means per-process info is
    unsupported; a process's memory None means NVML withholds it. `lost`
    makes every call answer GpuIsLost; `memory_error` and `processes_error`
    make only that call fail, with an NVML return code."""

    used_bytes: int = 3 * GiB
    total_bytes: int = 80 * GiB
    processes: list[tuple[int, int | None]] | None = field(default_factory=list)
    lost: bool = False
    memory_error: int | None = None
    processes_error: int | None = None


def _make_fake_pynvml(devices: list[FakeDevice], init_error: int | None = None) -> ModuleType:
    module = ModuleType("pynvml")

    class NVMLError(Exception):
        value = 999

        def __str__(self) -> str:
            return _ERROR_NAMES.get(self.value, ("", f"NVML error {self.value}"))[1]

    errors: dict[int, type[NVMLError]] = {}
    for code, (name, _) in _ERROR_NAMES.items():
        errors[code] = type(name, (NVMLError,), {"value": code})
        setattr(module, name, errors[code])
    module.NVML_ERROR_GPU_IS_LOST = NVML_ERROR_GPU_IS_LOST  # type: ignore[attr-defined]
    module.NVMLError = NVMLError  # type: ignore[attr-defined]
    calls: dict[str, int] = {"init": 0, "shutdown": 0}

    def check(device: FakeDevice) -> None:
        if device.lost:
            raise errors[NVML_ERROR_GPU_IS_LOST]()

    def nvml_init() -> None:
        calls["init"] += 1
        if module.init_error is not None:  # type: ignore[attr-defined]
            raise errors[module.init_error]()  # type: ignore[attr-defined]

    def get_handle(index: int) -> FakeDevice:
        return devices[index]

    def get_memory_info(handle: FakeDevice) -> SimpleNamespace:
        check(handle)
        if handle.memory_error is not None:
            raise errors[handle.memory_error]()
        return SimpleNamespace(
            total=handle.total_bytes,
            used=handle.used_bytes,
            free=handle.total_bytes - handle.used_bytes,
        )

    def get_processes(handle: FakeDevice) -> list[SimpleNamespace]:
        check(handle)
        if handle.processes_error is not None:
            raise errors[handle.processes_error]()
        if handle.processes is None:
            raise errors[NVML_ERROR_NOT_SUPPORTED]()
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in handle.processes]

    def shutdown() -> None:
        calls["shutdown"] += 1

    module.nvmlInit = nvml_init  # type: ignore[attr-defined]
    module.nvmlShutdown = shutdown  # type: ignore[attr-defined]
    module.nvmlDeviceGetCount = lambda: len(devices)  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByIndex = get_handle  # type: ignore[attr-defined]
    module.nvmlDeviceGetMemoryInfo = get_memory_info  # type: ignore[attr-defined]
    module.nvmlDeviceGetComputeRunningProcesses = get_processes  # type: ignore[attr-defined]
    module.calls = calls  # type: ignore[attr-defined]
    module.init_error = init_error  # type: ignore[attr-defined]  # None: the driver is up now
    return module


@pytest.fixture
def fake_pynvml() -> Callable[..., ModuleType]:
    """Factory: `fake_pynvml([FakeDevice(...)], init_error=None)`."""
    return _make_fake_pynvml


def _histogram(
    name: LatencyHistogram, per_bucket: list[int], sum_seconds: float
) -> HistogramCounts:
    """Cumulative counts from per-bucket ones (one more than the bounds: the last is +Inf)."""
    assert len(per_bucket) == len(name.buckets) + 1
    cumulative = [sum(per_bucket[: i + 1]) for i in range(len(per_bucket))]
    return HistogramCounts(tuple(float(c) for c in cumulative[:-1]), cumulative[-1], sum_seconds)


def _spread(name: LatencyHistogram, placed: dict[int, int]) -> list[int]:
    return [placed.get(i, 0) for i in range(len(name.buckets) + 1)]


# The example from docs/stats-file.md, with realistic figures, built with the
# contract's dataclasses: what the server's writer writes.
EXAMPLE_STATS = StatsDocument(
    written_at=1796000000.12,
    started_at=1795999000.0,
    pid=4242,
    model_name="chat",
    rss_bytes=1_234_567_890,
    cgroup_memory_usage_bytes=2_345_678_901,
    cgroup_memory_limit_bytes=107_374_182_400,
    cuda=CudaMemory(
        allocated_bytes=14_000_000_000,
        reserved_bytes=16_000_000_000,
        num_alloc_retries=2,
        num_ooms=1,
        contexts=1,
    ),
    nvml=(GpuMemory(index=0, memory_used_bytes=17 * GiB, memory_total_bytes=80 * GiB),),
    queue_length=5,
    running=8,
    tokenizer_cache_entries=812,
    tokenizer_cache_hits_total=10,
    tokenizer_template_hits_total=3,
    requests={
        RequestOutcome.SUCCEEDED: 1000,
        RequestOutcome.FAILED: 3,
        RequestOutcome.REJECTED: 40,
        RequestOutcome.TIMED_OUT: 2,
        RequestOutcome.CANCELLED: 6,
        RequestOutcome.INVALID: 9,
    },
    latency={
        LatencyMetric.TTFT: LatencySummary(p99_seconds=0.05, count=100),
        LatencyMetric.ITL: LatencySummary(p99_seconds=0.02, count=3000),
        LatencyMetric.E2E: LatencySummary(p99_seconds=0.90, count=100),
    },
    histograms={
        LatencyHistogram.TTFT: _histogram(
            LatencyHistogram.TTFT, _spread(LatencyHistogram.TTFT, {2: 60, 3: 39, 4: 1}), 3.1
        ),
        LatencyHistogram.ITL: _histogram(
            LatencyHistogram.ITL, _spread(LatencyHistogram.ITL, {3: 2000, 4: 970, 5: 30}), 33.0
        ),
        LatencyHistogram.E2E: _histogram(
            LatencyHistogram.E2E, _spread(LatencyHistogram.E2E, {2: 90, 3: 10}), 45.5
        ),
        LatencyHistogram.QUEUE: _histogram(
            LatencyHistogram.QUEUE, _spread(LatencyHistogram.QUEUE, {0: 70, 5: 28, 9: 2}), 4.2
        ),
    },
    tokens=Tokens(prompt_total=52_000, generation_total=31_000),
    prefix_cache=PrefixCacheStats(
        hits_total=300,
        misses_total=700,
        evictions_total=12,
        reused_tokens_total=297_600,
        entries=40,
        bytes=805_306_368,
        capacity_bytes=1_073_741_824,
    ),
    quality=Quality(sampled_total=10, failed_total=1, failure_ratio=0.1),
    heartbeats={HeartbeatThread.LOOP: 1796000000.10, HeartbeatThread.WORKER: 1796000000.05},
    state=RuntimeState(
        breaker=BreakerState.OPEN,
        admit_percent=5,
        degradation_level=DegradationLevel.FALLBACK_MODEL,
        variant=Variant.FALLBACK,
        model_loaded=True,
        memory_guard_active=False,
        model_revision="main",
        dtype=Dtype.BFLOAT16,
        quantization=Quantization.INT8,
        fallback_configured=True,
        fallback_available=False,
        fallback_unavailable_reason="the fallback is unavailable: int4 needs a CUDA device",
        target_variant=Variant.FALLBACK,
        converging=False,
    ),
)


@pytest.fixture
def stats_document() -> StatsDocument:
    """A complete, valid stats document (frozen: vary it with `dataclasses.replace`)."""
    return EXAMPLE_STATS


@pytest.fixture
def device_class() -> type[FakeDevice]:
    """The simulated GPU type, for building `fake_pynvml` devices."""
    return FakeDevice
