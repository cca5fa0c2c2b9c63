"""Is the cluster up? Probes of each daemon, the API server, the node and CoreDNS.

Used by `up` (to say "already up" or to wait), by `status`, and by the e2e
fixture through `status`'s exit code.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from localcluster import containerd, gpu, nodes, processes, registry
from localcluster.components import (
    HEALTH_URLS,
    Layout,
    enabled_components,
    registry_endpoint,
    registry_paths,
)
from localcluster.config import ClusterConfig
from localcluster.kubectl import Kubectl, KubectlError


def kubectl_for(config: ClusterConfig) -> Kubectl:
    return Kubectl(Path(config.bin_dir) / "kubectl", config.kubeconfig)


def component_states(config: ClusterConfig) -> dict[str, bool]:
    layout = Layout(config.state)
    states: dict[str, bool] = {}
    for component in enabled_components(config):
        proc = processes.read_pid_file(layout.pid(component))
        states[component] = proc is not None and processes.is_alive(proc)
    return states


def apiserver_ready(config: ClusterConfig) -> bool:
    if not config.kubeconfig.exists():
        return False
    try:
        return kubectl_for(config).run("get", "--raw", "/readyz", timeout_seconds=15).stdout == "ok"
    except KubectlError:
        return False


# Run by the node's python inside its namespace: exit 0 when the URL answers 200.
# The daemons' own serving certificates are self-signed, hence no verification.
_PROBE = """
import ssl, sys, urllib.request
context = ssl._create_unverified_context()
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                     urllib.request.HTTPSHandler(context=context))
try:
    sys.exit(0 if opener.open(sys.argv[1], timeout=3).status == 200 else 1)
except Exception:
    sys.exit(1)
"""


def url_answers_in_node(config: ClusterConfig, url: str) -> bool:
    """Whether url answers 200 from inside the node's network namespace."""
    command = ["nsenter", f"--net=/run/netns/{config.netns}", "--", sys.executable, "-c", _PROBE]
    try:
        result = subprocess.run([*command, url], capture_output=True, check=False, timeout=10)
    except subprocess.TimeoutExpired:
        return False
    return result.returncode == 0


def component_ready(config: ClusterConfig, component: str) -> bool:
    """Whether a (running) daemon serves: its health URL, /readyz, or ctr for containerd."""
    if component == "kube-apiserver":
        return apiserver_ready(config)
    if component == "containerd":
        return containerd.ctr_ok(config)
    if component == "registry":
        return registry_ready(config)
    url = HEALTH_URLS.get(component)
    return url is None or url_answers_in_node(config, url)


def registry_ready(config: ClusterConfig) -> bool:
    """The registry refuses anonymous clients and admits the cluster's credentials."""
    paths = registry_paths(config)
    try:
        credentials = registry.read_credentials(paths)
        endpoint = registry_endpoint(config)
        return (
            registry.readiness_problem(
                registry.v2_status(endpoint, paths.ca, None),
                registry.v2_status(endpoint, paths.ca, credentials),
            )
            is None
        )
    except registry.RegistryError:
        return False


def is_healthy(config: ClusterConfig) -> bool:
    return all(component_states(config).values()) and apiserver_ready(config)


def node_exists(kubectl: Kubectl, config: ClusterConfig) -> bool:
    return kubectl.run("get", "node", config.node_name, check=False).returncode == 0


def pod_cidr(kubectl: Kubectl, config: ClusterConfig) -> str:
    """The pod CIDR the controller-manager gave the node; empty before it did."""
    result = kubectl.run(
        "get", "node", config.node_name, "-o", "jsonpath={.spec.podCIDR}", check=False
    )
    return result.stdout.strip()


def node_ready(kubectl: Kubectl, config: ClusterConfig) -> bool:
    result = kubectl.run(
        "get",
        "node",
        config.node_name,
        "-o",
        "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
        check=False,
    )
    return result.stdout.strip() == "True"


def coredns_ready(kubectl: Kubectl) -> bool:
    result = kubectl.run(
        "-n",
        "kube-system",
        "get",
        "deployment",
        "coredns",
        "-o",
        "jsonpath={.status.availableReplicas}",
        check=False,
    )
    return result.stdout.strip() not in ("", "0")


def status_lines(config: ClusterConfig) -> tuple[bool, list[str]]:
    states = component_states(config)
    lines = [f"{name:<24} {'running' if alive else 'stopped'}" for name, alive in states.items()]
    ready = apiserver_ready(config)
    lines.append(f"{'apiserver /readyz':<24} {'ok' if ready else 'not answering'}")
    healthy = all(states.values()) and ready
    # Just after etcd died /readyz may still say ok, but every read then hangs
    # for the whole request timeout: asking would make `status` take a minute.
    if ready and states.get("etcd", False):
        kubectl = kubectl_for(config)
        is_ready = node_ready(kubectl, config)
        lines.append(f"{'node ' + config.node_name:<24} {'Ready' if is_ready else 'NotReady'}")
        try:
            count = gpu.advertised_count(kubectl.get_json("node", config.node_name))
        except KubectlError:
            count = 0
        lines.append(
            f"{'nvidia.com/gpu':<24} {count} ({config.gpu_product}, {config.gpu_memory_mib} MiB)"
        )
        dns = coredns_ready(kubectl)
        lines.append(f"{'coredns':<24} {'Available' if dns else 'not available'}")
        healthy = healthy and is_ready
    for view in nodes.extra_nodes(config):
        node_healthy, node_lines = extra_node_lines(
            view, ask_api=ready and states.get("etcd", False)
        )
        lines += node_lines
        healthy = healthy and node_healthy
    if not config.network_policy:
        lines.append(f"{'NetworkPolicy':<24} not enforced (up --no-network-policy)")
    lines.append(f"{'kubeconfig':<24} {config.kubeconfig}")
    for view in nodes.extra_nodes(config):
        lines.append(f"{'logs of ' + view.node_name:<24} {Layout(view.state).logs}")
    lines.append(f"{'logs':<24} {Layout(config.state).logs}")
    return healthy, lines


def extra_node_lines(view: ClusterConfig, *, ask_api: bool) -> tuple[bool, list[str]]:
    """An extra node's daemons, its Ready condition and GPUs (when the API can be asked)."""
    states = component_states(view)
    lines = [f"node {view.node_name} ({view.node_ip}, netns {view.netns}):"]
    lines += [f"  {name:<22} {'running' if alive else 'stopped'}" for name, alive in states.items()]
    healthy = all(states.values())
    if ask_api:
        kubectl = kubectl_for(view)
        is_ready = node_ready(kubectl, view)
        lines.append(f"  {'node':<22} {'Ready' if is_ready else 'NotReady'}")
        try:
            count = gpu.advertised_count(kubectl.get_json("node", view.node_name))
        except KubectlError:
            count = 0
        lines.append(f"  {'nvidia.com/gpu':<22} {count}")
        healthy = healthy and is_ready
    return healthy, lines
