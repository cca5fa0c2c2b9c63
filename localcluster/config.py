"""The shape of one local cluster: names, subnets, simulated GPUs and paths.

Everything `up`, `down` and `status` need to agree on lives here as one
frozen value, derived from flags and FUSEBOX_* environment variables and
saved next to the cluster's state so that `down`/`status`/`env` find the
cluster with nothing but its name. Pure: no I/O apart from reading the
environment handed in.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent

DEFAULT_NAME = "fusebox"
DEFAULT_GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
REGISTRY_PORT = 5000


class ConfigError(ValueError):
    """A flag or environment value that cannot describe a cluster."""


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """One cluster. Addresses are strings so the value round-trips through JSON."""

    name: str
    netns: str
    host_veth: str
    node_veth: str
    node_cidr: str  # the /30 (or wider) between host and node, e.g. 10.250.0.0/30
    pod_cidr: str
    service_cidr: str
    gpus: int
    gpu_product: str
    gpu_memory_mib: int
    state_dir: str
    containerd_root: str
    bin_dir: str
    # kube-router enforces NetworkPolicy; off only while something still needs
    # to reach pods from the host past their policies (docs/localcluster.md).
    network_policy: bool = True
    # How many nodes the cluster has; node 1 runs the control plane as well.
    nodes: int = 1
    # Which node this value describes: 1 for the cluster itself, 2..nodes for
    # the view nodes.node_config makes of an extra node (its own netns, state
    # directory and containerd root). A one-node cluster is exactly as before.
    node: int = 1
    # An authenticated OCI registry on node 1 (localcluster/registry.py) that every
    # node's containerd trusts: the images and chart a platform team pulls with
    # credentials. FUSEBOX_LOCALCLUSTER_REGISTRY=off leaves it out.
    registry: bool = True

    # --- derived values -------------------------------------------------
    @property
    def host_ip(self) -> str:
        """The host's end of the veth: first usable address of node_cidr."""
        return str(ipaddress.ip_network(self.node_cidr)[1])

    @property
    def node_ip(self) -> str:
        """This node's address, where its kubelet listens: node k has address k+1 of node_cidr."""
        return str(ipaddress.ip_network(self.node_cidr)[1 + self.node])

    @property
    def control_plane_ip(self) -> str:
        """Node 1's address, where the apiserver listens, whichever node this value describes."""
        return str(ipaddress.ip_network(self.node_cidr)[2])

    @property
    def registry_address(self) -> str:
        """HOST:PORT of the cluster's registry: node 1's address, reached from the host
        over the veth and from every node's containerd."""
        return f"{self.control_plane_ip}:{REGISTRY_PORT}"

    @property
    def node_prefix_len(self) -> int:
        return ipaddress.ip_network(self.node_cidr).prefixlen

    @property
    def node_pod_cidr(self) -> str:
        """Node 1's /24: the first subnet the controller-manager allocates, as node 1
        registers first. Extra nodes read theirs from their Node (its order is not fixed)."""
        return str(next(ipaddress.ip_network(self.pod_cidr).subnets(new_prefix=24)))

    @property
    def pod_gateway_ip(self) -> str:
        return str(ipaddress.ip_network(self.node_pod_cidr)[1])

    @property
    def apiserver_service_ip(self) -> str:
        """The `kubernetes` Service's ClusterIP: first address of the Service CIDR."""
        return str(ipaddress.ip_network(self.service_cidr)[1])

    @property
    def dns_service_ip(self) -> str:
        """kube-dns's ClusterIP: the tenth address of the Service CIDR, as kubeadm does."""
        return str(ipaddress.ip_network(self.service_cidr)[10])

    @property
    def node_name(self) -> str:
        """Node 1 is named after the cluster (as with one node); node k is <name>-node<k>."""
        return self.name if self.node == 1 else f"{self.name}-node{self.node}"

    @property
    def cgroup_root(self) -> str:
        """Parent cgroup of every pod of this node, so teardown can find them all by name."""
        return f"/fusebox-{self.node_name}"

    @property
    def cni_network_name(self) -> str:
        return f"fusebox-{self.node_name}"

    @property
    def firewall_comment(self) -> str:
        """Tag on every host iptables rule, so `down` deletes exactly ours."""
        return f"fusebox-localcluster:{self.name}"

    @property
    def state(self) -> Path:
        return Path(self.state_dir)

    @property
    def cluster_state(self) -> Path:
        """The cluster's state directory; an extra node's lies at <it>/nodes/<node name>."""
        return self.state if self.node == 1 else self.state.parents[1]

    @property
    def cache_dir(self) -> Path:
        """The cache this cluster keeps its images and layers in: containerd_root is
        <cache>/containerd/<node name>."""
        return Path(self.containerd_root).parents[1]

    @property
    def kubeconfig(self) -> Path:
        return self.cluster_state / "kubeconfig"

    @property
    def containerd_socket(self) -> Path:
        return self.state / "containerd" / "containerd.sock"

    @property
    def apiserver_url(self) -> str:
        return f"https://{self.control_plane_ip}:6443"

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ClusterConfig:
        raw: dict[str, Any] = json.loads(text)
        # Saved before NetworkPolicy was enforced: that cluster runs no kube-router.
        raw.setdefault("network_policy", False)
        # Saved before the registry existed: that cluster runs none until it is made again.
        raw.setdefault("registry", False)
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in fields})


def cache_dir(env: Mapping[str, str]) -> Path:
    return Path(env.get("FUSEBOX_CACHE") or Path.home() / ".cache" / "fusebox")


def state_root(env: Mapping[str, str]) -> Path:
    """Where every cluster keeps PKI, etcd, kubelet and containerd state, logs."""
    return Path(env.get("FUSEBOX_LOCALCLUSTER_DIR") or "/var/lib/fusebox-localcluster")


def state_dir_for(name: str, env: Mapping[str, str]) -> Path:
    return state_root(env) / name


def build_config(
    *,
    name: str,
    env: Mapping[str, str],
    netns: str | None = None,
    host_veth: str | None = None,
    node_veth: str | None = None,
    node_cidr: str | None = None,
    pod_cidr: str | None = None,
    service_cidr: str | None = None,
    gpus: int | None = None,
    gpu_product: str | None = None,
    gpu_memory_mib: int | None = None,
    network_policy: bool | None = None,
    nodes: int | None = None,
) -> ClusterConfig:
    """Flags win over FUSEBOX_LOCALCLUSTER_* variables, which win over defaults."""

    def pick(flag: str | None, var: str, default: str) -> str:
        if flag is not None:
            return flag
        return env.get(f"FUSEBOX_LOCALCLUSTER_{var}") or default

    def pick_int(flag: int | None, var: str, default: int) -> int:
        if flag is not None:
            return flag
        raw = env.get(f"FUSEBOX_LOCALCLUSTER_{var}")
        if not raw:
            return default
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(f"FUSEBOX_LOCALCLUSTER_{var}={raw!r} is not an integer") from None

    node_count = pick_int(nodes, "NODES", 1)
    config = ClusterConfig(
        name=name,
        netns=pick(netns, "NETNS", name),
        host_veth=pick(host_veth, "HOST_VETH", "fbx0"),
        node_veth=pick(node_veth, "NODE_VETH", "fbx1"),
        node_cidr=pick(node_cidr, "NODE_CIDR", default_node_cidr(node_count)),
        pod_cidr=pick(pod_cidr, "POD_CIDR", "10.251.0.0/16"),
        service_cidr=pick(service_cidr, "SERVICE_CIDR", "10.252.0.0/16"),
        gpus=pick_int(gpus, "GPUS", 1),
        gpu_product=pick(gpu_product, "GPU_PRODUCT", DEFAULT_GPU_PRODUCT),
        gpu_memory_mib=pick_int(gpu_memory_mib, "GPU_MEMORY_MIB", 1024),
        state_dir=str(state_dir_for(name, env)),
        containerd_root=str(cache_dir(env) / "containerd" / name),
        bin_dir=str(REPO_ROOT / ".cache" / "bin"),
        network_policy=network_policy_asked(network_policy, env) is not False,
        nodes=node_count,
        registry=_on_off(env, "FUSEBOX_LOCALCLUSTER_REGISTRY") is not False,
    )
    validate(config)
    return config


def default_node_cidr(nodes: int) -> str:
    """10.250.0.0/30 for one node (as always); wide enough for the host and every node else.

    The host takes the first address, node k address k+1; the network and
    broadcast addresses are left out.
    """
    prefix = 30
    while 2 ** (32 - prefix) < max(nodes, 1) + 3:
        prefix -= 1
    return f"10.250.0.0/{prefix}"


def network_policy_asked(flag: bool | None, env: Mapping[str, str]) -> bool | None:
    """--[no-]network-policy, else FUSEBOX_LOCALCLUSTER_NETWORK_POLICY=on|off, else None.

    None lets a running cluster keep what it runs; a new one enforces.
    """
    if flag is not None:
        return flag
    return _on_off(env, "FUSEBOX_LOCALCLUSTER_NETWORK_POLICY")


def _on_off(env: Mapping[str, str], name: str) -> bool | None:
    """An on/off environment variable: None when unset, a ConfigError when neither."""
    raw = (env.get(name) or "").strip().lower()
    if not raw:
        return None
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}={raw!r}: use on or off")


_NAME_OK = set("abcdefghijklmnopqrstuvwxyz0123456789-")


def validate(config: ClusterConfig) -> None:
    """Reject values that would make an invalid node name, link name or subnet plan."""
    if not config.name or set(config.name) - _NAME_OK or not config.name[0].isalpha():
        raise ConfigError(
            f"cluster name {config.name!r}: use lowercase letters, digits and '-', "
            "starting with a letter"
        )
    if len(config.name) > 20:
        raise ConfigError(f"cluster name {config.name!r} is longer than 20 characters")
    for label, link in (("host veth", config.host_veth), ("node veth", config.node_veth)):
        if not link or len(link) > 15 or "/" in link or " " in link:
            raise ConfigError(f"{label} name {link!r} must be 1-15 characters, no '/' or spaces")
    if config.host_veth == config.node_veth:
        raise ConfigError("host and node veth names must differ")
    if not config.netns or "/" in config.netns:
        raise ConfigError(f"network namespace name {config.netns!r} is invalid")
    nets: dict[str, ipaddress.IPv4Network] = {}
    for label, cidr in (
        ("node CIDR", config.node_cidr),
        ("pod CIDR", config.pod_cidr),
        ("service CIDR", config.service_cidr),
    ):
        try:
            net = ipaddress.ip_network(cidr, strict=True)
        except ValueError as err:
            raise ConfigError(f"{label} {cidr!r}: {err}") from None
        if not isinstance(net, ipaddress.IPv4Network):
            raise ConfigError(f"{label} {cidr!r}: only IPv4 is supported")
        nets[label] = net
    if config.nodes < 1:
        raise ConfigError(f"--nodes {config.nodes}: must be 1 or more")
    if nets["node CIDR"].prefixlen > 30:
        raise ConfigError(f"node CIDR {config.node_cidr} needs at least a /30")
    if nets["pod CIDR"].prefixlen > 24:
        raise ConfigError(f"pod CIDR {config.pod_cidr} needs at least a /24 (the node's share)")
    if nets["service CIDR"].prefixlen > 28:
        raise ConfigError(f"service CIDR {config.service_cidr} needs at least a /28")
    labels = list(nets)
    for i, first in enumerate(labels):
        for second in labels[i + 1 :]:
            if nets[first].overlaps(nets[second]):
                raise ConfigError(f"{first} {nets[first]} overlaps {second} {nets[second]}")
    if not 1 <= config.node <= config.nodes:
        raise ConfigError(f"node {config.node}: the cluster has nodes 1..{config.nodes}")
    if nets["node CIDR"].num_addresses < config.nodes + 3:
        raise ConfigError(
            f"node CIDR {config.node_cidr} has no room for {config.nodes} nodes and the host: "
            f"use --node-cidr with a /{default_node_cidr(config.nodes).split('/')[1]} or wider"
        )
    if 2 ** (24 - nets["pod CIDR"].prefixlen) < config.nodes:
        raise ConfigError(f"pod CIDR {config.pod_cidr} has fewer /24s than {config.nodes} nodes")
    if config.gpus < 0:
        raise ConfigError(f"--gpus {config.gpus}: must be 0 or more")
    if config.gpu_memory_mib <= 0:
        raise ConfigError(f"--gpu-memory-mib {config.gpu_memory_mib}: must be positive")
    if not config.gpu_product or any(c.isspace() for c in config.gpu_product):
        raise ConfigError(f"--gpu-product {config.gpu_product!r}: a label value without spaces")


def load_saved(name: str, env: Mapping[str, str]) -> ClusterConfig | None:
    """The config a previous `up` saved, or None when this cluster never ran."""
    path = state_dir_for(name, env) / "config.json"
    if not path.exists():
        return None
    return ClusterConfig.from_json(path.read_text())


def default_name(env: Mapping[str, str]) -> str:
    return env.get("FUSEBOX_LOCALCLUSTER_NAME") or DEFAULT_NAME


def current_env() -> Mapping[str, str]:
    return os.environ
