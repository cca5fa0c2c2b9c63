"""The node's memory as the pod sees it: `/proc/meminfo` and `/proc/pressure/memory`.

Why: another tenant on the node can drive it towards the kubelet's eviction
threshold (or the kernel's global OOM killer) while the server stays well
inside its own limit, so no per-pod figure moves. Neither file is
namespaced: a container reads the host's MemTotal and MemAvailable (no
lxcfs here) and the host's memory pressure stall information. The operator
compares MemAvailable with a floor; PSI is exported for people and alerts.

Parsing is pure; `read_node_memory` is the I/O edge and turns every failure
(a kernel without PSI, a masked file) into absent values, never an exception.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fusebox_contract.metrics import MemoryStall

KIB = 1024


@dataclass(frozen=True)
class NodeMemory:
    """One reading of the node's memory; None means not measured."""

    available_bytes: float | None = None
    total_bytes: float | None = None
    # Share of the last 10 s (0..1) in which tasks stalled waiting for memory.
    pressure: tuple[tuple[MemoryStall, float], ...] = ()


def parse_meminfo(text: str) -> tuple[float | None, float | None]:
    """(MemAvailable, MemTotal) in bytes from /proc/meminfo's text (values are in kB = KiB)."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if name in ("MemAvailable", "MemTotal") and len(parts) == 2 and parts[1] == "kB":
            if parts[0].isdigit():
                found[name] = float(int(parts[0]) * KIB)
    return found.get("MemAvailable"), found.get("MemTotal")


def parse_pressure(text: str) -> tuple[tuple[MemoryStall, float], ...]:
    """The avg10 share (0..1) of each stall line of /proc/pressure/memory.

    `some avg10=1.53 avg60=0.40 avg300=0.10 total=123` -> ((SOME, 0.0153), ...).
    """
    shares: list[tuple[MemoryStall, float]] = []
    for line in text.splitlines():
        words = line.split()
        # A blank line (or anything but a known stall kind first) is skipped, never raised on.
        if not words or words[0] not in tuple(MemoryStall):
            continue
        kind, *fields = words
        for field in fields:
            key, _, value = field.partition("=")
            if key != "avg10":
                continue
            try:
                percent = float(value)
            except ValueError:
                break
            if 0 <= percent <= 100:
                shares.append((MemoryStall(kind), percent / 100))
            break
    return tuple(shares)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="strict")
    except (OSError, UnicodeDecodeError):
        return None


def read_node_memory(proc_root: Path) -> NodeMemory:
    """Read both files under `proc_root`; what cannot be read is absent."""
    meminfo = _read(proc_root / "meminfo")
    available, total = parse_meminfo(meminfo) if meminfo is not None else (None, None)
    pressure_text = _read(proc_root / "pressure" / "memory")
    pressure = parse_pressure(pressure_text) if pressure_text is not None else ()
    return NodeMemory(available, total, pressure)
