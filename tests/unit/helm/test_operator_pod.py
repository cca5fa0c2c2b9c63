"""The operator pod as a platform team runs it: distinct probes, bounded resources,
its own NetworkPolicy (admitting exactly what the operator calls) and a PDB
when there is a standby."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fusebox_contract.wiring import Port
from fusebox_operator.manifests import SERVICE_LABEL

from .conftest import CHART, Render, by_kind, one, run_helm


def operator_policy(documents: list[dict[str, Any]]) -> dict[str, Any]:
    policy: dict[str, Any] = one(documents, "NetworkPolicy")["spec"]
    return policy


def ports_of(rule: dict[str, Any]) -> set[tuple[int, str]]:
    return {(port["port"], port["protocol"]) for port in rule["ports"]}


def test_the_policy_selects_exactly_the_operator_pods(render: Render) -> None:
    documents = render()
    pod_labels = one(documents, "Deployment")["spec"]["template"]["metadata"]["labels"]
    selector = operator_policy(documents)["podSelector"]["matchLabels"]
    assert selector == one(documents, "Deployment")["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()


def test_ingress_is_the_health_port_and_the_metrics_port_from_prometheus(render: Render) -> None:
    policy = operator_policy(render(sets=("healthPort=8081", "metricsPort=9500")))
    assert "Ingress" in policy["policyTypes"]
    health, metrics = policy["ingress"]
    assert ports_of(health) == {(8081, "TCP")} and "from" not in health  # the kubelet's probes
    assert ports_of(metrics) == {(9500, "TCP")}
    assert metrics["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]


def test_without_a_scrape_namespace_nobody_reaches_the_metrics_port(render: Render) -> None:
    policy = operator_policy(render(sets=("monitoring.scrapeNamespace=",)))
    assert [ports_of(rule) for rule in policy["ingress"]] == [{(8080, "TCP")}]


def test_egress_is_the_api_dns_and_the_inference_pods_admin_and_metrics_ports(
    render: Render,
) -> None:
    policy = operator_policy(render())
    assert "Egress" in policy["policyTypes"]
    api, dns, pods = policy["egress"]
    assert ports_of(api) == {(443, "TCP"), (6443, "TCP")}
    assert "to" not in api  # no CIDRs given: the API's address is not the chart's to know
    assert ports_of(dns) == {(53, "UDP"), (53, "TCP")}
    # The ports the operator calls, by their contract names, on inference pods only.
    assert ports_of(pods) == {(int(Port.ADMIN), "TCP"), (int(Port.METRICS), "TCP")}
    [peer] = pods["to"]
    assert peer["namespaceSelector"] == {}
    assert peer["podSelector"] == {
        "matchExpressions": [{"key": SERVICE_LABEL, "operator": "Exists"}]
    }


def test_apiserver_cidrs_narrow_the_api_rule(render: Render) -> None:
    policy = operator_policy(
        render(sets=("networkPolicy.apiServer.cidrs={10.0.0.1/32,fd00::1/128}",))
    )
    assert policy["egress"][0]["to"] == [
        {"ipBlock": {"cidr": "10.0.0.1/32"}},
        {"ipBlock": {"cidr": "fd00::1/128"}},
    ]


def test_no_dns_ports_render_no_dns_rule(render: Render, tmp_path: Path) -> None:
    values = tmp_path / "no-dns.yaml"
    values.write_text("networkPolicy:\n  dnsPorts: []\n")
    policy = operator_policy(render(values))
    assert [ports_of(rule) for rule in policy["egress"]][1] == {
        (int(Port.ADMIN), "TCP"),
        (int(Port.METRICS), "TCP"),
    }


def test_the_policy_can_be_turned_off(render: Render) -> None:
    assert by_kind(render(sets=("networkPolicy.enabled=false",)), "NetworkPolicy") == []


def test_the_schema_refuses_a_bad_port_and_a_bad_cidr(helm: Path) -> None:
    for bad in ("networkPolicy.apiServer.ports={0}", "networkPolicy.apiServer.cidrs={10.0.0.1}"):
        result = run_helm(helm, "template", "fusebox", str(CHART), "--set", bad)
        assert result.returncode != 0, bad
        assert "networkPolicy" in result.stderr, result.stderr


def test_a_pdb_keeps_a_standby_only_when_there_is_one(render: Render) -> None:
    assert by_kind(render(), "PodDisruptionBudget") == []
    [pdb] = by_kind(render(sets=("replicaCount=2",)), "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    deployment = one(render(sets=("replicaCount=2",)), "Deployment")
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]


def test_replicas_prefer_distinct_nodes_unless_the_values_say_otherwise(
    render: Render, tmp_path: Path
) -> None:
    def spread(*sets: str, values: tuple[Path, ...] = ()) -> Any:
        return one(render(*values, sets=sets), "Deployment")["spec"]["template"]["spec"].get(
            "topologySpreadConstraints"
        )

    assert spread() is None  # one replica: nothing to spread
    deployment = one(render(sets=("replicaCount=2",)), "Deployment")
    [default] = spread("replicaCount=2")
    assert default["topologyKey"] == "kubernetes.io/hostname"
    # A preference: a one-node cluster still runs both replicas.
    assert default["whenUnsatisfiable"] == "ScheduleAnyway"
    assert default["labelSelector"] == deployment["spec"]["selector"]
    none = tmp_path / "none.yaml"
    none.write_text("topologySpreadConstraints: []\n")
    assert spread("replicaCount=2", values=(none,)) is None
    [zone] = spread(
        "replicaCount=2",
        "topologySpreadConstraints[0].maxSkew=1",
        "topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone",
        "topologySpreadConstraints[0].whenUnsatisfiable=DoNotSchedule",
    )
    assert zone["topologyKey"] == "topology.kubernetes.io/zone"


def test_readiness_and_liveness_are_different_checks(render: Render) -> None:
    container = one(render(), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    # Liveness runs kopf's probe handlers; readiness only asks that it listens.
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["tcpSocket"] == {"port": "health"}
    assert "httpGet" not in container["readinessProbe"]


def test_cpu_and_ephemeral_storage_are_bounded_and_hold_the_tmp_volume(render: Render) -> None:
    pod = one(render(), "Deployment")["spec"]["template"]["spec"]
    resources = pod["containers"][0]["resources"]
    assert resources["limits"]["cpu"]
    assert resources["requests"]["ephemeral-storage"] == resources["limits"]["ephemeral-storage"]
    [tmp] = [v for v in pod["volumes"] if v["name"] == "tmp"]
    assert (tmp["emptyDir"]["sizeLimit"], resources["limits"]["ephemeral-storage"]) == (
        "64Mi",
        "128Mi",  # the volume plus the kubelet's default log rotation (5 x 10Mi)
    )
