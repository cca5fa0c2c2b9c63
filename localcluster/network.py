"""The node's network namespace, its veth to the host, routes and firewall.

Like a kind node, the whole cluster lives in one network namespace joined
to the host by a veth pair. The host routes the pod and Service CIDRs to the
node's address, so tests on the host reach pod IPs and ClusterIPs, and the
node has no default route, so nothing in the cluster reaches beyond the host.
Belt and braces: the host drops anything it would forward to or from the
veth, tagged with a comment so `down` removes exactly our rules.

With several nodes (nodes.py) node 1's address moves from its veth to a
bridge in its namespace, which the veth and one veth per extra node join:
host and nodes share one segment, so the host routes each extra node's pod
/24 straight to it and every path is the same both ways. Extra nodes have
no default route either.
"""

from __future__ import annotations

import ipaddress
import json
import shlex
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from localcluster import nodes
from localcluster.config import ClusterConfig


class NetworkError(RuntimeError):
    """The host's network cannot take this cluster (a name or subnet collides)."""


def _run(args: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(args), capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise NetworkError(f"{' '.join(args)}: {result.stderr.strip() or result.stdout.strip()}")
    return result


def _json(args: Sequence[str]) -> list[dict[str, Any]]:
    out = _run(args).stdout.strip()
    return json.loads(out) if out else []


def netns_names() -> list[str]:
    return [entry["name"] for entry in _json(["ip", "-j", "netns", "list"])]


def link_exists(name: str) -> bool:
    return _run(["ip", "link", "show", "dev", name], check=False).returncode == 0


def host_collisions(config: ClusterConfig) -> list[str]:
    """Why the host cannot take this cluster: names or subnets already in use.

    Called after our own leftovers were cleaned, so anything found is not ours.
    """
    problems: list[str] = []
    existing = netns_names()
    for view in nodes.all_nodes(config):
        if view.netns in existing:
            problems.append(f"network namespace {view.netns!r} already exists (ip netns list)")
    for link in (config.host_veth, config.node_veth):
        if link_exists(link):
            problems.append(f"network interface {link!r} already exists (ip link)")
    ours = [
        ipaddress.ip_network(c) for c in (config.node_cidr, config.pod_cidr, config.service_cidr)
    ]
    for route in _json(["ip", "-j", "route", "show"]):
        dst = route.get("dst", "")
        if dst in ("default", ""):
            continue
        try:
            net = ipaddress.ip_network(dst, strict=False)
        except ValueError:
            continue
        for cidr in ours:
            if net.overlaps(cidr):
                problems.append(f"host route {dst} dev {route.get('dev')} overlaps {cidr}")
    for iface in _json(["ip", "-j", "-4", "addr", "show"]):
        for info in iface.get("addr_info", []):
            local = ipaddress.ip_address(info["local"])
            for cidr in ours:
                if local in cidr:
                    problems.append(f"address {local} on {iface.get('ifname')} lies in {cidr}")
    return problems


def in_netns(config: ClusterConfig, args: Sequence[str]) -> list[str]:
    return ["nsenter", f"--net=/run/netns/{config.netns}", "--", *args]


def setup(config: ClusterConfig) -> None:
    ns = config.netns
    host, node = config.host_veth, config.node_veth
    prefix = config.node_prefix_len
    link = nodes.node_link(config)
    bridge: list[list[str]] = []
    if link != node:
        bridge = [
            ["ip", "-n", ns, "link", "add", link, "type", "bridge"],
            ["ip", "-n", ns, "link", "set", node, "master", link],
            ["ip", "-n", ns, "link", "set", link, "up"],
        ]
    steps: list[list[str]] = [
        ["ip", "netns", "add", ns],
        ["ip", "link", "add", host, "type", "veth", "peer", "name", node, "netns", ns],
        ["ip", "addr", "add", f"{config.host_ip}/{prefix}", "dev", host],
        ["ip", "link", "set", host, "up"],
        ["ip", "-n", ns, "link", "set", "lo", "up"],
        *bridge,
        ["ip", "-n", ns, "addr", "add", f"{config.node_ip}/{prefix}", "dev", link],
        ["ip", "-n", ns, "link", "set", node, "up"],
        # Locally generated packets to a ClusterIP need a route before
        # kube-proxy's OUTPUT DNAT rewrites them; there is no default route.
        ["ip", "-n", ns, "route", "add", config.service_cidr, "dev", link],
        in_netns(config, ["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"]),
        # Pod-to-ClusterIP-to-pod on one bridge needs the reply to pass
        # iptables to be un-NATed.
        in_netns(config, ["sysctl", "-q", "-w", "net.bridge.bridge-nf-call-iptables=1"]),
        ["ip", "route", "add", config.pod_cidr, "via", config.node_ip, "dev", host],
        ["ip", "route", "add", config.service_cidr, "via", config.node_ip, "dev", host],
    ]
    for step in steps:
        _run(step)
    for direction in ("-i", "-o"):
        _run(
            [
                "iptables",
                "-w",
                "-I",
                "FORWARD",
                direction,
                host,
                "-m",
                "comment",
                "--comment",
                config.firewall_comment,
                "-j",
                "DROP",
            ]
        )


def setup_extra_node(view: ClusterConfig) -> None:
    """An extra node's namespace, its veth to node 1's bridge, its address; no default route."""
    ns, first = view.netns, nodes.cluster_config(view).netns
    port, link = nodes.bridge_port(view), nodes.node_link(view)
    steps: list[list[str]] = [
        ["ip", "netns", "add", ns],
        ["ip", "-n", first, "link", "add", port, "type", "veth", "peer", "name", link, "netns", ns],
        ["ip", "-n", first, "link", "set", port, "master", nodes.NODE_BRIDGE],
        ["ip", "-n", first, "link", "set", port, "up"],
        ["ip", "-n", ns, "link", "set", "lo", "up"],
        ["ip", "-n", ns, "addr", "add", f"{view.node_ip}/{view.node_prefix_len}", "dev", link],
        ["ip", "-n", ns, "link", "set", link, "up"],
        ["ip", "-n", ns, "route", "add", view.service_cidr, "dev", link],
        in_netns(view, ["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"]),
        in_netns(view, ["sysctl", "-q", "-w", "net.bridge.bridge-nf-call-iptables=1"]),
    ]
    for step in steps:
        _run(step)


def apply_routes(routes: Sequence[nodes.Route]) -> None:
    """Install each route (replacing one to the same destination), on the host or in a node."""
    for route in routes:
        args = ["route", "replace", route.destination, "via", route.gateway]
        _run(["ip", *(["-n", route.netns] if route.netns else []), *args])


def teardown_extra_node(view: ClusterConfig, pod_netns: Sequence[str] = ()) -> None:
    """Remove an extra node's pods' namespaces and its own (its veth goes with it)."""
    for name in sorted(set(pod_netns)):
        if Path(f"/run/netns/{name}").exists():
            _run(["ip", "netns", "delete", name], check=False)
    if view.netns in netns_names():
        _run(["ip", "netns", "delete", view.netns], check=False)


def firewall_rules(config: ClusterConfig) -> list[str]:
    """Our rules in the host's filter table, as `iptables -S` prints them."""
    result = _run(["iptables", "-w", "-S"], check=False)
    return [
        line for line in result.stdout.splitlines() if _has_comment(line, config.firewall_comment)
    ]


def _has_comment(rule: str, comment: str) -> bool:
    words = shlex.split(rule)
    return any(a == "--comment" and b == comment for a, b in zip(words, words[1:], strict=False))


def remove_firewall_rules(config: ClusterConfig) -> None:
    for rule in firewall_rules(config):
        words = shlex.split(rule)
        if words and words[0] == "-A":
            _run(["iptables", "-w", "-D", *words[1:]], check=False)


def pod_netns_names(config: ClusterConfig) -> list[str]:
    """The pods' `cni-*` namespaces that hold an address of this cluster's pod CIDR."""
    pods = ipaddress.ip_network(config.pod_cidr)
    found: list[str] = []
    for name in netns_names():
        if not name.startswith("cni-"):
            continue
        result = _run(["ip", "-n", name, "-j", "-4", "addr", "show"], check=False)
        if result.returncode != 0 or not result.stdout.strip():
            continue
        for link in json.loads(result.stdout):
            if any(ipaddress.ip_address(a["local"]) in pods for a in link.get("addr_info", [])):
                found.append(name)
                break
    return found


def teardown(config: ClusterConfig, extra_pod_netns: Sequence[str] = ()) -> None:
    """Remove pod namespaces, our namespace, veth, routes and rules; tolerate absence."""
    for name in sorted(set(pod_netns_names(config)) | set(extra_pod_netns)):
        if Path(f"/run/netns/{name}").exists():
            _run(["ip", "netns", "delete", name], check=False)
    if link_exists(config.host_veth):
        _run(["ip", "link", "delete", config.host_veth], check=False)
    for cidr in (config.pod_cidr, config.service_cidr):
        _run(["ip", "route", "delete", cidr, "via", config.node_ip], check=False)
    if config.netns in netns_names():
        _run(["ip", "netns", "delete", config.netns], check=False)
    remove_firewall_rules(config)


def leftovers(config: ClusterConfig) -> list[str]:
    """What of our network is still on the host (empty after a clean `down`)."""
    found: list[str] = []
    existing = netns_names()
    found += [f"netns {v.netns}" for v in nodes.all_nodes(config) if v.netns in existing]
    if link_exists(config.host_veth):
        found.append(f"link {config.host_veth}")
    found += [f"pod netns {n}" for n in pod_netns_names(config)]
    found += [f"iptables {r}" for r in firewall_rules(config)]
    return found
