"""`up` recovers from a killed cluster, and `down` leaves the host as `up` found it.

A second, small cluster with its own name, namespace, links and subnets is
started beside the session's one and runs a pod; its daemons and shims are
then SIGKILLed (what a killed session leaves), `up` must restart them over the
kept state (dead shims' sockets removed), and after `down` no process, mount,
network namespace, link, route, firewall rule, cgroup or kernel setting of
either run may remain.
Comparing with a snapshot taken before the first `up` catches what a list
of known leftovers would miss.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..multinode import conftest as multinode

REPO_ROOT = Path(__file__).resolve().parents[3]
STATE_ROOT = Path(os.environ.get("FUSEBOX_LOCALCLUSTER_DIR") or "/var/lib/fusebox-localcluster")
NAME = "fbxdown"
UP_FLAGS = [
    "--netns",
    "fbxdown",
    "--host-veth",
    "fbxd0",
    "--node-veth",
    "fbxd1",
    "--node-cidr",
    "10.249.0.0/30",
    "--pod-cidr",
    "10.248.0.0/16",
    "--service-cidr",
    "10.247.0.0/16",
    "--gpus",
    "0",
    "--images",
    "pause,coredns,testapp",
]
POD_CIDR = ipaddress.IPv4Network("10.248.0.0/16")
SYSCTLS = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops")


def _lines(*argv: str) -> set[str]:
    return set(
        subprocess.run(argv, capture_output=True, text=True, check=False).stdout.splitlines()
    )


def _mounts() -> set[str]:
    points = {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()}
    # Image builds running beside the tests mount and unmount podman's layers.
    return {p for p in points if "/podman/" not in p}


def _cgroups() -> set[str]:
    return {str(p) for p in Path("/sys/fs/cgroup").glob("*/*") if p.is_dir()}


def _processes() -> set[str]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found.add(f"{entry.name} {(entry / 'cmdline').read_bytes()!r}")
            except OSError:
                pass
    return found


def snapshot() -> dict[str, set[str]]:
    return {
        "mounts": _mounts(),
        "netns": {line.split()[0] for line in _lines("ip", "netns", "list") if line.strip()},
        "links": {line.split(":")[1].strip() for line in _lines("ip", "-o", "link") if ":" in line},
        "routes": _lines("ip", "route"),
        "filter rules": _lines("iptables", "-w", "-S"),
        "nat rules": _lines("iptables", "-w", "-t", "nat", "-S"),
        "cgroups": _cgroups(),
        "sysctls": {f"{s}={Path('/proc/sys', s).read_text().strip()}" for s in SYSCTLS},
        "shim sockets": {str(p) for p in Path("/run/containerd/s").glob("*")},
        "container log links": {
            f"{p} -> {p.readlink()}"
            for p in Path("/var/log/containers").glob("*")
            if p.is_symlink()
        },
    }


# --- What other clusters (the session's, used by other tests meanwhile) may add.
def _netns_addresses(name: str) -> list[ipaddress.IPv4Address]:
    result = subprocess.run(
        ["ip", "-n", name, "-j", "-4", "addr"], capture_output=True, text=True, check=False
    )
    if result.returncode != 0 or not result.stdout.strip():
        return []
    return [
        ipaddress.IPv4Address(a["local"])
        for link in json.loads(result.stdout)
        for a in link.get("addr_info", [])
        if a["local"] != "127.0.0.1"
    ]


def _live_shim_sockets() -> set[str]:
    sockets = set()
    for entry in Path("/proc").iterdir():
        try:
            args = (entry / "cmdline").read_bytes().decode().split("\0")
        except (OSError, UnicodeDecodeError):
            continue
        if args and args[0].endswith("containerd-shim-runc-v2") and "-address" in args:
            flags = dict(zip(args[1::2], args[2::2], strict=False))
            key = f"{flags.get('-address')}/{flags.get('-namespace')}/{flags.get('-id')}"
            sockets.add(f"/run/containerd/s/{hashlib.sha256(key.encode()).hexdigest()}")
    return sockets


def _of_the_multinode_cluster(item: str) -> bool:
    """Whether an item names the multinode module's cluster, which the side lane of
    scripts/test-all.sh may bring up or down while this test runs: its namespaces,
    cgroups, state and firewall rules carry its name, its links and routes its veths."""
    return any(word in item for word in (multinode.NAME, multinode.HOST_VETH, multinode.NODE_VETH))


def _ours(kind: str, item: str) -> bool:
    """Whether an item that appeared can be of this test's cluster (else another's)."""
    if _of_the_multinode_cluster(item):
        return False
    if kind in ("mounts", "container log links"):
        other_state = re.search(r"/(fusebox-localcluster|containerd)/([^/]+)/", item)
        if other_state and other_state.group(2) != NAME:
            return False
    netns = re.search(r"(?:^|/run/netns/)(cni-[0-9a-f-]+)$", item)
    if kind in ("mounts", "netns") and netns:
        # A pod's namespace is ours when it holds an address of our pod CIDR.
        return any(a in POD_CIDR for a in _netns_addresses(netns.group(1)))
    if kind == "shim sockets":
        return item not in _live_shim_sockets()
    if kind == "cgroups":
        # Other tests make cgroups of their own; ours would name the cluster or a pod.
        return any(word in item for word in (NAME, "kube", "pod"))
    return True


BUSY_POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "busy", "namespace": "default"},
    "spec": {
        "containers": [
            {
                "name": "app",
                "image": "localhost/fusebox/testapp:latest",
                "imagePullPolicy": "Never",
                "securityContext": {
                    "runAsNonRoot": True,
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"]},
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
            }
        ]
    },
}


def _localcluster(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "localcluster", "--name", NAME, *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )


def _start_pod(kubectl: list[str]) -> None:
    subprocess.run(
        [*kubectl, "apply", "-f", "-"],
        input=json.dumps(BUSY_POD),
        text=True,
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [*kubectl, "wait", "--for=condition=Ready", "pod/busy", "--timeout=120s"],
        check=True,
        capture_output=True,
    )


def _kill_everything_without_down() -> None:
    """What a killed session leaves: every daemon and shim gone by SIGKILL, pods still there."""
    for line in _lines("pgrep", "-f", f"fusebox-localcluster/{NAME}/"):
        subprocess.run(["kill", "-9", line], check=False)


def test_killed_cluster_recovers_on_up_and_down_leaves_nothing_behind(cluster: Any) -> None:
    before = snapshot()
    processes_before = _processes()
    started = _localcluster("up", *UP_FLAGS)
    try:
        assert started.returncode == 0, started.stderr[-3000:]
        env = _localcluster("env").stdout
        kubeconfig = next(v.split("=", 1)[1] for v in env.splitlines() if "KUBECONFIG=" in v)
        kubectl = [str(cluster.bin_dir / "kubectl"), f"--kubeconfig={kubeconfig}"]
        _start_pod(kubectl)
        _kill_everything_without_down()
        assert _localcluster("status").returncode != 0
        # `up` over the wreck: restarts every daemon, keeping the state.
        restarted = _localcluster("up", *UP_FLAGS)
        assert restarted.returncode == 0, restarted.stderr[-3000:]
        assert _localcluster("status").returncode == 0
        _start_pod(kubectl)
        during = snapshot()
        # The cluster really made what `down` must remove.
        assert NAME in {n.split()[0] for n in during["netns"]}
        assert any(f"fusebox-{NAME}" in c for c in during["cgroups"])
    finally:
        stopped = _localcluster("down")
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    after = snapshot()
    appeared = {
        kind: sorted(i for i in after[kind] - before[kind] if _ours(kind, i)) for kind in before
    }
    assert {kind: new for kind, new in appeared.items() if new} == {}
    strays = [p for p in _processes() - processes_before if NAME in p]
    assert strays == []


def test_up_refuses_interfaces_and_subnets_already_in_use() -> None:
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "localcluster",
            "--name",
            "e2e-collide",
            "up",
            "--host-veth",
            "lo",
            "--node-cidr",
            "127.0.0.0/30",
            "--no-images",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert refused.returncode == 1
    assert "network interface 'lo' already exists" in refused.stderr
    assert "address 127.0.0.1 on lo lies in 127.0.0.0/30" in refused.stderr
    assert "Traceback" not in refused.stderr
    # Refused before touching anything.
    assert not [n for n in _lines("ip", "netns", "list") if n.startswith("e2e-collide")]
    assert not (STATE_ROOT / "e2e-collide").exists()
