"""The chart hooks' pure parts: which CRDs the upgrade hook applies and how it reports
one the API server will not establish; which InferenceServices block an uninstall
(the operator's namespace reading) and the message that names them."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from fusebox_operator.chart_hooks import crds, services
from fusebox_operator.chart_hooks.services import NamespaceScope, ServiceRef

REPO = Path(__file__).resolve().parents[3]


def item(namespace: str, name: str) -> dict[str, object]:
    return {"metadata": {"namespace": namespace, "name": name}}


def test_the_charts_crd_files_give_every_crd_in_file_order() -> None:
    files = {p.name: p.read_text() for p in (REPO / "helm" / "fusebox" / "crds").glob("*.yaml")}
    names = [d["metadata"]["name"] for d in crds.chart_crds(files)]
    assert names == [
        "inferenceservices.fusebox.dev",
        "clusterkopfpeerings.kopf.dev",
        "kopfpeerings.kopf.dev",
    ]


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", "a ConfigMap is not"),
        ("apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n", "without"),
        ("key: [unclosed\n", "not YAML"),
        ("# only a comment\n", "no CustomResourceDefinition"),
    ],
)
def test_a_crd_file_holding_anything_else_is_refused_naming_the_file(text: str, named: str) -> None:
    with pytest.raises(crds.ChartCrdError, match=named) as refused:
        crds.chart_crds({"extra.yaml": text})
    assert "extra.yaml" in str(refused.value)


def test_establishment_reports_the_names_conflict_before_established() -> None:
    status = {
        "conditions": [
            {"type": "NamesAccepted", "status": "False", "reason": "ListKindConflict",
             "message": "\"FooList\" is already in use"},
            {"type": "Established", "status": "False", "reason": "NotAccepted",
             "message": "not all names are accepted"},
        ]
    }  # fmt: skip
    state = crds.establishment({"status": status})
    assert (state.established, state.reason) == (False, "ListKindConflict")
    message = crds.not_established_message("foos.example.com", state, 60)
    assert message.startswith("CRD foos.example.com: applied but not Established after 60s")
    assert "ListKindConflict" in message and "already in use" in message
    assert crds.establishment({"status": {"conditions": [
        {"type": "Established", "status": "True"}]}}).established  # fmt: skip
    assert crds.establishment({}).reason == "NoConditions"


def test_a_missing_crd_is_named_with_what_to_run() -> None:
    message = crds.missing_message("kopfpeerings.kopf.dev")
    assert message.startswith("CRD kopfpeerings.kopf.dev does not exist")
    assert "kubectl apply --server-side -f crds/" in message
    assert "crds.upgradeOnHelmUpgrade=false" in message


@pytest.mark.parametrize(
    ("watch", "scope"),
    [
        ((), NamespaceScope(None)),
        (("team-a", "team-b", "team-a"), NamespaceScope(("team-a", "team-b"))),
        (("e2e-*",), NamespaceScope(None, ("e2e-*",))),
        (("team-a", "!kube-system"), NamespaceScope(None, ("team-a", "!kube-system"))),
    ],
)
def test_watch_namespaces_select_where_services_are_listed(
    watch: tuple[str, ...], scope: NamespaceScope
) -> None:
    assert services.namespace_scope(watch) == scope


def test_the_operator_env_format_is_read_as_the_operator_reads_it() -> None:
    assert services.parse_watch_namespaces(" a, ,b ,") == ("a", "b")
    assert services.parse_watch_namespaces("") == ()


def test_services_outside_the_watched_namespaces_do_not_block_the_uninstall() -> None:
    items = [item("e2e-1", "chat"), item("prod", "chat"), item("e2e-2", "bot"), item("x", "y")]
    glob = services.namespace_scope(("e2e-*",))
    assert [str(s) for s in services.services_in_scope(items, glob)] == ["e2e-1/chat", "e2e-2/bot"]
    negated = services.namespace_scope(("!prod",))
    assert [str(s) for s in services.services_in_scope(items, negated)] == [
        "e2e-1/chat",
        "e2e-2/bot",
        "x/y",
    ]
    named = services.namespace_scope(("prod",))
    assert services.services_in_scope(items, named) == [ServiceRef("prod", "chat")]
    everywhere = services.namespace_scope(())
    assert len(services.services_in_scope(items, everywhere)) == 4


def test_the_refusal_names_each_service_and_says_how_to_proceed() -> None:
    found = [ServiceRef("prod", "chat"), ServiceRef("prod", "embed")]
    message = services.refusal_message(found, "fusebox", "fusebox-system", 4, "0.1.0")
    assert message.startswith("helm uninstall fusebox -n fusebox-system refused: 2")
    assert "prod/chat, prod/embed." in message
    assert "kubectl delete inferenceservices" in message
    assert "--set uninstall.deleteServices=true" in message
    assert "uninstall.guard=false" in message
    # The refusal leaves the release "uninstalling", which `helm upgrade` refuses
    # ("has no deployed releases"): the revision being removed is deployed again first.
    rollback = message.index("`helm rollback fusebox 4 -n fusebox-system`")
    assert rollback < message.index("`helm upgrade fusebox CHART --version 0.1.0 -n fusebox-system")
    one = services.refusal_message(found[:1], "fusebox", "fusebox-system")
    assert "1 InferenceService remains" in one
    assert "`helm rollback fusebox REVISION -n fusebox-system`" in one


HELM_UPGRADE_VALUED_FLAGS = {"-n", "--namespace", "--version", "--set"}
"""The flags of `helm upgrade` the message uses that take a value."""


@pytest.mark.parametrize("chart_version", ["0.1.0", None])
def test_the_refusals_helm_upgrade_names_the_release_and_the_chart(
    chart_version: str | None,
) -> None:
    """`helm upgrade RELEASE CHART`: without CHART helm answers "requires 2 arguments"
    and the release stays stuck 'uninstalling'."""
    message = services.refusal_message(
        [ServiceRef("prod", "chat")], "fusebox", "fusebox-system", 4, chart_version
    )
    (command,) = re.findall(r"`(helm upgrade [^`]*)`", message)
    words = shlex.split(command)[2:]
    positional: list[str] = []
    flags: dict[str, str] = {}
    while words:
        word = words.pop(0)
        if word in HELM_UPGRADE_VALUED_FLAGS:
            flags[word] = words.pop(0)
        elif word.startswith("-"):
            flags[word] = ""
        else:
            positional.append(word)
    assert positional == ["fusebox", "CHART"]
    assert "CHART: the chart the release was installed from" in message
    assert flags["-n"] == "fusebox-system" and "--reuse-values" in flags
    assert flags["--set"] == "uninstall.deleteServices=true"
    # Pinned to the chart version rolled back to, when the hook knows it.
    assert flags.get("--version") == chart_version


def test_many_services_are_named_up_to_twenty_then_counted() -> None:
    found = [ServiceRef("ns", f"s{i:02d}") for i in range(25)]
    text = services.named(found)
    assert text.count("ns/") == services.NAMED_AT_MOST == 20
    assert text.endswith("ns/s19 and 5 more")
    assert services.named(found[:20]) == ", ".join(f"ns/s{i:02d}" for i in range(20))
    assert "and 5 more" in services.still_present_message(found, 180)
