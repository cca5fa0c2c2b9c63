"""localcluster's pure parts: the subnet plan, flag/env precedence, GPU labels, PV shape."""

from __future__ import annotations

from pathlib import Path

import pytest

from localcluster import gpu, storage
from localcluster.config import ClusterConfig, ConfigError, build_config
from localcluster.containerd import image_reference


def _config(**flags: object) -> ClusterConfig:
    return build_config(name="fusebox", env={"FUSEBOX_LOCALCLUSTER_DIR": "/tmp/x"}, **flags)  # type: ignore[arg-type]


def test_default_plan_derives_node_gateway_and_service_addresses() -> None:
    config = _config()
    assert (config.host_ip, config.node_ip) == ("10.250.0.1", "10.250.0.2")
    assert config.node_pod_cidr == "10.251.0.0/24"
    assert config.apiserver_service_ip == "10.252.0.1"
    assert config.dns_service_ip == "10.252.0.10"
    assert config.kubeconfig.as_posix() == "/tmp/x/fusebox/kubeconfig"


def test_flags_win_over_environment_which_wins_over_defaults() -> None:
    env = {"FUSEBOX_LOCALCLUSTER_GPUS": "4", "FUSEBOX_LOCALCLUSTER_POD_CIDR": "10.99.0.0/16"}
    from_env = build_config(name="a", env=env)
    assert (from_env.gpus, from_env.pod_cidr) == (4, "10.99.0.0/16")
    assert build_config(name="a", env=env, gpus=2).gpus == 2


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"pod_cidr": "10.252.0.0/16"}, "overlaps"),
        ({"node_cidr": "10.250.0.0/31"}, "at least a /30"),
        ({"service_cidr": "10.252.0.1/16"}, "host bits"),
        ({"host_veth": "fbx1"}, "must differ"),
        ({"host_veth": "a-name-longer-than-15"}, "1-15 characters"),
        ({"gpus": -1}, "0 or more"),
        ({"gpu_product": "NVIDIA H100"}, "without spaces"),
    ],
)
def test_bad_settings_are_refused_with_a_reason(flags: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _config(**flags)


def test_bad_cluster_name_is_refused() -> None:
    with pytest.raises(ConfigError, match="lowercase"):
        build_config(name="Bad_Name", env={})


def test_config_round_trips_through_json() -> None:
    config = _config(gpus=3)
    assert ClusterConfig.from_json(config.to_json()) == config


def test_gpu_labels_carry_product_memory_and_count() -> None:
    labels = gpu.labels(_config(gpus=2, gpu_memory_mib=2048))
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert (labels["nvidia.com/gpu.memory"], labels["nvidia.com/gpu.count"]) == ("2048", "2")


def test_local_pv_is_pinned_to_the_node_and_uses_the_local_class() -> None:
    pv = storage.persistent_volume(
        _config(),
        name="models",
        path=Path("/srv/m/"),
        size="2Gi",
        access_mode="ReadOnlyMany",
    )
    assert pv["spec"]["storageClassName"] == "local"
    assert pv["spec"]["local"] == {"path": "/srv/m"}
    term = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]
    assert term["matchExpressions"][0]["values"] == ["fusebox"]


def test_pv_directory_unreadable_by_pods_is_refused(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    with pytest.raises(storage.StorageError, match="chmod"):
        storage.check_directory(private)
    with pytest.raises(storage.StorageError, match="no such directory"):
        storage.check_directory(private / "absent")


def test_short_image_names_expand_to_the_local_registry() -> None:
    assert image_reference("testapp") == "localhost/fusebox/testapp:latest"
    assert image_reference("inference:dev") == "localhost/fusebox/inference:dev"
    assert image_reference("localhost/fusebox/pause:latest") == "localhost/fusebox/pause:latest"
