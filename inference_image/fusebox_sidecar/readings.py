"""Pure parsing of what the sidecar reads: the server's stats file and
`/proc/<pid>/status`.

The stats file is written by another process and may be missing, truncated,
from another schema or simply wrong. Parsing it here, without I/O, turns each
of those into a typed snapshot plus a list of named problems, so the
collectors never see raw JSON and a bad field costs one metric, not a scrape.
A field that is `null` or missing is absent (the contract's "cannot be
measured"); a field of the wrong type is absent *and* a problem.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Final

SUPPORTED_SCHEMA: Final = 1
PID_MAX: Final = 4_194_304  # the kernel's ceiling for /proc/sys/kernel/pid_max

BREAKER_STATES: Final = ("closed", "open", "half_open")
VARIANTS: Final = ("primary", "fallback")
REQUEST_OUTCOMES: Final = ("succeeded", "failed", "rejected", "timed_out")
LATENCY_METRICS: Final = ("ttft", "itl", "e2e")
HEARTBEAT_THREADS: Final = ("loop", "worker")


@dataclass(frozen=True)
class GpuMemory:
    """One GPU's memory as the server's NVML saw it."""

    index: int
    used_bytes: float | None
    total_bytes: float | None


@dataclass(frozen=True)
class StatsSnapshot:
    """The stats file, typed. Every value is optional: None means absent."""

    written_at: float | None = None
    pid: int | None = None
    rss_bytes: float | None = None
    cgroup_memory_usage_bytes: float | None = None
    cgroup_memory_limit_bytes: float | None = None
    cuda_allocated_bytes: float | None = None
    cuda_reserved_bytes: float | None = None
    cuda_alloc_retries_total: float | None = None
    cuda_ooms_total: float | None = None
    cuda_contexts: float | None = None
    nvml: tuple[GpuMemory, ...] = ()
    queue_length: float | None = None
    running: float | None = None
    tokenizer_cache_entries: float | None = None
    requests_total: Mapping[str, float] = field(default_factory=dict)
    latency_p99_seconds: Mapping[str, float] = field(default_factory=dict)
    quality_failure_ratio: float | None = None
    heartbeats: Mapping[str, float] = field(default_factory=dict)
    breaker: str | None = None
    degradation_level: int | None = None
    variant: str | None = None
    model_loaded: bool | None = None
    memory_guard_active: bool | None = None
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class StatsReading:
    """The outcome of reading the stats file once.

    `snapshot` is None when nothing usable was read; `problem` then says why
    (missing, empty, not JSON, ...). A snapshot whose fields had problems
    lists them in `snapshot.problems`.
    """

    snapshot: StatsSnapshot | None
    problem: str | None = None

    @property
    def valid(self) -> bool:
        return self.snapshot is not None and not self.snapshot.problems


class _Fields:
    """Typed access to a decoded JSON document, collecting problems."""

    def __init__(self, document: dict[str, object]) -> None:
        self._document = document
        self.problems: list[str] = []

    def raw(self, path: str) -> object:
        node: object = self._document
        for key in path.split("."):
            if node is None:  # a null parent: everything under it is absent
                return None
            if not isinstance(node, dict):  # JSON objects decode to dict
                self.problems.append(f"{path}: parent is not an object")
                return None
            node = node.get(key)
        return node

    def number(self, path: str, *, minimum: float = 0.0, maximum: float = math.inf) -> float | None:
        value = self.raw(path)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.problems.append(f"{path}: expected a number, got {type(value).__name__}")
            return None
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number) or not minimum <= number <= maximum:
            self.problems.append(
                f"{path}: {str(value)[:40]} is out of range [{minimum}, {maximum}]"
            )
            return None
        return number

    def integer(self, path: str, *, minimum: int = 0, maximum: int = 2**63 - 1) -> int | None:
        value = self.raw(path)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self.problems.append(f"{path}: expected an integer, got {type(value).__name__}")
            return None
        if not minimum <= value <= maximum:
            self.problems.append(
                f"{path}: {str(value)[:40]} is out of range [{minimum}, {maximum}]"
            )
            return None
        return value

    def boolean(self, path: str) -> bool | None:
        value = self.raw(path)
        if value is None or isinstance(value, bool):
            return value
        self.problems.append(f"{path}: expected true or false, got {type(value).__name__}")
        return None

    def choice(self, path: str, allowed: tuple[str, ...]) -> str | None:
        value = self.raw(path)
        if value is None:
            return None
        if not isinstance(value, str) or value not in allowed:
            self.problems.append(f"{path}: expected one of {', '.join(allowed)}, got {value!r}")
            return None
        return value

    def numbers(self, paths: Mapping[str, str]) -> dict[str, float]:
        """Numbers under several paths, keyed by label; absent ones left out."""
        found = {label: self.number(path) for label, path in paths.items()}
        return {label: value for label, value in found.items() if value is not None}

    def gpus(self, path: str) -> tuple[GpuMemory, ...]:
        value = self.raw(path)
        if value is None:
            return ()
        if not isinstance(value, list):
            self.problems.append(f"{path}: expected a list, got {type(value).__name__}")
            return ()
        gpus = []
        for position, entry in enumerate(value):
            if not isinstance(entry, dict):
                self.problems.append(f"{path}[{position}]: expected an object")
                continue
            inner = _Fields(entry)
            index = inner.integer("index")
            used = inner.number("memory_used_bytes")
            total = inner.number("memory_total_bytes")
            self.problems.extend(f"{path}[{position}].{problem}" for problem in inner.problems)
            if index is None:
                if not inner.problems:
                    self.problems.append(f"{path}[{position}].index: missing")
                continue
            gpus.append(GpuMemory(index=index, used_bytes=used, total_bytes=total))
        return tuple(gpus)


def parse_stats(raw: bytes) -> StatsReading:
    """Turn the stats file's bytes into a typed reading; never raises."""
    if not raw.strip():
        return StatsReading(None, "stats file is empty")
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError
        return StatsReading(None, f"stats file is not JSON: {str(error)[:200]}")
    if not isinstance(document, dict):
        return StatsReading(None, f"stats file holds a {type(document).__name__}, not an object")
    schema = document.get("schema")
    if isinstance(schema, bool) or schema != SUPPORTED_SCHEMA:
        return StatsReading(None, f"stats schema {schema!r} is not {SUPPORTED_SCHEMA}")

    fields = _Fields(document)
    snapshot = StatsSnapshot(
        written_at=fields.number("written_at", minimum=1e-9),
        pid=fields.integer("pid", minimum=1, maximum=PID_MAX),
        rss_bytes=fields.number("rss_bytes"),
        cgroup_memory_usage_bytes=fields.number("cgroup_memory_usage_bytes"),
        cgroup_memory_limit_bytes=fields.number("cgroup_memory_limit_bytes"),
        cuda_allocated_bytes=fields.number("cuda.allocated_bytes"),
        cuda_reserved_bytes=fields.number("cuda.reserved_bytes"),
        cuda_alloc_retries_total=fields.number("cuda.num_alloc_retries"),
        cuda_ooms_total=fields.number("cuda.num_ooms"),
        cuda_contexts=fields.number("cuda.contexts"),
        nvml=fields.gpus("nvml"),
        queue_length=fields.number("queue_length"),
        running=fields.number("running"),
        tokenizer_cache_entries=fields.number("tokenizer_cache_entries"),
        requests_total=fields.numbers(
            {outcome: f"requests.{outcome}_total" for outcome in REQUEST_OUTCOMES}
        ),
        latency_p99_seconds=fields.numbers(
            {metric: f"latency_seconds.{metric}.p99" for metric in LATENCY_METRICS}
        ),
        quality_failure_ratio=fields.number("quality.failure_ratio", maximum=1.0),
        heartbeats=fields.numbers({thread: f"heartbeats.{thread}" for thread in HEARTBEAT_THREADS}),
        breaker=fields.choice("state.breaker", BREAKER_STATES),
        degradation_level=fields.integer("state.degradation_level", maximum=3),
        variant=fields.choice("state.variant", VARIANTS),
        model_loaded=fields.boolean("state.model_loaded"),
        memory_guard_active=fields.boolean("state.memory_guard_active"),
    )
    return StatsReading(replace(snapshot, problems=tuple(fields.problems)))


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
    UNREADABLE = "unreadable"


@dataclass(frozen=True)
class ProcReading:
    outcome: ProcOutcome
    rss_bytes: float | None = None
    detail: str = ""
