"""Issue 14 item 4: GPUs through Dynamic Resource Allocation, next to the device plugin.

An InferenceService with gpu.deviceClassName asks for its GPU through a
ResourceClaimTemplate the operator owns: the controller-manager makes a
ResourceClaim per pod, the scheduler allocates it from the ResourceSlice of
localcluster's DRA driver (localcluster/gpudra), the kubelet has the driver
prepare it, and the pod runs and answers. The kubelet shows the device's health
in the pod's status; a device turning unhealthy drains the pod to another, as
on the device-plugin path (test_gpu_lost.py, which keeps covering that path).
A claim no device can satisfy leaves the pod Pending, and the service's Ready
condition (and one Warning event) names it with the scheduler's reason.

The GPUs are simulated at the hardware edge only (the driver's control files).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from fusebox_contract.names import ConditionType, EventReason
from fusebox_contract.wiring import (
    GPU_DEVICE_CLASS,
    GPU_DRA_DRIVER,
    GPU_RESOURCE,
    GPU_VISIBLE_DEVICES_ENV,
)
from localcluster import dra
from localcluster.config import default_name, load_saved

from .conftest import Service, ServiceFactory, base_spec, chat, wait_for

CLAIM_HEALTH_NAME = "claim:gpu"  # how the kubelet names the pod's claim "gpu"


def slice_devices(cluster: Any) -> list[dict[str, Any]]:
    slices = json.loads(cluster.kubectl("get", "resourceslices", "-o", "json").stdout)["items"]
    return [
        d for s in slices if s["spec"]["driver"] == GPU_DRA_DRIVER for d in s["spec"]["devices"]
    ]


def allocated_devices(cluster: Any) -> set[str]:
    claims = json.loads(cluster.kubectl("get", "resourceclaims", "-A", "-o", "json").stdout)
    return {
        result["device"]
        for claim in claims["items"]
        for result in ((claim.get("status") or {}).get("allocation") or {})
        .get("devices", {})
        .get("results", [])
        if result["driver"] == GPU_DRA_DRIVER
    }


@pytest.fixture
def dra_control(cluster: Any) -> Iterator[dra.DraControl]:
    """Two GPUs of the DRA driver free for the test (the count raised if need be, put
    back afterwards); every GPU healthy again at the end."""
    assert cluster.local, "the DRA driver is localcluster's"
    saved = load_saved(default_name(os.environ), os.environ)
    assert saved is not None
    control = dra.control_for(saved)
    before = control.count_file.read_text() if control.count_file.exists() else None
    published = len(slice_devices(cluster))
    free = published - len(allocated_devices(cluster))
    if free < 2:
        wanted = published + 2 - free
        dra.set_count(control, wanted)
        wait_for(f"{wanted} GPUs in the slice", lambda: len(slice_devices(cluster)) == wanted, 60)
    try:
        yield control
    finally:
        for flag in control.unhealthy_dir.glob("*"):
            flag.unlink()
        if before is None:
            control.count_file.unlink(missing_ok=True)
        elif control.count_file.read_text() != before:
            dra.set_count(control, int(before))


def dra_spec() -> dict[str, Any]:
    return base_spec(gpu={"count": 1, "deviceClassName": GPU_DEVICE_CLASS})


def server_of(pod: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod["spec"]["containers"] if c["name"] == "server")


def claim_of(service: Service, pod: dict[str, Any]) -> dict[str, Any]:
    (status,) = pod["status"]["resourceClaimStatuses"]
    claim = service.kubectl("get", "resourceclaim", status["resourceClaimName"], "-o", "json")
    return dict(json.loads(claim.stdout))


def visible_gpu(service: Service, pod: dict[str, Any]) -> str:
    """NVIDIA_VISIBLE_DEVICES as the server container sees it."""
    read = f"import os; print(os.environ.get({GPU_VISIBLE_DEVICES_ENV!r}, ''))"
    result = service.kubectl(
        "exec", pod["metadata"]["name"], "-c", "server", "--", "/opt/venv/bin/python", "-c", read
    )
    return str(result.stdout).strip()


def claim_health(service: Service, pod_name: str) -> list[dict[str, Any]]:
    pod = json.loads(service.kubectl("get", "pod", pod_name, "-o", "json").stdout)
    server = next(s for s in pod["status"].get("containerStatuses", []) if s["name"] == "server")
    return next(
        (
            s.get("resources", [])
            for s in server.get("allocatedResourcesStatus", [])
            if s["name"] == CLAIM_HEALTH_NAME
        ),
        [],
    )


def test_a_device_class_gets_the_pod_its_gpu_through_a_claim_from_the_drivers_slice(
    cluster: Any, inference_service: ServiceFactory, dra_control: dra.DraControl
) -> None:
    service = inference_service("dra", dra_spec())
    (pod,) = wait_for(
        "one ready pod", service.ready_pods, timeout=300, diagnose=service.diagnose_pods
    )
    # The pod names the claim and does not ask the device plugin.
    resources = server_of(pod)["resources"]
    assert resources["claims"] == [{"name": "gpu"}]
    assert GPU_RESOURCE not in resources.get("limits", {})
    (template,) = json.loads(service.kubectl("get", "resourceclaimtemplates", "-o", "json").stdout)[
        "items"
    ]
    (owner,) = template["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("InferenceService", "dra")

    # The scheduler allocated one of the driver's devices on the pod's node, for this pod.
    claim = claim_of(service, pod)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"]) == (GPU_DRA_DRIVER, pod["spec"]["nodeName"])
    assert pod["metadata"]["uid"] in [r["uid"] for r in claim["status"]["reservedFor"]]
    device = next(d for d in slice_devices(cluster) if d["name"] == result["device"])
    uuid = device["attributes"]["uuid"]["string"]

    # The driver prepared it and containerd applied its CDI spec: the container sees
    # the allocated GPU's UUID, as it does the device plugin's.
    spec_file = dra_control.cdi_dir / f"k8s.gpu.nvidia.com-{claim['metadata']['uid']}.json"
    assert spec_file.exists(), "the driver wrote no CDI spec for the claim"
    assert visible_gpu(service, pod) == uuid

    # The kubelet reports the device's health, streamed by the driver, in the pod's status.
    resource_id = f"k8s.gpu.nvidia.com/claim={claim['metadata']['uid']}-{result['device']}"
    health = wait_for(
        "the claim's device health in the pod's status",
        lambda: claim_health(service, pod["metadata"]["name"]),
        timeout=60,
    )
    assert health == [{"resourceID": resource_id, "health": "Healthy"}], health

    assert wait_for("a 200 through the Service", lambda: chat(service.service_url()) == 200, 60)

    # Deleting the service takes the template with it (owner reference), and the claim.
    service.kubectl("delete", "inferenceservice", "dra", "--wait=true", "--timeout=120s")
    wait_for(
        "the claim template and the claim gone",
        lambda: (
            not json.loads(
                service.kubectl("get", "resourceclaimtemplates,resourceclaims", "-o", "json").stdout
            )["items"]
        ),
        timeout=120,
    )
    assert not spec_file.exists(), "the driver kept the CDI spec of an unprepared claim"


def test_a_claimed_gpu_turning_unhealthy_drains_the_pod_to_another_gpu(
    cluster: Any, inference_service: ServiceFactory, dra_control: dra.DraControl
) -> None:
    service = inference_service("dra-lost", dra_spec())
    (pod,) = wait_for(
        "one ready pod", service.ready_pods, timeout=300, diagnose=service.diagnose_pods
    )
    (result,) = claim_of(service, pod)["status"]["allocation"]["devices"]["results"]
    sick = result["device"]
    dra.set_health(dra_control, int(sick.removeprefix("gpu-")), healthy=False)
    message = wait_for(
        "a GPUUnhealthy event",
        lambda: next(
            (e["message"] for e in service.events() if e["reason"] == EventReason.GPU_UNHEALTHY),
            None,
        ),
        timeout=120,
    )
    assert pod["metadata"]["name"] in message and sick in message, message

    def replaced() -> dict[str, Any] | None:
        ready = [p for p in service.ready_pods() if p["metadata"]["uid"] != pod["metadata"]["uid"]]
        return ready[0] if ready and len(service.pods()) == 1 else None

    new = wait_for(
        "a replacement pod, ready, and the old one gone",
        replaced,
        timeout=300,
        diagnose=service.diagnose_pods,
    )
    # The driver tainted the sick GPU: the new claim got another one.
    (new_result,) = claim_of(service, new)["status"]["allocation"]["devices"]["results"]
    assert new_result["device"] != sick
    wait_for(
        "GPUHealthy True again",
        lambda: service.condition(ConditionType.GPU_HEALTHY).get("status") == "True",
        timeout=60,
    )


def test_a_claim_no_device_can_satisfy_leaves_the_pod_pending_and_ready_names_the_reason(
    cluster: Any, inference_service: ServiceFactory, namespace: str
) -> None:
    # A DeviceClass no GPU of the slice matches: the claim can never be allocated.
    device_class = dra.device_class()
    device_class["metadata"]["name"] = f"none.{namespace}"
    device_class["spec"]["selectors"][0]["cel"]["expression"] += (
        f" && device.attributes['{GPU_DRA_DRIVER}'].productName == 'no-such-gpu'"
    )
    cluster.kubectl("apply", "-f", "-", input=json.dumps(device_class))
    try:
        spec = base_spec(gpu={"count": 1, "deviceClassName": device_class["metadata"]["name"]})
        service = inference_service("dra-none", spec)

        def unschedulable() -> str | None:
            for pod in service.pods():
                for condition in pod["status"].get("conditions", []):
                    if condition["type"] == "PodScheduled" and condition["status"] == "False":
                        return str(condition.get("message", ""))
            return None

        message = wait_for("the pod unschedulable", unschedulable, timeout=120)
        assert "cannot allocate all claims" in message, message
        (pod,) = service.pods()
        assert pod["status"]["phase"] == "Pending"

        # The user sees it on the service itself, without autoscaling: Ready names the
        # pod and the scheduler's words, and one Warning event says the same.
        def ready_unschedulable() -> dict[str, Any] | None:
            ready = service.condition(ConditionType.READY)
            return ready if ready.get("reason") == EventReason.PODS_UNSCHEDULABLE else None

        ready = wait_for("Ready False PodsUnschedulable", ready_unschedulable, timeout=60)
        assert ready["status"] == "False"
        assert pod["metadata"]["name"] in ready["message"], ready
        assert "cannot allocate all claims" in ready["message"], ready
        wait_for(
            "a PodsUnschedulable event",
            lambda: EventReason.PODS_UNSCHEDULABLE in service.event_reasons(),
            timeout=30,
        )
        warnings = [e for e in service.events() if e["reason"] == EventReason.PODS_UNSCHEDULABLE]
        assert len(warnings) == 1 and warnings[0]["type"] == "Warning", warnings
        assert "cannot allocate all claims" in warnings[0]["message"]
    finally:
        cluster.kubectl(
            "delete", "deviceclass", device_class["metadata"]["name"], "--ignore-not-found"
        )
