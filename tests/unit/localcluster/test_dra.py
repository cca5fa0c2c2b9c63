"""The DRA driver's Python side: its command line, its files, and the DeviceClass addon."""

from __future__ import annotations

from pathlib import Path

from localcluster import dra, gpu
from localcluster.components import BUILT_BINARIES, COMPONENTS, Layout, argv_for
from localcluster.config import ClusterConfig, build_config


def _config(tmp_path: Path) -> ClusterConfig:
    return build_config(name="fusebox", env={"FUSEBOX_LOCALCLUSTER_DIR": str(tmp_path)})


def _flags(argv: list[str]) -> dict[str, str]:
    return dict(a.removeprefix("--").split("=", 1) for a in argv[1:])


def test_driver_registers_in_the_kubelets_plugin_directories_as_the_node(tmp_path: Path) -> None:
    config = _config(tmp_path)
    layout = Layout(config.state)
    argv = argv_for(dra.COMPONENT, config, layout)
    flags = _flags(argv)
    assert argv[0] == str(Path(config.bin_dir) / "gpudra")
    assert flags["registry-dir"] == str(layout.kubelet_root / "plugins_registry")
    assert flags["data-dir"] == str(layout.kubelet_root / "plugins" / "gpu.nvidia.com")
    # The kubelet's credentials: the node authorizer scopes them to this node's slices.
    assert flags["kubeconfig"] == str(layout.kubeconfig("kubelet"))
    assert flags["node-name"] == config.node_name
    assert (flags["product"], flags["memory-mib"]) == (
        config.gpu_product,
        str(config.gpu_memory_mib),
    )


def test_driver_has_its_own_gpus_and_files_inside_the_clusters_state(tmp_path: Path) -> None:
    config = _config(tmp_path)
    control = dra.control_for(config)
    flags = _flags(dra.driver_argv(config, tmp_path, tmp_path / "kubeconfig"))
    assert flags["count-file"] == str(control.count_file)
    assert flags["unhealthy-dir"] == str(control.unhealthy_dir)
    assert flags["cdi-dir"] == str(control.cdi_dir)
    assert flags["gpus"] == str(config.gpus)
    # `down` deletes the state; the device plugin's files are another pool's.
    assert control.directory.is_relative_to(config.state)
    assert control.directory != gpu.control_for(config).directory


def test_driver_starts_after_the_device_plugin_and_its_binary_is_required() -> None:
    assert COMPONENTS.index(dra.COMPONENT) == COMPONENTS.index("device-plugin") + 1
    assert dra.DRIVER_BINARY in BUILT_BINARIES


def test_device_class_selects_the_drivers_gpus_by_cel() -> None:
    device_class = dra.device_class()
    assert (device_class["apiVersion"], device_class["kind"]) == (
        "resource.k8s.io/v1",
        "DeviceClass",
    )
    assert device_class["metadata"]["name"] == "gpu.nvidia.com"
    expression = device_class["spec"]["selectors"][0]["cel"]["expression"]
    assert "device.driver == 'gpu.nvidia.com'" in expression
    assert "device.attributes['gpu.nvidia.com'].type == 'gpu'" in expression


def test_count_and_health_are_files_the_driver_polls(tmp_path: Path) -> None:
    control = dra.DraControl(tmp_path / "gpus-dra")
    dra.set_count(control, 3)
    assert control.count_file.read_text() == "3\n"
    dra.set_health(control, 1, healthy=False)
    assert (control.unhealthy_dir / "1").exists()
    dra.set_health(control, 1, healthy=True)
    dra.set_health(control, 1, healthy=True)  # already healthy: nothing to do
    assert not (control.unhealthy_dir / "1").exists()
