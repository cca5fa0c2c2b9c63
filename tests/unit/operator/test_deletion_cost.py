"""A scale-down removes the pods that serve least first: the pod-deletion-cost the
operator sets from what it observed of each pod, the tick that asks for it only when
the count goes down, and the merge patch that carries it to the apiserver."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from fusebox_contract.names import BreakerState, EventReason
from fusebox_operator.actuator import ActionResult, RuntimeCall
from fusebox_operator.deletion_cost import (
    DELETION_COST_ANNOTATION,
    DeletionCost,
    deletion_cost,
    deletion_costs,
)
from fusebox_operator.kube import KubeError
from fusebox_operator.observations import PodSample, PodView
from fusebox_operator.serving import PodServing, ServingReason
from fusebox_operator.spec import parse_spec
from fusebox_operator.tick import TickInputs, TickMemory, TickOutcome, run_tick

from .test_kube_apply import FakeApiserver, against

T0 = 1_800_000_000.0


@pytest.mark.parametrize(
    ("reason", "cost"),
    [
        (ServingReason.NOT_READY, DeletionCost.NOT_SERVING),
        (ServingReason.MEMORY_GUARD, DeletionCost.NOT_SERVING),
        (ServingReason.SERVER_WEDGED, DeletionCost.NOT_SERVING),
        (ServingReason.MODEL_UNAVAILABLE, DeletionCost.NOT_SERVING),
        (ServingReason.POD_BREAKER_OPEN, DeletionCost.NOT_SERVING),
        (ServingReason.METRICS_UNREACHABLE, DeletionCost.UNOBSERVED),
        (ServingReason.STATS_INVALID, DeletionCost.UNOBSERVED),
        (ServingReason.SERVING, DeletionCost.SERVING),
    ],
)
def test_each_verdict_has_its_cost(reason: ServingReason, cost: DeletionCost) -> None:
    assert deletion_cost(PodServing("p", reason)) is cost


def test_pods_that_do_not_serve_go_before_unseen_ones_and_unseen_before_serving() -> None:
    verdicts = [
        PodServing("serving", ServingReason.SERVING),
        PodServing("unseen", ServingReason.METRICS_UNREACHABLE),
        PodServing("tripped", ServingReason.POD_BREAKER_OPEN),
    ]
    costs = deletion_costs(verdicts)
    assert sorted(costs, key=costs.__getitem__) == ["tripped", "unseen", "serving"]


# ----- in the tick: costs only before a scale-down -----------------------------------------

AUTOSCALED = parse_spec(
    {
        "model": {"name": "chat", "source": "pvc://models/tiny"},
        "autoscaling": {
            "minReplicas": 1,
            "maxReplicas": 4,
            "targetPerReplica": 2,
            "scaleDownStabilizationSeconds": 0,
        },
    }
)


def pod(name: str, ready: bool = True) -> PodView:
    return PodView(name, f"uid-{name}", "10.0.0.1", "Running", ready, True, True, 0, False, False)


def idle(name: str, queue: float = 0.0, **extra: Any) -> PodSample:
    values: dict[str, Any] = {
        "model_loaded": True,
        "stats_valid": True,
        "stats_age_seconds": 1.0,
        "queue_length": queue,
        "requests_running": 0.0,
        "breaker_state": BreakerState.CLOSED,
        "memory_guard_active": False,
    }
    return PodSample(name, T0, **{**values, **extra})


class IdleActuator:
    async def execute(self, *_: Any) -> ActionResult:
        return ActionResult("done")

    async def reconcile_runtime(self, *_: Any) -> RuntimeCall:
        return RuntimeCall()


def tick(answers: Sequence[PodSample], replicas: int = 4) -> TickOutcome:
    """One tick over pods a, b, c (Ready) and d (not Ready) at `replicas`; each scrape
    answers from `answers`, the others are refused."""

    async def scrape(targets: Sequence[PodView]) -> list[PodSample]:
        by_pod = {a.pod: a for a in answers}
        refused = "connection refused"
        return [by_pod.get(t.name) or PodSample(t.name, T0, ok=False, error=refused)
                for t in targets]  # fmt: skip

    pods = [pod("a"), pod("b"), pod("c"), pod("d", ready=False)]
    status = {"autoscaling": {"replicas": replicas}}
    inputs = TickInputs("ns", "svc", AUTOSCALED, status, pods, "token", 1)
    return asyncio.run(run_tick(inputs, TickMemory(), scrape, IdleActuator(), lambda: T0))


def test_a_scale_down_ranks_every_pod_by_what_was_observed_of_it() -> None:
    # a serves; b's own breaker refuses every request; c's sidecar does not answer; d is
    # not Ready. The load (a and b idle, c and d counted at the target) asks for 2 of 4.
    tripped = idle("b", breaker_state=BreakerState.OPEN)
    outcome = tick([idle("a"), tripped])
    assert outcome.replicas == 2
    assert [e.reason for e in outcome.events if e.reason is EventReason.SCALED_DOWN]
    assert outcome.deletion_costs == {"a": 2, "b": 0, "c": 1, "d": 0}


def test_no_cost_is_set_unless_the_count_goes_down() -> None:
    steady = tick([idle("a", queue=2.0), idle("b", queue=2.0)], replicas=2)
    assert steady.replicas == 2 and steady.deletion_costs == {}
    up = tick([idle("a", queue=8.0), idle("b", queue=8.0)], replicas=2)
    assert up.replicas == 4 and up.deletion_costs == {}


# ----- the patch the apiserver gets -------------------------------------------------------


def pod_object(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "team", "resourceVersion": "3"}}


def test_each_pod_is_merge_patched_with_its_cost_and_a_gone_pod_is_skipped() -> None:
    apiserver = FakeApiserver()
    apiserver.objects["/api/v1/namespaces/team/pods/a"] = pod_object("a")
    apiserver.objects["/api/v1/namespaces/team/pods/c"] = pod_object("c")
    against(apiserver, lambda kube: kube.set_deletion_costs("team", {"a": 2, "b": 0, "c": 1}))
    assert apiserver.calls == [
        ("PATCH", "/api/v1/namespaces/team/pods/a"),
        ("PATCH", "/api/v1/namespaces/team/pods/b"),  # gone: 404, skipped
        ("PATCH", "/api/v1/namespaces/team/pods/c"),
    ]
    assert apiserver.content_types == ["application/merge-patch+json"] * 3
    annotations = {
        path.rsplit("/", 1)[1]: stored["metadata"]["annotations"]
        for path, stored in apiserver.objects.items()
    }
    assert annotations == {
        "a": {DELETION_COST_ANNOTATION: "2"},
        "c": {DELETION_COST_ANNOTATION: "1"},
    }


def test_a_refused_patch_is_a_kube_error_naming_the_pod() -> None:
    apiserver = FakeApiserver(refuse={"PATCH": 403})
    apiserver.objects["/api/v1/namespaces/team/pods/a"] = pod_object("a")
    with pytest.raises(KubeError, match=r"^pod-deletion-cost of pod team/a: "):
        against(apiserver, lambda kube: kube.set_deletion_costs("team", {"a": 2}))
