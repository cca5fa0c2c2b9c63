"""Several nodes: names, addresses, subnets, credentials and routes of each node. Pure."""

from __future__ import annotations

from pathlib import Path

import pytest

from localcluster import components, nodes
from localcluster.components import Layout
from localcluster.config import ClusterConfig, ConfigError, build_config


def _config(**flags: object) -> ClusterConfig:
    env = {"FUSEBOX_LOCALCLUSTER_DIR": "/tmp/x", "FUSEBOX_CACHE": "/tmp/cache"}
    return build_config(name="fbxmn", env=env, **flags)  # type: ignore[arg-type]


def test_one_node_keeps_the_addresses_names_and_links_it_always_had() -> None:
    config = _config()
    assert config.node_cidr == "10.250.0.0/30"
    assert (config.node_name, config.node_ip, config.control_plane_ip) == (
        "fbxmn",
        "10.250.0.2",
        "10.250.0.2",
    )
    assert config.cgroup_root == "/fusebox-fbxmn"
    assert config.cni_network_name == "fusebox-fbxmn"
    assert nodes.node_link(config) == "fbx1"
    assert nodes.all_nodes(config) == [config]
    assert nodes.extra_nodes(config) == []
    assert nodes.pod_routes(nodes.all_nodes(config), {"fbxmn": "10.251.0.0/24"}) == []


def test_default_node_cidr_widens_only_for_more_nodes() -> None:
    assert _config(nodes=3).node_cidr == "10.250.0.0/29"
    assert _config(nodes=6).node_cidr == "10.250.0.0/28"
    assert build_config(name="a", env={"FUSEBOX_LOCALCLUSTER_NODES": "2"}).nodes == 2


def test_each_extra_node_has_its_own_name_address_subnet_and_places() -> None:
    config = _config(nodes=3)
    second, third = nodes.extra_nodes(config)
    assert [v.node_name for v in (second, third)] == ["fbxmn-node2", "fbxmn-node3"]
    assert [v.node_ip for v in (second, third)] == ["10.250.0.3", "10.250.0.4"]
    assert second.netns == "fbxmn-node2"
    assert second.state == Path("/tmp/x/fbxmn/nodes/fbxmn-node2")
    assert second.containerd_root == "/tmp/cache/containerd/fbxmn-node2"
    assert second.containerd_socket != config.containerd_socket
    assert second.cgroup_root == "/fusebox-fbxmn-node2"
    # What every node shares: the API server, the admin kubeconfig, the Service network.
    assert second.apiserver_url == config.apiserver_url == "https://10.250.0.2:6443"
    assert second.kubeconfig == config.kubeconfig
    assert second.dns_service_ip == config.dns_service_ip
    assert nodes.cluster_config(second) == config
    assert nodes.node_link(config) == nodes.NODE_BRIDGE
    assert nodes.node_link(second) == nodes.EXTRA_NODE_LINK


def test_an_extra_node_runs_only_the_node_daemons() -> None:
    second = nodes.node_config(_config(nodes=2), 2)
    assert components.enabled_components(second) == (
        "containerd",
        "kubelet",
        "kube-proxy",
        "device-plugin",
        "dra-driver",
        "kube-router",
    )
    assert "etcd" in components.enabled_components(nodes.cluster_config(second))


def test_an_extra_node_s_daemons_name_it_and_reach_node_1() -> None:
    second = nodes.node_config(_config(nodes=2), 2)
    layout = Layout(second.state)
    kubelet = components.kubelet_argv(second, layout)
    assert "--hostname-override=fbxmn-node2" in kubelet
    assert "--node-ip=10.250.0.3" in kubelet
    assert "cgroupRoot: /fusebox-fbxmn-node2" in components.kubelet_config(second, layout)
    assert '"subnet": "10.251.7.0/24"' in components.cni_conflist(second, layout, "10.251.7.0/24")
    assert "bindAddress: 10.250.0.3" in components.kube_proxy_config(second, layout)
    assert str(second.containerd_root) in components.containerd_config(second, layout)


def test_extra_node_certificates_name_the_node_and_its_address() -> None:
    second = nodes.node_config(_config(nodes=2), 2)
    specs = {s.name: s for s in nodes.node_cert_specs(second)}
    client = specs["fbxmn-node2-kubelet-client"]
    assert (client.common_name, client.organizations) == (
        "system:node:fbxmn-node2",
        ("system:nodes",),
    )
    assert specs["fbxmn-node2-kubelet-server"].ip_addresses == ("10.250.0.3",)
    files = nodes.node_pki_files(second)
    assert files["fbxmn-node2-kubelet-client.key"] == "kubelet-client.key"
    assert "ca.key" not in files


# Which /24 a node gets is the controller-manager's choice: node 3 may get the fourth.
GIVEN = {"fbxmn": "10.251.0.0/24", "fbxmn-node2": "10.251.1.0/24", "fbxmn-node3": "10.251.3.0/24"}


def test_routes_carry_each_node_s_pod_subnet_to_that_node_only() -> None:
    config = _config(nodes=3)
    routes = nodes.pod_routes(nodes.all_nodes(config), GIVEN)
    assert nodes.Route(None, "10.251.1.0/24", "10.250.0.3") in routes
    assert nodes.Route(None, "10.251.3.0/24", "10.250.0.4") in routes
    # The host's route for the whole pod CIDR to node 1 covers node 1's /24.
    assert not [r for r in routes if r.netns is None and r.destination == "10.251.0.0/24"]
    assert nodes.Route("fbxmn-node2", "10.251.0.0/24", "10.250.0.2") in routes
    assert nodes.Route("fbxmn-node3", "10.251.1.0/24", "10.250.0.3") in routes
    assert nodes.Route("fbxmn", "10.251.3.0/24", "10.250.0.4") in routes
    assert not [r for r in routes if r.netns == "fbxmn-node2" and r.gateway == "10.250.0.3"]
    assert len(routes) == 2 + 3 * 2


def test_routes_while_nodes_join_name_only_nodes_that_exist() -> None:
    views = nodes.all_nodes(_config(nodes=3))[:2]
    assert {r.netns for r in nodes.pod_routes(views, GIVEN)} == {None, "fbxmn", "fbxmn-node2"}


def test_a_node_is_found_by_name_or_refused_naming_the_nodes() -> None:
    config = _config(nodes=2)
    assert nodes.by_name(config, "fbxmn-node2").node == 2
    assert nodes.by_name(config, "fbxmn") == config
    with pytest.raises(ConfigError, match="fbxmn, fbxmn-node2"):
        nodes.by_name(config, "fbxmn-node7")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"nodes": 0}, "1 or more"),
        ({"nodes": 3, "node_cidr": "10.250.0.0/30"}, "no room for 3 nodes"),
        ({"nodes": 3, "pod_cidr": "10.251.0.0/23"}, "fewer /24s"),
    ],
)
def test_impossible_node_counts_are_refused(flags: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _config(**flags)


def test_node_count_is_saved_and_a_config_from_before_has_one_node() -> None:
    config = _config(nodes=3)
    assert ClusterConfig.from_json(config.to_json()).nodes == 3
    old = config.to_json().replace('"nodes": 3,', "").replace('"node": 1,', "")
    assert ClusterConfig.from_json(old).nodes == 1
