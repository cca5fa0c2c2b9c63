"""Whether a variant change can load the new variant before it releases the old one.

Why: a change of variant (the fallback tier, the swap rung, the way back)
must never leave a pod with no model. The safe order is to load the new
variant beside the old one, which serves until the new one has passed its
warm-up, and release the old one only then: a load that fails leaves the
old one serving, untouched. That needs room for both at once. When there is
no room (the usual case for a fallback meant to relieve memory pressure),
the old variant is released first, and `variants.py` loads it again if the
new one fails.

"Room" is measured, not guessed: the new variant needs its footprint (what
it measured when it was last loaded, else its weights' size on disk, which
a quantized-on-load fallback passes through in full) in every memory a load
fills: host memory (the cgroup limit, else the machine's), and on CUDA the
device too. Both must stay under the memory guard's ratio of their limit,
the line past which the server refuses requests anyway. A figure that
cannot be read means no room: releasing first is the order that always
fits.

`load_order` is pure; the readers below it take the figures.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import torch

from fusebox_server.model import memory

MEMINFO: Final = Path("/proc/meminfo")
WEIGHT_SUFFIXES: Final = (".safetensors", ".bin", ".pt", ".pth")


class LoadOrder(enum.StrEnum):
    LOAD_FIRST = "load-first"  # the old variant serves until the new one is warm
    RELEASE_FIRST = "release-first"  # the old one goes first; it is restored on failure


@dataclass(frozen=True)
class MemoryRoom:
    """One memory a load fills (host memory, a GPU): what it uses now and its limit."""

    name: str
    used_bytes: int | None
    limit_bytes: int | None


def load_order(
    needed_bytes: int | None, rooms: Sequence[MemoryRoom], guard_ratio: float
) -> LoadOrder:
    """LOAD_FIRST when `needed_bytes` more stay under `guard_ratio` of every room's limit."""
    if needed_bytes is None or not rooms:
        return LoadOrder.RELEASE_FIRST
    for room in rooms:
        if room.used_bytes is None or room.limit_bytes is None:
            return LoadOrder.RELEASE_FIRST
        if room.used_bytes + needed_bytes > guard_ratio * room.limit_bytes:
            return LoadOrder.RELEASE_FIRST
    return LoadOrder.LOAD_FIRST


def weights_on_disk_bytes(model_dir: Path) -> int | None:
    """The size of a model directory's weight files, or None when it has none to read."""
    try:
        sizes = [
            path.stat().st_size
            for path in model_dir.iterdir()
            if path.suffix in WEIGHT_SUFFIXES and path.is_file()
        ]
    except OSError:
        return None
    return sum(sizes) if sizes else None


def _meminfo_bytes(key: str, meminfo: Path) -> int | None:
    try:
        for line in meminfo.read_text().splitlines():
            name, _, value = line.partition(":")
            if name == key:
                return int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def host_room(meminfo: Path = MEMINFO) -> MemoryRoom:
    """This process's memory cgroup (working set and limit), else the machine's memory."""
    cgroup = memory.cgroup_memory()
    if cgroup.limit_bytes is not None and cgroup.usage_bytes is not None:
        return MemoryRoom("cgroup", cgroup.usage_bytes, cgroup.limit_bytes)
    total = _meminfo_bytes("MemTotal", meminfo)
    available = _meminfo_bytes("MemAvailable", meminfo)
    used = total - available if total is not None and available is not None else None
    return MemoryRoom("host", used, total)


def device_room(device: torch.device) -> MemoryRoom | None:
    """The CUDA device's memory in use (by every process) and its total; None off CUDA."""
    if device.type != "cuda":
        return None
    try:
        free, total = torch.cuda.mem_get_info(device)
    except RuntimeError:
        return MemoryRoom("gpu", None, None)
    return MemoryRoom("gpu", int(total - free), int(total))


def rooms(device: torch.device) -> list[MemoryRoom]:
    """Every memory a load on `device` fills: the host always (weights pass through it)."""
    gpu = device_room(device)
    return [host_room(), *([gpu] if gpu is not None else [])]
