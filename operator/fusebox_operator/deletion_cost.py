"""Which pods a scale-down removes first: the pod-deletion-cost the operator sets.

Why: lowering a Deployment's replicas lets its ReplicaSet choose the pods to
delete. It takes a pod the kubelet calls not Ready first, but among Ready pods
it knows nothing of what the operator observed, and may delete the one pod
that serves while keeping one whose breaker refuses every request or whose
sidecar nobody can read. The ReplicaSet reads the pod annotation
`controller.kubernetes.io/pod-deletion-cost` (a lower cost goes first) right
after readiness, so before the autoscaler lowers the count the operator sets it
on every pod of the service from this tick's verdicts (serving.py):

    NOT_SERVING (0)  not Ready, or seen refusing every request (memory
                     guard, wedged server, no model loaded, its own breaker open),
                     or left out of the Service's ready endpoints
    UNOBSERVED  (1)  the operator cannot tell whether it serves (its sidecar not
                     scraped, or no valid stats of its server)
    SERVING     (2)  seen serving

A pod the operator has not judged carries no annotation, which the ReplicaSet
reads as 0: with the pods that do not serve. The costs are rewritten at each
scale-down, not in between (the annotation only matters when a count goes down).

Pure: verdicts in, costs and the patch body out; kube.py sends it.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

from fusebox_operator.serving import PodServing

DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"


class DeletionCost(enum.IntEnum):
    """A pod's deletion cost: the ReplicaSet deletes the lowest first."""

    NOT_SERVING = 0
    UNOBSERVED = 1
    SERVING = 2


def deletion_cost(verdict: PodServing) -> DeletionCost:
    """What losing this pod costs the service, by what the operator observed of it."""
    if verdict.serving:
        return DeletionCost.SERVING
    if verdict.unobserved:
        return DeletionCost.UNOBSERVED
    return DeletionCost.NOT_SERVING


def deletion_costs(verdicts: Sequence[PodServing]) -> dict[str, int]:
    """Each judged pod's cost, by name."""
    return {v.pod: int(deletion_cost(v)) for v in verdicts}


def deletion_cost_patch(cost: int) -> dict[str, Any]:
    """The merge patch that sets a pod's cost (the annotation's value is a string)."""
    return {"metadata": {"annotations": {DELETION_COST_ANNOTATION: str(cost)}}}
