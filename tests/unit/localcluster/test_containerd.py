"""The node's containerd: the built v2 binaries, a version-4 config with CDI for DRA, and
where a task's bundle says its shim listens."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from localcluster import dra, lifecycle
from localcluster.components import (
    CONTAINERD_BIN_DIR,
    CONTAINERD_BINARIES,
    SANDBOX_IMAGE,
    SYSTEM_BINARIES,
    Layout,
    containerd_argv,
    containerd_config,
)
from localcluster.config import ClusterConfig, build_config
from localcluster.containerd import CTR, shim_socket_in


def _config() -> ClusterConfig:
    return build_config(name="fusebox", env={"FUSEBOX_LOCALCLUSTER_DIR": "/tmp/x"})


def _parsed(config: ClusterConfig) -> dict[str, Any]:
    return tomllib.loads(containerd_config(config, Layout(config.state)))


def test_the_config_is_version_4_with_the_servers_as_plugins() -> None:
    config = _config()
    parsed = _parsed(config)
    assert parsed["version"] == 4
    plugins = parsed["plugins"]
    assert plugins["io.containerd.server.v1.grpc"]["address"] == str(config.containerd_socket)
    assert (
        plugins["io.containerd.server.v1.ttrpc"]["address"] == f"{config.containerd_socket}.ttrpc"
    )
    assert "grpc" not in parsed and "ttrpc" not in parsed


def test_containerd_reads_the_dra_drivers_cdi_specs_and_only_those() -> None:
    config = _config()
    runtime = _parsed(config)["plugins"]["io.containerd.cri.v1.runtime"]
    assert runtime["cdi_spec_dirs"] == [str(dra.control_for(config).cdi_dir)]


def test_the_cri_settings_of_the_1_6_config_carry_over() -> None:
    config = _config()
    plugins = _parsed(config)["plugins"]
    images = plugins["io.containerd.cri.v1.images"]
    assert (images["snapshotter"], images["pinned_images"]["sandbox"]) == (
        "overlayfs",
        SANDBOX_IMAGE,
    )
    runtime = plugins["io.containerd.cri.v1.runtime"]
    assert runtime["restrict_oom_score_adj"] is True
    runc = runtime["containerd"]["runtimes"]["runc"]
    assert runc["runtime_type"] == "io.containerd.runc.v2"
    assert runc["options"]["SystemdCgroup"] is False
    assert runc["options"]["Root"] == str(Layout(config.state).containerd / "runc")
    assert runtime["cni"]["bin_dirs"] == ["/usr/lib/cni"]
    assert runtime["cni"]["conf_dir"] == str(Layout(config.state).cni_conf_dir)
    assert plugins["io.containerd.grpc.v1.cri"]["stream_server_address"] == "127.0.0.1"


def test_nothing_of_the_hosts_containerd_setup_leaks_in() -> None:
    parsed = _parsed(_config())
    assert parsed["imports"] == []
    assert parsed["plugins"]["io.containerd.nri.v1.nri"]["disable"] is True


def test_the_built_containerd_runs_and_its_shim_comes_before_debians_on_path() -> None:
    config = _config()
    assert containerd_argv(Layout(config.state))[0] == str(CONTAINERD_BIN_DIR / "containerd")
    assert CTR == str(CONTAINERD_BIN_DIR / "ctr")
    path = lifecycle._system_path(config).split(":")
    assert path.index(str(CONTAINERD_BIN_DIR)) < path.index("/usr/bin")
    assert not set(CONTAINERD_BINARIES) & set(SYSTEM_BINARIES)


def test_a_containerd_2_bundle_names_its_shims_socket_in_bootstrap_json(tmp_path: Path) -> None:
    socket = "/run/containerd/s/be85c0ca988ba0e7de517678eac801e33e3a08ee611fc1c8e9c213a8591e2d30"
    bootstrap = {"version": 3, "address": f"unix://{socket}", "protocol": "ttrpc"}
    (tmp_path / "bootstrap.json").write_text(json.dumps(bootstrap))
    assert shim_socket_in(tmp_path) == Path(socket)


def test_a_containerd_1_bundle_names_it_in_its_address_file(tmp_path: Path) -> None:
    (tmp_path / "address").write_text("unix:///run/containerd/s/abc\n")
    assert shim_socket_in(tmp_path) == Path("/run/containerd/s/abc")


def test_a_bundle_without_either_names_no_socket(tmp_path: Path) -> None:
    assert shim_socket_in(tmp_path) is None
    (tmp_path / "bootstrap.json").write_text("{")
    assert shim_socket_in(tmp_path) is None
