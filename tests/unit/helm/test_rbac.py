"""The operator's RBAC per scope and replica count: exactly the verbs the code and
kopf send in that mode, and no peering kind or Namespace read the mode never uses.
Every replica count peers (a rollout's new pod and the old one are peers), so the
peering rule follows the scope, never replicaCount; a namespace glob has none."""

from __future__ import annotations

import pytest

from .conftest import Render, by_kind, one
from .names import cluster_scoped_name
from .test_chart import canonical_rules, rule_triples

Triples = set[tuple[str, str, str]]


def grants(group: str, resources: tuple[str, ...], verbs: str) -> Triples:
    return {(group, resource, verb) for resource in resources for verb in verbs.split()}


# Children: created, merge-patched, Deployments replaced (update); events POSTed, and
# listed by a successor that finds an action its predecessor ran (Kube.actions_told).
NAMESPACED = (
    grants("fusebox.dev", ("inferenceservices",), "get list watch patch")
    | grants("fusebox.dev", ("inferenceservices/status",), "get patch")
    | grants("apps", ("deployments",), "get list watch create update patch")
    | grants("", ("services", "configmaps"), "get list watch create patch")
    | grants("", ("secrets",), "get create")
    | grants("policy", ("poddisruptionbudgets",), "get list watch create patch")
    | grants("networking.k8s.io", ("networkpolicies",), "get list watch create patch")
    | grants("resource.k8s.io", ("resourceclaimtemplates",), "get create patch")
    | grants("", ("pods",), "get list watch patch delete")
    # Ready reads whether the Service lists its pods: the EndpointSlices, watched.
    | grants("discovery.k8s.io", ("endpointslices",), "get list watch")
    | grants("", ("pods/resize",), "patch")
    | grants("", ("events",), "create list")
)
CLUSTER = grants("apiextensions.k8s.io", ("customresourcedefinitions",), "get list watch") | (
    grants("", ("nodes",), "get list")
)
NAMESPACES = grants("", ("namespaces",), "get list watch")
PEERINGS = grants("kopf.dev", ("kopfpeerings",), "get list watch patch")
CLUSTER_PEERINGS = grants("kopf.dev", ("clusterkopfpeerings",), "get list watch patch")


@pytest.mark.parametrize("replicas", [1, 3])
def test_watching_every_namespace_grants_cluster_peerings_at_every_replica_count(
    render: Render, replicas: int
) -> None:
    """One replica or several peer through a ClusterKopfPeering. kopf reads no
    Namespace when it watches all of them."""
    documents = render(sets=(f"replicaCount={replicas}",))
    assert rule_triples(one(documents, "ClusterRole")["rules"]) == (
        NAMESPACED | CLUSTER | CLUSTER_PEERINGS
    )
    assert by_kind(documents, "Role") == []


@pytest.mark.parametrize("replicas", [1, 2])
def test_named_namespaces_grant_namespaced_peerings_at_every_replica_count(
    render: Render, replicas: int
) -> None:
    documents = render(sets=(f"replicaCount={replicas}", "watchNamespaces={team-a,team-b}"))
    roles = by_kind(documents, "Role")
    assert [role["metadata"]["namespace"] for role in roles] == ["team-a", "team-b"]
    assert all(rule_triples(role["rules"]) == NAMESPACED | PEERINGS for role in roles)
    # kopf lists and watches Namespaces to find the named ones.
    assert rule_triples(one(documents, "ClusterRole")["rules"]) == CLUSTER | NAMESPACES


def test_a_namespace_glob_grants_the_namespaced_rules_cluster_wide_and_namespace_reads(
    render: Render,
) -> None:
    """No peering rule: a glob runs standalone (no KopfPeering in namespaces not known yet)."""
    documents = render(sets=("watchNamespaces={e2e-*}",))
    assert rule_triples(one(documents, "ClusterRole")["rules"]) == (
        NAMESPACED | CLUSTER | NAMESPACES
    )


def test_the_static_cluster_role_is_the_charts_default() -> None:
    """operator/rbac/clusterrole.yaml: every namespace, one replica, peering."""
    assert canonical_rules() == NAMESPACED | CLUSTER | CLUSTER_PEERINGS


@pytest.mark.parametrize(
    ("sets", "suffix"),
    [((), ""), (("watchNamespaces={a,b}",), "cluster"), (("watchNamespaces={team-*}",), "")],
    ids=["every-namespace", "named", "glob"],
)
def test_one_release_name_in_two_namespaces_claims_distinct_cluster_roles(
    render: Render, sets: tuple[str, ...], suffix: str
) -> None:
    """Two teams each install `fusebox` in their own namespace: helm refuses an
    object another release owns, so no ClusterRole or binding (the hooks' included)
    may share a name across them, and each binding grants its own release's role."""
    names: list[set[str]] = []
    for namespace in ("team-a", "team-b"):
        documents = render(sets=sets, namespace=namespace)
        roles = {r["metadata"]["name"] for r in by_kind(documents, "ClusterRole")}
        bindings = by_kind(documents, "ClusterRoleBinding")
        assert roles and all(namespace in name for name in roles), roles
        assert cluster_scoped_name("fusebox-operator", namespace, suffix) in roles, roles
        assert {b["metadata"]["name"] for b in bindings} == roles
        assert all(b["roleRef"]["name"] == b["metadata"]["name"] for b in bindings)
        names.append(roles)
    assert not names[0] & names[1]


def test_long_cluster_scoped_names_are_cut_to_a_dns_label_and_still_differ(
    render: Render,
) -> None:
    prefix = "inference-platform-team-chat-production"  # two namespaces alike for 40 characters
    names: list[set[str]] = []
    for namespace in (f"{prefix}-eu-west1", f"{prefix}-eu-west2"):
        documents = render(sets=("watchNamespaces={a}",), namespace=namespace)
        roles = {r["metadata"]["name"] for r in by_kind(documents, "ClusterRole")}
        assert roles and all(len(name) <= 63 for name in roles), roles
        assert cluster_scoped_name("fusebox-operator", namespace, "cluster") in roles
        names.append(roles)
    assert not names[0] & names[1]
