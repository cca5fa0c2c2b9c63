"""Pure parsing of the server's `/proc/<pid>/status`, which the sidecar reads itself.

The stats file's parser is not here: it is the contract's
(`fusebox_contract.stats.parse`), shared with the server's writer.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True)
class ProcStatus:
    """What the sidecar needs from `/proc/<pid>/status`."""

    rss_bytes: float | None


def parse_proc_status(text: str) -> ProcStatus:
    """Read VmRSS (reported in kB, meaning KiB) from a status file's text.

    Kernel threads and zombies have no VmRSS line: their RSS is absent.
    """
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name != "VmRSS":
            continue
        parts = rest.split()
        if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
            return ProcStatus(rss_bytes=float(int(parts[0]) * 1024))
        return ProcStatus(rss_bytes=None)
    return ProcStatus(rss_bytes=None)


class ProcOutcome(StrEnum):
    """How reading the server's `/proc/<pid>/status` went."""

    MEASURED = "measured"
    NO_PID = "no_pid"
    GONE = "gone"
    EXITED = "exited"  # gone after the sidecar measured it: the server process ended
    UNREADABLE = "unreadable"


@dataclass(frozen=True)
class ProcReading:
    outcome: ProcOutcome
    rss_bytes: float | None = None
    detail: str = ""
