"""`node stop|start|drain|uncordon|pressure NAME`: what tests do to one node of a cluster.

stop is a machine dying: the node's daemons (containerd, kubelet, kube-proxy,
device plugin, DRA driver, kube-router) and every container of its pods are
SIGKILLed at once, with no chance to tell the API server anything; the node
turns NotReady when its lease runs out, as a real one would. On node 1 the
control plane keeps running. start brings the daemons back with the same
state (lifecycle.restart), so the kubelet finds its pods dead and starts them
again. drain and uncordon are kubectl's own: cordon, then evict every pod
through the Eviction API, which honours PodDisruptionBudgets. pressure puts
the node under real kubelet MemoryPressure, or takes it off: every node is a
namespace on one host, so memory cannot be short on one node only, but the
node's own kubelet can be told a threshold it is past (see
components.MEMORY_PRESSURE_EVICTION).
"""

from __future__ import annotations

from localcluster import cgroups, health, lifecycle, processes
from localcluster.components import NODE_COMPONENTS, Layout, enabled_components, kubelet_config
from localcluster.config import ClusterConfig
from localcluster.kubectl import Kubectl
from localcluster.progress import Reporter

SHIM = "containerd-shim-runc-v2"


def stop(view: ClusterConfig, report: Reporter) -> None:
    """Kill the node's daemons and containers at once, as a power cut would."""
    layout = Layout(view.state)
    victims: list[processes.Running] = []
    for component in enabled_components(view):
        if component in NODE_COMPONENTS:
            proc = processes.read_pid_file(layout.pid(component))
            if proc is not None and processes.is_alive(proc):
                victims.append(proc)
    victims += processes.find_by_cmdline(str(view.containerd_socket), frozenset({SHIM}))
    report.say(f"node {view.node_name}: killing {len(victims)} daemons and shims, and its pods")
    processes.kill_all(victims)
    cgroups.kill_tasks(view.cgroup_root)


def start(view: ClusterConfig, report: Reporter, *, timeout_seconds: float = 120) -> None:
    """Start the node's dead daemons with their state, and wait until the node is Ready."""
    dead = [
        c
        for c, alive in health.component_states(view).items()
        if not alive and c in NODE_COMPONENTS
    ]
    if dead:
        cgroups.create_root(view.cgroup_root)
        lifecycle.restart(view, dead, report=report)
    kubectl = health.kubectl_for(view)
    lifecycle.wait_for(
        view,
        Layout(view.state),
        tuple(c for c in enabled_components(view) if c in NODE_COMPONENTS),
        lambda: health.node_ready(kubectl, view),
        timeout_seconds,
        f"node {view.node_name} to be Ready after its daemons started",
    )
    report.say(f"node {view.node_name} Ready")


def drain(view: ClusterConfig, report: Reporter, *, timeout_seconds: float) -> None:
    """Cordon the node and evict its pods (DaemonSets' stay), within PodDisruptionBudgets."""
    report.say(f"draining {view.node_name}")
    health.kubectl_for(view).run(
        "drain",
        view.node_name,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        f"--timeout={timeout_seconds:.0f}s",
        timeout_seconds=timeout_seconds + 30,
    )


def uncordon(view: ClusterConfig, report: Reporter) -> None:
    """Let the scheduler place pods on the node again (after a drain)."""
    health.kubectl_for(view).run("uncordon", view.node_name)
    report.say(f"node {view.node_name} uncordoned")


def pressure(
    view: ClusterConfig, report: Reporter, *, on: bool, timeout_seconds: float = 120
) -> None:
    """Put the node under the kubelet's MemoryPressure (on) or take it off, and wait
    until its Node's condition says so.

    The node's kubelet configuration is rewritten with (or without) a soft
    memory threshold every node is past, with an hour's grace, and that kubelet
    alone restarts: its pods keep running in containerd, the other nodes are
    untouched, nothing is evicted. The setting stays in the node's state, so a
    later `restart kubelet` keeps it, until `--off` or `down`.
    """
    layout = Layout(view.state)
    layout.kubelet_config.write_text(kubelet_config(view, layout, memory_pressure=on))
    lifecycle.restart(view, ["kubelet"], report=report)
    wanted = "True" if on else "False"
    kubectl = health.kubectl_for(view)
    lifecycle.wait_for(
        view,
        layout,
        ("kubelet",),
        lambda: _memory_pressure(kubectl, view) == wanted,
        timeout_seconds,
        f"node {view.node_name}'s MemoryPressure to be {wanted} after its kubelet restarted",
    )
    report.say(f"node {view.node_name}: MemoryPressure {wanted}")


def _memory_pressure(kubectl: Kubectl, view: ClusterConfig) -> str:
    """The Node's MemoryPressure status as the API server holds it ('' when unread)."""
    result = kubectl.run(
        "get",
        "node",
        view.node_name,
        "-o",
        "jsonpath={.status.conditions[?(@.type=='MemoryPressure')].status}",
        check=False,
    )
    return result.stdout.strip()
