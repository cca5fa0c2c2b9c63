"""A CPU probe for an operator under the fleet bench, loaded by Python's startup
(`sitecustomize`) only when the bench puts this folder on that operator's path
(`--cpu-probe`); the operator's shipped code carries no profiling hook.

Why: the operator's CPU per new service stayed above the target and a deterministic
profiler (cProfile) inflates the many small calls that dominate kopf's event path
(deepcopy, dict access), so its shares could not be trusted. This is a sampler
weighted by CPU time instead, every FUSEBOX_CPU_PROBE_PERIOD_MS (default 5 ms):
- the main thread (kopf's event loop) by SIGPROF (`setitimer(ITIMER_PROF)`, a timer of
  the process's CPU time): Python runs the handler in the main thread between two of
  its bytecodes, so the main thread's CPU since the last sample (its own CPU clock,
  `pthread_getcpuclockid`) is charged to the stack it is running;
- every other thread (the watches, the client calls `asyncio.to_thread` runs) by a
  daemon thread that wakes on the same period and charges each thread's CPU since the
  last wake-up to the stack that thread is on now. It needs the GIL to look, and a
  thread gives the GIL up mostly where it blocks, so for these threads the leaf frames
  lean towards the blocking call (a socket read) and the callers are the reliable part.
A thread that waited costs nothing; the probe's own thread is not counted. Its cost is
a few per cent of the operator's CPU.

With FUSEBOX_CPU_PROBE_DIR set, each SIGUSR2 writes `<n>.folded` (one line per stack,
`frame;frame;... microseconds`, the input of flamegraph tools) and `<n>.json` (totals
by function, own and cumulative, and by package) for the CPU since the previous signal
into that folder, and starts counting afresh: the bench signals once when the figure's
window opens (what came before is the startup) and once when it closes.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from types import FrameType

MAX_DEPTH = 80  # deeper stacks are cut at the root end: the leaf end says where CPU goes


def _frame_name(frame: FrameType) -> str:
    code = frame.f_code
    return f"{_short_path(code.co_filename)}:{code.co_name}"


def _short_path(filename: str) -> str:
    """The path from the package down (site-packages/kopf/_core/x.py -> kopf/_core/x.py)."""
    for marker in ("site-packages/", "/lib/python3", "/operator/", "/bench/"):
        at = filename.rfind(marker)
        if at >= 0:
            tail = filename[at + len(marker) :]
            if marker == "/lib/python3":  # the standard library: drop "12/"
                tail = "stdlib/" + tail.partition("/")[2]
            return tail
    return filename


def package_of(frame_name: str) -> str:
    """The package a frame belongs to, for the by-package table."""
    path = frame_name.partition(":")[0]
    if path.startswith("stdlib/"):
        parts = path.split("/")
        return "stdlib/" + (parts[1].removesuffix(".py") if len(parts) > 1 else "?")
    head = path.split("/")[0]
    return head.removesuffix(".py")


def _stack(frame: FrameType | None) -> tuple[str, ...]:
    names: list[str] = []
    while frame is not None and len(names) < MAX_DEPTH:
        names.append(_frame_name(frame))
        frame = frame.f_back
    names.reverse()
    return tuple(names)


class CpuSampler:
    """Charges each thread's CPU since the last wake-up to its current stack."""

    def __init__(self, period_seconds: float) -> None:
        self.period_seconds = period_seconds
        self.lock = threading.Lock()
        self.stacks: Counter[tuple[str, ...]] = Counter()  # microseconds by stack
        self.last_cpu: dict[int, float] = {}
        self.started = time.monotonic()

    def charge(self, ident: int, frame: FrameType | None) -> None:
        """Charge the thread's CPU since its last sample to `frame`'s stack.

        Never waits for the lock: a signal handler runs between two bytecodes of the
        main thread, which may be inside this very method (an earlier SIGPROF) or
        `take`, and waiting there would wait forever. A sample skipped so is charged,
        CPU and all, at the next one."""
        if not self.lock.acquire(blocking=False):
            return
        try:
            cpu = time.clock_gettime(time.pthread_getcpuclockid(ident))
            used = cpu - self.last_cpu.get(ident, cpu)
            self.last_cpu[ident] = cpu
            if used > 0:
                self.stacks[_stack(frame)] += int(used * 1e6)
        except (OSError, ProcessLookupError):
            pass
        finally:
            self.lock.release()

    def run(self) -> None:
        """The other threads, from a thread of its own (the main one has SIGPROF)."""
        skip = {threading.get_ident(), threading.main_thread().ident}
        while True:
            time.sleep(self.period_seconds)
            for ident, frame in sys._current_frames().items():
                if ident not in skip:
                    self.charge(ident, frame)

    def take(self) -> tuple[Counter[tuple[str, ...]], float]:
        """The stacks since the last take; counting starts afresh. A swap, not a lock:
        this runs in a signal handler, which a SIGPROF may interrupt (and skip)."""
        stacks, self.stacks = self.stacks, Counter()
        now = time.monotonic()
        seconds, self.started = now - self.started, now
        return stacks, seconds


def summary(stacks: Counter[tuple[str, ...]], seconds: float, top: int = 60) -> dict[str, object]:
    """Own and cumulative CPU by function, and own CPU by package, in seconds."""
    own: Counter[str] = Counter()
    cumulative: Counter[str] = Counter()
    packages: Counter[str] = Counter()
    for stack, micros in stacks.items():
        if not stack:
            continue
        own[stack[-1]] += micros
        packages[package_of(stack[-1])] += micros
        for name in set(stack):
            cumulative[name] += micros
    total = sum(stacks.values())

    def table(counter: Counter[str]) -> list[list[object]]:
        return [[name, round(us / 1e6, 3)] for name, us in counter.most_common(top)]

    return {
        "wall_seconds": round(seconds, 1),
        "sampled_cpu_seconds": round(total / 1e6, 3),
        "own_by_package": table(packages),
        "own_by_function": table(own),
        "cumulative_by_function": table(cumulative),
    }


def _dump(sampler: CpuSampler, folder: Path, count: list[int]) -> None:
    stacks, seconds = sampler.take()
    count[0] += 1
    stem = folder / str(count[0])
    lines = [f"{';'.join(stack)} {micros}" for stack, micros in stacks.most_common()]
    Path(str(stem) + ".folded").write_text("\n".join(lines) + "\n")
    Path(str(stem) + ".json.tmp").write_text(json.dumps(summary(stacks, seconds), indent=1))
    os.replace(str(stem) + ".json.tmp", str(stem) + ".json")


def _install() -> None:
    folder = os.environ.get("FUSEBOX_CPU_PROBE_DIR")
    if not folder:
        return
    period = float(os.environ.get("FUSEBOX_CPU_PROBE_PERIOD_MS", "5")) / 1000
    sampler = CpuSampler(period)
    threading.Thread(target=sampler.run, name="cpu-probe", daemon=True).start()
    main = threading.main_thread().ident
    assert main is not None
    signal.signal(signal.SIGPROF, lambda _signum, frame: sampler.charge(main, frame))
    signal.setitimer(signal.ITIMER_PROF, period, period)
    # Off before the interpreter drops its handlers: SIGPROF's default ends the process.
    atexit.register(signal.setitimer, signal.ITIMER_PROF, 0)
    count = [0]

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        try:
            _dump(sampler, Path(folder), count)
        except Exception as error:  # a failed probe must never stop the operator
            print(f"cpu probe: {error!r}", file=sys.stderr)

    signal.signal(signal.SIGUSR2, on_signal)


_install()
