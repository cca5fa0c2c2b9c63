"""`down`: stop only what this cluster started and leave the host as `up` found it.

Order matters: the kubelet first (or it restarts what is killed), then every
container while containerd can still be asked, then the daemons, then any
process that still names the state directory (shims), then whatever is left
in the cluster's cgroup root. Only then can the mounts go, and only after
those the pods' network namespaces and the node's own namespace, veth,
routes and rules; last the kernel settings the kubelet changed. Extra nodes
go first, each the same way, down to its own namespace.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from localcluster import cgroups, containerd, hostchanges, network, nodes, processes
from localcluster.components import COMPONENTS, PROGRAM_NAMES, Layout
from localcluster.config import ClusterConfig
from localcluster.progress import Reporter


def down(config: ClusterConfig, *, report: Reporter, keep_logs: bool = True) -> list[str]:
    """Stop and remove everything of this cluster; returns what could not be removed."""
    layout = Layout(config.state)
    problems: list[str] = []
    if config.node == 1:
        for view in reversed(nodes.extra_nodes(config)):
            problems += down(view, report=report, keep_logs=keep_logs)

    def stop(component: str) -> None:
        proc = processes.read_pid_file(layout.pid(component))
        if proc is not None and processes.is_alive(proc):
            where = "" if config.node == 1 else f" of {config.node_name}"
            report.say(f"stopping {component}{where}")
            processes.stop(proc, grace_seconds=10 if component != "kubelet" else 5)

    stop("kubelet")
    # Shims killed without a trace leave their sockets; their ids are the bundles'.
    shim_sockets = [
        hostchanges.shim_socket(
            str(config.containerd_socket), containerd.K8S_NAMESPACE, bundle.name
        )
        for bundle in containerd.task_bundles(layout)
    ]
    pod_netns = containerd.kill_containers(config, report)
    for component in reversed(COMPONENTS):
        if component != "kubelet":
            stop(component)
    # Anything of ours still running (pid files lost, shims, nsenter wrappers).
    strays = processes.find_by_cmdline(str(config.state), PROGRAM_NAMES)
    shim_sockets += [
        socket for p in strays if (socket := containerd.shim_socket_of(processes.cmdline(p.pid)))
    ]
    if strays:
        report.say(f"killing {len(strays)} leftover processes")
        processes.kill_all(strays)
    stuck_cgroups = cgroups.kill_and_remove(config.cgroup_root)
    stuck_mounts = unmount_under((config.state, Path(config.containerd_root)))
    if config.node == 1:
        network.teardown(config, pod_netns)
    else:
        network.teardown_extra_node(config, pod_netns)
    hostchanges.restore(
        layout.host_records,
        pod_logs_dir=layout.pod_logs,
        cni_network_name=config.cni_network_name,
        shim_sockets=shim_sockets,
    )
    problems += [f"cgroup {c}" for c in stuck_cgroups] + [f"mount {m}" for m in stuck_mounts]
    if config.node == 1:
        problems += network.leftovers(config)
    elif config.netns in network.netns_names():
        problems.append(f"netns {config.netns}")
    if not problems:
        for entry in config.state.iterdir() if config.state.exists() else []:
            # Extra nodes keep their logs below nodes/ as node 1 keeps its own.
            if keep_logs and entry.name in ("logs", "logs.previous", "nodes"):
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
    return problems


def mount_points() -> list[str]:
    points: list[str] = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        raw = line.split()[4]
        points.append(raw.encode().decode("unicode_escape"))
    return points


def unmount_under(roots: tuple[Path, ...]) -> list[str]:
    prefixes = tuple(str(r).rstrip("/") + "/" for r in roots)
    for _attempt in range(3):
        targets = [m for m in mount_points() if m.startswith(prefixes)]
        if not targets:
            return []
        for mount in sorted(targets, key=len, reverse=True):
            result = subprocess.run(["umount", mount], capture_output=True, check=False)
            if result.returncode != 0:
                subprocess.run(["umount", "-l", mount], capture_output=True, check=False)
    return [m for m in mount_points() if m.startswith(prefixes)]
