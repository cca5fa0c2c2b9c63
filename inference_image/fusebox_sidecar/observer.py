"""The sidecar's I/O edge: read the stats file, `/proc` and NVML once per scrape.

Kept apart from the collectors so those stay pure. Every expected failure
(file missing, unreadable, garbage; process gone; NVML down) becomes a value
in the `Observation`, never an exception, so a scrape always answers.

The only memory kept between scrapes: the last valid stats file's
`written_at` (so `fusebox_server_stats_age_seconds` keeps growing after the
file is deleted or corrupted) and its `pid` (so the server's RSS is still
measured from `/proc` while its stats file is broken), and since when, on
the monotonic clock, that `written_at` and each heartbeat stamp have kept
their value (so a stamp in the future, after the clock stepped back, cannot
hide a server that stopped writing), and when the read before it changed was
(so a forward step cannot make a stamp written since then look older),
and the counters' totals, carried across server restarts and variant swaps
(counters.py), so an exported counter never goes back or counts twice,
and the free-text label values seen within the last hour (cardinality.py),
so a file gone wrong cannot mint a series per write.
Problems are logged when they change, not on every scrape, so a broken file
does not flood the log at the scrape rate.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Final

from fusebox_contract.model_fetch import parse as parse_fetch_report
from fusebox_contract.names import HeartbeatThread
from fusebox_contract.stats import StatsDocument, StatsReading, parse
from fusebox_sidecar.cardinality import (
    MAX_RELAYED_GPUS,
    MAX_TEXT_LABEL_VALUES,
    TEXT_LABEL_WINDOW_SECONDS,
    TextField,
    TextLabelBudget,
    relayable_gpus,
)
from fusebox_sidecar.collectors import FetchReading, Observation, StampAge
from fusebox_sidecar.counters import CounterCarry
from fusebox_sidecar.node_memory import read_node_memory
from fusebox_sidecar.nvml import GpuAccess, GpuReading, NvmlReader
from fusebox_sidecar.readings import ProcOutcome, ProcReading, parse_proc_status

log = logging.getLogger(__name__)

# A stats file is a few KiB; anything much larger is not ours and is not read.
MAX_STATS_BYTES: Final = 1024 * 1024
# The fetcher's report is one short JSON document (model_fetch.FetchReport).
MAX_FETCH_REPORT_BYTES: Final = 64 * 1024
# The server and the sidecar share the node's clock, so a stamp further
# ahead than this was written before the clock stepped back (or is wrong).
FUTURE_STAMP_TOLERANCE_SECONDS: Final = 5.0
# A label value dropped by cardinality.py is warned about again only after this long
# without that problem: a file that flaps between good and bad, or names a new bad
# value at every write, logs once, not once per scrape.
DROPPED_LABEL_QUIET_SECONDS: Final = 3600.0


class Unreadable(Exception):
    """A file the sidecar reads is there but cannot be used; the message says why."""


def read_regular_file(path: Path, limit: int) -> tuple[bytes, float]:
    """A small file's bytes and its modification time.

    Raises FileNotFoundError, or Unreadable naming the path and the cause.
    """
    try:
        # O_NONBLOCK: a FIFO planted at the path must not hang every scrape.
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise
    except OSError as error:
        raise Unreadable(f"{path} is unreadable: {error.strerror or error}") from None
    try:
        found = os.fstat(descriptor)
        if not stat.S_ISREG(found.st_mode):
            raise Unreadable(f"{path} is not a regular file")
        with os.fdopen(descriptor, "rb", closefd=False) as opened:
            raw = opened.read(limit + 1)
    except OSError as error:
        raise Unreadable(f"{path} is unreadable: {error.strerror or error}") from None
    finally:
        os.close(descriptor)
    if len(raw) > limit:
        raise Unreadable(f"{path} is larger than {limit} bytes")
    return raw, found.st_mtime


def read_stats_file(path: Path) -> StatsReading:
    try:
        raw, _ = read_regular_file(path, MAX_STATS_BYTES)
    except FileNotFoundError:
        return StatsReading(None, f"stats file {path} is missing")
    except Unreadable as error:
        return StatsReading(None, f"stats file {error}")
    return parse(raw)


def read_fetch_report(path: Path) -> FetchReading | None:
    """The model fetcher's last report and when it was written; None without one (a
    local model, a fetcher not started yet, a file that holds no report)."""
    try:
        raw, written_at = read_regular_file(path, MAX_FETCH_REPORT_BYTES)
    except (FileNotFoundError, Unreadable):
        return None
    report = parse_fetch_report(raw.decode("utf-8", errors="replace"))
    return None if report is None else FetchReading(report, written_at)


def read_proc(proc_root: Path, pid: int | None, own_pid: int) -> ProcReading:
    if pid is None:
        return ProcReading(ProcOutcome.NO_PID, detail="no valid stats file has named a pid yet")
    if pid == own_pid:
        # Without a shared process namespace the server's pid (often 1) can
        # name the sidecar itself; its RSS would be a confident wrong answer.
        return ProcReading(
            ProcOutcome.UNREADABLE,
            detail=f"pid {pid} is the sidecar itself: the pod does not share its process namespace",
        )
    status_path = proc_root / str(pid) / "status"
    try:
        text = status_path.read_text(encoding="utf-8", errors="strict")
    except (FileNotFoundError, ProcessLookupError):
        return ProcReading(ProcOutcome.GONE, detail=f"no process {pid} in {proc_root}")
    except (OSError, UnicodeDecodeError) as error:
        return ProcReading(ProcOutcome.UNREADABLE, detail=f"{status_path} is unreadable: {error}")
    status = parse_proc_status(text)
    if status.rss_bytes is None:
        return ProcReading(ProcOutcome.UNREADABLE, detail=f"{status_path} has no VmRSS line")
    return ProcReading(ProcOutcome.MEASURED, rss_bytes=status.rss_bytes)


@dataclasses.dataclass
class _Sighting:
    stamp: float
    first_read: float  # monotonic: the first read that held this stamp
    read_before: float | None  # monotonic: the last read that held another one
    last_read: float


class StampWatch:
    """For each of the server's stamps, on the monotonic clock: since when it has kept
    its value, and when the last read before it changed was."""

    def __init__(self) -> None:
        self._sightings: dict[Hashable, _Sighting] = {}

    def age(self, key: Hashable, stamp: float, monotonic_now: float) -> StampAge:
        seen = self._sightings.get(key)
        if seen is None or seen.stamp != stamp:
            read_before = None if seen is None else seen.last_read
            seen = _Sighting(stamp, monotonic_now, read_before, monotonic_now)
            self._sightings[key] = seen
        seen.last_read = monotonic_now
        return StampAge(
            at_least_seconds=monotonic_now - seen.first_read,
            at_most_seconds=None if seen.read_before is None else monotonic_now - seen.read_before,
        )


class ServerObserver:
    """Gathers one `Observation` per scrape; safe to call from many threads."""

    def __init__(
        self,
        stats_path: Path,
        proc_root: Path,
        nvml: NvmlReader,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        fetch_report_path: Path | None = None,
    ) -> None:
        self._stats_path = stats_path
        self._fetch_report_path = fetch_report_path
        self._proc_root = proc_root
        self._nvml = nvml
        self._clock = clock
        self._monotonic = monotonic
        self._own_pid = os.getpid()
        self._lock = threading.Lock()
        self._last_written_at: float | None = None
        self._last_pid: int | None = None
        self._measured_pid: int | None = None  # the last pid whose /proc entry was read
        self._stamps = StampWatch()
        self._counters = CounterCarry()
        self._text_labels = TextLabelBudget()
        self._reported: dict[str, str | None] = {}
        self._dropped_seen: dict[str, float] = {}  # problem -> last seen (monotonic)

    def observe(self) -> Observation:
        with self._lock:
            stats = read_stats_file(self._stats_path)
            now_seconds = self._clock()
            monotonic_now = self._monotonic()
            document = stats.document
            if document is not None and document.written_at is not None:
                self._last_written_at = document.written_at
            if document is not None and document.pid is not None:
                self._last_pid = document.pid
            stats_age = StampAge()
            if self._last_written_at is not None:
                stats_age = self._stamps.age("written_at", self._last_written_at, monotonic_now)
            heartbeat_ages = self._heartbeat_ages(document, monotonic_now)
            withheld: tuple[TextField, ...] = ()
            if document is not None:
                # Exported counters are the sidecar's totals (counters.py), not the raw values.
                carried = self._counters.carried(document)
                bounded, withheld = self._text_labels.bounded(carried, monotonic_now)
                stats = dataclasses.replace(stats, document=bounded)
            proc = self._read_proc()
            gpu = self._nvml.read(self._last_pid)
            self._report(stats, now_seconds, proc, gpu)
            self._report_dropped_labels(document, gpu, withheld, monotonic_now)
            node = read_node_memory(self._proc_root)
            fetch = None
            if self._fetch_report_path is not None:
                fetch = read_fetch_report(self._fetch_report_path)
            if fetch is not None:
                fetch_age = self._stamps.age("fetch_report", fetch.written_at, monotonic_now)
                fetch = dataclasses.replace(fetch, stamp_age=fetch_age)
            return Observation(
                now_seconds,
                stats,
                self._last_written_at,
                proc,
                gpu,
                node,
                stats_age,
                heartbeat_ages,
                fetch,
            )

    def _read_proc(self) -> ProcReading:
        """The server's /proc entry. A pid the sidecar measured and that is gone now is a
        server that exited, not one hidden by another PID namespace: the RSS its last
        stats file wrote is a dead process's, and is not relayed."""
        proc = read_proc(self._proc_root, self._last_pid, self._own_pid)
        if proc.outcome is ProcOutcome.MEASURED:
            self._measured_pid = self._last_pid
        elif proc.outcome is ProcOutcome.GONE and self._last_pid == self._measured_pid:
            return ProcReading(ProcOutcome.EXITED, detail=f"server process {self._last_pid} exited")
        return proc

    def _heartbeat_ages(
        self, document: StatsDocument | None, monotonic_now: float
    ) -> dict[HeartbeatThread, StampAge]:
        if document is None:
            return {}
        return {
            thread: self._stamps.age(thread, stamp, monotonic_now)
            for thread, stamp in document.heartbeats.items()
        }

    def _report(
        self, stats: StatsReading, now_seconds: float, proc: ProcReading, gpu: GpuReading
    ) -> None:
        stats_problem = "; ".join(stats.problems) or None
        self._transition("stats", stats_problem, "stats file unusable", "stats file valid again")
        written_at = self._last_written_at
        ahead = written_at is not None and written_at - now_seconds > FUTURE_STAMP_TOLERANCE_SECONDS
        self._transition(
            "future_stamp",
            # A fixed text: the gap shrinks every scrape and must not log every scrape.
            "written_at is ahead of the sidecar's clock" if ahead else None,
            "stats file stamped in the future: its age counts from when the sidecar saw it change",
            "stats file stamped in the past again",
        )
        proc_problem = None if proc.outcome is ProcOutcome.MEASURED else proc.detail
        if proc.outcome is ProcOutcome.NO_PID:
            proc_problem = None  # already reported as a stats problem
        self._transition(
            "proc",
            proc_problem,
            "server RSS not measurable from /proc",
            "server RSS measured again",
        )
        self._report_gpu_access(gpu, stats.document)
        lost = [str(device.index) for device in gpu.devices if device.lost]
        self._transition(
            "gpu_lost",
            f"GPU {', '.join(lost)} lost" if lost else None,
            "NVML reports a GPU as lost",
            "no GPU reported lost",
        )
        unreadable = [f"GPU {d.index}: {d.read_error}" for d in gpu.devices if d.read_error]
        self._transition(
            "gpu_read",
            "; ".join(unreadable) or None,
            "NVML cannot read a GPU's memory; the server's figures stand in where it has them",
            "NVML reads every GPU's memory again",
        )

    def _report_gpu_access(self, gpu: GpuReading, document: StatsDocument | None) -> None:
        """Once at INFO that NVML is not there (normal in a CPU pod); once at WARNING when
        the server's own figures show it uses a GPU (the sidecar should see it: a driver or
        claim not ready, tried again every few scrapes); once at INFO when NVML comes back."""
        logged = self._reported.get("gpu_access")
        if gpu.access is GpuAccess.OK:
            if logged is not None:
                self._reported["gpu_access"] = None
                log.info("GPU metrics measured by the sidecar again", extra={"reason": gpu.detail})
            return
        if not _server_uses_gpu(document):
            if logged is None:
                self._reported["gpu_access"] = "info"
                log.info("GPU metrics come from the server only", extra={"reason": gpu.detail})
        elif logged != "warning":
            self._reported["gpu_access"] = "warning"
            log.warning(
                "the server uses a GPU the sidecar's NVML cannot see; "
                "GPU metrics come from the server only",
                extra={"problem": gpu.detail},
            )

    def _report_dropped_labels(
        self,
        document: StatsDocument | None,
        gpu: GpuReading,
        withheld: tuple[TextField, ...],
        monotonic_now: float,
    ) -> None:
        """One warning per problem (GPU indices, each text field), not per scrape."""
        if document is not None and not gpu.visible:
            relayed = relayable_gpus(document.nvml)
            if relayed.refused:
                self._warn_dropped(
                    "gpu_index",
                    monotonic_now,
                    "the stats file names GPU indices no node has; their figures are dropped",
                    {
                        "problem": f"{relayed.refused} nvml entries with an index outside "
                        f"0..{MAX_RELAYED_GPUS - 1}, such as "
                        + ", ".join(str(index) for index in relayed.refused_examples)
                    },
                )
        for field in withheld:
            self._warn_dropped(
                f"text_label:{field.value}",
                monotonic_now,
                "a stats file text changes too often to be a label; new values are withheld",
                {
                    "field": field.value,
                    "problem": f"more than {MAX_TEXT_LABEL_VALUES} values within "
                    f"{TEXT_LABEL_WINDOW_SECONDS:.0f} s",
                },
            )

    def _warn_dropped(
        self, key: str, monotonic_now: float, warning: str, extra: dict[str, str]
    ) -> None:
        last_seen = self._dropped_seen.get(key)
        self._dropped_seen[key] = monotonic_now
        if last_seen is None or monotonic_now - last_seen >= DROPPED_LABEL_QUIET_SECONDS:
            log.warning(warning, extra=extra)

    def _transition(self, key: str, problem: str | None, warning: str, recovery: str) -> None:
        previous = self._reported.get(key)
        if problem == previous:
            return
        self._reported[key] = problem
        if problem is not None:
            log.warning(warning, extra={"problem": problem})
        elif previous is not None:
            log.info(recovery)


def _server_uses_gpu(document: StatsDocument | None) -> bool:
    """Whether the server's stats show it on a GPU: CUDA memory, or GPUs its NVML sees."""
    if document is None:
        return False
    return document.cuda.reserved_bytes is not None or bool(document.nvml)
