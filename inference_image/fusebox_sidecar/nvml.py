"""GPU memory through NVML, measured by the sidecar itself.

The only module that touches `pynvml` (the nvidia-ml-py distribution). The
module object is injected, so tests hand in a fake one (there is no GPU on
the development machine) without patching `sys.modules`.

Why classify failures: "no GPU here" and "the GPU fell off the bus" look the
same to a naive reader (no numbers), but the first is normal in a CPU pod
and the second must page someone. So: library missing, NVML failing to
initialise, or zero devices → GPU metrics absent and `fusebox_gpu_visible 0`;
`NVMLError_GpuIsLost` on a device (from any call) → that device's numbers
absent and `fusebox_gpu_lost 1`; any other error reading a device's memory →
its figures fall back to the server's own (`read_error` says why, for the
log); per-process memory unavailable → only the device-level numbers.

NVML that fails to initialise is tried again every `RETRY_INIT_EVERY_READS`
reads: a driver or a DRA claim that is not ready when the sidecar starts
must not leave the GPU unmeasured for the container's whole life.

NVML reports host PIDs. The server's own share of a device can only be told
apart when the sidecar sees host PIDs (it runs in the host's PID namespace,
as in `bench/gpu_check.py`); inside a pod the PIDs differ and the per-process
figure is absent, leaving the device-level one.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from enum import StrEnum
from types import ModuleType
from typing import Final

RETRY_INIT_EVERY_READS: Final = 20
"""While NVML is unavailable, `nvmlInit` is tried again every this many reads (scrapes):
every 5 minutes at the chart's 15 s interval, cheap enough, and soon enough for a
driver that came up late."""


class GpuAccess(StrEnum):
    """Whether the sidecar can see GPUs through NVML, and if not, why."""

    OK = "ok"
    NOT_INSTALLED = "not_installed"
    UNAVAILABLE = "unavailable"
    NO_GPU = "no_gpu"


@dataclass(frozen=True)
class GpuDevice:
    """One device's memory; None where NVML could not say."""

    index: int
    used_bytes: float | None
    total_bytes: float | None
    process_used_bytes: float | None = None
    lost: bool = False
    # Why NVML could not read the device's memory (empty when it could, or when it is lost).
    read_error: str = ""


@dataclass(frozen=True)
class GpuReading:
    access: GpuAccess
    devices: tuple[GpuDevice, ...] = ()
    detail: str = ""

    @property
    def visible(self) -> bool:
        return self.access is GpuAccess.OK

    @property
    def lost(self) -> bool:
        return any(device.lost for device in self.devices)


def load_pynvml() -> ModuleType | None:
    """The real `pynvml` module, or None when nvidia-ml-py is not installed."""
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return None


class NvmlReader:
    """Initialises NVML (again every `retry_every_reads` reads while it fails) and reads
    every visible device per scrape."""

    def __init__(
        self, nvml: ModuleType | None, retry_every_reads: int = RETRY_INIT_EVERY_READS
    ) -> None:
        self._nvml = nvml
        self._device_count = 0
        self._retry_every_reads = retry_every_reads
        self._reads_unavailable = 0
        self._access, self._detail = self._initialise()

    def _initialise(self) -> tuple[GpuAccess, str]:
        nvml = self._nvml
        if nvml is None:
            return GpuAccess.NOT_INSTALLED, "nvidia-ml-py (pynvml) is not installed"
        try:
            nvml.nvmlInit()
        except (nvml.NVMLError, OSError) as error:
            return GpuAccess.UNAVAILABLE, f"NVML did not initialise: {error}"
        try:
            self._device_count = int(nvml.nvmlDeviceGetCount())
        except (nvml.NVMLError, OSError) as error:
            self._shutdown()  # nvmlInit counts references: a retry must not add one
            return GpuAccess.UNAVAILABLE, f"NVML did not initialise: {error}"
        if self._device_count == 0:
            return GpuAccess.NO_GPU, "NVML sees no GPU"
        return GpuAccess.OK, f"NVML sees {self._device_count} GPU(s)"

    def read(self, server_pid: int | None) -> GpuReading:
        if self._access is GpuAccess.UNAVAILABLE:
            self._reads_unavailable += 1
            if self._reads_unavailable >= self._retry_every_reads:
                self._reads_unavailable = 0
                self._access, self._detail = self._initialise()
        if self._access is not GpuAccess.OK:
            return GpuReading(self._access, detail=self._detail)
        devices = tuple(self._read_device(index, server_pid) for index in range(self._device_count))
        return GpuReading(GpuAccess.OK, devices, self._detail)

    def _read_device(self, index: int, server_pid: int | None) -> GpuDevice:
        nvml = self._nvml
        assert nvml is not None
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        except nvml.NVMLError as error:
            if self._is_gpu_lost(error):
                return GpuDevice(index, None, None, lost=True)
            return GpuDevice(index, None, None, read_error=str(error) or type(error).__name__)
        used, total = float(memory.used), float(memory.total)
        try:
            processes = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except nvml.NVMLError as error:
            if self._is_gpu_lost(error):
                # Figures read a moment before the loss describe a device that is gone.
                return GpuDevice(index, None, None, lost=True)
            return GpuDevice(index, used, total)
        return GpuDevice(index, used, total, _process_used_bytes(processes, server_pid))

    def _is_gpu_lost(self, error: BaseException) -> bool:
        nvml = self._nvml
        lost_class = getattr(nvml, "NVMLError_GpuIsLost", None)
        if isinstance(lost_class, type) and isinstance(error, lost_class):
            return True
        return getattr(error, "value", None) == getattr(nvml, "NVML_ERROR_GPU_IS_LOST", None)

    def close(self) -> None:
        if self._access is GpuAccess.OK:
            self._shutdown()

    def _shutdown(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass


def _process_used_bytes(processes: object, server_pid: int | None) -> float | None:
    """The server's memory on a device, summed over its entries.

    None when the pid is unknown, not in NVML's (host PID) list, or NVML
    withholds the figure (`usedGpuMemory` None: per-process accounting off,
    or a platform that does not report it).
    """
    if server_pid is None or not isinstance(processes, list | tuple):
        return None
    matching = [process for process in processes if getattr(process, "pid", None) == server_pid]
    if not matching:
        return None
    figures: list[int] = []
    for process in matching:
        figure = getattr(process, "usedGpuMemory", None)
        if not isinstance(figure, int):
            return None
        figures.append(figure)
    return float(sum(figures))
