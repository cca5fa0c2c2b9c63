"""The inference pod's probes and ephemeral storage, as kube-score and the kubelet see them."""

from __future__ import annotations

from typing import Any

import pytest

from fusebox_operator.manifests import build_pod_template
from fusebox_operator.settings import OperatorSettings
from fusebox_operator.sizing import size_memory
from fusebox_operator.spec import parse_spec

from .conftest import load_example

EXAMPLES = ["tiny-chat.yaml", "llama-h100.yaml", "cpu-only.yaml"]
MIB = 1024**2
UNITS = {"Ki": 1024, "Mi": MIB, "Gi": 1024 * MIB}


def pod_spec_of(example: str) -> dict[str, Any]:
    spec = parse_spec(load_example(example)["spec"])
    template = build_pod_template(spec, "x", size_memory(spec, [1024]), OperatorSettings())
    pod: dict[str, Any] = template["spec"]
    return pod


def all_containers(pod_spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The server and the native sidecar (an init container that keeps running)."""
    return [*pod_spec.get("initContainers", []), *pod_spec["containers"]]


def quantity_bytes(quantity: str) -> int:
    number, unit = quantity[:-2], quantity[-2:]
    assert unit in UNITS, f"unexpected quantity {quantity}"
    return int(number) * UNITS[unit]


@pytest.mark.parametrize("example", EXAMPLES)
def test_no_container_probes_readiness_the_way_it_probes_liveness(example: str) -> None:
    for container in all_containers(pod_spec_of(example)):
        if "livenessProbe" not in container:
            continue  # the sidecar: test_a_hung_sidecar_is_never_restarted_by_the_kubelet
        readiness, liveness = container["readinessProbe"], container["livenessProbe"]
        handler = next(key for key in ("httpGet", "tcpSocket", "exec") if key in readiness)
        assert readiness.get(handler) != liveness.get(handler), container["name"]


@pytest.mark.parametrize("example", EXAMPLES)
def test_a_hung_sidecar_is_never_restarted_by_the_kubelet(example: str) -> None:
    # A native sidecar's readiness counts toward the pod's: a liveness restart of a hung
    # sidecar took a serving pod out of its Service for the metrics' sake.
    (sidecar,) = [c for c in pod_spec_of(example)["initContainers"] if c["name"] == "sidecar"]
    assert sidecar["restartPolicy"] == "Always"  # native: counted in the pod's readiness
    assert "livenessProbe" not in sidecar
    assert "tcpSocket" in sidecar["readinessProbe"]  # the port listens, not /metrics


@pytest.mark.parametrize("example", EXAMPLES)
def test_every_container_reserves_and_bounds_its_ephemeral_storage(example: str) -> None:
    for container in all_containers(pod_spec_of(example)):
        resources = container["resources"]
        request = resources["requests"]["ephemeral-storage"]
        assert resources["limits"]["ephemeral-storage"] == request, container["name"]


@pytest.mark.parametrize("example", EXAMPLES)
def test_the_pods_storage_limit_holds_its_disk_volumes_and_each_containers_logs(
    example: str,
) -> None:
    # The kubelet evicts a pod whose emptyDirs, writable layers and logs exceed
    # the sum of its containers' limits: a full /tmp must stay under that sum.
    pod = pod_spec_of(example)
    disk_volumes = sum(
        quantity_bytes(volume["emptyDir"]["sizeLimit"])
        for volume in pod["volumes"]
        if "emptyDir" in volume and volume["emptyDir"].get("medium") != "Memory"
    )
    limits = [
        quantity_bytes(c["resources"]["limits"]["ephemeral-storage"]) for c in all_containers(pod)
    ]
    logs_per_container = 50 * MIB  # the kubelet's default rotation: 5 files of 10Mi
    assert sum(limits) >= disk_volumes + logs_per_container * len(limits)
