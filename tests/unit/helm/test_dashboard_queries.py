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
import re
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


def _seconds(duration: str) -> float:
    """A Prometheus duration such as 1m or 1h30m in seconds."""
    unit_seconds = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    parts = re.findall(r"([0-9]+)(ms|s|m|h|d|w|y)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(int(number) * unit_seconds[unit] for number, unit in parts)


def test_no_rate_window_is_a_fixed_one_a_slow_scrape_leaves_empty(render: Render) -> None:
    """`monitoring.podMonitor.interval` takes any duration: at 1m a fixed `[1m]` window
    holds one sample and `rate` draws nothing, without an error. `$__rate_interval`
    follows the scrape interval; a fixed window must be long enough for any sane one."""
    for title, expression in dashboard_queries(render):
        for window in re.findall(r"\[([^\]:]+)\]", expression):
            assert window == "$__rate_interval" or _seconds(window) >= 300, (title, expression)


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


def test_every_query_selects_the_service_by_its_label_not_by_a_pod_name_prefix(
    render: Render,
) -> None:
    """`pod=~"$service-.*"` made `chat` match chat-bot's pods too; the PodMonitor now puts
    the service on every series, and each query selects it exactly."""
    for title, expression in dashboard_queries(render):
        assert "pod=~" not in expression, (title, expression)
        selectors = re.findall(r"\{([^}]*)\}", expression)
        assert selectors, (title, expression)
        for selector in selectors:
            assert 'service=~"$service"' in selector, (title, expression)
            assert 'namespace=~"$namespace"' in selector, (title, expression)


def test_the_service_variable_lists_the_service_label(render: Render) -> None:
    documents = render(sets=("grafana.dashboard.enabled=true",))
    dashboard = json.loads(one(documents, "ConfigMap")["data"]["fusebox.json"])
    variable = next(v for v in dashboard["templating"]["list"] if v["name"] == "service")
    assert (
        variable["query"] == 'label_values(fusebox_stats_valid{namespace=~"$namespace"}, service)'
    )
    assert "regex" not in variable  # no pod-name pattern to cut a service name out of


# Two services, one name the other's prefix, as the PodMonitor labels their series.
CHAT = 'namespace="team-a",pod="chat-7d9f-abcde",service="chat",model_name="tiny"'
CHAT_BOT = 'namespace="team-a",pod="chat-bot-5c4b-fghij",service="chat-bot",model_name="tiny"'


def test_selecting_chat_no_longer_shows_chat_bots_pods(render: Render, tmp_path: Path) -> None:
    """promtool evaluates each plain-selector panel with $service=chat over both services'
    series: only chat's pod answers (the old `pod=~"chat-.*"` returned chat-bot's too)."""
    plain = [
        (title, expression)
        for title, expression in dashboard_queries(render)
        if re.fullmatch(r"[a-z_]+\{[^}]*\}", expression)
    ]
    assert len(plain) >= 10, plain
    tests = []
    for _, expression in plain:
        (name,) = metric_names(expression)
        query = as_prometheus_gets_it(expression).replace("$namespace", "team-a")
        tests.append(
            {
                "interval": "1m",
                "input_series": [
                    {"series": f"{name}{{{CHAT}}}", "values": "1x3"},
                    {"series": f"{name}{{{CHAT_BOT}}}", "values": "2x3"},
                ],
                "promql_expr_test": [
                    {
                        "expr": query.replace("$service", "chat"),
                        "eval_time": "2m",
                        "exp_samples": [{"labels": f"{name}{{{CHAT}}}", "value": 1}],
                    }
                ],
            }
        )
    path = tmp_path / "test.yaml"
    path.write_text(yaml.safe_dump({"rule_files": [], "tests": tests}), encoding="utf-8")
    checked = subprocess.run(
        ["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=120
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
