"""A real Prometheus, under the real Prometheus Operator, monitors Fusebox as users run it
(issue 11, item 3).

Prometheus (localcluster's monitoring addon, in the `monitoring` namespace the
pods' NetworkPolicy admits on the metrics port) discovers pods through the
Kubernetes API; the session's operator release turns on the chart's PodMonitor
and PrometheusRule through its values, as a user would. Then, for one
InferenceService:

- every sidecar target of the chart's PodMonitor in the test namespace is up,
  one per ready pod, labelled with the service and its model;
- the operator's own PodMonitor target answers and its ticks are counted;
- after real traffic every dashboard query (Grafana's variables substituted)
  returns a number, GPU and CUDA panels excepted on CPU.

The chart's alerts loaded and firing (FuseboxMemoryGrowing for a leaking pod, with
its severity and runbook URL, and not for a pod without a leak) are walked by
test_day_one.py, through docs/day-one.md's Prometheus view.

The release's values are restored afterwards.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from fusebox_contract.metrics import Metric
from fusebox_contract.wiring import Port
from fusebox_operator.operator_metrics import OperatorMetric

from ...unit.helm.promql import metric_names
from ..monitoring import PrometheusApi
from .conftest import (
    CHART,
    OperatorRelease,
    ServiceFactory,
    base_spec,
    chat,
    helm,
    pod_url,
    wait_for,
)
from .test_metrics import GPU_ONLY
from .test_operator import wait_ready

SCRAPE_INTERVAL = "5s"
# Grafana's $__rate_interval for a 5 s scrape is 4 x 5 s = 20 s; a minute keeps
# the sample from before the traffic inside every rate window.
RATE_INTERVAL = "1m"
CHATS = 6
LIMIT = "3Gi"


def chart_values(cluster: Any, release: OperatorRelease) -> dict[str, Any]:
    out = helm(
        cluster, "get", "values", release.release, "--namespace", release.namespace, "-o", "json"
    ).stdout
    return dict(json.loads(out) or {})


def upgrade(cluster: Any, release: OperatorRelease, values: dict[str, Any]) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
        yaml.safe_dump(values, file)
        file.flush()
        helm(
            cluster,
            "upgrade",
            release.release,
            str(CHART),
            "--namespace",
            release.namespace,
            "--reset-values",
            "--values",
            file.name,
            "--wait",
            "--timeout",
            "2m",
        )


@pytest.fixture
def chart_monitors(cluster: Any, operator: OperatorRelease) -> Iterator[str]:
    """The session release with the chart's PodMonitors on; yields the sidecars'
    PodMonitor's scrape job (`<namespace>/<name>`). The release's values are put back."""
    before = chart_values(cluster, operator)
    monitoring = {"podMonitor": {"enabled": True, "interval": SCRAPE_INTERVAL}}
    upgrade(cluster, operator, {**before, "monitoring": monitoring})
    try:
        yield f"{operator.namespace}/{operator.release}-operator-inference"
    finally:
        upgrade(cluster, operator, before)


def prometheus_spec() -> dict[str, Any]:
    spec = base_spec(
        # Every answer quality-checked, so the quality panel has a ratio to show.
        breaker={"quality": {"sampleRate": 1.0}},
    )
    spec["memory"] = {"limit": LIMIT}
    return spec


def dashboard_queries(cluster: Any) -> list[str]:
    """Every query of the chart's dashboard, as Grafana sends them for one service."""
    rendered = helm(
        cluster, "template", "fusebox", str(CHART), "--set", "grafana.dashboard.enabled=true"
    ).stdout
    queries = []
    for document in yaml.safe_load_all(rendered):
        if document and document["kind"] == "ConfigMap" and "fusebox.json" in document["data"]:
            dashboard = json.loads(document["data"]["fusebox.json"])
            queries += [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert queries, "the chart rendered no dashboard"
    return queries


def substituted(query: str, namespace: str, service: str) -> str:
    return (
        query.replace("$__rate_interval", RATE_INTERVAL)
        .replace("$namespace", namespace)
        .replace("$service", service)
    )


def numbers(result: list[dict[str, Any]]) -> list[float]:
    return [float(series["value"][1]) for series in result]


def test_prometheus_scrapes_every_sidecar_and_answers_every_dashboard_query(
    cluster: Any,
    namespace: str,
    inference_service: ServiceFactory,
    chart_monitors: str,
    prometheus: PrometheusApi,
) -> None:
    service = inference_service("prom", prometheus_spec())
    wait_ready(service)
    pods = {p["metadata"]["name"]: p for p in service.ready_pods()}

    # Every sidecar target of the chart's PodMonitor in this namespace is up, one per pod.
    def targets_up() -> dict[str, str] | None:
        ours = [
            t
            for t in prometheus.targets()
            if t["labels"].get("job") == chart_monitors
            and t["labels"].get("namespace") == namespace
        ]
        health = {t["labels"].get("pod", ""): t["health"] for t in ours}
        return health if set(health) == set(pods) and set(health.values()) == {"up"} else None

    # The PodMonitor reaches Prometheus through the Prometheus Operator's config Secret,
    # the kubelet's resync of its pod's volume and the config reloader's re-read (each
    # every 10 s in localcluster; a production cluster's kubelet resyncs every minute).
    wait_for("every sidecar target up", targets_up, timeout=240, diagnose=prometheus.targets)
    # Each sidecar target carries the service and its model (the PodMonitor's relabelings).
    labelled = {
        (t["labels"].get("service"), t["labels"].get("model_name"))
        for t in prometheus.targets()
        if t["labels"].get("job") == chart_monitors and t["labels"].get("namespace") == namespace
    }
    assert labelled == {(service.name, prometheus_spec()["model"]["name"])}, labelled

    # The operator's own metrics: its PodMonitor's target answers and counts ticks.
    operator_job = chart_monitors.removesuffix("-inference")
    ticks = f'{OperatorMetric.TICK_DURATION_SECONDS.value}_count{{job="{operator_job}"}} > 0'
    wait_for(
        "the operator's ticks in Prometheus",
        lambda: prometheus.query(ticks),
        timeout=120,
        diagnose=lambda: str([t["labels"] for t in prometheus.targets()]),
    )
    ttft_count = f'{Metric.TIME_TO_FIRST_TOKEN_SECONDS.value}_count{{namespace="{namespace}"}}'
    # Two scrapes before the traffic, so every rate has a sample from before it.
    wait_for(
        "two scrapes of the idle pod",
        lambda: prometheus.query(f"count_over_time({ttft_count}[1m]) >= 2"),
        timeout=60,
    )
    before = sum(numbers(prometheus.query(ttft_count)))

    # Real traffic, then every dashboard query answers with a number.
    api = pod_url(next(iter(pods.values())), Port.API)
    statuses = [chat(api, f"count me {n}", max_tokens=8) for n in range(CHATS)]
    assert statuses == [200] * CHATS, statuses
    wait_for(
        "the chats in Prometheus",
        lambda: sum(numbers(prometheus.query(ttft_count))) >= before + CHATS,
        timeout=60,
    )
    unanswered = {}
    checked = 0
    for query in dashboard_queries(cluster):
        if metric_names(query) & GPU_ONLY:
            continue  # a CPU-only pod measures no GPU or CUDA memory
        expression = substituted(query, namespace, service.name)
        values = numbers(prometheus.query(expression))
        checked += 1
        if not values or not all(math.isfinite(v) for v in values):
            unanswered[expression] = values
    assert not unanswered, f"dashboard queries without data: {unanswered}"
    assert checked >= 20, checked
