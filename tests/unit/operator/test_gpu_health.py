"""gpu_health: a pod on an Unhealthy GPU is drained once, and the condition names it."""

from __future__ import annotations

from kubernetes.client import (
    V1ContainerStatus,
    V1ObjectMeta,
    V1Pod,
    V1PodStatus,
    V1ResourceHealth,
    V1ResourceStatus,
)

from fusebox_contract.names import ConditionType, EventReason
from fusebox_operator.gpu_health import drain_actions, gpu_condition
from fusebox_operator.observations import PodView
from fusebox_operator.policy_state import ActionKind, PolicyState
from fusebox_operator.status import ACTION_EVENT_REASONS

from .served import view_of

T0 = 1_800_000_000.0


def view(name: str, unhealthy: tuple[str, ...] = (), terminating: bool = False) -> PodView:
    return PodView(name, f"uid-{name}", "10.0.0.1", "Running", True, True, True, 0,
                   terminating, False, "", unhealthy)  # fmt: skip


def test_the_kubelets_device_health_is_read_from_the_servers_status() -> None:
    health = [
        V1ResourceHealth(resource_id="GPU-a", health="Unhealthy"),
        V1ResourceHealth(resource_id="GPU-b", health="Healthy"),
    ]
    server = V1ContainerStatus(
        name="server",
        image="i",
        image_id="",
        ready=True,
        restart_count=0,
        allocated_resources_status=[V1ResourceStatus(name="nvidia.com/gpu", resources=health)],
    )
    pod = V1Pod(
        metadata=V1ObjectMeta(name="p", uid="u"),
        status=V1PodStatus(phase="Running", container_statuses=[server]),
    )
    assert view_of(pod).unhealthy_gpus == ("GPU-a",)


def test_a_pod_on_an_unhealthy_gpu_is_drained_once_and_others_are_left_alone() -> None:
    state, drained = PolicyState("svc"), set[str]()
    pods = [view("a", ("GPU-1",)), view("b"), view("c", ("GPU-3",), terminating=True)]
    (action,) = drain_actions(pods, drained, state, T0)
    assert action.kind is ActionKind.DRAIN and action.pod == "a"
    assert "GPU-1" in action.reason and "Unhealthy" in action.reason
    assert ACTION_EVENT_REASONS[ActionKind.DRAIN] == (EventReason.GPU_UNHEALTHY,)
    # The listing still shows it on the next tick: no second drain.
    assert drain_actions(pods, drained, state, T0 + 5) == []
    # Once it is gone from the listing it is forgotten: the set does not grow forever.
    assert drain_actions(pods[1:], drained, state, T0 + 10) == []
    assert drained == set()


def test_the_condition_names_the_pods_and_their_gpus_until_they_are_gone() -> None:
    sick = gpu_condition([], [view("a", ("GPU-1",)), view("b")], 3, T0)
    (condition,) = sick
    assert condition["type"] == ConditionType.GPU_HEALTHY and condition["status"] == "False"
    assert "a (GPU-1)" in condition["message"]
    (healthy,) = gpu_condition(sick, [view("a2"), view("b")], 3, T0 + 30)
    assert healthy["status"] == "True" and healthy["reason"] == "AllGPUsHealthy"
