"""Starting and stopping the cluster's daemons without systemd.

Each daemon runs detached (its own session, so it outlives `up`), entered
into the node's network namespace with `nsenter --net=...` (not `ip netns
exec`, which remounts /sys and hides the cgroup mounts). A pid file holds
the pid and the kernel's start time of the process, so a recycled pid is
never mistaken for ours. Leftovers of a cluster whose pid files were lost are
found by their command lines, which all name the cluster's state directory.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Running:
    pid: int
    start_ticks: int


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name is parenthesised and may hold spaces: split after it.
    return raw[raw.rindex(")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    fields = _stat_fields(pid)
    # Field 22 of /proc/pid/stat (starttime) is the 20th after "pid (comm)".
    return int(fields[19]) if fields else None


def is_alive(proc: Running) -> bool:
    """True when the pid still names the process we started and it is not a zombie."""
    fields = _stat_fields(proc.pid)
    if fields is None or fields[0] in ("Z", "X"):
        if fields is not None:
            _reap(proc.pid)
        return False
    return int(fields[19]) == proc.start_ticks


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def spawn(
    argv: Sequence[str],
    *,
    log_path: Path,
    pid_path: Path,
    netns: str | None,
    environment: Mapping[str, str] | None = None,
) -> Running:
    """Start argv detached, stdout+stderr appended to log_path; record it in pid_path.

    `environment` defaults to this process's, less its proxy settings."""
    command = list(argv)
    if netns is not None:
        command = ["nsenter", f"--net=/run/netns/{netns}", "--", *command]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    executable = _which(command[0])
    _keep_inherited_files_from_daemons()
    with open(log_path, "ab") as log:
        log.write(f"\n==== {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(command)}\n".encode())
    pid = os.posix_spawn(
        executable,
        command,
        dict(environment) if environment is not None else daemon_environment(os.environ),
        setsid=True,
        file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, str(log_path), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640),
            (os.POSIX_SPAWN_DUP2, 1, 2),
        ],
    )
    ticks = start_ticks(pid) or 0
    proc = Running(pid=pid, start_ticks=ticks)
    pid_path.parent.mkdir(parents=True, exist_ok=True)
    pid_path.write_text(f"{pid} {ticks}\n")
    return proc


def _keep_inherited_files_from_daemons() -> None:
    """Mark every file this process inherited (beyond stdio) close-on-exec.

    A daemon outlives `up`; any descriptor it inherits stays open as long as
    it runs. `flock LOCK python -m localcluster up` hands its lock's
    descriptor down, and a daemon holding it kept the lock taken for as long
    as the cluster ran. Python's own files are close-on-exec already.
    """
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2:
            try:
                os.set_inheritable(fd, False)
            except OSError:
                pass  # the directory's own descriptor, closed by now


PROXY_VARIABLES = frozenset({"http_proxy", "https_proxy", "all_proxy", "no_proxy"})


def daemon_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The caller's environment minus proxy settings. Pure.

    Every peer of a cluster daemon is inside the node; a machine-wide proxy
    would send the apiserver's calls to the kubelet (logs, exec) astray.
    """
    return {k: v for k, v in environ.items() if k.lower() not in PROXY_VARIABLES}


def _which(program: str) -> str:
    if "/" in program:
        return program
    for directory in os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin").split(":"):
        candidate = Path(directory) / program
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    for directory in ("/usr/sbin", "/usr/bin", "/sbin", "/bin"):
        candidate = Path(directory) / program
        if candidate.is_file():
            return str(candidate)
    raise FileNotFoundError(program)


def read_pid_file(pid_path: Path) -> Running | None:
    try:
        pid_text, ticks_text = pid_path.read_text().split()
        return Running(pid=int(pid_text), start_ticks=int(ticks_text))
    except (FileNotFoundError, ValueError):
        return None


def stop(proc: Running, *, grace_seconds: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after grace_seconds; returns once the process is gone."""
    if not is_alive(proc):
        return
    _signal(proc.pid, signal.SIGTERM)
    if wait_gone([proc], timeout_seconds=grace_seconds):
        return
    _signal(proc.pid, signal.SIGKILL)
    wait_gone([proc], timeout_seconds=10.0)


def wait_gone(procs: Iterable[Running], *, timeout_seconds: float) -> bool:
    pending = list(procs)
    deadline = time.monotonic() + timeout_seconds
    while pending:
        pending = [p for p in pending if is_alive(p)]
        if not pending:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def find_by_cmdline(needle: str, programs: frozenset[str]) -> list[Running]:
    """Live processes named in programs whose command line mentions needle.

    The program filter keeps a user's `tail -f <state>/logs/...` alive.
    """
    found: list[Running] = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if pid == me:
            continue
        args = cmdline(pid)
        if args and Path(args[0]).name in programs and any(needle in arg for arg in args):
            ticks = start_ticks(pid)
            if ticks is not None:
                found.append(Running(pid=pid, start_ticks=ticks))
    return found


def kill_all(procs: Sequence[Running]) -> None:
    for proc in procs:
        if is_alive(proc):
            _signal(proc.pid, signal.SIGKILL)
    wait_gone(procs, timeout_seconds=10.0)
