"""Each chart value an audit found set but never asserted has its effect in the
render: the operator's settings as it parses them from its env, the objects
turned off, the pod and the monitors carrying the value, the SLO numbers in the
alert expressions."""

from __future__ import annotations

from pathlib import Path

import yaml

from fusebox_operator.settings import OperatorSettings

from .conftest import Render, by_kind, env_of, hooks, one, release_objects


def test_operator_timings_reach_the_settings_the_operator_parses(render: Render) -> None:
    deployment = one(
        render(
            sets=(
                "resyncSeconds=17",
                "kopf.requestTimeoutSeconds=45",
                "kopf.watchServerTimeoutSeconds=120",
                "kopf.watchClientTimeoutSeconds=150",
                "logLevel=DEBUG",
            )
        ),
        "Deployment",
    )
    env = env_of(deployment)
    settings = OperatorSettings.from_env(env)
    assert settings.resync_seconds == 17
    assert settings.request_timeout_seconds == 45
    assert settings.watch_server_timeout_seconds == 120
    assert settings.watch_client_timeout_seconds == 150
    assert env["FUSEBOX_LOG_LEVEL"] == "DEBUG"  # __main__ sets the root logger's level from it


def test_bring_your_own_service_account(render: Render) -> None:
    documents = render(sets=("serviceAccount.create=false", "serviceAccount.name=platform-op"))
    assert by_kind(documents, "ServiceAccount") == []
    pod = one(documents, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "platform-op"
    binding = one(documents, "ClusterRoleBinding")
    assert binding["subjects"][0]["name"] == "platform-op"


def test_service_account_annotations_reach_the_service_account(render: Render) -> None:
    documents = render(sets=("serviceAccount.annotations.iam\\.example\\.com/role=fusebox",))
    account = one(documents, "ServiceAccount")
    assert account["metadata"]["annotations"] == {"iam.example.com/role": "fusebox"}


def test_service_disabled_renders_no_service(render: Render) -> None:
    assert by_kind(render(sets=("service.enabled=false",)), "Service") == []
    assert len(by_kind(render(), "Service")) == 1


def test_the_dashboard_goes_to_its_namespace(render: Render) -> None:
    sets = ("grafana.dashboard.enabled=true",)
    assert one(render(sets=sets), "ConfigMap")["metadata"]["namespace"] == "fusebox-system"
    elsewhere = render(sets=(*sets, "grafana.dashboard.namespace=grafana"))
    assert one(elsewhere, "ConfigMap")["metadata"]["namespace"] == "grafana"


def test_operator_pod_annotations_and_placement_reach_its_pod(render: Render) -> None:
    documents = render(
        sets=(
            "podAnnotations.example\\.com/owner=platform",
            "nodeSelector.pool=system",
            "tolerations[0].key=dedicated",
            "tolerations[0].operator=Exists",
            "affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight=1",
            "affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0]"
            ".preference.matchExpressions[0].key=pool",
            "affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0]"
            ".preference.matchExpressions[0].operator=Exists",
        )
    )
    template = one(documents, "Deployment")["spec"]["template"]
    assert template["metadata"]["annotations"]["example.com/owner"] == "platform"
    pod = template["spec"]
    assert pod["nodeSelector"] == {"pool": "system"}
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    preferred = pod["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred == [
        {"weight": 1, "preference": {"matchExpressions": [{"key": "pool", "operator": "Exists"}]}}
    ]


def test_the_scrape_interval_is_both_pod_monitors(render: Render) -> None:
    documents = render(
        sets=("monitoring.podMonitor.enabled=true", "monitoring.podMonitor.interval=42s")
    )
    monitors = by_kind(documents, "PodMonitor")
    assert len(monitors) == 2  # the sidecars' and the operator's
    for monitor in monitors:
        assert [e["interval"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["42s"]


def test_the_slo_objectives_reach_the_burn_rate_expressions(render: Render, tmp_path: Path) -> None:
    values = tmp_path / "slo.yaml"
    slo = {"availability": 0.995, "latency": {"objective": 0.95}}
    values.write_text(yaml.safe_dump({"monitoring": {"prometheusRule": {"slo": slo}}}))
    documents = render(values, sets=("monitoring.prometheusRule.enabled=true",))
    rule = one(documents, "PrometheusRule")
    alerts = {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}
    for name in ("FuseboxErrorBudgetBurn", "FuseboxErrorBudgetBurnSlow"):
        assert "(1 - 0.995)" in alerts[name]["expr"] and "0.99)" not in alerts[name]["expr"]
    for name in ("FuseboxLatencyBudgetBurn", "FuseboxLatencyBudgetBurnSlow"):
        assert "(1 - 0.95)" in alerts[name]["expr"] and "0.99" not in alerts[name]["expr"]
    assert "(14.4 * (1 - 0.995))" in alerts["FuseboxErrorBudgetBurn"]["expr"]
    assert "(14.4 * (1 - 0.95))" in alerts["FuseboxLatencyBudgetBurn"]["expr"]


def test_rbac_create_false_leaves_the_operators_rbac_to_the_platform(render: Render) -> None:
    documents = render(sets=("rbac.create=false",))
    rbac_kinds = {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
    assert not rbac_kinds & {doc["kind"] for doc in release_objects(documents)}
    # The hooks keep their own short-lived RBAC: they are not the operator's.
    assert {doc["kind"] for doc in hooks(documents, "pre-delete")} & rbac_kinds


def test_inference_egress_reaches_the_settings_the_operator_parses(render: Render) -> None:
    default = OperatorSettings.from_env(env_of(one(render(), "Deployment")))
    assert default.inference_egress_allowed is False
    allowed = one(render(sets=("inference.egress=allow",)), "Deployment")
    assert OperatorSettings.from_env(env_of(allowed)).inference_egress_allowed is True
