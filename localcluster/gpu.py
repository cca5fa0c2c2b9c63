"""Simulated GPUs: what a node with NVIDIA's device plugin and GFD would advertise.

There is no GPU here, so a device plugin written for localcluster
(localcluster/gpusim, Go) stands in for NVIDIA's: it registers with the
kubelet's device manager through the kubelet's plugin watcher, advertises
`nvidia.com/gpu` devices with ids shaped like NVIDIA UUIDs, reports each
one's health through ListAndWatch and answers Allocate with the
NVIDIA_VISIBLE_DEVICES a container gets on a GPU node. The kubelet, not
localcluster, then puts the count in the node's capacity and allocatable,
and allocation, the scheduler's refusals and a device turning Unhealthy all
follow the real path.

localcluster steers the plugin through files it polls (GpuControl): the
GPU count, and one file per unhealthy GPU. The node labels GPU Feature
Discovery would set are still applied with kubectl.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from fusebox_contract import wiring
from localcluster.config import ClusterConfig
from localcluster.gpu_control import ControlFiles, mark_health, read_count, write_count
from localcluster.kubectl import Kubectl
from localcluster.progress import ClusterError

RESOURCE = wiring.GPU_RESOURCE
VISIBLE_DEVICES_ENV = wiring.GPU_VISIBLE_DEVICES_ENV
PLUGIN_BINARY = "gpusim"
# Inside the kubelet root, where its plugin watcher discovers plugins' sockets.
PLUGIN_REGISTRY_DIR = "plugins_registry"
PLUGIN_SOCKET = "fusebox-gpusim.sock"

HEALTHY = wiring.DeviceHealth.HEALTHY
UNHEALTHY = wiring.DeviceHealth.UNHEALTHY


@dataclasses.dataclass(frozen=True)
class GpuControl(ControlFiles):
    """The files through which localcluster steers the device plugin."""

    @property
    def devices_file(self) -> Path:
        """What the plugin advertises now, written by the plugin (JSON)."""
        return self.directory / "devices.json"


@dataclasses.dataclass(frozen=True)
class AdvertisedGpu:
    index: int
    id: str
    health: str


def control_for(config: ClusterConfig) -> GpuControl:
    return GpuControl(config.state / "gpus")


def device_plugin_argv(config: ClusterConfig, kubelet_root: Path) -> list[str]:
    """The device plugin's command line. Pure."""
    control = control_for(config)
    return [
        str(Path(config.bin_dir) / PLUGIN_BINARY),
        f"--socket={kubelet_root / PLUGIN_REGISTRY_DIR / PLUGIN_SOCKET}",
        f"--resource={RESOURCE}",
        # Ids derive from the node name: the same cluster gets the same ids after a restart.
        f"--id-seed={config.node_name}",
        *control.flags(config.gpus),
        f"--devices-file={control.devices_file}",
    ]


def labels(config: ClusterConfig) -> dict[str, str]:
    """GPU Feature Discovery's labels for this node. Pure."""
    return {
        "nvidia.com/gpu.product": config.gpu_product,
        "nvidia.com/gpu.memory": str(config.gpu_memory_mib),
        "nvidia.com/gpu.count": str(config.gpus),
        "nvidia.com/gpu.present": "true",
    }


def set_count(control: GpuControl, gpus: int) -> None:
    """Tell the plugin how many GPUs to advertise (it follows within a second)."""
    write_count(control, gpus)


def set_health(control: GpuControl, index: int, *, healthy: bool) -> None:
    """Mark GPU `index` healthy or unhealthy; the plugin reports it through ListAndWatch."""
    count = configured_count(control)
    if not 0 <= index < count:
        raise ClusterError(f"GPU {index} does not exist: this cluster has {count} (0..{count - 1})")
    mark_health(control, index, healthy=healthy)


def configured_count(control: GpuControl) -> int:
    return read_count(control)


def advertised(control: GpuControl) -> list[AdvertisedGpu]:
    """The devices the plugin advertises now, by index; [] before it first ran."""
    try:
        raw: list[dict[str, Any]] = json.loads(control.devices_file.read_text())
    except FileNotFoundError:
        return []
    return [AdvertisedGpu(index=d["index"], id=d["id"], health=d["health"]) for d in raw]


def advertise(kubectl: Kubectl, config: ClusterConfig, timeout_seconds: float = 60) -> None:
    """Make the node offer config.gpus GPUs through the device plugin, and label it as GFD would.

    Waits until the kubelet reports the plugin's count as the node's capacity.
    """
    set_count(control_for(config), config.gpus)
    if config.gpus == 0:
        kubectl.run("label", "node", config.node_name, *(f"{k}-" for k in labels(config)))
    else:
        pairs = [f"{k}={v}" for k, v in labels(config).items()]
        kubectl.run("label", "node", config.node_name, "--overwrite", *pairs)
    deadline = time.monotonic() + timeout_seconds
    while True:
        node = kubectl.get_json("node", config.node_name)
        shown = node.get("status", {}).get("capacity", {}).get(RESOURCE)
        if int(shown or 0) == config.gpus:
            return
        if time.monotonic() > deadline:
            raise ClusterError(
                f"the node's capacity shows {shown!r} {RESOURCE}, not {config.gpus}, "
                f"{timeout_seconds:.0f} s after asking the device plugin; see the "
                "device-plugin and kubelet logs (`python -m localcluster status` names "
                "their directory)"
            )
        time.sleep(0.5)


def advertised_count(node: dict[str, Any]) -> int:
    return int(node.get("status", {}).get("allocatable", {}).get(RESOURCE, "0"))
