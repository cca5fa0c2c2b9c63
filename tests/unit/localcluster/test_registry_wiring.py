"""The cluster's registry as one of its daemons: on node 1 only, on by default, off by
setting, and every node's containerd pointed at the hosts.toml that trusts its CA."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from localcluster import components, lifecycle, nodes, registry
from localcluster.components import Layout
from localcluster.config import ClusterConfig, ConfigError, build_config


def _config(env: dict[str, str] | None = None, **flags: object) -> ClusterConfig:
    base = {"FUSEBOX_LOCALCLUSTER_DIR": "/tmp/x", "FUSEBOX_CACHE": "/tmp/cache"}
    return build_config(name="fusebox", env={**base, **(env or {})}, **flags)  # type: ignore[arg-type]


def test_a_new_cluster_runs_the_registry_on_node_1_only() -> None:
    config = _config(nodes=2)
    assert config.registry
    assert "registry" in components.enabled_components(config)
    assert "registry" not in components.enabled_components(nodes.node_config(config, 2))
    # After the control plane, before the containerd that pulls from it.
    order = components.enabled_components(config)
    assert order.index("kube-scheduler") < order.index("registry") < order.index("containerd")


@pytest.mark.parametrize(("value", "on"), [("off", False), ("0", False), ("on", True), ("", True)])
def test_the_registry_is_switched_by_its_variable(value: str, on: bool) -> None:
    config = _config({"FUSEBOX_LOCALCLUSTER_REGISTRY": value})
    assert config.registry is on
    assert ("registry" in components.enabled_components(config)) is on


def test_a_bad_switch_value_is_refused_naming_the_variable() -> None:
    with pytest.raises(ConfigError, match="FUSEBOX_LOCALCLUSTER_REGISTRY='maybe'"):
        _config({"FUSEBOX_LOCALCLUSTER_REGISTRY": "maybe"})


def test_a_cluster_saved_before_the_registry_runs_none() -> None:
    saved = _config().to_json().replace('"registry": true', '"registry-gone": 0')
    assert ClusterConfig.from_json(saved).registry is False


def test_it_listens_on_node_1_where_every_node_and_the_host_reach_it() -> None:
    config = _config(nodes=3)
    assert config.registry_address == f"{config.control_plane_ip}:5000"
    assert components.registry_endpoint(nodes.node_config(config, 3)).address == (
        config.registry_address
    )
    argv = components.argv_for("registry", config, Layout(config.state))
    assert argv == [str(registry.REGISTRY_BINARY), "serve", "/tmp/x/fusebox/registry/config.yml"]
    # Layers in the cache, so a pushed image survives down and up.
    assert components.registry_paths(config).storage == Path("/tmp/cache/oci-registry/fusebox")


def test_every_nodes_containerd_reads_the_hosts_file_that_trusts_the_cluster_ca() -> None:
    config = _config(nodes=2)
    for view in nodes.all_nodes(config):
        layout = Layout(view.state)
        images = tomllib.loads(components.containerd_config(view, layout))["plugins"][
            "io.containerd.cri.v1.images"
        ]
        assert images["registry"]["config_path"] == str(layout.registry_hosts)
        hosts = components.registry_hosts_file(view, layout)
        assert hosts.path == layout.registry_hosts / config.registry_address / "hosts.toml"
        parsed = tomllib.loads(hosts.text)
        assert parsed["host"][f"https://{config.registry_address}"]["ca"] == (
            "/tmp/x/fusebox/pki/ca.crt"
        )


def test_without_the_registry_containerd_has_no_registry_section() -> None:
    config = _config({"FUSEBOX_LOCALCLUSTER_REGISTRY": "off"})
    images = tomllib.loads(components.containerd_config(config, Layout(config.state)))["plugins"][
        "io.containerd.cri.v1.images"
    ]
    assert "registry" not in images


def test_a_missing_registry_binary_is_named_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(registry, "REGISTRY_BINARY", tmp_path / "registry")
    problems = lifecycle.missing_binaries(_config())
    assert f"{tmp_path / 'registry'} is missing: run `make setup-binaries`" in problems
    off = lifecycle.missing_binaries(_config({"FUSEBOX_LOCALCLUSTER_REGISTRY": "off"}))
    assert not any("registry" in p for p in off)
