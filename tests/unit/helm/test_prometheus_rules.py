"""The chart's PrometheusRule: rendered only when asked, valid for promtool, reading
only what the sidecar exports, and each alert unit-tested with `promtool test rules`.

Each alert has a case where it fires (with its labels) and one where it must
not: a rule that never fires, or fires on a healthy pod, fails here rather
than at 3 a.m.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.utils import floatToGoString

from fusebox_contract.metrics import LatencyHistogram, Metric

from .conftest import CHART, Render, by_kind, one, run_helm
from .promql import PROMETHEUS_OWN, exported_sample_names, metric_names

NAMESPACE = "fusebox-system"
JOB = f"{NAMESPACE}/fusebox-operator-inference"  # the PodMonitor's job, as the operator sets it
OPERATOR_JOB = f"{NAMESPACE}/fusebox-operator"  # the operator's own PodMonitor's job
POD = 'namespace="team-a",pod="chat-7d9f-abcde"'
ALERT_LABELS = {"namespace": "team-a", "pod": "chat-7d9f-abcde"}
# As the inference PodMonitor labels a sidecar's series; the SLO alerts are per service.
SERVED = f'{POD},service="chat",model_name="tiny"'
SERVICE_LABELS = {"namespace": "team-a", "service": "chat"}
SLO_ALERTS = {
    "FuseboxErrorBudgetBurn",
    "FuseboxErrorBudgetBurnSlow",
    "FuseboxLatencyBudgetBurn",
    "FuseboxLatencyBudgetBurnSlow",
}
# Alerts over days of data are tested at 5-minute samples and evaluations.
INTERVALS = {"FuseboxErrorBudgetBurnSlow": "5m", "FuseboxLatencyBudgetBurnSlow": "5m"}
TTFT_BELOW_TARGET = f'{Metric.TIME_TO_FIRST_TOKEN_SECONDS.bucket}{{{SERVED},le="1.0"}}'
TTFT_COUNT = f"{Metric.TIME_TO_FIRST_TOKEN_SECONDS.value}_count{{{SERVED}}}"
GiB = 1024**3


def rendered_rule(render: Render) -> dict[str, Any]:
    """With the PodMonitors on too: FuseboxOperatorDown reads the operator's job."""
    sets = ("monitoring.prometheusRule.enabled=true", "monitoring.podMonitor.enabled=true")
    return one(render(sets=sets), "PrometheusRule")


def alerts(rule: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}


def series(name: Metric | str, values: str, labels: str = POD) -> dict[str, str]:
    sample = name.sample if isinstance(name, Metric) else name
    return {"series": f"{sample}{{{labels}}}", "values": values}


def requests(failed: str, succeeded: str) -> list[dict[str, str]]:
    """fusebox_requests_total of one service: failed (5xx) and succeeded counts."""
    return [
        series(Metric.REQUESTS, failed, f'{SERVED},outcome="failed"'),
        series(Metric.REQUESTS, succeeded, f'{SERVED},outcome="succeeded"'),
    ]


def latency(within: str, count: str) -> list[dict[str, str]]:
    """TTFT histogram of one service: requests within the 1.0 s target, and all."""
    return [
        {"series": TTFT_BELOW_TARGET, "values": within},
        {"series": TTFT_COUNT, "values": count},
    ]


def fetch_report(age: str, reason: str) -> list[dict[str, str]]:
    """A pod's model fetch report as its sidecar exports it: its age and its reason."""
    return [
        series(Metric.MODEL_FETCH_REPORT_AGE_SECONDS, age),
        series(Metric.MODEL_FETCH_INFO, "1x7", f'{POD},reason="{reason}"'),
    ]


# Per alert: (input series, evaluation time, fires?). Samples are a minute apart.
CASES: dict[str, list[tuple[list[dict[str, str]], str, bool]]] = {
    "FuseboxBreakerOpen": [
        ([series(Metric.BREAKER_STATE, "0 1 1 2 1 2 1 1")], "7m", True),  # open/half-open 7m
        ([series(Metric.BREAKER_STATE, "1 1 1 0 1 1 1 0")], "7m", False),  # it closed
    ],
    "FuseboxDegraded": [
        ([series(Metric.DEGRADATION_LEVEL, "2x12")], "12m", True),
        ([series(Metric.DEGRADATION_LEVEL, "2x5 0x7")], "12m", False),
    ],
    "FuseboxMemoryNearLimit": [
        (
            [
                series(Metric.CGROUP_MEMORY_USAGE_BYTES, f"{int(7.6 * GiB)}x5"),
                series(Metric.MEMORY_LIMIT_BYTES, f"{8 * GiB}x5"),
            ],
            "4m",
            True,
        ),
        (
            [
                series(Metric.CGROUP_MEMORY_USAGE_BYTES, f"{6 * GiB}x5"),
                series(Metric.MEMORY_LIMIT_BYTES, f"{8 * GiB}x5"),
            ],
            "4m",
            False,
        ),
    ],
    "FuseboxMemoryGrowing": [
        (  # +100 MiB a minute from 4 GiB towards 8 GiB: there within the hour
            [
                series(Metric.PROCESS_RESIDENT_MEMORY_BYTES, f"{4 * GiB}+{100 * 1024**2}x40"),
                series(Metric.MEMORY_LIMIT_BYTES, f"{8 * GiB}x40"),
            ],
            "30m",
            True,
        ),
        (  # flat at 6 GiB: high, but not growing
            [
                series(Metric.PROCESS_RESIDENT_MEMORY_BYTES, f"{6 * GiB}x40"),
                series(Metric.MEMORY_LIMIT_BYTES, f"{8 * GiB}x40"),
            ],
            "30m",
            False,
        ),
    ],
    "FuseboxGpuMemoryNearTotal": [
        (
            [
                series(Metric.GPU_MEMORY_USED_BYTES, f"{79 * GiB}x5", f'{POD},gpu="0"'),
                series(Metric.GPU_MEMORY_TOTAL_BYTES, f"{80 * GiB}x5", f'{POD},gpu="0"'),
            ],
            "4m",
            True,
        ),
        (
            [
                series(Metric.GPU_MEMORY_USED_BYTES, f"{60 * GiB}x5", f'{POD},gpu="0"'),
                series(Metric.GPU_MEMORY_TOTAL_BYTES, f"{80 * GiB}x5", f'{POD},gpu="0"'),
            ],
            "4m",
            False,
        ),
    ],
    "FuseboxGpuLost": [
        ([series(Metric.GPU_LOST, "0 0 1")], "2m", True),
        ([series(Metric.GPU_LOST, "0 0 0")], "2m", False),
    ],
    "FuseboxServerWedged": [
        (  # the stats file stopped being written
            [series(Metric.SERVER_STATS_AGE_SECONDS, "1 1 60+60x5")],
            "5m",
            True,
        ),
        (  # the file is fresh but the event loop stopped beating
            [
                series(Metric.SERVER_STATS_AGE_SECONDS, "1x6"),
                series(Metric.HEARTBEAT_AGE_SECONDS, "0.5 0.5 60+60x4", f'{POD},thread="loop"'),
                series(Metric.HEARTBEAT_AGE_SECONDS, "0.5x6", f'{POD},thread="worker"'),
            ],
            "5m",
            True,
        ),
        (
            [
                series(Metric.SERVER_STATS_AGE_SECONDS, "1x6"),
                series(Metric.HEARTBEAT_AGE_SECONDS, "0.5x6", f'{POD},thread="loop"'),
            ],
            "5m",
            False,
        ),
    ],
    "FuseboxServerRestarting": [
        ([series(Metric.SERVER_START_TIME_SECONDS, "1000 1000 1200 1200 1500")], "4m", True),
        ([series(Metric.SERVER_START_TIME_SECONDS, "1000 1000 1200 1200 1200")], "4m", False),
    ],
    "FuseboxStatsInvalid": [
        ([series(Metric.STATS_VALID, "1 0x7")], "7m", True),
        ([series(Metric.STATS_VALID, "0 0 1 0 0 1 0 0")], "7m", False),
        (  # a long model download: the sidecar runs before the server exists
            [
                series(Metric.STATS_VALID, "0x7"),
                series(Metric.MODEL_FETCH_INFO, "1x7", f'{POD},reason="Downloading"'),
            ],
            "7m",
            False,
        ),
        (  # the model is there and the server still writes no stats file
            [
                series(Metric.STATS_VALID, "0x7"),
                series(Metric.MODEL_FETCH_INFO, "1x7", f'{POD},reason="Verified"'),
            ],
            "7m",
            True,
        ),
    ],
    "FuseboxModelDownloadStalled": [
        (fetch_report("130+60x7", "Downloading"), "5m", True),  # no bytes since before 0m
        (fetch_report("2x7", "Downloading"), "5m", False),  # bytes keep arriving
        # Bytes again after three minutes without: the wait starts over.
        (fetch_report("130 190 250 2 2 62 122 182", "Downloading"), "7m", False),
        # The fetcher ended: a verified report only ages, a failed one is ModelReady's.
        (fetch_report("130+60x7", "Verified"), "5m", False),
        (fetch_report("130+60x7", "SourceUnreachable"), "5m", False),
    ],
    "FuseboxScrapeDown": [
        ([series("up", "1 0x7", f'{POD},job="{JOB}"')], "7m", True),
        ([series("up", "1 0x7", f'{POD},job="other/monitor"')], "7m", False),  # not ours
    ],
    "FuseboxOperatorDown": [
        ([series("up", "1 0x9", f'pod="op-1",job="{OPERATOR_JOB}"')], "8m", True),
        ([series("up", "1x9", 'pod="op-1",job="other/monitor"')], "8m", True),  # none of ours
        (  # the standby answers while the acting replica restarts: an operator is up
            [
                series("up", "1 0x9", f'pod="op-1",job="{OPERATOR_JOB}"'),
                series("up", "1x9", f'pod="op-2",job="{OPERATOR_JOB}"'),
            ],
            "8m",
            False,
        ),
    ],
    # 100 requests a minute; the budget is 1% (availability 0.99).
    "FuseboxErrorBudgetBurn": [
        (requests("0+20x70", "0+80x70"), "65m", True),  # 20% fail: 20x the budget's pace
        (requests("0+1x70", "0+99x70"), "65m", False),  # 1%: exactly the budget's pace
        # 30% failed for 50 minutes, then none for 40: the six hours still burn (19%), the
        # last 30 (and 5) minutes do not, so the page stops once the trouble has.
        (requests("0+30x50 1500x40", "0+70x90"), "90m", False),
    ],
    "FuseboxErrorBudgetBurnSlow": [  # 5-minute samples: 500 requests each
        (requests("0+25x300", "0+475x300"), "25h", True),  # 5% fail: 5x the budget's pace
        (requests("0+2x300", "0+498x300"), "25h", False),  # 0.4%: within the budget
    ],
    "FuseboxLatencyBudgetBurn": [
        (latency("0+80x70", "0+100x70"), "65m", True),  # 20% slower than 1 s
        (latency("0+995x70", "0+1000x70"), "65m", False),  # 0.5%: the p99 holds
    ],
    "FuseboxLatencyBudgetBurnSlow": [
        (latency("0+475x300", "0+500x300"), "25h", True),  # 5% slower than 1 s
        (latency("0+498x300", "0+500x300"), "25h", False),
    ],
}


def expected_labels(alert: str, rule: dict[str, Any], inputs: list[dict[str, str]]) -> dict:
    if alert in SLO_ALERTS:
        return {"alertname": alert, **rule["labels"], **SERVICE_LABELS}
    if alert == "FuseboxOperatorDown":  # absent(): no series, so no labels of one
        return {"alertname": alert, **rule["labels"]}
    labels = {"alertname": alert, **rule["labels"], **ALERT_LABELS}
    if alert == "FuseboxGpuMemoryNearTotal":
        labels["gpu"] = "0"
    if alert == "FuseboxScrapeDown":
        labels["job"] = JOB
    return labels


def promtool_test(
    tmp_path: Path,
    rule: dict[str, Any],
    alert: str,
    inputs: list[dict[str, str]],
    at: str,
    fires: bool,
) -> subprocess.CompletedProcess[str]:
    # When and with which labels an alert fires is tested here; the annotations'
    # templates are checked by `promtool check rules` above, so they are left out
    # rather than spelled again per case.
    groups = [
        {
            **group,
            "rules": [{k: v for k, v in r.items() if k != "annotations"} for r in group["rules"]],
        }
        for group in rule["spec"]["groups"]
    ]
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(yaml.safe_dump({"groups": groups}), encoding="utf-8")
    rules = alerts(rule)[alert]
    expected = [{"exp_labels": expected_labels(alert, rules, inputs)}] if fires else []
    interval = INTERVALS.get(alert, "1m")
    test = {
        "rule_files": [rules_file.name],
        "evaluation_interval": interval,
        "tests": [
            {
                "interval": interval,
                "input_series": inputs,
                "alert_rule_test": [{"eval_time": at, "alertname": alert, "exp_alerts": expected}],
            }
        ],
    }
    test_file = tmp_path / "test.yaml"
    test_file.write_text(yaml.safe_dump(test), encoding="utf-8")
    return subprocess.run(
        ["promtool", "test", "rules", str(test_file)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )


def test_no_rule_is_rendered_unless_asked(render: Render) -> None:
    assert by_kind(render(), "PrometheusRule") == []


def test_operator_down_needs_the_operators_pod_monitor(render: Render) -> None:
    """Without the chart's operator PodMonitor there is no job to be up: no alert."""
    rule = one(render(sets=("monitoring.prometheusRule.enabled=true",)), "PrometheusRule")
    assert "FuseboxOperatorDown" not in alerts(rule)
    assert "FuseboxOperatorDown" in alerts(rendered_rule(render))


def test_the_rules_pass_promtool_check(render: Render, tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rendered_rule(render)["spec"]["groups"]}))
    checked = subprocess.run(
        ["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=120
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_every_expression_reads_only_what_the_sidecar_exports(render: Render) -> None:
    known = exported_sample_names() | PROMETHEUS_OWN
    unknown = {
        (name, metric)
        for name, rule in alerts(rendered_rule(render)).items()
        for metric in metric_names(rule["expr"])
        if metric not in known
    }
    assert not unknown, unknown


def test_the_issue_s_alerts_are_all_there_and_each_has_a_promtool_test(render: Render) -> None:
    rendered = set(alerts(rendered_rule(render)))
    assert rendered == set(CASES)
    for alert, cases in CASES.items():
        assert {fires for *_, fires in cases} == {True, False}, alert


def test_alert_labels_and_rule_labels_come_from_values(render: Render) -> None:
    documents = render(
        sets=(
            "monitoring.prometheusRule.enabled=true",
            "monitoring.prometheusRule.labels.release=prometheus",
            "monitoring.prometheusRule.alertLabels.team=ml-platform",
        )
    )
    rule = one(documents, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    assert all(r["labels"]["team"] == "ml-platform" for r in alerts(rule).values())


def test_a_severity_in_alert_labels_replaces_each_alerts_own_once(render: Render) -> None:
    """The render fixture's loader refuses a repeated key, as strict YAML loaders do."""
    default = {name: r["labels"]["severity"] for name, r in alerts(rendered_rule(render)).items()}
    assert set(default.values()) == {"warning", "critical"}
    rule = one(
        render(
            sets=(
                "monitoring.prometheusRule.enabled=true",
                "monitoring.prometheusRule.alertLabels.severity=page",
            )
        ),
        "PrometheusRule",
    )
    assert {r["labels"]["severity"] for r in alerts(rule).values()} == {"page"}


def test_stats_invalid_is_described_as_broken_telemetry_not_staleness(helm: Path) -> None:
    """The sidecar sets fusebox_stats_valid to 0 for a broken stats file; a stale one
    is FuseboxServerWedged's (fusebox_server_stats_age_seconds)."""
    result = run_helm(
        helm,
        "template",
        "fusebox",
        str(CHART),
        "--show-only",
        "templates/prometheusrule.yaml",
        "--set",
        "monitoring.prometheusRule.enabled=true",
    )
    assert result.returncode == 0, result.stderr
    text = result.stdout.split("- alert: FuseboxStatsInvalid", 1)[1].split("- alert:", 1)[0]
    assert "Broken telemetry" in text
    assert "stale" not in text.lower()


@pytest.mark.parametrize(
    ("alert", "case"),
    [(alert, index) for alert, cases in CASES.items() for index in range(len(cases))],
)
def test_each_alert_fires_when_it_should_and_only_then(
    render: Render, tmp_path: Path, alert: str, case: int
) -> None:
    inputs, at, fires = CASES[alert][case]
    result = promtool_test(tmp_path, rendered_rule(render), alert, inputs, at, fires)
    assert result.returncode == 0, result.stdout + result.stderr


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped,
    spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_alert_links_to_its_own_section_of_the_runbook(render: Render) -> None:
    runbook = (CHART.parents[1] / "docs" / "runbook.md").read_text(encoding="utf-8")
    anchors = {github_anchor(h) for h in re.findall(r"^#+ (.+)$", runbook, flags=re.MULTILINE)}
    base = "https://github.com/fusebox-dev/fusebox/blob/main/docs/runbook.md#"
    for name, rule in alerts(rendered_rule(render)).items():
        url = rule["annotations"]["runbook_url"]
        assert url == base + name.lower(), (name, url)
        assert url.removeprefix(base) in anchors, f"docs/runbook.md has no section {name}"


def test_the_runbook_base_url_is_a_value(render: Render) -> None:
    sets = (
        "monitoring.prometheusRule.enabled=true",
        "monitoring.prometheusRule.runbookBaseUrl=https://wiki.example.com/fusebox",
    )
    rule = one(render(sets=sets), "PrometheusRule")
    urls = {r["annotations"]["runbook_url"] for r in alerts(rule).values()}
    assert "https://wiki.example.com/fusebox#fuseboxbreakeropen" in urls
    assert all(url.startswith("https://wiki.example.com/fusebox#") for url in urls)


def test_the_latency_slo_reads_a_bucket_the_sidecar_exports(render: Render) -> None:
    """The default target is one of the TTFT histogram's bounds, spelled as the sidecar
    writes `le` (prometheus_client's float spelling), so the selector matches a series."""
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    latency = values["monitoring"]["prometheusRule"]["slo"]["latency"]
    histogram = LatencyHistogram(latency["metric"])
    exposed = {floatToGoString(bound) for bound in histogram.buckets}
    assert latency["thresholdSeconds"] in exposed
    expression = alerts(rendered_rule(render))["FuseboxLatencyBudgetBurn"]["expr"]
    assert f'{histogram.metric.bucket}{{le="{latency["thresholdSeconds"]}"}}' in expression


@pytest.mark.parametrize("histogram", list(LatencyHistogram))
def test_each_latency_metric_value_selects_its_histogram(
    render: Render, histogram: LatencyHistogram
) -> None:
    sets = (
        "monitoring.prometheusRule.enabled=true",
        f"monitoring.prometheusRule.slo.latency.metric={histogram.value}",
    )
    rule = alerts(one(render(sets=sets), "PrometheusRule"))["FuseboxLatencyBudgetBurnSlow"]
    assert f"{histogram.metric.value}_count[" in rule["expr"]


def latency_refusal(helm: Path, metric: str, threshold: str) -> str:
    result = run_helm(
        helm,
        *("template", "fusebox", str(CHART)),
        *("--set", f"monitoring.prometheusRule.slo.latency.metric={metric}"),
        *("--set-string", f"monitoring.prometheusRule.slo.latency.thresholdSeconds={threshold}"),
    )
    assert result.returncode != 0, f"{metric} {threshold} rendered"
    return result.stderr


@pytest.mark.parametrize("histogram", list(LatencyHistogram))
def test_the_charts_bucket_bounds_are_the_le_labels_the_sidecar_exports(
    helm: Path, histogram: LatencyHistogram
) -> None:
    """The chart keeps a copy of the contract's buckets; the refusal lists it."""
    stderr = latency_refusal(helm, histogram.value, "0.0")
    listed = re.search(r"use one of: ([0-9., ]+)", stderr)
    assert listed, stderr
    # The sidecar writes `le` as str(bound) (collectors.py), as prometheus_client does.
    assert listed.group(1).strip().split(", ") == [str(bound) for bound in histogram.buckets]
    assert [str(bound) for bound in histogram.buckets] == [
        floatToGoString(bound) for bound in histogram.buckets
    ]


@pytest.mark.parametrize(
    ("metric", "threshold"),
    [("ttft", "1.5"), ("ttft", "1.00"), ("e2e", "2.50"), ("itl", "300.0"), ("queue", "0.0025")],
)
def test_a_latency_threshold_that_is_no_bucket_bound_of_its_metric_is_refused(
    helm: Path, metric: str, threshold: str
) -> None:
    """Such a `le` selects no series: the latency alerts would never fire."""
    stderr = latency_refusal(helm, metric, threshold)
    assert (
        f'monitoring.prometheusRule.slo.latency.thresholdSeconds "{threshold}" is not a '
        f"bucket bound of the {metric} histogram"
    ) in stderr, stderr


def test_another_metrics_own_bound_selects_its_bucket(render: Render) -> None:
    sets = (
        "monitoring.prometheusRule.enabled=true",
        "monitoring.prometheusRule.slo.latency.metric=e2e",
        "monitoring.prometheusRule.slo.latency.thresholdSeconds=300.0",
    )
    rule = alerts(one(render(sets=sets), "PrometheusRule"))["FuseboxLatencyBudgetBurn"]
    assert 'fusebox_e2e_request_latency_seconds_bucket{le="300.0"}' in rule["expr"]
