"""The cluster's cgroup root, made before the kubelet and removed after it.

The kubelet (cgroupfs driver, cgroup v1 here) puts every pod under its
`cgroupRoot`, which must already exist in each hierarchy. One root per
cluster, named after it, lets `down` kill whatever is left in it (containers
of a cluster whose shims were killed) and remove the whole tree, touching no
other cgroup on the machine.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

CGROUP_MOUNT = Path("/sys/fs/cgroup")


def hierarchies() -> list[Path]:
    """Mount points of every cgroup hierarchy (v1 controllers, name=systemd, unified)."""
    found: list[Path] = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fstype = right.split()[0] if right else ""
        if fstype in ("cgroup", "cgroup2"):
            found.append(Path(left.split()[4]))
    return found


def create_root(root: str) -> None:
    for hierarchy in hierarchies():
        path = hierarchy / root.lstrip("/")
        path.mkdir(exist_ok=True)
        # A new v1 cpuset is empty; copy the parent's CPUs and memory nodes
        # or no task can join anything below it.
        for name in ("cpuset.cpus", "cpuset.mems"):
            parent_file = hierarchy / name
            if parent_file.exists() and not (path / name).read_text().strip():
                (path / name).write_text(parent_file.read_text())


def existing(root: str) -> list[Path]:
    return [h / root.lstrip("/") for h in hierarchies() if (h / root.lstrip("/")).is_dir()]


def pids_in(root: str) -> set[int]:
    pids: set[int] = set()
    for top in existing(root):
        for directory, _dirs, files in os.walk(top):
            if "cgroup.procs" in files:
                try:
                    text = (Path(directory) / "cgroup.procs").read_text()
                except OSError:
                    continue
                pids.update(int(p) for p in text.split())
    return pids


def kill_tasks(root: str, *, timeout_seconds: float = 20.0) -> None:
    """SIGKILL every task under root (a node's pods, as when its machine dies)."""
    deadline = time.monotonic() + timeout_seconds
    while (pids := pids_in(root)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)


def kill_and_remove(root: str, *, timeout_seconds: float = 20.0) -> list[str]:
    """SIGKILL every task under root, then remove the tree bottom-up. Returns what stayed."""
    kill_tasks(root, timeout_seconds=timeout_seconds)
    remaining: list[str] = []
    for top in existing(root):
        for directory, _dirs, _files in sorted(os.walk(top), key=lambda w: -len(w[0])):
            for _ in range(50):
                try:
                    os.rmdir(directory)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
            else:
                remaining.append(directory)
    return remaining
