"""The monitoring addon's objects: what Prometheus selects, where it runs, what it may do."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from fusebox_operator.settings import DEFAULT_MONITORING_NAMESPACE
from localcluster import monitoring_addon
from localcluster.progress import ClusterError

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "helm" / "fusebox"
WRITE_VERBS = {"*", "create", "update", "patch", "delete", "deletecollection"}


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [o for o in monitoring_addon.all_objects("v3.16.0") if o["kind"] == kind]


def the_prometheus() -> dict[str, Any]:
    (prometheus,) = by_kind("Prometheus")
    return prometheus


def helm_binary() -> str:
    found = REPO / ".cache" / "bin" / "helm"
    return str(found) if found.exists() else shutil.which("helm") or "helm"


def test_the_prometheus_version_follows_the_pinned_module() -> None:
    go_mod = "require github.com/prometheus/prometheus v0.316.0\n"
    assert monitoring_addon.prometheus_version(go_mod) == "v3.16.0"
    assert monitoring_addon.prometheus_version("\tgithub.com/prometheus/prometheus v0.305.2\n") == (
        "v3.5.2"
    )
    with pytest.raises(ClusterError):
        monitoring_addon.prometheus_version("require github.com/prometheus/prometheus v0.53.0\n")


def test_the_pinned_module_gives_a_version() -> None:
    text = monitoring_addon.PROMETHEUS_GO_MOD.read_text()
    assert monitoring_addon.prometheus_version(text).startswith("v3.")


def test_prometheus_runs_in_the_namespace_the_pods_admit_scrapes_from() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert monitoring_addon.NAMESPACE == DEFAULT_MONITORING_NAMESPACE
    assert monitoring_addon.NAMESPACE == values["monitoring"]["scrapeNamespace"]
    assert the_prometheus()["metadata"]["namespace"] == monitoring_addon.NAMESPACE


def test_prometheus_selects_the_chart_s_pod_monitor_and_rule_in_every_namespace() -> None:
    rendered = subprocess.run(
        [
            helm_binary(),
            "template",
            "fusebox",
            str(CHART),
            "--set",
            "monitoring.podMonitor.enabled=true",
            "--set",
            "monitoring.prometheusRule.enabled=true",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    labels = {
        d["kind"]: d["metadata"]["labels"]
        for d in yaml.safe_load_all(rendered)
        if d and d["kind"] in ("PodMonitor", "PrometheusRule")
    }
    spec = the_prometheus()["spec"]
    for kind, selector in (
        ("PodMonitor", "podMonitorSelector"),
        ("PrometheusRule", "ruleSelector"),
    ):
        wanted = spec[selector]["matchLabels"]
        assert wanted.items() <= labels[kind].items(), (kind, wanted, labels[kind])
    assert spec["podMonitorNamespaceSelector"] == {}
    assert spec["ruleNamespaceSelector"] == {}


def test_the_images_are_the_ones_built_here_and_never_pulled() -> None:
    (deployment,) = by_kind("Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == monitoring_addon.OPERATOR_IMAGE
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert f"--prometheus-config-reloader={monitoring_addon.RELOADER_IMAGE}" in container["args"]
    spec = the_prometheus()["spec"]
    assert spec["image"] == monitoring_addon.PROMETHEUS_IMAGE
    assert spec["imagePullPolicy"] == "IfNotPresent"


def test_cluster_wide_the_operator_and_prometheus_only_read() -> None:
    for role in by_kind("ClusterRole"):
        for rule in role["rules"]:
            assert not WRITE_VERBS & set(rule["verbs"]), (role["metadata"]["name"], rule)
    (role,) = by_kind("Role")
    assert role["metadata"]["namespace"] == monitoring_addon.NAMESPACE


def test_everything_runs_under_restricted_pod_security() -> None:
    (namespace,) = by_kind("Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    (deployment,) = by_kind("Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in pod["containers"]:
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert the_prometheus()["spec"]["securityContext"]["runAsNonRoot"] is True


# The init reloader's arguments as operator v0.85 rendered them for this Prometheus
# (read from the lab's StatefulSet).
OPERATOR_INIT_RELOADER_ARGS = [
    "--watch-interval=0",
    "--listen-address=:8081",
    "--config-file=/etc/prometheus/config/prometheus.yaml.gz",
    "--config-envsubst-file=/etc/prometheus/config_out/prometheus.env.yaml",
    "--watched-dir=/etc/prometheus/rules/prometheus-fusebox-rulefiles-0",
]


def rendered(reloader_args: list[str], init_args: list[str]) -> dict[str, Any]:
    """The StatefulSet as the operator renders it, the Prometheus' containers merged in."""
    return {"spec": {"template": {"spec": {
        "containers": [{"name": "prometheus", "args": []},
                       {"name": "config-reloader", "args": reloader_args}],
        "initContainers": [{"name": "init-config-reloader", "args": init_args}],
    }}}}  # fmt: skip


def test_the_config_reloader_rereads_the_config_every_ten_seconds() -> None:
    (reloader,) = the_prometheus()["spec"]["containers"]
    assert reloader["name"] == "config-reloader"
    assert "--watch-interval=10s" in reloader["args"]
    # Prometheus is told to reload through its lifecycle endpoint, on the port it serves.
    assert "--reload-url=http://localhost:9090/-/reload" in reloader["args"]
    # Every argument the operator gives its own reloader is restated.
    statefulset = rendered(reloader["args"], OPERATOR_INIT_RELOADER_ARGS)
    assert monitoring_addon.reloader_args_missing(statefulset) == []


def test_an_argument_a_newer_operator_adds_is_named_as_missing() -> None:
    (reloader,) = the_prometheus()["spec"]["containers"]
    newer = [*OPERATOR_INIT_RELOADER_ARGS, "--watched-dir=/etc/prometheus/rules/rulefiles-1"]
    missing = monitoring_addon.reloader_args_missing(rendered(reloader["args"], newer))
    assert missing == ["--watched-dir=/etc/prometheus/rules/rulefiles-1"]


def test_available_only_when_the_operator_says_so() -> None:
    available = {"status": {"conditions": [{"type": "Available", "status": "True"}]}}
    degraded = {"status": {"conditions": [{"type": "Available", "status": "Degraded"}]}}
    assert monitoring_addon.prometheus_available(available)
    assert not monitoring_addon.prometheus_available(degraded)
    assert not monitoring_addon.prometheus_available({})


def test_the_addon_is_a_localcluster_command() -> None:
    from localcluster import cli

    assert cli._parser().parse_args(["monitoring"]).command == "monitoring"


class WaitingKubectl:
    """Answers `kubectl wait` with the prepared (returncode, stderr) in turn."""

    def __init__(self, answers: list[tuple[int, str]]) -> None:
        self.answers = answers
        self.calls = 0

    def run(self, *args: str, **_: Any) -> subprocess.CompletedProcess[str]:
        assert args[:2] == ("wait", "--for=condition=Established")
        self.calls += 1
        code, stderr = self.answers.pop(0)
        return subprocess.CompletedProcess(list(args), code, "", stderr)


NULL_CONDITIONS = (
    "error: .status.conditions accessor error: <nil> is of the type <nil>, expected []interface{}"
)


def test_a_crd_whose_conditions_are_not_written_yet_is_waited_for_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(monitoring_addon.time, "sleep", lambda _: None)
    kubectl = WaitingKubectl([(1, NULL_CONDITIONS), (1, NULL_CONDITIONS), (0, "")])
    monitoring_addon._wait_established(kubectl, Path("crds"))  # type: ignore[arg-type]
    assert kubectl.calls == 3


def test_any_other_failure_to_establish_is_an_error_naming_kubectl_s_words() -> None:
    kubectl = WaitingKubectl([(1, "error: timed out waiting for the condition")])
    with pytest.raises(ClusterError, match="timed out waiting for the condition"):
        monitoring_addon._wait_established(kubectl, Path("crds"))  # type: ignore[arg-type]
    assert kubectl.calls == 1
