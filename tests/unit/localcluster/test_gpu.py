"""The simulated GPUs' Python side: the device plugin's command line and its control files."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from localcluster import gpu, gpu_cli
from localcluster.config import ClusterConfig, build_config
from localcluster.progress import ClusterError


def _config(tmp_path: Path, **flags: object) -> ClusterConfig:
    env = {"FUSEBOX_LOCALCLUSTER_DIR": str(tmp_path)}
    return build_config(name="fusebox", env=env, **flags)  # type: ignore[arg-type]


def _flags(argv: list[str]) -> dict[str, str]:
    return dict(a.removeprefix("--").split("=", 1) for a in argv[1:])


def test_device_plugin_serves_in_the_kubelets_plugin_registry_and_reads_the_clusters_files(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)
    kubelet_root = tmp_path / "fusebox" / "kubelet"
    argv = gpu.device_plugin_argv(config, kubelet_root)
    flags = _flags(argv)
    assert argv[0] == str(Path(config.bin_dir) / "gpusim")
    assert flags["socket"] == str(kubelet_root / "plugins_registry" / "fusebox-gpusim.sock")
    assert flags["resource"] == "nvidia.com/gpu"
    control = gpu.control_for(config)
    assert flags["count-file"] == str(control.count_file)
    assert flags["gpus"] == str(config.gpus)
    assert flags["unhealthy-dir"] == str(control.unhealthy_dir)
    assert flags["devices-file"] == str(control.devices_file)
    # Every control file lives in the cluster's state, which `down` deletes.
    assert control.directory.is_relative_to(config.state)


def test_device_ids_are_seeded_by_the_node_name_so_two_clusters_never_share_one(
    tmp_path: Path,
) -> None:
    first = _flags(gpu.device_plugin_argv(_config(tmp_path), tmp_path))
    other = build_config(name="other", env={"FUSEBOX_LOCALCLUSTER_DIR": str(tmp_path)})
    second = _flags(gpu.device_plugin_argv(other, tmp_path))
    assert (first["id-seed"], second["id-seed"]) == ("fusebox", "other")


def test_count_file_holds_the_gpus_to_advertise(tmp_path: Path) -> None:
    control = gpu.GpuControl(tmp_path / "gpus")
    assert gpu.configured_count(control) == 0
    gpu.set_count(control, 3)
    assert control.count_file.read_text() == "3\n"
    assert gpu.configured_count(control) == 3


def test_marking_a_gpu_unhealthy_leaves_a_file_named_after_it_and_healthy_removes_it(
    tmp_path: Path,
) -> None:
    control = gpu.GpuControl(tmp_path / "gpus")
    gpu.set_count(control, 2)
    gpu.set_health(control, 1, healthy=False)
    assert [p.name for p in control.unhealthy_dir.iterdir()] == ["1"]
    gpu.set_health(control, 1, healthy=False)  # twice is still one mark
    gpu.set_health(control, 1, healthy=True)
    assert list(control.unhealthy_dir.iterdir()) == []
    gpu.set_health(control, 0, healthy=True)  # healthy already: nothing to undo


@pytest.mark.parametrize("index", [2, -1])
def test_marking_a_gpu_the_cluster_lacks_is_refused_with_the_valid_range(
    tmp_path: Path, index: int
) -> None:
    control = gpu.GpuControl(tmp_path / "gpus")
    gpu.set_count(control, 2)
    with pytest.raises(ClusterError, match=r"GPU -?\d does not exist: this cluster has 2 \(0..1\)"):
        gpu.set_health(control, index, healthy=False)
    assert not control.unhealthy_dir.exists()


def test_advertised_devices_are_read_from_what_the_plugin_published(tmp_path: Path) -> None:
    control = gpu.GpuControl(tmp_path / "gpus")
    assert gpu.advertised(control) == []
    control.directory.mkdir()
    control.devices_file.write_text(
        json.dumps(
            [
                {"index": 0, "id": "GPU-aaaaaaaa-0000-0000-0000-000000000000", "health": "Healthy"},
                {
                    "index": 1,
                    "id": "GPU-bbbbbbbb-0000-0000-0000-000000000000",
                    "health": "Unhealthy",
                },
            ]
        )
    )
    devices = gpu.advertised(control)
    assert [(d.index, d.health) for d in devices] == [(0, gpu.HEALTHY), (1, gpu.UNHEALTHY)]
    assert gpu_cli.format_devices(devices).splitlines()[1] == (
        "1  GPU-bbbbbbbb-0000-0000-0000-000000000000  Unhealthy"
    )
    assert gpu_cli.format_devices([]) == "no simulated GPUs advertised"


def test_gpu_command_line_takes_an_action_and_an_index() -> None:
    parser = argparse.ArgumentParser()
    gpu_cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["gpu", "unhealthy", "1"])
    assert (args.command, args.gpu_command, args.index) == ("gpu", "unhealthy", 1)
    assert parser.parse_args(["gpu", "list"]).gpu_command == "list"
    with pytest.raises(SystemExit):
        parser.parse_args(["gpu", "unhealthy", "first"])
