"""GPU health: a pod whose GPU went Unhealthy is drained so a healthy GPU replaces it.

Why: when a GPU fails (Xid errors, fallen off the bus) the device plugin marks
it Unhealthy and the kubelet stops offering it, but the pod that holds it keeps
it: the pod may still pass its probes while every CUDA call fails. Nothing in
Kubernetes moves that pod. The operator reads the kubelet's per-device health
from the pod's status (`allocatedResourcesStatus`), deletes the pod gracefully
(its in-flight requests finish within the grace period) and the Deployment's
replacement is scheduled on a GPU that is still allocatable. One drain per pod
run; the `GPUHealthy` condition names the pods while any is affected.

Pure: a function of the pods, the policy state (for action ids) and the clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fusebox_contract.names import ConditionType
from fusebox_operator.observations import PodView
from fusebox_operator.policy_state import Action, ActionKind, PolicyState, next_action_id
from fusebox_operator.status import set_condition

GPU_UNHEALTHY_REASON = "GPUUnhealthy"
GPUS_HEALTHY_REASON = "AllGPUsHealthy"


def drain_actions(
    pods: Sequence[PodView], drained: set[str], state: PolicyState, now: float
) -> list[Action]:
    """A drain for each pod (not yet drained, not already going) holding an Unhealthy GPU.

    `drained` remembers the pod runs already told, so a slow listing never
    drains one twice, and forgets each once it is no longer listed.
    """
    drained.intersection_update(pod.uid for pod in pods)
    actions = []
    for pod in pods:
        if not pod.unhealthy_gpus or pod.terminating or pod.uid in drained:
            continue
        gpus = ", ".join(pod.unhealthy_gpus)
        reason = f"GPU {gpus} reported Unhealthy by the kubelet: draining to a healthy GPU"
        kind = ActionKind.DRAIN
        actions.append(Action(next_action_id(state, kind), kind, pod.name, reason, now))
        drained.add(pod.uid)
    return actions


def gpu_condition(
    conditions: Sequence[dict[str, Any]], pods: Sequence[PodView], generation: int, now: float
) -> list[dict[str, Any]]:
    """`GPUHealthy`: False naming the pods on an Unhealthy GPU, True otherwise."""
    affected = sorted(f"{p.name} ({', '.join(p.unhealthy_gpus)})" for p in pods if p.unhealthy_gpus)
    if affected:
        message = "Unhealthy GPU on " + "; ".join(affected) + ": draining"
        return set_condition(
            conditions,
            ConditionType.GPU_HEALTHY,
            False,
            GPU_UNHEALTHY_REASON,
            message,
            generation,
            now,
        )
    return set_condition(
        conditions,
        ConditionType.GPU_HEALTHY,
        True,
        GPUS_HEALTHY_REASON,
        "every pod's GPUs are Healthy",
        generation,
        now,
    )
