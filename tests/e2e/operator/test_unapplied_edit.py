"""An edit the operator cannot apply yet leaves the running pods watched and protected.

The operator keeps the last spec it applied (status.appliedSpec) and runs its
control loop with it. An edit asking for a GPU no node offers waits
(WaitingForGPUNodes) instead of being refused for good; meanwhile the pod of
the applied spec keeps its Deployment, and a wedge on it is still acted on.
Undoing the edit applies again.
"""

from __future__ import annotations

import json
from typing import Any

from fusebox_contract.names import ConditionType, EventReason

from .conftest import Service, ServiceFactory, base_spec, wait_for

UNKNOWN_GPU = {"count": 1, "product": "Fusebox-Unknown-Accelerator"}


def patch_spec(service: Service, spec: dict[str, Any]) -> None:
    body = json.dumps({"spec": spec})
    service.kubectl("patch", "inferenceservice", service.name, "--type", "merge", "-p", body)


def deployment_generation(service: Service) -> int:
    out = service.kubectl(
        "get", "deployment", service.name, "-o", "jsonpath={.metadata.generation}"
    )
    return int(out.stdout)


def invalid_spec_reason(service: Service) -> str:
    return str(service.condition(ConditionType.INVALID_SPEC).get("reason", ""))


def test_an_edit_waiting_for_gpu_nodes_leaves_the_running_pod_protected(
    inference_service: ServiceFactory,
) -> None:
    spec = base_spec()
    spec["server"]["env"] = [{"name": "FUSEBOX_FAULTS", "value": "wedge"}]
    service = inference_service("held", spec)
    (pod,) = wait_for("the pod Ready", service.ready_pods, timeout=240, diagnose=service.diagnose)
    applied = service.status()["appliedGeneration"]
    rolled = deployment_generation(service)

    patch_spec(service, {"gpu": UNKNOWN_GPU})
    wait_for(
        "InvalidSpec False, WaitingForGPUNodes",
        lambda: invalid_spec_reason(service) == EventReason.WAITING_FOR_GPU_NODES,
        timeout=60,
        diagnose=service.diagnose,
    )
    assert service.condition(ConditionType.INVALID_SPEC)["status"] == "False"
    assert EventReason.WAITING_FOR_GPU_NODES in service.event_reasons()
    assert service.status()["appliedGeneration"] == applied
    assert deployment_generation(service) == rolled

    # Still watched with the applied spec: the operator acts on a wedge of the old pod.
    name = pod["metadata"]["name"]
    service.set_faults(pod, {"wedge": 1})
    wait_for(
        f"PodRestarted for {name}",
        lambda: any(
            e["reason"] == EventReason.POD_RESTARTED and name in e["message"]
            for e in service.events()
        ),
        timeout=180,
        diagnose=service.diagnose,
    )

    patch_spec(service, {"gpu": {"count": 0, "product": None}})
    wait_for(
        "the reverted spec applied",
        lambda: (
            invalid_spec_reason(service) == "SpecValid"
            and service.status().get("appliedGeneration", 0) > applied
        ),
        timeout=150,
        diagnose=service.diagnose,
    )
    wait_for("a Ready pod again", service.ready_pods, timeout=240, diagnose=service.diagnose)
