"""Issue 14, item 1: the operator scales an InferenceService on its pods' load.

Real load through the Service (a slow fault keeps each request in flight for
seconds), the operator's own scrapes, the real Deployment and scheduler:
- load raises the replicas within a few scrape intervals, and idle lowers them
  once the scale-down window has passed, each change an event;
- pods Pending for lack of GPUs hold further scale-up, with a condition and a
  Warning event naming them.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fusebox_contract.names import ConditionType, EventReason
from fusebox_contract.wiring import FAULTS_ENV
from fusebox_operator.deletion_cost import DELETION_COST_ANNOTATION as DELETION_COST

from .conftest import Service, ServiceFactory, base_spec, chat_reply, wait_for

GPU = "nvidia.com/gpu"


def autoscaled_spec(**overrides: Any) -> dict[str, Any]:
    spec = base_spec(
        server={"env": [{"name": FAULTS_ENV, "value": "slow:300"}], "maxNewTokens": 16},
        # Slow answers are this test's load, not a latency incident.
        breaker={"latency": {"p99ThresholdMillis": 600000}},
        autoscaling={
            "minReplicas": 1,
            "maxReplicas": 2,
            "metric": "inFlight",
            "targetPerReplica": 1,
            "scaleDownStabilizationSeconds": 20,
        },
    )
    spec.update(overrides)
    return spec


@contextmanager
def steady_load(service: Service, clients: int) -> Iterator[list[int]]:
    """`clients` threads sending chat requests back to back until the block ends."""
    statuses: list[int] = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            statuses.append(chat_reply(service.service_url(), max_tokens=16, timeout=60).status)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    try:
        yield statuses
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=90)


def scaling_messages(service: Service, reason: EventReason) -> list[str]:
    return [str(e["message"]) for e in service.events() if e["reason"] == reason]


def test_load_scales_up_and_idle_scales_back_down_each_change_an_event(
    inference_service: ServiceFactory,
) -> None:
    service = inference_service("autoscaled", autoscaled_spec())
    wait_for(
        "one ready pod", lambda: len(service.ready_pods()) == 1, diagnose=service.diagnose_pods
    )
    assert service.deployment_replicas() == 1

    with steady_load(service, clients=4) as statuses:
        wait_for("a second replica", lambda: service.deployment_replicas() == 2, timeout=120)
        wait_for(
            "two ready pods",
            lambda: len(service.ready_pods()) == 2,
            timeout=240,
            diagnose=service.diagnose_pods,
        )
        scaled = service.status()["autoscaling"]
        assert scaled["replicas"] == 2 and scaled["metric"] == "inFlight", scaled
    assert statuses and set(statuses) <= {200, 429, 503}, sorted(set(statuses))
    assert statuses.count(200) > 0
    (up,) = scaling_messages(service, EventReason.SCALED_UP)
    assert "1 -> 2 replicas" in up and "inFlight" in up, up

    # Idle: the count comes down only after the 20 s window, and says so: the hold
    # first, then the scale-down, the pods ranked for the ReplicaSet before it.
    wait_for("back to one replica", lambda: service.deployment_replicas() == 1, timeout=180)
    held = scaling_messages(service, EventReason.SCALE_DOWN_HELD)
    assert any("2 replicas held, load asks for 1" in m for m in held), held
    (down,) = scaling_messages(service, EventReason.SCALED_DOWN)
    assert "2 -> 1 replicas" in down, down
    costs = {
        p["metadata"]["name"]: (p["metadata"].get("annotations") or {}).get(DELETION_COST)
        for p in service.ready_pods()
    }
    assert costs and set(costs.values()) == {"2"}, f"the serving pod kept: {costs}"
    assert service.status()["autoscaling"]["replicas"] == 1
    limited = service.condition(ConditionType.SCALING_LIMITED)
    assert limited.get("status") == "False", limited


def free_gpus(cluster: Any) -> int:
    """The node's allocatable GPUs less those its live pods requested."""
    node = json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"][0]
    allocatable = int(node["status"]["allocatable"].get(GPU, 0))
    pods = json.loads(cluster.kubectl("get", "pods", "-A", "-o", "json").stdout)["items"]
    used = sum(
        int(((c.get("resources") or {}).get("requests") or {}).get(GPU, 0))
        for pod in pods
        if pod["status"].get("phase") in ("Pending", "Running")
        and pod["spec"].get("nodeName") == node["metadata"]["name"]
        for c in pod["spec"]["containers"]
    )
    return allocatable - used


def test_pods_pending_for_gpus_hold_scale_up_with_a_condition_and_an_event(
    inference_service: ServiceFactory, cluster: Any
) -> None:
    free = free_gpus(cluster)
    assert free >= 1, "the node has no free simulated GPU"
    # One pod more than the node has GPUs for: it stays Pending.
    spec = autoscaled_spec(
        replicas=free + 1,
        gpu={"count": 1},
        autoscaling={**autoscaled_spec()["autoscaling"], "maxReplicas": free + 2},
    )
    spec.pop("memory")  # sized by the operator from the (simulated) GPU
    service = inference_service("gpu-bound", spec)
    wait_for(
        f"{free} ready pods",
        lambda: len(service.ready_pods()) == free,
        timeout=300,
        diagnose=service.diagnose_pods,
    )

    with steady_load(service, clients=3 * (free + 2)):
        limited = wait_for(
            "ScalingLimited=True (PodsPendingForGPU)",
            lambda: (
                (c := service.condition(ConditionType.SCALING_LIMITED)).get("status") == "True"
                and c.get("reason") == "PodsPendingForGPU"
                and c
            ),
            timeout=180,
        )
        assert "Pending for lack of GPUs" in limited["message"], limited
        blocked = wait_for(
            "a ScaleUpBlocked event",
            lambda: scaling_messages(service, EventReason.SCALE_UP_BLOCKED) or None,
            timeout=60,
        )
        assert service.deployment_replicas() == free + 1  # held: no further pod asked for
    assert len(blocked) == 1, blocked  # once when the hold starts, not every tick
    assert EventReason.SCALED_UP not in service.event_reasons()
