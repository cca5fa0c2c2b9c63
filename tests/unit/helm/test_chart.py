"""The Helm chart: lints strictly, renders what a platform team expects, keeps
the CRD and the RBAC in step with their canonical copies, and refuses bad
values with a message naming the key."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from fusebox_operator.settings import OperatorSettings

from .conftest import (
    CHART,
    REPO,
    VALUES_DIR,
    Render,
    by_kind,
    env_of,
    load_documents,
    one,
    release_objects,
    run_helm,
)

ALL_OPTIONS = VALUES_DIR / "all-options.yaml"


def rule_triples(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """RBAC rules as (apiGroup, resource, verb): equal sets grant exactly the same."""
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule.get("apiGroups", [])
        for resource in rule.get("resources", [])
        for verb in rule.get("verbs", [])
    }


def canonical_rules() -> set[tuple[str, str, str]]:
    document = yaml.safe_load((REPO / "operator" / "rbac" / "clusterrole.yaml").read_text())
    return rule_triples(document["rules"])


CLUSTER_PEERING_RULES = {
    ("kopf.dev", "clusterkopfpeerings", verb) for verb in ("get", "list", "watch", "patch")
}
"""The canonical set's peering rule: watching every namespace, kopf peers cluster-wide."""


def test_chart_passes_helm_lint_strict(helm: Path) -> None:
    for values in (None, ALL_OPTIONS):
        args = ["lint", "--strict", str(CHART)] + (["--values", str(values)] if values else [])
        result = run_helm(helm, *args)
        assert result.returncode == 0, result.stdout + result.stderr


def test_chart_crds_are_byte_identical_to_the_canonical_crds() -> None:
    def files(folder: Path) -> dict[str, bytes]:
        return {path.name: path.read_bytes() for path in sorted(folder.glob("*.yaml"))}

    canonical = files(REPO / "crds")
    assert set(canonical) == {"inferenceservice.yaml", "kopf-peerings.yaml"}
    assert files(CHART / "crds") == canonical


def test_defaults_render_operator_with_restricted_security_and_local_image(render: Render) -> None:
    documents = render()
    kinds = sorted(doc["kind"] for doc in release_objects(documents))
    assert kinds == sorted(
        [
            "CustomResourceDefinition",  # InferenceService
            "CustomResourceDefinition",  # ClusterKopfPeering
            "CustomResourceDefinition",  # KopfPeering
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Deployment",
            "Service",
            "NetworkPolicy",  # the operator pod's own
            "ClusterKopfPeering",  # one replica peers too (test_operator_rollouts.py)
        ]
    )
    deployment = one(documents, "Deployment")
    assert deployment["metadata"]["name"] == "fusebox-operator"
    assert deployment["spec"]["replicas"] == 1
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == "localhost/fusebox/operator:dev"
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    env = env_of(deployment)
    assert env["FUSEBOX_INFERENCE_IMAGE"] == "localhost/fusebox/inference:dev"
    assert env["FUSEBOX_WATCH_NAMESPACES"] == ""
    assert env["FUSEBOX_PEERING"] == "fusebox-operator"
    assert env["FUSEBOX_OPERATOR_NAMESPACE"] == "fusebox-system"
    # The NetworkPolicy peer the operator writes must match these very pods.
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = dict(pair.split("=") for pair in env["FUSEBOX_OPERATOR_POD_SELECTOR"].split(","))
    assert selector.items() <= labels.items()
    service = one(documents, "Service")
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"][0]["port"] == 8080


def test_cluster_role_grants_exactly_the_operator_rbac_rules(render: Render) -> None:
    role = one(render(), "ClusterRole")
    assert rule_triples(role["rules"]) == canonical_rules()
    binding = one(render(), "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "fusebox-operator", "namespace": "fusebox-system"}
    ]


def test_watch_namespaces_grants_namespaced_rules_only_in_those_namespaces(
    render: Render,
) -> None:
    documents = render(sets=("watchNamespaces={team-a,team-b}",))
    roles = by_kind(documents, "Role")
    assert sorted(role["metadata"]["namespace"] for role in roles) == ["team-a", "team-b"]
    bindings = by_kind(documents, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    cluster_role = one(documents, "ClusterRole")
    cluster_scoped = {"customresourcedefinitions", "namespaces", "nodes"}
    assert {resource for _, resource, _ in rule_triples(cluster_role["rules"])} == cluster_scoped
    # Nothing lost: the split is the canonical set, plus kopf's Namespace reads, with
    # the peering in each namespace (KopfPeering) instead of cluster-wide.
    namespaces = {("", "namespaces", verb) for verb in ("get", "list", "watch")}
    peerings = {("kopf.dev", "kopfpeerings", v) for v in ("get", "list", "watch", "patch")}
    assert rule_triples(cluster_role["rules"]) | rule_triples(roles[0]["rules"]) == (
        canonical_rules() - CLUSTER_PEERING_RULES | peerings | namespaces
    )
    assert env_of(one(documents, "Deployment"))["FUSEBOX_WATCH_NAMESPACES"] == "team-a,team-b"


def test_several_replicas_turn_on_kopf_peering_with_its_peering_object(render: Render) -> None:
    documents = render(sets=("replicaCount=3",))
    deployment = one(documents, "Deployment")
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    env = env_of(deployment)
    # The peering is the release's own (its fullname), never one another release shares.
    assert (env["FUSEBOX_PEERING"], env["FUSEBOX_OPERATOR_REPLICAS"]) == ("fusebox-operator", "3")
    assert one(documents, "ClusterKopfPeering")["metadata"]["name"] == "fusebox-operator"
    assert env["FUSEBOX_PEERING_LIFETIME_SECONDS"] == "15"  # a dead replica's takeover time
    lifetime = env_of(one(render(sets=("peering.lifetimeSeconds=30",)), "Deployment"))
    assert lifetime["FUSEBOX_PEERING_LIFETIME_SECONDS"] == "30"
    # Watching namespaces: kopf peers per namespace.
    documents = render(sets=("replicaCount=2", "watchNamespaces={team-a}"))
    peering = one(documents, "KopfPeering")
    assert (peering["metadata"]["name"], peering["metadata"]["namespace"]) == (
        "fusebox-operator",
        "team-a",
    )


def test_two_releases_with_several_replicas_never_share_a_peering(helm: Path) -> None:
    """kopf pauses every operator of a peering but the highest-priority one: two
    releases sharing one (the old default, "fusebox") would stand each other still."""
    names = set()
    for release in ("demo", "suite"):
        result = run_helm(
            helm, "template", release, str(CHART), "--set", "replicaCount=2", "--include-crds"
        )
        assert result.returncode == 0, result.stderr
        documents = load_documents(result.stdout)
        names.add(one(documents, "ClusterKopfPeering")["metadata"]["name"])
        assert env_of(one(documents, "Deployment"))["FUSEBOX_PEERING"] in names
    assert names == {"demo-operator", "suite-operator"}


@pytest.mark.parametrize(
    ("replicas", "sets"),
    [
        (1, ()),
        (2, ()),
        (1, ("watchNamespaces={team-a}",)),
        (2, ("peering.name=fusebox-peers",)),
        (3, ("peering.name=fusebox-peers", "watchNamespaces={team-a}")),
    ],
)
def test_the_operator_peers_through_the_very_peering_object_the_chart_creates(
    render: Render, replicas: int, sets: tuple[str, ...]
) -> None:
    """Across the boundary: the operator's own parser of the rendered env peers, one
    replica or several, through the object the chart made, of the kind its scope uses."""
    documents = render(sets=(f"replicaCount={replicas}", *sets))
    settings = OperatorSettings.from_env(env_of(one(documents, "Deployment")))
    assert not settings.standalone
    kind = "KopfPeering" if settings.watch_namespaces else "ClusterKopfPeering"
    assert {p["metadata"]["name"] for p in by_kind(documents, kind)} == {settings.peering_name}


@pytest.mark.parametrize(
    ("sets", "named", "why"),
    [
        (("peering.name=standalone",), 'peering.name "standalone"', "act on every service"),
        (("peering.name=auto",), 'peering.name "auto"', "no replica would ever act"),
        (("fullnameOverride=auto",), 'fullnameOverride "auto"', "no replica would ever act"),
    ],
)
def test_a_peering_name_the_operator_reads_as_a_keyword_is_refused(
    helm: Path, sets: tuple[str, ...], named: str, why: str
) -> None:
    """FUSEBOX_PEERING=standalone runs every pod unpeered, and =auto peers several
    replicas through "fusebox", which the chart never creates: neither may name the
    chart's peering."""
    args = [arg for pair in ("replicaCount=2", *sets) for arg in ("--set", pair)]
    result = run_helm(helm, "template", "fusebox", str(CHART), *args)
    assert result.returncode != 0, "rendered"
    assert named in result.stderr and why in result.stderr, result.stderr
    assert "FUSEBOX_PEERING" in result.stderr, result.stderr


def test_a_keyword_peering_name_is_refused_with_one_replica_too(helm: Path) -> None:
    """One replica peers as well: FUSEBOX_PEERING=auto would run it unpeered (the old
    and the new pod of a rollout both acting), =standalone too."""
    for sets in ("peering.name=standalone", "fullnameOverride=auto"):
        result = run_helm(helm, "template", "fusebox", str(CHART), "--set", sets)
        assert result.returncode != 0, sets
        assert "FUSEBOX_PEERING" in result.stderr and "at once" in result.stderr, sets


def test_an_unused_peering_name_is_still_refused_when_it_is_a_keyword(helm: Path) -> None:
    """A namespace glob runs standalone, so the name is unused, but naming the
    namespaces later must not be what fails."""
    glob = ("template", "fusebox", str(CHART), "--set", "watchNamespaces={e2e-*}")
    result = run_helm(helm, *glob, "--set", "peering.name=auto")
    assert result.returncode != 0 and 'peering.name "auto"' in result.stderr
    # A fullname of "auto" names no peering there: nothing to refuse.
    fine = run_helm(helm, *glob, "--set", "fullnameOverride=auto")
    assert fine.returncode == 0, fine.stderr


def sidecar_monitor(documents: list[dict[str, Any]]) -> dict[str, Any]:
    """The inference pods' PodMonitor (the other one scrapes the operator)."""
    (monitor,) = [
        m for m in by_kind(documents, "PodMonitor") if m["metadata"]["name"].endswith("-inference")
    ]
    return monitor


def test_a_namespace_glob_is_watched_with_cluster_wide_rules(render: Render) -> None:
    """A glob ("e2e-*") names namespaces that do not exist yet: no Role can be made in
    each, so the rules are the cluster-wide ones, and kopf filters by the glob."""
    documents = render(sets=("watchNamespaces={e2e-*}", "monitoring.podMonitor.enabled=true"))
    assert by_kind(documents, "Role") == [] and by_kind(documents, "RoleBinding") == []
    namespaces = {("", "namespaces", verb) for verb in ("get", "list", "watch")}
    # No peering rule: a glob runs standalone (test_operator_rollouts.py).
    assert rule_triples(one(documents, "ClusterRole")["rules"]) == (
        canonical_rules() - CLUSTER_PEERING_RULES | namespaces
    )
    binding = one(documents, "ClusterRoleBinding")
    assert binding["subjects"][0]["name"] == "fusebox-operator"
    assert env_of(one(documents, "Deployment"))["FUSEBOX_WATCH_NAMESPACES"] == "e2e-*"
    assert sidecar_monitor(documents)["spec"]["namespaceSelector"] == {"any": True}


def test_a_namespace_glob_with_several_replicas_is_refused(helm: Path) -> None:
    """Peering needs a KopfPeering in each watched namespace, which a glob cannot name."""
    result = run_helm(
        helm,
        "template",
        "fusebox",
        str(CHART),
        "--set",
        "watchNamespaces={e2e-*}",
        "--set",
        "replicaCount=2",
    )
    assert result.returncode != 0
    assert "list watchNamespaces by name, not by glob" in result.stderr, result.stderr


@pytest.mark.parametrize("client_seconds", [300, 200])
def test_a_watch_client_timeout_not_above_the_servers_is_refused(
    helm: Path, client_seconds: int
) -> None:
    """kopf's client would drop each watch before the server ends it (the server's is 300)."""
    result = run_helm(
        helm,
        "template",
        "fusebox",
        str(CHART),
        "--set",
        f"kopf.watchClientTimeoutSeconds={client_seconds}",
    )
    assert result.returncode != 0
    assert (
        f"kopf.watchClientTimeoutSeconds ({client_seconds}) must be above "
        "kopf.watchServerTimeoutSeconds (300)"
    ) in result.stderr, result.stderr


def install_notes(helm: Path) -> str:
    result = run_helm(
        helm, "install", "fusebox", str(CHART), "--dry-run=client", "--namespace", "fusebox-system"
    )
    assert result.returncode == 0, result.stderr
    return " ".join(result.stdout.split("NOTES:", 1)[1].split())


def test_install_notes_say_where_the_server_reads_a_model_and_where_it_is_documented(
    helm: Path,
) -> None:
    notes = install_notes(helm)
    assert "The server loads local files only" in notes
    assert "model.source is pvc://CLAIM/path" in notes
    # The example the notes apply, and the field reference they point at, say the same.
    example = yaml.safe_load((REPO / "crds" / "examples" / "tiny-chat.yaml").read_text())
    assert f"The tiny-chat example reads {example['spec']['model']['source']}:" in notes
    assert "docs/api.md, spec.model.source, has the rules" in notes
    assert "| `spec.model.source` |" in (REPO / "docs" / "api.md").read_text()


def test_all_options_render_monitors_dashboard_and_overrides(render: Render) -> None:
    documents = render(ALL_OPTIONS)
    deployment = one(documents, "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    digest = "sha256:" + "0123456789abcdef" * 4
    assert container["image"] == f"registry.example.com/fusebox/operator@{digest}"
    assert container["imagePullPolicy"] == "Always"
    env = env_of(deployment)
    assert env["FUSEBOX_INFERENCE_IMAGE"] == (
        f"registry.example.com/fusebox/inference:v0.1.0@{digest}"
    )
    assert env["FUSEBOX_MONITORING_NAMESPACE"] == "observability"
    assert env["FUSEBOX_LIVENESS_PORT"] == "8081"
    assert container["ports"][0]["containerPort"] == 8081
    assert deployment["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    monitor = sidecar_monitor(documents)
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    dashboard = one(documents, "ConfigMap")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    panels = json.loads(dashboard["data"]["fusebox.json"])["panels"]
    assert len(panels) >= 10


def test_dashboard_queries_only_metrics_the_sidecar_documents() -> None:
    documented = set(
        re.findall(r"`(fusebox_[a-z0-9_]+)", (REPO / "docs" / "metrics.md").read_text())
    )
    dashboard = json.loads((CHART / "dashboards" / "fusebox.json").read_text())
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"fusebox_[a-z0-9_]+", target["expr"])
    }
    assert queried and queried <= documented, queried - documented


def test_every_values_key_has_a_comment() -> None:
    """values.yaml is the chart's manual: each key is preceded by a comment line."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    missing = []
    for number, line in enumerate(lines):
        key = re.match(r"^(\s*)([A-Za-z][\w-]*):", line)
        if not key:
            continue
        indent = key.group(1)
        above = lines[number - 1] if number else ""
        is_parent_of_commented = number + 1 < len(lines) and lines[number + 1].strip().startswith(
            "#"
        )
        if not above.strip().startswith("#") and not is_parent_of_commented:
            # Keys inside a documented map (e.g. resources.requests.cpu) inherit its comment.
            parent_documented = any(
                lines[i].strip().startswith("# --")
                for i in range(number - 1, -1, -1)
                if len(lines[i]) - len(lines[i].lstrip()) < len(indent) and lines[i].strip()
            )
            if not indent or not parent_documented:
                missing.append(line.strip())
    assert missing == []


@pytest.mark.parametrize(
    ("values_file", "message"),
    [
        ("invalid-replicas.yaml", "at '/replicaCount': minimum: got 0, want 1"),
        (
            "invalid-pull-policy.yaml",
            "at '/image/pullPolicy': value must be one of 'Always', 'IfNotPresent', 'Never'",
        ),
        ("invalid-namespace.yaml", "at '/watchNamespaces/0': 'Team_A' does not match pattern"),
        ("invalid-typo.yaml", "additional properties 'replicas' not allowed"),
        ("invalid-root.yaml", "at '/securityContext/runAsNonRoot': value must be true"),
    ],
)
def test_schema_rejects_bad_values_with_a_message_naming_the_key(
    helm: Path, values_file: str, message: str
) -> None:
    result = run_helm(
        helm, "template", "fusebox", str(CHART), "--values", str(VALUES_DIR / values_file)
    )
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert message in result.stderr, result.stderr
