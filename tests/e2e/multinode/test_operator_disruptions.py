"""Disruptions of two kinds across nodes, with the operator from the chart: its own (two
replicas on two nodes leaking together are reloaded one at a time, the budget of one
unavailable pod that the service's PodDisruptionBudget gives evictions) and an
administrator's (`kubectl drain` of a node in the middle of a ladder: the eviction
honours that budget, the operator starts nothing more on the evicted pod, and its
replacement on the other node is sized and watched).

Each pod's readiness is read from its server's own /readyz, polled from the host,
not from the kubelet's probe (every 2 s, two failures): a reload of the tiny model
is over before the kubelet would notice it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest

from fusebox_contract.names import EventReason
from fusebox_contract.wiring import HttpPath, Port

from ..conftest import Cluster, wait_for
from ..localcluster.conftest import Kube
from ..operator.conftest import apply_service, http, pod_url, traffic
from ..operator.test_operator import leak_spec
from ..operator.test_operator_replicas import action_id
from .conftest import (
    IMAGE_LABEL,
    multinode_cli,
    one_ready_pod_per_node,
    shared_model_claim,
    spread_one_per_node,
    wait_serving,
)
from .test_operator_across_nodes import (
    ladder_events,
    ladder_events_of,
    observed_after,
    server_limits,
)

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]

READYZ_EVERY_SECONDS = 0.1
Samples = dict[str, list[tuple[float, int]]]  # pod -> (monotonic time, /readyz status)


@contextmanager
def readyz_sampled(urls: Mapping[str, str]) -> Iterator[Samples]:
    """Each pod's /readyz (pod name -> its API URL), polled from the host, one thread a
    pod so the pods are read at the same moments; status 0 when no answer came."""
    samples: Samples = {pod: [] for pod in urls}
    stop = threading.Event()

    def poll(pod: str, url: str) -> None:
        while not stop.is_set():
            status, _ = http("GET", f"{url}{HttpPath.READYZ.value}", timeout=1)
            samples[pod].append((time.monotonic(), status))
            stop.wait(READYZ_EVERY_SECONDS)

    threads = [threading.Thread(target=poll, args=item, daemon=True) for item in urls.items()]
    for thread in threads:
        thread.start()
    try:
        yield samples
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=5)


def not_ready_spans(samples: list[tuple[float, int]]) -> list[tuple[float, float]]:
    """The spans in which the server said 503 (not ready) at every poll; an unanswered poll
    (a host too busy to answer within a second) neither starts nor ends a span."""
    spans: list[tuple[float, float]] = []
    start = last = None
    for moment, status in samples:
        if status == 503:
            start = moment if start is None else start
            last = moment
        elif status == 200 and start is not None and last is not None:
            spans.append((start, last))
            start = last = None
    if start is not None and last is not None:
        spans.append((start, last))
    return spans


def overlapping(spans_by_pod: Mapping[str, list[tuple[float, float]]]) -> list[str]:
    """Every pair of spans of two different pods that share a moment."""
    found = []
    pods = sorted(spans_by_pod)
    for i, pod in enumerate(pods):
        for other in pods[i + 1 :]:
            for start, end in spans_by_pod[pod]:
                for other_start, other_end in spans_by_pod[other]:
                    if start <= other_end and other_start <= end:
                        found.append(
                            f"{pod} {start:.1f}-{end:.1f} s and "
                            f"{other} {other_start:.1f}-{other_end:.1f} s"
                        )
    return found


def two_replicas_one_per_node(name: str, **spread_policy: str) -> dict[str, Any]:
    spec = leak_spec()
    spec["replicas"] = 2
    spec["pod"] = {
        "nodeSelector": {IMAGE_LABEL: "true"},
        "topologySpreadConstraints": spread_one_per_node(name, **spread_policy),
    }
    return spec


def test_two_pods_on_two_nodes_leaking_together_are_reloaded_one_at_a_time(
    multinode: Cluster, services_kube: Kube, inference_nodes: list[str], model_root: Path
) -> None:
    """Both replicas take the same leaking traffic, so their ladders reach the reload
    rung within seconds of each other. A reload takes a pod out of service; the
    operator reloads one, waits for it to serve again, then reloads the other: at no
    moment did both servers answer 503."""
    name = "rolling"
    with shared_model_claim(multinode, services_kube.namespace, model_root, inference_nodes):
        service = apply_service(
            multinode, services_kube.namespace, name, two_replicas_one_per_node(name)
        )
        placed = wait_for(
            "a ready pod on each node",
            lambda: one_ready_pod_per_node(service),
            timeout=420,
            diagnose=service.diagnose,
        )
        urls = {p["metadata"]["name"]: pod_url(p, Port.API) for p in placed.values()}

        def reloaded_each() -> list[dict[str, Any]] | None:
            reloads = [e for e in service.events() if e["reason"] == EventReason.MODEL_RELOADED]
            each = all(any(pod in e["message"] for e in reloads) for pod in urls)
            return reloads if each else None

        with ExitStack() as stack:
            samples = stack.enter_context(readyz_sampled(urls))
            for url in urls.values():
                stack.enter_context(traffic(url, 1.0))
            wait_for(
                "a reload of each pod",
                reloaded_each,
                timeout=360,
                every=1,
                diagnose=service.diagnose,
            )
        events = service.events()

    spans = {pod: not_ready_spans(samples[pod]) for pod in urls}
    for pod, pod_spans in spans.items():
        print(f"{pod} not ready (monotonic s):", [(round(a, 1), round(b, 1)) for a, b in pod_spans])
    assert overlapping(spans) == [], "both pods were out of service at once"
    # Each pod's readiness was read through its reloads (the check above saw them).
    assert all(len(s) > 20 for s in samples.values()), {p: len(s) for p, s in samples.items()}
    # Each reload is one action on one pod: unloaded and reloaded under one id.
    for event in ladder_events_of(events):
        named = [pod for pod in urls if pod in event["message"]]
        assert len(named) == 1, event["message"]


def test_a_drain_mid_ladder_evicts_within_the_budget_and_the_operator_lets_the_pod_go(
    multinode: Cluster, services_kube: Kube, inference_nodes: list[str], model_root: Path
) -> None:
    """One replica per node; the one on node 2 takes leaking traffic and climbs the
    ladder. `kubectl drain` of node 2 then evicts it (the budget allows one pod out
    while the other serves), and the replacement lands on node 1 (the spread ignores
    the cordoned node: nodeTaintsPolicy Honor). The operator starts no action on the
    evicted pod after the drain began (one already running may finish), never touches
    the pod on node 1, and lists the replacement with the same limits and figures
    observed after the drain."""
    staying, drained = inference_nodes
    name = "drained"
    spec = two_replicas_one_per_node(name, nodeTaintsPolicy="Honor")
    with shared_model_claim(multinode, services_kube.namespace, model_root, inference_nodes):
        service = apply_service(multinode, services_kube.namespace, name, spec)
        placed = wait_for(
            "a ready pod on each node",
            lambda: one_ready_pod_per_node(service),
            timeout=420,
            diagnose=service.diagnose,
        )
        kept, leaking = placed[staying], placed[drained]
        kept_name, leaking_name = kept["metadata"]["name"], leaking["metadata"]["name"]
        with ExitStack() as stack:
            samples = stack.enter_context(readyz_sampled({kept_name: pod_url(kept, Port.API)}))
            stack.enter_context(traffic(pod_url(leaking, Port.API), 1.0))
            wait_for(
                "the ladder's first rung on the pod of the drained node",
                lambda: [e for e in ladder_events(service) if leaking_name in e["message"]],
                timeout=300,
                every=0.5,
                diagnose=service.diagnose,
            )
            started_before = {action_id(e) for e in ladder_events(service)}
            drain_began = time.time()
            try:
                multinode_cli("node", "drain", drained, "--timeout=180", timeout=300)
                print(f"drain took {time.time() - drain_began:.0f} s")

                def replacement() -> dict[str, Any] | None:
                    on_staying = [
                        p
                        for p in service.ready_pods()
                        if p["spec"]["nodeName"] == staying and p["metadata"]["name"] != kept_name
                    ]
                    return on_staying[0] if on_staying and len(service.ready_pods()) == 2 else None

                second = wait_for(
                    f"the replacement Ready on {staying}",
                    replacement,
                    timeout=420,
                    diagnose=service.diagnose,
                )
                wait_for(
                    "status to name the replacement with figures observed after the drain",
                    lambda: observed_after(service, second["metadata"]["name"], drain_began),
                    timeout=120,
                    diagnose=service.diagnose,
                )
                wait_serving(service, "the service Ready 2/2")
                status, events = service.status(), service.events()
            finally:
                multinode_cli("node", "uncordon", drained)
        still = next(p for p in service.pods() if p["metadata"]["name"] == kept_name)

    # The evicted pod: nothing new started on it once the drain began.
    on_evicted = [e for e in ladder_events_of(events) if leaking_name in e["message"]]
    started_after = {action_id(e) for e in on_evicted} - started_before
    assert started_after == set(), f"acted on the evicted pod after the drain: {started_after}"
    # Node 1's pod: the same pod, never restarted, never acted on, serving throughout.
    assert still["metadata"]["uid"] == kept["metadata"]["uid"]
    assert all(s["restartCount"] == 0 for s in still["status"]["containerStatuses"])
    assert [e for e in ladder_events_of(events) if kept_name in e["message"]] == []
    assert not_ready_spans(samples[kept_name]) == [], "the pod that stayed left service"
    # The replacement: the evicted pod's limits, and status lists the two pods now serving.
    assert server_limits(second) == server_limits(leaking)
    assert sorted(p["name"] for p in status["pods"]) == sorted(
        [kept_name, second["metadata"]["name"]]
    )
