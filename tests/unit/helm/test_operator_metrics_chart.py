"""The operator's own metrics as the chart wires them: a named container port the
operator listens on (FUSEBOX_METRICS_PORT), a PodMonitor that scrapes it, and a
port distinct from the health endpoint's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fusebox_operator.settings import OperatorSettings

from .conftest import CHART, Render, by_kind, env_of, one, run_helm


def operator_monitor(documents: list[dict[str, Any]]) -> dict[str, Any]:
    (monitor,) = [
        m for m in by_kind(documents, "PodMonitor") if m["metadata"]["name"] == "fusebox-operator"
    ]
    return monitor


def test_the_operator_listens_on_the_port_the_pod_names_metrics(render: Render) -> None:
    deployment = one(render(sets=("metricsPort=9555",)), "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"health": 8080, "metrics": 9555}
    settings = OperatorSettings.from_env(env_of(deployment))
    assert settings.metrics_port == 9555


def test_the_default_port_is_the_operators_own_default(render: Render) -> None:
    deployment = one(render(), "Deployment")
    assert OperatorSettings.from_env(env_of(deployment)).metrics_port == (
        OperatorSettings().metrics_port
    )


def test_a_pod_monitor_scrapes_the_operator_pods_by_the_port_name(render: Render) -> None:
    documents = render(sets=("monitoring.podMonitor.enabled=true",))
    monitor = operator_monitor(documents)
    deployment = one(documents, "Deployment")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["fusebox-system"]}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")
    assert by_kind(render(), "PodMonitor") == []


def test_the_metrics_port_may_not_be_the_health_port(helm: Path) -> None:
    result = run_helm(helm, "template", "fusebox", str(CHART), "--set", "metricsPort=8080")
    assert result.returncode != 0
    assert "metricsPort (8080) must differ from healthPort" in result.stderr, result.stderr


@pytest.mark.parametrize("network_policy", ["true", "false"])
def test_pod_monitors_without_a_scrape_namespace_are_refused_naming_it(
    helm: Path, network_policy: str
) -> None:
    """The NetworkPolicies admit scrapes from monitoring.scrapeNamespace only (each
    service's whatever networkPolicy.enabled says): empty, every scrape the PodMonitors
    ask for would time out and FuseboxOperatorDown would page for good."""
    sets = (
        "monitoring.podMonitor.enabled=true",
        "monitoring.prometheusRule.enabled=true",
        "monitoring.scrapeNamespace=",
        f"networkPolicy.enabled={network_policy}",
    )
    args = [arg for pair in sets for arg in ("--set", pair)]
    result = run_helm(helm, "template", "fusebox", str(CHART), *args)
    assert result.returncode != 0, "rendered"
    assert "monitoring.podMonitor.enabled needs monitoring.scrapeNamespace" in result.stderr
