"""A real pod's sidecar serves what the dashboard and the alerts query (issue 11, item 3).

The unit tests compare each dashboard query and alert expression with the
contract's names; here a pod the operator built, after real traffic, is
scraped the way Prometheus scrapes it (port 9400, through `kubectl
port-forward` as the NetworkPolicy admits only the monitoring namespace),
and every name those queries read is in the scrape, except the GPU and CUDA
ones a CPU-only pod cannot measure.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from fusebox_contract.metrics import (
    MEASURED_ONLY_WITH_A_GPU,
    ONLY_WITH_A_FETCHED_MODEL,
    LatencyHistogram,
    Metric,
)
from fusebox_contract.wiring import HttpPath, Port

from ...unit.helm.promql import metric_names
from .conftest import CHART, ServiceFactory, base_spec, chat, http, pod_url, wait_for
from .test_operator import wait_ready

GPU_ONLY = {sample for metric in MEASURED_ONLY_WITH_A_GPU for sample in metric.samples}
# This pod's model is on a PVC: no fetcher, no report (test_model_sources reads them).
FETCHED_ONLY = {sample for metric in ONLY_WITH_A_FETCHED_MODEL for sample in metric.samples}
PROMETHEUS_OWN = {"up"}
CHATS = 6


def scrape(url: str) -> tuple[str, dict[str, list[tuple[dict[str, str], float]]]]:
    status, text = http("GET", f"{url}{HttpPath.METRICS}")
    assert status == 200 and isinstance(text, str), (status, text)
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return text, samples


def queried_names(cluster: Any) -> set[str]:
    """Every metric name the rendered chart's dashboard and alert rules read."""
    rendered = subprocess.run(
        [
            str(cluster.bin_dir / "helm"),
            "template",
            "fusebox",
            str(CHART),
            "--set",
            "grafana.dashboard.enabled=true",
            "--set",
            "monitoring.prometheusRule.enabled=true",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    names: set[str] = set()
    for document in yaml.safe_load_all(rendered):
        if not document:
            continue
        if document["kind"] == "ConfigMap" and "fusebox.json" in document.get("data", {}):
            dashboard = json.loads(document["data"]["fusebox.json"])
            for panel in dashboard["panels"]:
                for target in panel["targets"]:
                    names |= metric_names(target["expr"])
        if document["kind"] == "PrometheusRule":
            for group in document["spec"]["groups"]:
                for rule in group["rules"]:
                    names |= metric_names(rule["expr"])
    return names


def test_a_pod_s_sidecar_serves_every_name_the_dashboard_and_the_alerts_read(
    cluster: Any, inference_service: ServiceFactory
) -> None:
    # A prefix cache of 512 MiB, not the default 1 GiB: the field reaches the server.
    spec = base_spec(
        breaker={"quality": {"sampleRate": 1.0}}, server={"prefixCache": {"maxBytes": "512Mi"}}
    )
    service = inference_service("metrics", spec)
    wait_ready(service)
    pod = service.ready_pods()[0]
    metrics_url = pod_url(pod, Port.METRICS)
    _, idle = scrape(metrics_url)
    ttft_count = f"{Metric.TIME_TO_FIRST_TOKEN_SECONDS.value}_count"
    idle_count = idle[ttft_count][0][1]

    api = pod_url(pod, Port.API)
    statuses = [chat(api, f"count me {n}", max_tokens=4) for n in range(CHATS)]
    assert statuses == [200] * CHATS, statuses
    # The stats file is rewritten every second; wait until it carries the chats.
    wait_for(
        "the chats in the sidecar's histogram",
        lambda: scrape(metrics_url)[1][ttft_count][0][1] >= idle_count + CHATS,
        timeout=30,
    )
    text, samples = scrape(metrics_url)

    promtool = shutil.which("promtool")
    assert promtool, "promtool is installed by scripts/install-system-packages.sh"
    checked = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr

    queried = queried_names(cluster) - PROMETHEUS_OWN
    assert queried, "the chart's dashboard and rules read no metric"
    missing = sorted(name for name in queried - GPU_ONLY - FETCHED_ONLY if name not in samples)
    assert missing == [], missing

    for name in LatencyHistogram:
        assert samples[name.metric.bucket], name  # buckets present, queue included
    assert samples[Metric.GENERATION_TOKENS.sample][0][1] >= CHATS
    assert samples[Metric.REQUEST_QUEUE_LENGTH.sample][0][1] == 0
    assert samples[Metric.PREFIX_CACHE_CAPACITY_BYTES.sample][0][1] == 512 * 2**20
