"""A memory probe for the operator under the fleet bench, loaded by Python's startup
(`sitecustomize`) only when the bench puts this folder on the operator's path
(`--memory-probe`); the operator's shipped code carries no profiling hook.

Why: the operator's RSS grew about 0.5 MiB per service and nobody could say where.
With FUSEBOX_MEMORY_PROBE_DIR set this starts tracemalloc (FUSEBOX_MEMORY_PROBE_FRAMES
frames per allocation, default 1: cheap enough to leave the operator's pace alone;
0: no tracemalloc, the figures alone) and, on SIGUSR1, writes `<n>.snapshot`
(tracemalloc's own format, for `tracemalloc.Snapshot.load` and `compare_to`) and
`<n>.json` (RSS, the traced heap, glibc's malloc counters, resident bytes by kind of
mapping, the objects the collector tracks by type, and the RSS once glibc's
`malloc_trim(0)` has returned the free pages it held: how much of the RSS was
fragmentation) into that folder.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import signal
import sys
import tracemalloc
from collections import Counter
from pathlib import Path
from types import FrameType


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
            "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


def _malloc_counters() -> dict[str, int]:
    """glibc's mallinfo2: `arena` bytes from sbrk, `hblkhd` in mmapped blocks,
    `uordblks` in use, `fordblks` free but kept (fragmentation and arena slack)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        info = libc.mallinfo2()
    except (OSError, AttributeError):
        return {}
    return {name: int(getattr(info, name)) for name, _ in _MallInfo2._fields_}


def _rss_after_malloc_trim() -> int | None:
    """The RSS once glibc has handed back every free page it can (malloc_trim(0))."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        return None
    return _status_bytes("VmRSS")


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _mappings() -> dict[str, int]:
    """Resident bytes by kind of mapping (/proc/self/smaps): glibc's main heap,
    pymalloc's 1 MiB arenas, other anonymous memory (the arenas glibc gives threads,
    up to MALLOC_ARENA_MAX; blocks mmapped whole; thread stacks), files."""
    kinds: dict[str, int] = {}
    kind = ""
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if "-" in head[0] and not head[0].endswith(":"):
            start, end = (int(x, 16) for x in head[0].split("-"))
            size, name = end - start, head[5] if len(head) > 5 else ""
            if name == "[heap]" or name.startswith("[stack"):
                kind = name
            elif name:
                kind = "file"
            elif size == 1024**2:
                kind = "anon 1 MiB (pymalloc arena)"
            else:
                kind = "anon other (thread arenas, large blocks, thread stacks)"
        elif head[0] == "Rss:":
            kinds[kind] = kinds.get(kind, 0) + int(head[1]) * 1024
    return kinds


def _dump(folder: Path, count: list[int]) -> None:
    count[0] += 1
    stem = folder / str(count[0])
    rss = _status_bytes("VmRSS")
    snapshot = tracemalloc.take_snapshot() if tracemalloc.is_tracing() else None
    current, peak = tracemalloc.get_traced_memory()
    types = Counter(type(o).__name__ for o in gc.get_objects())
    facts = {
        "rss_bytes": rss,
        "rss_anon_bytes": _status_bytes("RssAnon"),
        "traced_bytes": current,
        "traced_peak_bytes": peak,
        "tracemalloc_overhead_bytes": tracemalloc.get_tracemalloc_memory(),
        "malloc": _malloc_counters(),
        "rss_by_mapping": _mappings(),
        "threads": len(os.listdir("/proc/self/task")),
        "gc_objects_by_type": dict(types.most_common(40)),
    }
    if snapshot is not None:
        snapshot.dump(str(stem) + ".snapshot.tmp")
        os.replace(str(stem) + ".snapshot.tmp", str(stem) + ".snapshot")
    # Last: the trim changes what the figures above describe.
    facts["rss_after_malloc_trim_bytes"] = _rss_after_malloc_trim()
    Path(str(stem) + ".json").write_text(json.dumps(facts, indent=1))


def _install() -> None:
    folder = os.environ.get("FUSEBOX_MEMORY_PROBE_DIR")
    if not folder:
        return
    frames = int(os.environ.get("FUSEBOX_MEMORY_PROBE_FRAMES", "1"))
    if frames > 0:
        tracemalloc.start(frames)
    count = [0]

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        try:
            _dump(Path(folder), count)
        except Exception as error:  # a failed probe must never stop the operator
            print(f"memory probe: {error!r}", file=sys.stderr)

    signal.signal(signal.SIGUSR1, on_signal)


_install()
