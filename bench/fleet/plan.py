"""What the fleet is made of: fake GPU nodes, their loopback address blocks, which
pod runs which curve, and the InferenceServices the bench applies.

Why loopback: kwok gives each pod an address from its node's podCIDR, and the
operator scrapes and calls pods at their address. With every node's block
inside 127.64.0.0/10 the whole of that range reaches this host's `lo`, so one
simulator process listening on 0.0.0.0 answers every fake pod and tells them
apart by the address a connection arrived at. No traffic leaves the host.
Pure: the bench and the tests build the same objects.
"""

from __future__ import annotations

import hashlib
import ipaddress
from typing import Any

from bench.fleet.curves import Shape

POD_NETWORK = ipaddress.IPv4Network("127.64.0.0/10")
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
GPU_MEMORY_MIB = 81559
LEAK_SHARE = 0.05
SPIKE_SHARE = 0.10


def node_blocks(count: int, network: ipaddress.IPv4Network = POD_NETWORK) -> list[str]:
    """`count` equal, disjoint podCIDRs inside `network` (at most /24 each: 254 pods)."""
    if count < 1:
        raise ValueError("at least one node")
    bits = max(0, (count - 1).bit_length())
    prefix = network.prefixlen + bits
    if prefix > 24:
        raise ValueError(f"{count} nodes do not fit {network} at /24 each")
    blocks = network.subnets(new_prefix=prefix)
    return [str(next(blocks)) for _ in range(count)]


def fake_node(index: int, pod_cidr: str, gpus: int) -> dict[str, Any]:
    """A kwok node with GPUs: the GFD labels the operator selects and sizes by, and the
    device plugin's `nvidia.com/gpu` capacity the scheduler counts."""
    name = f"fleet-node-{index:04d}"
    capacity = {
        "cpu": "256",
        "memory": "4Ti",
        "ephemeral-storage": "100Ti",
        "pods": "250",
        "nvidia.com/gpu": str(gpus),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {FAKE_NODE_ANNOTATION: "fake"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "type": "kwok",
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": GPU_PRODUCT,
                "nvidia.com/gpu.memory": str(GPU_MEMORY_MIB),
                "nvidia.com/gpu.count": str(gpus),
            },
        },
        "spec": {"podCIDR": pod_cidr, "podCIDRs": [pod_cidr]},
        "status": {"capacity": capacity, "allocatable": capacity},
    }


def shape_of(address: str) -> Shape:
    """Which curve the pod at `address` runs: a stable draw (5% leak, 10% spike)."""
    digest = hashlib.sha256(address.encode()).digest()
    draw = int.from_bytes(digest[:8], "big") / 2**64
    if draw < LEAK_SHARE:
        return Shape.LEAK
    if draw < LEAK_SHARE + SPIKE_SHARE:
        return Shape.SPIKE
    return Shape.STEADY


def hangs(address: str, share: float) -> bool:
    """Whether the pod at `address` is one whose sidecar accepts a scrape and never
    answers (a stable draw, independent of its memory curve)."""
    digest = hashlib.sha256(b"hung:" + address.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share


def inference_service(name: str, namespace: str, replicas: int) -> dict[str, Any]:
    """One service of the fleet: a GPU each pod, on the fake nodes' product."""
    return {
        "apiVersion": "fusebox.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"name": "m", "source": "file:///models/tiny"},
            "fallback": {},
            "replicas": replicas,
            "gpu": {"count": 1 if replicas else 0, "product": GPU_PRODUCT if replicas else ""},
        },
    }
