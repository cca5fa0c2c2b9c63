"""Simulated GPUs through Dynamic Resource Allocation, next to the device plugin.

localcluster/gpudra (Go, k8s.io/dynamic-resource-allocation's kubeletplugin)
registers with the kubelet's plugin watcher as the DRA driver
`gpu.nvidia.com`, publishes the node's GPUs as a ResourceSlice, prepares the
claims the scheduler allocates from it (one CDI spec per claim) and streams
each GPU's health to the kubelet. Its GPUs are a pool of their own, not the
device plugin's: a GPU handed out twice, once per path, cannot happen.

The DeviceClass `gpu.nvidia.com` (what NVIDIA's chart installs) selects the
driver's devices; `up` applies it with the other addons.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from fusebox_contract import wiring
from localcluster.config import ClusterConfig
from localcluster.gpu_control import ControlFiles, mark_health, write_count

DRIVER = wiring.GPU_DRA_DRIVER
DEVICE_CLASS = wiring.GPU_DEVICE_CLASS
DRIVER_BINARY = "gpudra"
COMPONENT = "dra-driver"
# Inside the kubelet root: where its plugin watcher looks, and where DRA
# drivers keep their sockets (the kubelet's own layout).
PLUGIN_REGISTRY_DIR = "plugins_registry"
PLUGINS_DIR = "plugins"


@dataclasses.dataclass(frozen=True)
class DraControl(ControlFiles):
    """The files through which localcluster steers the DRA driver, and its CDI specs."""

    @property
    def cdi_dir(self) -> Path:
        """One CDI spec per prepared claim, written by the driver."""
        return self.directory / "cdi"


def control_for(config: ClusterConfig) -> DraControl:
    return DraControl(config.state / "gpus-dra")


def driver_argv(config: ClusterConfig, kubelet_root: Path, kubeconfig: Path) -> list[str]:
    """The DRA driver's command line. Pure.

    It uses the kubelet's credentials: the node authorizer lets a node publish
    its own ResourceSlices and read the claims of its pods, nothing more.
    """
    control = control_for(config)
    return [
        str(Path(config.bin_dir) / DRIVER_BINARY),
        f"--kubeconfig={kubeconfig}",
        f"--node-name={config.node_name}",
        f"--registry-dir={kubelet_root / PLUGIN_REGISTRY_DIR}",
        f"--data-dir={kubelet_root / PLUGINS_DIR / DRIVER}",
        f"--cdi-dir={control.cdi_dir}",
        *control.flags(config.gpus),
        f"--product={config.gpu_product}",
        f"--memory-mib={config.gpu_memory_mib}",
    ]


def device_class() -> dict[str, Any]:
    """The DeviceClass selecting every device of the driver, as NVIDIA's chart defines it. Pure."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DEVICE_CLASS},
        "spec": {
            "selectors": [
                {
                    "cel": {
                        "expression": (
                            f"device.driver == '{DRIVER}' && "
                            f"device.attributes['{DRIVER}'].type == 'gpu'"
                        )
                    }
                }
            ]
        },
    }


def set_count(control: DraControl, gpus: int) -> None:
    """Tell the driver how many GPUs to publish (it follows within a second)."""
    write_count(control, gpus)


def set_health(control: DraControl, index: int, *, healthy: bool) -> None:
    """Mark GPU `index` healthy or unhealthy: the driver streams it to the kubelet and
    taints an unhealthy GPU in its ResourceSlice."""
    mark_health(control, index, healthy=healthy)
