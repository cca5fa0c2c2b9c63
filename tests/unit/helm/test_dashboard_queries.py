"""Every dashboard query reads only what the sidecar exports, and parses as PromQL.

A query on a name nobody exports shows "No data" forever and nobody notices:
that is how a third of the first dashboard stayed empty. The names come from
the rendered chart's ConfigMap and are compared with the contract's
(`fusebox_contract.metrics`); the live scrape's names are compared with the
contract in tests/integration/sidecar/test_with_server.py, so a query here
is a series a real sidecar serves.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from fusebox_contract.metrics import LatencyHistogram, Metric

from .conftest import Render, one
from .promql import exported_sample_names, metric_names

# What Grafana substitutes before a query reaches Prometheus.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h"}


def dashboard_queries(render: Render) -> list[tuple[str, str]]:
    """(panel title, expression) for every target of the rendered dashboard."""
    documents = render(sets=("grafana.dashboard.enabled=true",))
    dashboard = json.loads(one(documents, "ConfigMap")["data"]["fusebox.json"])
    return [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel["targets"]
    ]


def as_prometheus_gets_it(expression: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expression = expression.replace(variable, value)
    return expression


def test_every_query_reads_only_metrics_the_sidecar_exports(render: Render) -> None:
    exported = exported_sample_names()
    unknown = {
        (title, name)
        for title, expression in dashboard_queries(render)
        for name in metric_names(expression)
        if name not in exported
    }
    assert not unknown, unknown


def test_every_query_selects_at_least_one_metric(render: Render) -> None:
    empty = [(t, e) for t, e in dashboard_queries(render) if not metric_names(e)]
    assert not empty, empty


def test_latency_panels_take_quantiles_from_the_histograms_not_the_p99_gauge(
    render: Render,
) -> None:
    queried = {name for _, e in dashboard_queries(render) for name in metric_names(e)}
    assert Metric.LATENCY_P99_SECONDS.sample not in queried
    assert {name.metric.bucket for name in LatencyHistogram} <= queried
    assert {Metric.PROMPT_TOKENS.sample, Metric.GENERATION_TOKENS.sample} <= queried


def test_every_query_is_valid_promql(render: Render, tmp_path: Path) -> None:
    """promtool parses each query (Grafana's variables substituted) as a recording rule."""
    rules: dict[str, Any] = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query_{index}", "expr": as_prometheus_gets_it(e)}
                    for index, (_, e) in enumerate(dashboard_queries(render))
                ],
            }
        ]
    }
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump(rules), encoding="utf-8")
    checked = subprocess.run(
        ["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=120
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize(
    ("expression", "names"),
    [
        (
            'histogram_quantile(0.99, sum by (le) (rate(a_bucket{pod=~"$x-.*"}[1m])))',
            {"a_bucket"},
        ),
        ("max without (thread) (b) > 30 or c offset 5m < bool 1e-9", {"b", "c"}),
        ('up{job="ns/name"} == 0', {"up"}),
    ],
)
def test_the_name_finder_finds_metrics_and_nothing_else(expression: str, names: set[str]) -> None:
    assert metric_names(expression) == names
