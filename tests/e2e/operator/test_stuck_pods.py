"""The walkthrough's first surprises: a pod that can never become ready is named on the
service, not only on the pod.

A service whose model path is not in the PVC crash-loops: `kubectl get fis` must say
so (Ready False, reason PodsFailing, the pod and the kubelet's reason with the last
exit) with one Warning event, however many times the kubelet retries. A service whose
`gpu.product` no node carries is never placed: Ready False, reason PodsUnschedulable,
quoting the scheduler, on the device-plugin path without autoscaling (test_dra.py
covers a DRA claim).
"""

from __future__ import annotations

import re
from typing import Any

from fusebox_contract.names import ConditionType, EventReason

from .conftest import Service, ServiceFactory, base_spec, wait_for

SMALL_SERVER = {"cpu": "100m"}  # room next to whatever else the shared node runs


def ready_with(service: Service, reason: str) -> dict[str, Any] | None:
    ready = service.condition(ConditionType.READY)
    return ready if ready.get("reason") == reason else None


def server_status(pod: dict[str, Any]) -> dict[str, Any]:
    statuses = pod["status"].get("containerStatuses") or []
    return next((s for s in statuses if s["name"] == "server"), {})


def test_a_crash_looping_server_is_named_in_ready_and_posted_once(
    inference_service: ServiceFactory,
) -> None:
    spec = base_spec(
        model={"name": "chat", "source": "pvc://models/no-such-model"},
        server={**base_spec()["server"], **SMALL_SERVER},
    )
    service = inference_service("crashing", spec)

    ready = wait_for(
        "Ready False PodsFailing",
        lambda: ready_with(service, EventReason.PODS_FAILING),
        timeout=240,
        diagnose=service.diagnose,
    )
    (pod,) = service.pods()
    assert ready["status"] == "False"
    assert pod["metadata"]["name"] in ready["message"], ready
    # Seen just after the exit ("server exited 2: Error") or in back-off
    # ("server CrashLoopBackOff (last exit 2: Error)"): the exit code either way.
    assert re.search(r"\bserver .*\bexit(ed)? 2\b", ready["message"]), ready
    # The server's own words (its termination message), not the kubelet's back-off.
    assert "--model-dir /models/" in ready["message"], ready
    assert "no-such-model: not a directory" in ready["message"], ready

    # The kubelet retries (running again between back-offs): still the same spell.
    def retried_and_waiting() -> bool:
        (current,) = service.pods()
        server = server_status(current)
        return server.get("restartCount", 0) >= 2 and "waiting" in server.get("state", {})

    wait_for("a second crash", retried_and_waiting, timeout=240, diagnose=service.diagnose)
    wait_for(
        "Ready still PodsFailing",
        lambda: ready_with(service, EventReason.PODS_FAILING),
        timeout=30,
    )
    posted = [e for e in service.events() if e["reason"] == EventReason.PODS_FAILING]
    assert len(posted) == 1 and posted[0]["type"] == "Warning", posted
    assert pod["metadata"]["name"] in posted[0]["message"]


def test_a_gpu_product_no_node_carries_is_named_in_ready_without_autoscaling(
    inference_service: ServiceFactory,
) -> None:
    spec = base_spec(
        gpu={"count": 1, "product": "NO-SUCH-GPU", "memoryGiB": 1},
        server={**base_spec()["server"], **SMALL_SERVER},
    )
    service = inference_service("nowhere", spec)

    ready = wait_for(
        "Ready False PodsUnschedulable",
        lambda: ready_with(service, EventReason.PODS_UNSCHEDULABLE),
        timeout=120,
        diagnose=service.diagnose,
    )
    (pod,) = service.pods()
    assert pod["status"]["phase"] == "Pending"
    assert pod["metadata"]["name"] in ready["message"], ready
    assert "node affinity/selector" in ready["message"], ready
    wait_for(
        "a PodsUnschedulable event",
        lambda: EventReason.PODS_UNSCHEDULABLE in service.event_reasons(),
        timeout=30,
    )
