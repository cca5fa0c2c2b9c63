"""Pure builders: GPUs through Dynamic Resource Allocation (spec.gpu.deviceClassName).

Why: with a DeviceClass the pod does not ask the device plugin for
`nvidia.com/gpu`; it names a ResourceClaimTemplate, from which the
controller-manager creates one ResourceClaim per pod, the scheduler
allocates it from a driver's ResourceSlices, and the kubelet asks the driver
to prepare it. The template's spec cannot change after creation, so its name
carries a digest of the request: a changed request is a new template, the pod
template moves to it (a rollout), and the old one goes with the
InferenceService (owner reference).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from fusebox_operator.spec import GpuSpec

Manifest = dict[str, Any]

CLAIM_NAME = "gpu"
"""The pod's entry in spec.resourceClaims, which the server and sidecar containers name."""
REQUEST_NAME = "gpu"
"""The one device request in the claim; the kubelet reports health as claim:<claim>/<request>."""


def device_request(gpu: GpuSpec) -> Manifest:
    """Exactly gpu.count devices of the DeviceClass."""
    return {
        "name": REQUEST_NAME,
        "exactly": {
            "deviceClassName": gpu.device_class_name,
            "allocationMode": "ExactCount",
            "count": gpu.count,
        },
    }


def claim_template_name(name: str, gpu: GpuSpec) -> str:
    """`<service>-gpu-<digest of the request>`: a new name whenever the request changes."""
    canonical = json.dumps(device_request(gpu), sort_keys=True, separators=(",", ":"))
    return f"{name}-gpu-{hashlib.sha256(canonical.encode()).hexdigest()[:8]}"


def build_claim_template(
    gpu: GpuSpec, name: str, namespace: str, labels: dict[str, str]
) -> Manifest:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": claim_template_name(name, gpu),
            "namespace": namespace,
            "labels": labels,
        },
        "spec": {"spec": {"devices": {"requests": [device_request(gpu)]}}},
    }


def pod_resource_claims(gpu: GpuSpec, name: str) -> list[Manifest]:
    """The pod spec's resourceClaims: one claim per pod, made from the template."""
    return [{"name": CLAIM_NAME, "resourceClaimTemplateName": claim_template_name(name, gpu)}]


def container_claims() -> list[Manifest]:
    """The resources.claims of the server and of the metrics sidecar: both get the
    pod's GPU claim (a claim may be shared by the containers of one pod), so the
    sidecar's NVML sees the server's GPU from outside it (DESIGN.md §4)."""
    return [{"name": CLAIM_NAME}]
