"""Issue 14, item 2: growing the memory limit in place is a ladder rung, before a reload.

A real leak on the real kubelet: after gc and empty_cache free nothing, the
operator resizes the server container's memory (limit and, the pod being
Guaranteed, request) through `pods/resize`. The same pod keeps running — same
UID, no container restart — its status shows the new limit, the sidecar reads
it from the cgroup, and the event tells old -> new.
"""

from __future__ import annotations

from typing import Any

from fusebox_contract.names import EventReason

from .conftest import Service, ServiceFactory, wait_for
from .test_operator import leak_spec, traffic, wait_ready

GIB = 1024**3


def server_status(pod: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod["status"]["containerStatuses"] if c["name"] == "server")


def memory_events(service: Service) -> list[str]:
    wanted = {
        EventReason.GARBAGE_COLLECTED,
        EventReason.CACHE_EMPTIED,
        EventReason.MEMORY_LIMIT_GROWN,
        EventReason.MODEL_UNLOADED,
        EventReason.MODEL_RELOADED,
    }
    return [r for r in service.event_reasons() if r in wanted]


def test_the_ladder_grows_the_limit_in_place_before_it_reloads(
    inference_service: ServiceFactory,
) -> None:
    spec = leak_spec()
    spec["memory"] = {"limit": "2Gi", "maxGrowthRatio": 1.5}
    service = inference_service("grows", spec)
    wait_ready(service)
    (before,) = service.pods()
    uid = before["metadata"]["uid"]
    assert server_status(before)["resources"]["limits"]["memory"] == "2Gi"

    with traffic(service.service_url(), 1.0, max_tokens=4):
        wait_for(
            "a MemoryLimitGrown event",
            lambda: EventReason.MEMORY_LIMIT_GROWN in memory_events(service),
            timeout=300,
            diagnose=service.diagnose_pods,
        )
    order = memory_events(service)
    grown_at = order.index(EventReason.MEMORY_LIMIT_GROWN)
    assert order[:grown_at] == [EventReason.GARBAGE_COLLECTED, EventReason.CACHE_EMPTIED], order
    message = next(
        e["message"] for e in service.events() if e["reason"] == EventReason.MEMORY_LIMIT_GROWN
    )
    assert "2Gi -> 3Gi" in message and "no restart" in message, message

    def resized() -> dict[str, Any] | None:
        (pod,) = service.pods()
        limits = server_status(pod).get("resources", {}).get("limits", {})
        return pod if limits.get("memory") == "3Gi" else None

    pod = wait_for("the kubelet to apply 3Gi", resized, timeout=60, diagnose=service.diagnose_pods)
    assert pod["metadata"]["uid"] == uid  # the same pod ...
    assert server_status(pod)["restartCount"] == 0  # ... and the same container run
    assert server_status(pod)["resources"]["requests"]["memory"] == "3Gi"  # still Guaranteed
    assert pod["status"]["qosClass"] == "Guaranteed"
    wait_for(
        "the sidecar's cgroup reading of 3 GiB in status",
        lambda: (
            [p.get("memoryLimitBytes") for p in service.status().get("pods") or []] == [3 * GIB]
        ),
        timeout=60,
    )
