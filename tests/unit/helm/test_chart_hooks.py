"""The chart's Helm hooks as `helm template` renders them: the pre-upgrade Job that
applies crds/ and the pre-delete Job that guards `helm uninstall`, each with its own
least-privilege RBAC, restricted Pod Security, and gone when its value is off."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from fusebox_operator.chart_hooks import cli, services

from .conftest import CHART, Render, by_kind, hooks, load_documents, one, run_helm

HOOK_ANNOTATIONS = "helm.sh/hook-delete-policy"
PULL_SECRET_SETS = ("imagePullSecrets={regcred}", "image.tag=1.2.3")


def of_kind(documents: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in documents if doc["kind"] == kind]


def the(documents: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = of_kind(documents, kind)
    return found


def weight(document: dict[str, Any]) -> int:
    return int(document["metadata"]["annotations"]["helm.sh/hook-weight"])


def rules(document: dict[str, Any]) -> list[dict[str, Any]]:
    return list(document["rules"])


def assert_restricted_hook_job(job: dict[str, Any], operator: dict[str, Any]) -> None:
    """Restricted Pod Security, the operator's image and pull secrets, bounded retries."""
    assert job["spec"]["backoffLimit"] <= 2
    # helm prints a failed hook Job's log: the reason reaches whoever ran helm.
    assert job["metadata"]["annotations"]["helm.sh/hook-output-log-policy"] == "hook-failed"
    assert 0 < job["spec"]["activeDeadlineSeconds"] <= 600
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["readOnlyRootFilesystem"] is True
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["command"][-2:] == ["-m", "fusebox_operator.chart_hooks"]
    operator_pod = operator["spec"]["template"]["spec"]
    assert container["image"] == operator_pod["containers"][0]["image"]
    assert container["imagePullPolicy"] == operator_pod["containers"][0]["imagePullPolicy"]
    assert pod.get("imagePullSecrets") == operator_pod.get("imagePullSecrets")
    assert container["resources"]["limits"]["memory"]
    # Its own labels: the operator's Service, PDB and NetworkPolicy never select it.
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert not operator["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # A refusal (exit 3, chart_hooks.cli) would say the same again: no retry.
    assert job["spec"]["podFailurePolicy"]["rules"] == [
        {
            "action": "FailJob",
            "onExitCodes": {"containerName": container["name"], "operator": "In", "values": [3]},
        }
    ]


def assert_prerequisites_come_first(event_hooks: list[dict[str, Any]]) -> None:
    job = the(event_hooks, "Job")
    for document in event_hooks:
        annotations = document["metadata"]["annotations"]
        assert annotations[HOOK_ANNOTATIONS] == "before-hook-creation,hook-succeeded"
        if document is not job:
            assert weight(document) < weight(job), document["kind"]


def unreachable_kubeconfig(tmp_path: Path) -> Path:
    """A cluster nothing listens at: helm reaches for it only after it took the command."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "none",
            "clusters": [{"name": "none", "cluster": {"server": "https://127.0.0.1:1"}}],
            "contexts": [{"name": "none", "context": {"cluster": "none", "user": "none"}}],
            "users": [{"name": "none", "user": {}}],
        })
    )  # fmt: skip
    return kubeconfig


def deleted_namespace_section() -> str:
    """docs/releases.md on a watched namespace deleted before `helm uninstall`."""
    text = (CHART.parents[1] / "docs" / "releases.md").read_text()
    start = text.index("**A watched namespace deleted first.**")
    return " ".join(text[start : text.index("\n\n", text.index("--no-hooks", start))].split())


def render_with(helm: Path, *args: str) -> list[dict[str, Any]]:
    result = run_helm(helm, "template", "fusebox", str(CHART), *args)
    assert result.returncode == 0, result.stderr
    return load_documents(result.stdout)


def test_the_upgrade_hook_applies_crds_with_a_job_of_its_own(render: Render) -> None:
    documents = render(sets=PULL_SECRET_SETS)
    upgrade = hooks(documents, "pre-upgrade")
    assert sorted(d["kind"] for d in upgrade) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "Job",
        "NetworkPolicy",
        "ServiceAccount",
    ]
    assert_prerequisites_come_first(upgrade)
    job = the(upgrade, "Job")
    assert_restricted_hook_job(job, one(documents, "Deployment"))
    pod = job["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["containers"][0]["image"].endswith(":1.2.3")
    assert pod["serviceAccountName"] == the(upgrade, "ServiceAccount")["metadata"]["name"]
    assert pod["containers"][0]["args"][:3] == ["apply-crds", "--crds-dir", "/etc/fusebox/crds"]
    mounted = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert mounted["crds"] == "/etc/fusebox/crds"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["crds"]["configMap"]["name"] == the(upgrade, "ConfigMap")["metadata"]["name"]
    # Nothing of the hook is left in the running release.
    assert all(d["metadata"]["name"] != job["metadata"]["name"] for d in by_kind(documents, "Job"))


def test_the_hook_configmap_carries_exactly_the_charts_crd_files(render: Render) -> None:
    configmap = the(hooks(render(), "pre-upgrade"), "ConfigMap")
    files = {path.name: path.read_text() for path in (CHART / "crds").glob("*.yaml")}
    assert configmap["data"] == files


def test_the_upgrade_hook_may_only_get_and_patch_the_charts_crds_by_name(
    render: Render,
) -> None:
    upgrade = hooks(render(), "pre-upgrade")
    role = the(upgrade, "ClusterRole")
    assert rules(role) == [
        {
            "apiGroups": ["apiextensions.k8s.io"],
            "resources": ["customresourcedefinitions"],
            "resourceNames": [
                "inferenceservices.fusebox.dev",
                "clusterkopfpeerings.kopf.dev",
                "kopfpeerings.kopf.dev",
            ],
            "verbs": ["get", "patch"],
        }
    ]
    binding = the(upgrade, "ClusterRoleBinding")
    account = the(upgrade, "ServiceAccount")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"],
         "namespace": "fusebox-system"}
    ]  # fmt: skip


def test_the_uninstall_guard_lists_cluster_wide_and_deletes_nothing_by_default(
    render: Render,
) -> None:
    documents = render(sets=PULL_SECRET_SETS)
    guard = hooks(documents, "pre-delete")
    assert sorted(d["kind"] for d in guard) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "Job",
        "NetworkPolicy",
        "ServiceAccount",
    ]
    assert_prerequisites_come_first(guard)
    assert rules(the(guard, "ClusterRole")) == [
        {"apiGroups": ["fusebox.dev"], "resources": ["inferenceservices"],
         "verbs": ["list"]}
    ]  # fmt: skip
    job = the(guard, "Job")
    assert_restricted_hook_job(job, one(documents, "Deployment"))
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args == [
        "guard-uninstall",
        "--release=fusebox",
        "--release-namespace=fusebox-system",
        "--revision=1",  # helm template's; on uninstall, the revision being removed
        "--chart-version=0.1.0",  # for the refusal's `helm upgrade RELEASE CHART --version`
        "--watch-namespaces=",
        "--timeout-seconds=180",
    ]


def test_the_refusals_helm_upgrade_is_a_command_helm_accepts(
    helm: Path, render: Render, tmp_path: Path
) -> None:
    """Across the boundary: the guard Job's arguments, read by the hook's own parser,
    give a refusal whose `helm upgrade` the real helm accepts once CHART is filled in:
    it gets past the arguments and the chart and stops only at the (absent) cluster."""
    job = the(hooks(render(), "pre-delete"), "Job")
    arguments = cli.parser().parse_args(job["spec"]["template"]["spec"]["containers"][0]["args"])
    message = services.refusal_message(
        [services.ServiceRef("prod", "chat")],
        arguments.release,
        arguments.release_namespace,
        arguments.revision,
        arguments.chart_version,
    )
    (command,) = re.findall(r"`helm (upgrade [^`]*)`", message)
    words = [str(CHART) if word == "CHART" else word for word in shlex.split(command)]
    result = subprocess.run(
        [str(helm), *words, "--kubeconfig", str(unreachable_kubeconfig(tmp_path))],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert "UPGRADE FAILED: kubernetes cluster unreachable" in result.stderr, result.stderr


def test_delete_services_grants_delete_and_waits_within_the_jobs_deadline(
    render: Render,
) -> None:
    guard = hooks(render(sets=("uninstall.deleteServices=true",)), "pre-delete")
    assert rules(the(guard, "ClusterRole"))[0]["verbs"] == ["list", "delete"]
    job = the(guard, "Job")
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[-2:] == ["--timeout-seconds=180", "--delete-services"]
    assert job["spec"]["activeDeadlineSeconds"] > 180


def test_watched_namespaces_get_the_guards_rights_only_there(render: Render) -> None:
    guard = hooks(
        render(sets=("watchNamespaces={team-a,team-b}", "uninstall.deleteServices=true")),
        "pre-delete",
    )
    assert of_kind(guard, "ClusterRole") == [] and of_kind(guard, "ClusterRoleBinding") == []
    roles = of_kind(guard, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    assert all(rules(r)[0]["verbs"] == ["list", "delete"] for r in roles)
    bindings = of_kind(guard, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    assert {b["subjects"][0]["namespace"] for b in bindings} == {"fusebox-system"}
    args = the(guard, "Job")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--watch-namespaces=team-a,team-b" in args
    # A glob names no namespace to hold a Role: the list is cluster-wide, filtered.
    globbed = hooks(render(sets=("watchNamespaces={e2e-*}",)), "pre-delete")
    assert of_kind(globbed, "Role") == [] and len(of_kind(globbed, "ClusterRole")) == 1


def test_the_documented_upgrade_that_drops_a_deleted_namespace_is_one_helm_accepts(
    helm: Path, tmp_path: Path
) -> None:
    """The way out of an uninstall that fails creating the guard's Role in a namespace
    deleted since: an upgrade that no longer names it, runnable as written."""
    (command,) = re.findall(r"`helm (upgrade [^`]*--set-json[^`]*)`", deleted_namespace_section())
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    filled = {"RELEASE": "fusebox", "CHART": str(CHART), "VERSION": version}
    words = [filled.get(word, word) for word in shlex.split(command)]
    result = subprocess.run(
        [str(helm), *words, "--kubeconfig", str(unreachable_kubeconfig(tmp_path))],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert "UPGRADE FAILED: kubernetes cluster unreachable" in result.stderr, result.stderr
    # The values it sets are the chart's: a list of names, one Role in each.
    values = words[words.index("--set-json") + 1]
    guard = hooks(render_with(helm, "--set-json", values), "pre-delete")
    assert len(of_kind(guard, "Role")) == 2


def test_the_documented_cleanup_after_no_hooks_selects_every_guard_object(
    render: Render,
) -> None:
    """`helm uninstall --no-hooks` leaves what the failed guard attempt created; the
    documented `kubectl delete` selects each kind of it by its labels."""
    (command,) = re.findall(r"`kubectl (delete [^`]*)`", deleted_namespace_section())
    words = shlex.split(command.replace("RELEASE", "fusebox"))
    kinds = set(words[1].split(","))
    selector = dict(pair.split("=") for pair in words[words.index("-l") + 1].split(","))
    guard = hooks(render(sets=("watchNamespaces={team-a,team-b}",)), "pre-delete")
    assert {doc["kind"].lower() for doc in guard} <= kinds
    for doc in guard:
        assert selector.items() <= doc["metadata"]["labels"].items(), doc["metadata"]


def test_the_hook_pods_may_reach_only_the_api_server_and_dns(render: Render) -> None:
    documents = render()
    for event in ("pre-upgrade", "pre-delete"):
        event_hooks = hooks(documents, event)
        policy = the(event_hooks, "NetworkPolicy")["spec"]
        labels = the(event_hooks, "Job")["spec"]["template"]["metadata"]["labels"]
        assert policy["podSelector"]["matchLabels"].items() <= labels.items()
        assert policy["policyTypes"] == ["Ingress", "Egress"] and "ingress" not in policy
        ports = {(p["port"], p["protocol"]) for rule in policy["egress"] for p in rule["ports"]}
        assert ports == {(443, "TCP"), (6443, "TCP"), (53, "UDP"), (53, "TCP")}
    without = render(sets=("networkPolicy.enabled=false",))
    assert [d for d in without if d["kind"] == "NetworkPolicy"] == []


@pytest.mark.parametrize(
    ("value", "event"),
    [("crds.upgradeOnHelmUpgrade=false", "pre-upgrade"), ("uninstall.guard=false", "pre-delete")],
)
def test_turning_a_hook_off_removes_all_of_it(render: Render, value: str, event: str) -> None:
    assert hooks(render(), event)
    documents = render(sets=(value,))
    assert hooks(documents, event) == []
    other = "pre-delete" if event == "pre-upgrade" else "pre-upgrade"
    assert hooks(documents, other)


def test_both_hooks_off_render_the_release_as_before(render: Render) -> None:
    documents = render(sets=("crds.upgradeOnHelmUpgrade=false", "uninstall.guard=false"))
    assert [d for d in documents if "helm.sh/hook" in d["metadata"].get("annotations", {})] == []


def test_delete_services_without_the_guard_is_refused_naming_both(helm: Path) -> None:
    """The guard's Job is what deletes: with guard off, deleteServices would do nothing."""
    result = run_helm(
        helm,
        *("template", "fusebox", str(CHART)),
        *("--set", "uninstall.deleteServices=true", "--set", "uninstall.guard=false"),
    )
    assert result.returncode != 0
    assert "uninstall.deleteServices=true needs uninstall.guard=true" in result.stderr, (
        result.stderr
    )


HELM_DEFAULT_TIMEOUT_SECONDS = 300


def test_the_guards_longest_wait_ends_before_helms_default_timeout(
    render: Render, helm: Path
) -> None:
    """The Job, not helm's 5m --timeout, must be what reports a wait that ran out."""
    guard = hooks(
        render(sets=("uninstall.deleteServices=true", "uninstall.deleteTimeoutSeconds=180")),
        "pre-delete",
    )
    job = the(guard, "Job")
    assert job["spec"]["template"]["spec"]["containers"][0]["args"][-2] == "--timeout-seconds=180"
    assert 180 < job["spec"]["activeDeadlineSeconds"] < HELM_DEFAULT_TIMEOUT_SECONDS
    result = run_helm(
        helm, "template", "fusebox", str(CHART), "--set", "uninstall.deleteTimeoutSeconds=181"
    )
    assert result.returncode != 0
    assert "at '/uninstall/deleteTimeoutSeconds': maximum: got 181, want 180" in result.stderr


def test_hook_pods_are_placed_on_the_nodes_the_operator_may_use(render: Render) -> None:
    node_affinity = {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["system"]}]}
            ]
        }
    }
    anti_affinity = {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {
                "topologyKey": "kubernetes.io/hostname",
                "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "fusebox-operator"}},
            }
        ]
    }
    documents = render(
        sets=(
            "nodeSelector.pool=system",
            "tolerations[0].key=dedicated",
            "tolerations[0].operator=Exists",
            "tolerations[0].effect=NoSchedule",
            "priorityClassName=platform-critical",
            "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
            ".nodeSelectorTerms[0].matchExpressions[0].key=pool",
            "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
            ".nodeSelectorTerms[0].matchExpressions[0].operator=In",
            "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
            ".nodeSelectorTerms[0].matchExpressions[0].values={system}",
            "affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]"
            ".topologyKey=kubernetes.io/hostname",
            "affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]"
            ".labelSelector.matchLabels.app\\.kubernetes\\.io/name=fusebox-operator",
        )
    )
    operator = one(documents, "Deployment")["spec"]["template"]["spec"]
    assert operator["affinity"] == {"nodeAffinity": node_affinity, "podAntiAffinity": anti_affinity}
    for event in ("pre-upgrade", "pre-delete"):
        pod = the(hooks(documents, event), "Job")["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == {"pool": "system"}
        assert pod["tolerations"] == [
            {"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}
        ]
        assert pod["priorityClassName"] == "platform-critical"
        # Only the node terms: an anti-affinity to the operator pods could leave a
        # one-node cluster no node for the hook.
        assert pod["affinity"] == {"nodeAffinity": node_affinity}
        assert "topologySpreadConstraints" not in pod


POD_TERM = {
    "topologyKey": "kubernetes.io/hostname",
    "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "fusebox-operator"}},
}
NODE_AFFINITY = {
    "preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": {"matchExpressions": [{"key": "pool", "operator": "Exists"}]}}
    ]
}


@pytest.mark.parametrize(
    "affinity",
    [
        {},
        None,
        {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
        {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [POD_TERM]}},
        {"nodeAffinity": {}, "podAntiAffinity": {}},
        {"nodeAffinity": NODE_AFFINITY},
        {
            "nodeAffinity": NODE_AFFINITY,
            "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [POD_TERM]},
        },
    ],
    ids=["empty", "null", "pod-only", "anti-only", "empty-node", "node-only", "node-and-pod"],
)
def test_hook_pods_get_the_node_affinity_only_when_one_is_given(
    helm: Path, tmp_path: Path, affinity: dict[str, Any] | None
) -> None:
    """The hooks read affinity's nodeAffinity, whatever else affinity holds or lacks.
    The schema refuses a null affinity at install (a removed key); a render that
    skips the schema must still work rather than fail on a nil map."""
    values = tmp_path / "affinity.yaml"
    values.write_text(yaml.safe_dump({"affinity": affinity}))
    args = ["template", "fusebox", str(CHART), "--values", str(values)]
    if affinity is None:
        args.append("--skip-schema-validation")
    result = run_helm(helm, *args)
    assert result.returncode == 0, result.stderr
    documents = load_documents(result.stdout)
    operator = one(documents, "Deployment")["spec"]["template"]["spec"]
    assert operator.get("affinity") == (affinity or None)
    node_affinity = (affinity or {}).get("nodeAffinity")
    for event in ("pre-upgrade", "pre-delete"):
        pod = the(hooks(documents, event), "Job")["spec"]["template"]["spec"]
        if node_affinity:
            assert pod["affinity"] == {"nodeAffinity": node_affinity}
        else:
            assert "affinity" not in pod
