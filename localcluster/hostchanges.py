"""Machine-wide things the kubelet and containerd change, recorded and undone.

The kubelet sets kernel sysctls (vm.overcommit_memory, kernel.panic, ...)
at start, writes /var/log/containers symlinks, libcni caches results under
/var/lib/cni, and containerd's shims put sockets in /run/containerd/s. None
of these can be moved into the cluster's directory, so `up` records the
sysctls' values before the kubelet runs (once: a crashed cluster's record
is the truth) and `down` restores them and removes only our entries from
the shared directories, and the directories themselves if we made them.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Iterable
from pathlib import Path

# What the kubelet's setupKernelTunables writes.
KUBELET_SYSCTLS = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
)

SHARED_DIRS = (
    Path("/var/log/containers"),
    Path("/var/lib/cni"),
    Path("/run/containerd"),
    Path("/run/netns"),
)
# `ip netns add` makes /run/netns a shared bind mount of itself, once.
NETNS_DIR = Path("/run/netns")
SHIM_SOCKET_DIR = Path("/run/containerd/s")
CNI_RESULTS_DIR = Path("/var/lib/cni/results")


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def record(records_dir: Path) -> None:
    """Save sysctl values and which shared dirs exist, unless a record already exists."""
    records_dir.mkdir(parents=True, exist_ok=True)
    path = records_dir / "host.json"
    if path.exists():
        return
    saved = {
        "sysctls": {n: _sysctl_path(n).read_text().strip() for n in KUBELET_SYSCTLS},
        "preexisting_dirs": [str(d) for d in SHARED_DIRS if d.exists()],
        "netns_dir_mounted": _is_mount_point(NETNS_DIR),
    }
    path.write_text(json.dumps(saved, indent=2))


def restore(
    records_dir: Path, *, pod_logs_dir: Path, cni_network_name: str, shim_sockets: Iterable[Path]
) -> None:
    path = records_dir / "host.json"
    if not path.exists():
        return
    saved = json.loads(path.read_text())
    for name, value in saved["sysctls"].items():
        target = _sysctl_path(name)
        if target.read_text().strip() != value:
            target.write_text(value)
    _remove_links_into(Path("/var/log/containers"), pod_logs_dir)
    if CNI_RESULTS_DIR.is_dir():
        for entry in CNI_RESULTS_DIR.glob(f"{cni_network_name}-*"):
            entry.unlink(missing_ok=True)
    for socket in shim_sockets:
        socket.unlink(missing_ok=True)
    if not saved["netns_dir_mounted"] and _is_mount_point(NETNS_DIR):
        if NETNS_DIR.is_dir() and not any(NETNS_DIR.iterdir()):
            subprocess.run(["umount", str(NETNS_DIR)], capture_output=True, check=False)
    preexisting = set(saved["preexisting_dirs"])
    for directory in SHARED_DIRS:
        if str(directory) not in preexisting:
            _remove_empty_tree(directory)
    path.unlink()


def _is_mount_point(path: Path) -> bool:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        if line.split()[4] == str(path):
            return True
    return False


def _remove_links_into(directory: Path, target_root: Path) -> None:
    if not directory.is_dir():
        return
    for entry in directory.iterdir():
        if entry.is_symlink() and str(entry.readlink()).startswith(str(target_root)):
            entry.unlink()


def _remove_empty_tree(directory: Path) -> None:
    """rmdir bottom-up; stops at the first directory that holds something not ours."""
    if not directory.is_dir():
        return
    for child in directory.iterdir():
        if child.is_dir() and not child.is_symlink():
            _remove_empty_tree(child)
    try:
        directory.rmdir()
    except OSError:
        pass


def shim_socket(containerd_address: str, namespace: str, shim_id: str) -> Path:
    """Where containerd 1.6 puts a shim's socket: /run/containerd/s/sha256(address/ns/id)."""
    digest = hashlib.sha256(f"{containerd_address}/{namespace}/{shim_id}".encode()).hexdigest()
    return SHIM_SOCKET_DIR / digest
