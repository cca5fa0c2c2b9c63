"""Reads the process's memory: RSS, its memory cgroup, CUDA allocator, NVML.

Why: the stats file, the admin actions (memory before/after) and the local
memory guard all need the same figures, measured the same way. Every reader
returns `None` for what cannot be measured here (no cgroup limit, no CUDA,
no NVML), never a fake 0.

The cgroup figure is the working set (usage minus inactive file cache), as
the kubelet computes it for eviction: page cache the kernel can drop is not
pressure. The cgroup is looked up on every read, because a process can be
moved into another cgroup after it starts (the memory-guard test does).

NVML errors are logged, not swallowed: one device that NVML cannot read is
left out alone (the others are still reported), and the failure is logged
once per device and message every `NVML_ERROR_LOG_SECONDS`, so a GPU that
vanishes from the stats file has a reason in the log without one line a
second.
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Final

import structlog
import torch

from fusebox_contract.admin import MemoryFigures

CGROUP_ROOT = Path("/sys/fs/cgroup")
SELF_CGROUP = Path("/proc/self/cgroup")
# cgroup v1 reports "no limit" as a huge page-aligned number.
UNLIMITED_BYTES = 1 << 60
NVML_ERROR_LOG_SECONDS: Final = 300.0  # one line per device and message this often at most

log = structlog.get_logger("fusebox_server")


def cuda_initialized() -> bool:
    return bool(torch.cuda.is_initialized())  # type: ignore[no-untyped-call]


def rss_bytes() -> int | None:
    try:
        fields = Path("/proc/self/statm").read_text().split()
    except OSError:
        return None
    return int(fields[1]) * os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class CgroupMemory:
    usage_bytes: int | None
    limit_bytes: int | None


def _memory_cgroup_dir(
    self_cgroup: Path = SELF_CGROUP, cgroup_root: Path = CGROUP_ROOT
) -> tuple[Path, int] | None:
    """(directory, cgroup version) of this process's memory cgroup."""
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        return None
    v1_mount = cgroup_root / "memory"
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(",") and v1_mount.is_dir():
            candidate = v1_mount / path.lstrip("/")
            return (candidate if candidate.is_dir() else v1_mount), 1
    for line in lines:
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0" and controllers == "":
            candidate = cgroup_root / path.lstrip("/")
            return (candidate if candidate.is_dir() else cgroup_root), 2
    return None


def _read_int(path: Path) -> int | None:
    try:
        raw = path.read_text().strip()
    except OSError:
        return None
    if raw == "max":
        return None
    try:
        return int(raw)
    except ValueError:
        return None


def _stat_value(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def cgroup_memory(self_cgroup: Path = SELF_CGROUP, cgroup_root: Path = CGROUP_ROOT) -> CgroupMemory:
    """The working set and limit of this process's memory cgroup, v1 or v2 (the paths
    are parameters so a test can hand it either layout)."""
    found = _memory_cgroup_dir(self_cgroup, cgroup_root)
    if found is None:
        return CgroupMemory(None, None)
    directory, version = found
    if version == 1:
        usage = _read_int(directory / "memory.usage_in_bytes")
        limit = _read_int(directory / "memory.limit_in_bytes")
        inactive = _stat_value(directory / "memory.stat", "total_inactive_file")
    else:
        usage = _read_int(directory / "memory.current")
        limit = _read_int(directory / "memory.max")
        inactive = _stat_value(directory / "memory.stat", "inactive_file")
    if limit is not None and limit >= UNLIMITED_BYTES:
        limit = None
    working_set = None if usage is None else max(0, usage - inactive)
    return CgroupMemory(working_set, limit)


def cuda_memory(device: torch.device | None = None) -> dict[str, int | None]:
    """Allocated/reserved bytes on a CUDA device; None on CPU or before CUDA is used."""
    if device is not None and device.type != "cuda":
        return {"allocated_bytes": None, "reserved_bytes": None}
    if not torch.cuda.is_available() or not cuda_initialized():
        return {"allocated_bytes": None, "reserved_bytes": None}
    return {
        "allocated_bytes": int(torch.cuda.memory_allocated(device)),
        "reserved_bytes": int(torch.cuda.memory_reserved(device)),
    }


def cuda_stats(device: torch.device) -> dict[str, int | None]:
    """The stats file's `cuda` block."""
    empty: dict[str, int | None] = {
        "allocated_bytes": None,
        "reserved_bytes": None,
        "num_alloc_retries": None,
        "num_ooms": None,
        "contexts": None,
    }
    if device.type != "cuda" or not cuda_initialized():
        return empty
    stats = torch.cuda.memory_stats(device)
    contexts = sum(
        1 for index in range(torch.cuda.device_count()) if torch.cuda.memory_reserved(index) > 0
    )
    return {
        "allocated_bytes": int(torch.cuda.memory_allocated(device)),
        "reserved_bytes": int(torch.cuda.memory_reserved(device)),
        "num_alloc_retries": int(stats.get("num_alloc_retries", 0)),
        "num_ooms": int(stats.get("num_ooms", 0)),
        "contexts": max(contexts, 1),
    }


def cuda_total_bytes(device: torch.device) -> int | None:
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return int(torch.cuda.get_device_properties(device).total_memory)


def _load_pynvml() -> ModuleType | None:
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return None


class Nvml:
    """Device memory per visible GPU through NVML; [] where there is no driver.

    `load` gives pynvml, or None when nvidia-ml-py is not installed (tests hand
    in a fake: NVML is the hardware edge).
    """

    def __init__(
        self,
        load: Callable[[], ModuleType | None] = _load_pynvml,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._logged_at: dict[tuple[str, int | None, str], float] = {}
        self._nvml: Any = load()
        if self._nvml is None:
            return
        try:
            self._nvml.nvmlInit()
        except Exception as error:  # any failure of a C library's binding: no GPU figures
            # Normal in a CPU pod, so INFO; the sidecar warns when the server is on a GPU.
            log.info("nvml_unavailable", error=_error_text(error))
            self._nvml = None

    def devices(self) -> list[dict[str, Any]]:
        if self._nvml is None:
            return []
        nvml = self._nvml
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as error:
            self._log_error("nvml_device_count_failed", None, error)
            return []
        found: list[dict[str, Any]] = []
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                info = nvml.nvmlDeviceGetMemoryInfo(handle)
                uuid = nvml.nvmlDeviceGetUUID(handle)
            except Exception as error:
                self._log_error("nvml_device_read_failed", index, error)
                continue  # this device only: the others are still reported
            found.append(
                {
                    "index": index,
                    "uuid": uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                    "memory_used_bytes": int(info.used),
                    "memory_total_bytes": int(info.total),
                }
            )
        return found

    def _log_error(self, event: str, index: int | None, error: Exception) -> None:
        text = _error_text(error)
        key = (event, index, text)
        now = self._clock()
        last = self._logged_at.get(key)
        if last is not None and now - last < NVML_ERROR_LOG_SECONDS:
            return
        self._logged_at[key] = now
        log.warning(event, gpu=index, error=text)


def _error_text(error: Exception) -> str:
    return str(error) or type(error).__name__


def memory_snapshot(device: torch.device) -> MemoryFigures:
    """Before/after figures for admin actions."""
    cgroup = cgroup_memory()
    cuda = cuda_memory(device)
    return MemoryFigures(
        rss_bytes=rss_bytes(),
        cgroup_memory_usage_bytes=cgroup.usage_bytes,
        cuda_allocated_bytes=cuda["allocated_bytes"],
        cuda_reserved_bytes=cuda["reserved_bytes"],
    )
