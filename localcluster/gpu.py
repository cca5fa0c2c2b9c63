"""Simulated GPUs: what a node with NVIDIA's device plugin and GFD would advertise.

There is no GPU here, so the node status gets `nvidia.com/gpu` capacity and
allocatable by a JSON patch (the scheduler then counts and refuses exactly as
on a GPU node) and the labels GPU Feature Discovery would set. The kubelet
keeps unknown extended resources across its status syncs but zeroes them
when it re-registers, so `up` re-applies them whenever they are missing.
"""

from __future__ import annotations

import json
from typing import Any

from localcluster.config import ClusterConfig
from localcluster.kubectl import Kubectl

RESOURCE = "nvidia.com/gpu"


def labels(config: ClusterConfig) -> dict[str, str]:
    """GPU Feature Discovery's labels for this node. Pure."""
    return {
        "nvidia.com/gpu.product": config.gpu_product,
        "nvidia.com/gpu.memory": str(config.gpu_memory_mib),
        "nvidia.com/gpu.count": str(config.gpus),
        "nvidia.com/gpu.present": "true",
    }


def status_patch(node: dict[str, Any], gpus: int) -> list[dict[str, Any]]:
    """JSON-patch operations making capacity and allocatable say `gpus`. Pure; [] if they do."""
    pointer = RESOURCE.replace("~", "~0").replace("/", "~1")
    ops: list[dict[str, Any]] = []
    for field in ("capacity", "allocatable"):
        current = node.get("status", {}).get(field, {}).get(RESOURCE)
        if current != str(gpus):
            ops.append({"op": "add", "path": f"/status/{field}/{pointer}", "value": str(gpus)})
    return ops


def advertise(kubectl: Kubectl, config: ClusterConfig) -> None:
    """Make the node show config.gpus GPUs; with 0, withdraw any it showed before."""
    node = kubectl.get_json("node", config.node_name)
    shown = RESOURCE in node.get("status", {}).get("capacity", {})
    if config.gpus == 0 and not shown:
        return
    ops = status_patch(node, config.gpus)
    if ops:
        kubectl.run(
            "patch",
            "node",
            config.node_name,
            "--subresource=status",
            "--type=json",
            "-p",
            json.dumps(ops),
        )
    if config.gpus == 0:
        kubectl.run("label", "node", config.node_name, *(f"{k}-" for k in labels(config)))
    else:
        pairs = [f"{k}={v}" for k, v in labels(config).items()]
        kubectl.run("label", "node", config.node_name, "--overwrite", *pairs)


def advertised_count(node: dict[str, Any]) -> int:
    return int(node.get("status", {}).get("allocatable", {}).get(RESOURCE, "0"))
