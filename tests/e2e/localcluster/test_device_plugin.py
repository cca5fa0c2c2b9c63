"""Simulated GPUs go through the kubelet's device manager, as on a GPU node.

localcluster's device plugin (localcluster/gpusim) advertises them; the
kubelet, not localcluster, sets the node's capacity and allocatable,
allocates devices to containers (NVIDIA_VISIBLE_DEVICES), takes an
Unhealthy one out of allocatable and reports it on the pod, and finds the
plugin again after it restarts.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localcluster import gpu, processes
from localcluster.components import Layout
from localcluster.config import ClusterConfig, default_name, load_saved

from ..conftest import localcluster
from .conftest import eventually

REPO = Path(__file__).resolve().parents[3]
PRINT_VISIBLE_DEVICES = f"import os; print(os.environ.get({gpu.VISIBLE_DEVICES_ENV!r}, ''))"


@pytest.fixture
def local_config(cluster: Any) -> Iterator[ClusterConfig]:
    """The running localcluster's saved config; every GPU healthy again afterwards."""
    assert cluster.local, "the device plugin is localcluster's"
    saved = load_saved(default_name(os.environ), os.environ)
    assert saved is not None
    assert saved.gpus >= 1, "these tests need at least one simulated GPU (up --gpus N)"
    yield saved
    for device in gpu.advertised(gpu.control_for(saved)):
        if device.health != gpu.HEALTHY:
            localcluster("gpu", "healthy", str(device.index))


@pytest.fixture
def free_gpu(cluster: Any, local_config: ClusterConfig) -> Iterator[ClusterConfig]:
    """The config once at least one GPU is held by no pod; the count is raised for that if
    need be (others' pods, the demo's, may hold them all) and put back afterwards."""
    in_use = _gpus_in_use(cluster)
    if in_use < local_config.gpus:
        yield local_config
        return
    localcluster("up", "--gpus", str(in_use + 1))
    try:
        yield dataclasses.replace(local_config, gpus=in_use + 1)
    finally:
        localcluster("up", "--gpus", str(local_config.gpus))


def _node(cluster: Any, local_config: ClusterConfig) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(
        cluster.kubectl("get", "node", local_config.node_name, "-o", "json").stdout
    )
    return result


def _status_gpu_owners(cluster: Any, local_config: ClusterConfig) -> set[str]:
    """Who wrote the node's status.capacity/allocatable nvidia.com/gpu (managedFields).

    The kubelet's own writes may show no entry at all (it created the node with
    its status); anyone else's patch shows up under its manager's name.
    """
    node = json.loads(
        cluster.kubectl(
            "get", "node", local_config.node_name, "--show-managed-fields", "-o", "json"
        ).stdout
    )
    key = f"f:{gpu.RESOURCE}"
    return {
        entry["manager"]
        for entry in node["metadata"]["managedFields"]
        if any(
            key in entry.get("fieldsV1", {}).get("f:status", {}).get(f"f:{field}", {})
            for field in ("capacity", "allocatable")
        )
    }


def _gpus(node: dict[str, Any], field: str) -> int:
    return int(node["status"][field].get(gpu.RESOURCE, "0"))


def _listed_ids() -> dict[str, int]:
    """Device id -> index, as `localcluster gpu list` prints them."""
    lines = localcluster("gpu", "list").stdout.splitlines()
    return {line.split()[1]: int(line.split()[0]) for line in lines}


def _gpus_in_use(cluster: Any) -> int:
    """GPUs that pods hold and keep, in every namespace (the demo's too).

    A pod being deleted is left out: its GPU comes free once it is gone.
    """
    pods = json.loads(cluster.kubectl("get", "pods", "-A", "-o", "json").stdout)["items"]
    return sum(
        int(c.get("resources", {}).get("limits", {}).get(gpu.RESOURCE, "0"))
        for pod in pods
        if pod["status"].get("phase") not in ("Succeeded", "Failed")
        and pod["spec"].get("nodeName")
        and not pod["metadata"].get("deletionTimestamp")
        for c in pod["spec"]["containers"]
    )


def _gpu_pod(kube: Any, name: str) -> dict[str, Any]:
    container = kube.testapp_container()
    container["resources"]["limits"][gpu.RESOURCE] = "1"
    return dict(kube.testapp_pod(name, containers=[container]))


def _plugin_log(local_config: ClusterConfig) -> str:
    return Layout(local_config.state).log("device-plugin").read_text()


def _plugin_connections(local_config: ClusterConfig) -> int:
    """How often a kubelet opened ListAndWatch on the plugin (its log says each time)."""
    return _plugin_log(local_config).count("kubelet connected: ListAndWatch")


def test_node_offers_as_many_gpus_as_configured_through_the_device_plugin(
    cluster: Any, local_config: ClusterConfig
) -> None:
    listed = _listed_ids()
    assert len(listed) == local_config.gpus
    assert all(i.startswith("GPU-") for i in listed)

    # A GPU an earlier test took Unhealthy and back comes back to allocatable a
    # kubelet status update later than to capacity.
    def offered() -> dict[str, Any] | None:
        node = _node(cluster, local_config)
        counts = {_gpus(node, "capacity"), _gpus(node, "allocatable")}
        return node if counts == {local_config.gpus} else None

    node = eventually(offered, timeout_seconds=60, what="capacity = allocatable = the GPUs")
    # Only the kubelet writes the count: no status patch from localcluster.
    owners = _status_gpu_owners(cluster, local_config)
    assert owners <= {"kubelet"}, f"nvidia.com/gpu in the node status is written by {owners}"
    # GPU Feature Discovery's labels are still there.
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == local_config.gpu_product


def test_pod_sees_the_device_it_was_allocated_and_a_pod_beyond_the_free_gpus_stays_pending(
    cluster: Any, kube: Any, free_gpu: ClusterConfig
) -> None:
    free = free_gpu.gpus - _gpus_in_use(cluster)
    assert free >= 1, f"all {free_gpu.gpus} GPUs are held by other pods"
    names = [f"gpu-{i}" for i in range(free)]
    kube.apply(*(_gpu_pod(kube, n) for n in names), _gpu_pod(kube, "one-too-many"))
    listed = _listed_ids()
    seen = set()
    for name in names:
        kube.wait(f"pod/{name}", "condition=Ready")
        visible = kube.exec_python(name, PRINT_VISIBLE_DEVICES).strip()
        assert visible in listed, f"{name} sees {visible!r}, not one of {sorted(listed)}"
        seen.add(visible)
    assert len(seen) == free, "two pods were given the same GPU"

    def unschedulable_message() -> str:
        conditions = kube.get("pod", "one-too-many").get("status", {}).get("conditions", [])
        scheduled = next((c for c in conditions if c["type"] == "PodScheduled"), {})
        return str(scheduled.get("message", "")) if scheduled.get("status") == "False" else ""

    message = kube.eventually(unschedulable_message, what="one-too-many to be unschedulable")
    assert f"Insufficient {gpu.RESOURCE}" in message
    assert kube.get("pod", "one-too-many")["status"]["phase"] == "Pending"


def test_unhealthy_gpu_leaves_allocatable_and_shows_on_its_pod_and_healthy_brings_it_back(
    cluster: Any, kube: Any, free_gpu: ClusterConfig
) -> None:
    kube.apply(_gpu_pod(kube, "holder"))
    kube.wait("pod/holder", "condition=Ready")
    device_id = kube.exec_python("holder", PRINT_VISIBLE_DEVICES).strip()
    index = _listed_ids()[device_id]

    localcluster("gpu", "unhealthy", str(index))
    kube.eventually(
        lambda: _gpus(_node(cluster, free_gpu), "allocatable") == free_gpu.gpus - 1,
        what=f"allocatable {gpu.RESOURCE} to drop to {free_gpu.gpus - 1}",
    )
    assert _gpus(_node(cluster, free_gpu), "capacity") == free_gpu.gpus

    def health_on_pod() -> str:
        statuses = kube.get("pod", "holder")["status"].get("containerStatuses", [])
        for resource in statuses[0].get("allocatedResourcesStatus") or []:
            for entry in resource.get("resources") or []:
                if resource["name"] == gpu.RESOURCE and entry["resourceID"] == device_id:
                    return str(entry.get("health", ""))
        return ""

    kube.eventually(
        lambda: health_on_pod() == gpu.UNHEALTHY, what="the pod to show its GPU Unhealthy"
    )

    localcluster("gpu", "healthy", str(index))
    kube.eventually(
        lambda: _gpus(_node(cluster, free_gpu), "allocatable") == free_gpu.gpus,
        what=f"allocatable {gpu.RESOURCE} back to {free_gpu.gpus}",
    )
    kube.eventually(lambda: health_on_pod() == gpu.HEALTHY, what="the pod's GPU Healthy again")


def test_restarted_kubelet_finds_the_plugin_again_and_allocates_through_it(
    cluster: Any, kube: Any, free_gpu: ClusterConfig
) -> None:
    connections = _plugin_connections(free_gpu)
    kubelet = processes.read_pid_file(Layout(free_gpu.state).pid("kubelet"))
    assert kubelet is not None
    os.kill(kubelet.pid, signal.SIGKILL)
    assert processes.wait_gone([kubelet], timeout_seconds=30)
    localcluster("restart", "kubelet")
    kube.eventually(
        lambda: _plugin_connections(free_gpu) > connections,
        what="the restarted kubelet to open ListAndWatch on the plugin",
    )
    kube.eventually(
        lambda: _gpus(_node(cluster, free_gpu), "allocatable") == free_gpu.gpus,
        what=f"allocatable {gpu.RESOURCE} back to {free_gpu.gpus}",
    )
    assert free_gpu.gpus - _gpus_in_use(cluster) >= 1
    allocations = _plugin_log(free_gpu).count("allocate ")
    pod = _gpu_pod(kube, "after-restart")
    # No service-account volume: a kubelet seconds after its start may fail to
    # mount kube-root-ca.crt ("not registered"), which is not what this tests.
    pod["spec"]["automountServiceAccountToken"] = False

    def ready_with_a_gpu() -> bool:
        found = kube("get", "pod", "after-restart", "-o", "json", check=False)
        if found.returncode != 0:
            kube.apply(pod)
            return False
        status = json.loads(found.stdout)["status"]
        if status.get("phase") == "Failed":
            # Admitted in the moment before the new kubelet had the plugin's devices
            # again: refused, as on any GPU node (a ReplicaSet would make another).
            assert status.get("reason") == "UnexpectedAdmissionError", status
            kube("delete", "pod", "after-restart", "--wait=true")
            return False
        conditions = status.get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    kube.eventually(ready_with_a_gpu, what="a GPU pod Ready on the restarted kubelet")
    visible = kube.exec_python("after-restart", PRINT_VISIBLE_DEVICES).strip()
    assert visible in _listed_ids()
    assert _plugin_log(free_gpu).count("allocate ") > allocations, "not allocated by the plugin"
