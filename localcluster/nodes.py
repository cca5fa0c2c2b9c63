"""The nodes of a cluster: which exist, what each is called, where it lives. Pure.

Node 1 is the cluster as it always was: the control plane and a kubelet in
the namespace `config.netns`, joined to the host by the veth. With
`up --nodes N` each extra node k is a kubelet, containerd, kube-proxy,
device plugin, DRA driver (and kube-router) in a namespace of its own,
`<netns>-node<k>`, with its own state directory, containerd root, cgroup
root, simulated GPUs and the pod /24 the controller-manager gives it.
Every node's address lies in node_cidr, on one Ethernet segment: a bridge
in node 1's namespace to which the host's veth and one veth per extra node
are attached, as a switch joins machines.
A node view (node_config) is a ClusterConfig whose node-specific properties
describe that node, so the builders of components.py serve every node.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

from localcluster import netpolicy, pki
from localcluster.config import ClusterConfig, ConfigError

# In node 1's namespace, when the cluster has several nodes: the segment every node is on.
NODE_BRIDGE = "fbxnodes"
# Inside an extra node's own namespace: its end of the veth to the bridge.
EXTRA_NODE_LINK = "eth0"


def node_config(config: ClusterConfig, node: int) -> ClusterConfig:
    """The view of node `node` (1..config.nodes); node 1's is config itself."""
    if not 1 <= node <= config.nodes:
        raise ConfigError(f"node {node}: cluster {config.name!r} has nodes 1..{config.nodes}")
    if node == 1:
        return config
    cluster = dataclasses.replace(config, node=1)
    name = f"{config.name}-node{node}"
    return dataclasses.replace(
        cluster,
        node=node,
        netns=f"{cluster.netns}-node{node}",
        state_dir=str(cluster.state / "nodes" / name),
        containerd_root=str(Path(cluster.containerd_root).parent / name),
    )


def cluster_config(view: ClusterConfig) -> ClusterConfig:
    """The cluster a node view belongs to (node 1's config)."""
    if view.node == 1:
        return view
    return dataclasses.replace(
        view,
        node=1,
        netns=view.netns.removesuffix(f"-node{view.node}"),
        state_dir=str(view.cluster_state),
        containerd_root=str(Path(view.containerd_root).parent / view.name),
    )


def all_nodes(config: ClusterConfig) -> list[ClusterConfig]:
    """Every node's view, node 1 first."""
    return [node_config(config, k) for k in range(1, config.nodes + 1)]


def extra_nodes(config: ClusterConfig) -> list[ClusterConfig]:
    """The views of nodes 2..N, in start order (empty for a one-node cluster)."""
    return all_nodes(config)[1:]


def by_name(config: ClusterConfig, node_name: str) -> ClusterConfig:
    """The view of the node named node_name; a clear error naming the nodes otherwise."""
    for view in all_nodes(config):
        if view.node_name == node_name:
            return view
    known = ", ".join(v.node_name for v in all_nodes(config))
    raise ConfigError(f"no node {node_name!r} in cluster {config.name!r}; its nodes: {known}")


def node_link(config: ClusterConfig) -> str:
    """The device holding this node's address inside its own namespace.

    One node keeps its address on the veth (as always); with several, node 1
    holds it on the bridge the veth and the other nodes are attached to.
    """
    if config.node != 1:
        return EXTRA_NODE_LINK
    return config.node_veth if config.nodes == 1 else NODE_BRIDGE


def bridge_port(view: ClusterConfig) -> str:
    """Node 1's end of the veth to extra node k (inside node 1's namespace)."""
    return f"node{view.node}"


@dataclasses.dataclass(frozen=True)
class Route:
    """`ip route replace <destination> via <gateway>` in one namespace (None: the host)."""

    netns: str | None
    destination: str
    gateway: str


def pod_routes(views: Sequence[ClusterConfig], pod_cidrs: Mapping[str, str]) -> list[Route]:
    """Routes that carry each node's pod /24 to that node, on the host and on the other nodes.

    views are the nodes that exist so far; pod_cidrs maps each node's name to
    the podCIDR the controller-manager gave it (which /24 goes to which node
    depends on its allocator, not only on the order the nodes registered).
    The host keeps its route for the whole pod CIDR to node 1; the /24s of the
    other nodes are more specific and go straight to them, over the segment
    they share.
    """
    routes: list[Route] = []
    for target in views:
        cidr = pod_cidrs[target.node_name]
        if target.node != 1:
            routes.append(Route(None, cidr, target.node_ip))
        for other in views:
            if other.node != target.node:
                routes.append(Route(other.netns, cidr, target.node_ip))
    return routes


# The leaves whose subject names one node: each extra node gets its own.
PER_NODE_CERTS = ("kubelet-client", "kubelet-server")


def node_cert_specs(view: ClusterConfig) -> list[pki.CertSpec]:
    """An extra node's kubelet certificates, named after the node in the cluster's PKI."""
    specs = pki.cluster_cert_specs(
        node_name=view.node_name,
        node_ip=view.node_ip,
        apiserver_service_ip=view.apiserver_service_ip,
    )
    return [
        dataclasses.replace(spec, name=f"{view.node_name}-{spec.name}")
        for spec in specs
        if spec.name in PER_NODE_CERTS
    ]


def node_pki_files(view: ClusterConfig) -> dict[str, str]:
    """File in the cluster's PKI -> file in the node's: what an extra node's daemons read."""
    files = {"ca.crt": "ca.crt"}
    for name in PER_NODE_CERTS:
        for ext in ("crt", "key"):
            files[f"{view.node_name}-{name}.{ext}"] = f"{name}.{ext}"
    for shared in ("kube-proxy", netpolicy.CLIENT_CERT.name):
        for ext in ("crt", "key"):
            files[f"{shared}.{ext}"] = f"{shared}.{ext}"
    return files
