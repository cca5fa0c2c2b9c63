"""`python -m localcluster gpu list|unhealthy INDEX|healthy INDEX`: the simulated GPUs' controls.

A GPU marked unhealthy is reported Unhealthy by the device plugin, as
NVIDIA's plugin reports a GPU with an XID error: the kubelet takes it out of
allocatable, and a pod it was allocated to shows it Unhealthy in
status.containerStatuses[].allocatedResourcesStatus. Each command returns
once the plugin advertises the new state.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from localcluster import gpu
from localcluster.config import ClusterConfig
from localcluster.progress import ClusterError


def add_parser(commands: Any) -> None:
    """Add `gpu` and its actions to the top-level subparsers."""
    parser = commands.add_parser(
        "gpu", help="simulated GPUs: list them, mark one unhealthy or healthy again"
    )
    parser.add_argument(
        "--node", metavar="NAME", help="the node whose GPUs these are (default: node 1)"
    )
    actions = parser.add_subparsers(dest="gpu_command", required=True)
    actions.add_parser("list", help="each GPU's index, device id and health")
    for verb, meaning in (("unhealthy", "reported Unhealthy"), ("healthy", "Healthy again")):
        action = actions.add_parser(verb, help=f"GPU INDEX is {meaning} to the kubelet")
        action.add_argument("index", metavar="INDEX", type=int, help="0-based GPU index")


def run(args: argparse.Namespace, config: ClusterConfig) -> int:
    control = gpu.control_for(config)
    if args.gpu_command == "list":
        print(format_devices(gpu.advertised(control)))
        return 0
    healthy = args.gpu_command == "healthy"
    gpu.set_health(control, args.index, healthy=healthy)
    wanted = gpu.HEALTHY if healthy else gpu.UNHEALTHY
    device = _wait_advertised(control, args.index, wanted)
    print(f"GPU {device.index} ({device.id}) is {device.health}")
    return 0


def format_devices(devices: list[gpu.AdvertisedGpu]) -> str:
    """One line per GPU: index, id, health. Pure."""
    if not devices:
        return "no simulated GPUs advertised"
    return "\n".join(f"{d.index}  {d.id}  {d.health}" for d in devices)


def _wait_advertised(
    control: gpu.GpuControl, index: int, health: str, timeout_seconds: float = 15
) -> gpu.AdvertisedGpu:
    deadline = time.monotonic() + timeout_seconds
    while True:
        for device in gpu.advertised(control):
            if device.index == index and device.health == health:
                return device
        if time.monotonic() > deadline:
            raise ClusterError(
                f"the device plugin has not reported GPU {index} {health} after "
                f"{timeout_seconds:.0f} s: is it running (`python -m localcluster status`)?"
            )
        time.sleep(0.2)
