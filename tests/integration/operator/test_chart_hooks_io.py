"""The chart's hooks against a real kube-apiserver (etcd and the API server from the
cluster binaries, on loopback, RBAC on), run as the hook's own service account with
the RBAC `helm template` renders for it.

What only a real API server shows: a server-side apply with the hook's get/patch
rights upgrades an installed CRD (the changed field takes effect, owned by
fusebox-chart), an invalid CRD comes back named with the server's reason, and the
uninstall guard lists, refuses, and deletes within exactly the rights it is granted.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from fusebox_operator.chart_hooks import cluster, crds, services
from fusebox_operator.kube import SERVICE_GROUP, SERVICE_PLURAL, SERVICE_VERSION

from .loopback_apiserver import BINARIES, REPO, loopback_apiserver, skip_without_binaries

CHART = REPO / "helm" / "fusebox"
TOKEN = "chart-hooks-test-token"
RELEASE, RELEASE_NAMESPACE = "fusebox", "fusebox-system"
CRD_NAME = "inferenceservices.fusebox.dev"
FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"
SPEC: dict[str, Any] = {
    "model": {"name": "chat", "source": "pvc://models/tiny"},
    "gpu": {"count": 0},
}


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    skip_without_binaries("helm")
    # RBAC: the hooks run as their service accounts, with the chart's rules.
    with loopback_apiserver(
        tmp_path_factory.mktemp("apiserver"), token=TOKEN, user="admin", authorization_mode="RBAC"
    ) as config:
        _prepare(config)
        yield config


def admin(config: Path) -> kubernetes.client.ApiClient:
    return cluster.api_client(str(config))


def as_account(config: Path, account: str) -> kubernetes.client.ApiClient:
    """The hook's service account, impersonated: only the chart's RBAC applies."""
    api = admin(config)
    api.set_default_header(
        "Impersonate-User", f"system:serviceaccount:{RELEASE_NAMESPACE}:{account}"
    )
    return api


def rendered_hooks(*sets: str) -> list[dict[str, Any]]:
    args = [str(BINARIES / "helm"), "template", RELEASE, str(CHART), "-n", RELEASE_NAMESPACE]
    for pair in sets:
        args += ["--set", pair]
    result = subprocess.run(args, capture_output=True, text=True, check=True, timeout=120)
    return [
        d
        for d in yaml.safe_load_all(result.stdout)
        if d and "helm.sh/hook" in (d["metadata"].get("annotations") or {})
    ]


def create_rbac(config: Path, documents: list[dict[str, Any]]) -> None:
    """The hook's ServiceAccount, roles and bindings, as helm would create them."""
    api = admin(config)
    rbac, core = kubernetes.client.RbacAuthorizationV1Api(api), kubernetes.client.CoreV1Api(api)
    for document in documents:
        namespace = document["metadata"].get("namespace", "")
        body = copy.deepcopy(document)
        try:
            if body["kind"] == "ServiceAccount":
                core.create_namespaced_service_account(namespace, body)
            elif body["kind"] == "ClusterRole":
                rbac.create_cluster_role(body)
            elif body["kind"] == "ClusterRoleBinding":
                rbac.create_cluster_role_binding(body)
            elif body["kind"] == "Role":
                rbac.create_namespaced_role(namespace, body)
            elif body["kind"] == "RoleBinding":
                rbac.create_namespaced_role_binding(namespace, body)
        except kubernetes.client.exceptions.ApiException as error:
            if error.status != 409:
                raise


def chart_crd_files() -> dict[str, str]:
    return cluster.read_crd_files(CHART / "crds")


def _prepare(config: Path) -> None:
    """Namespaces; the InferenceService CRD as an older chart installed it (shortName
    `fisold`); the upgrade hook's RBAC; the guard's for watchNamespaces={prod,empty}."""
    api = admin(config)
    core = kubernetes.client.CoreV1Api(api)
    for namespace in (RELEASE_NAMESPACE, "prod", "empty", "other"):
        core.create_namespace({"metadata": {"name": namespace}})
    (crd,) = [d for d in crds.chart_crds(chart_crd_files()) if d["metadata"]["name"] == CRD_NAME]
    older = copy.deepcopy(crd)
    older["spec"]["names"]["shortNames"] = ["fisold"]
    older["spec"]["versions"][0]["additionalPrinterColumns"].append(
        {"name": "Dropped", "type": "string", "jsonPath": ".spec.replicas"}
    )
    kubernetes.client.ApiextensionsV1Api(api).create_custom_resource_definition(older)
    create_rbac(config, rendered_hooks())
    create_rbac(config, rendered_hooks("watchNamespaces={prod,empty}"))
    # Created as `helm install` creates it (a plain create, not an apply).
    deadline = time.monotonic() + 60
    while not crds.establishment(read_crd(config, CRD_NAME)).established:
        assert time.monotonic() < deadline, "the installed CRD never became Established"
        time.sleep(0.2)


def read_crd(config: Path, name: str) -> dict[str, Any]:
    extensions = kubernetes.client.ApiextensionsV1Api(admin(config))
    response = extensions.read_custom_resource_definition(name, _preload_content=False)
    return dict(yaml.safe_load(response.data))


def create_service(config: Path, namespace: str, name: str, finalizer: bool = False) -> None:
    objects = kubernetes.client.CustomObjectsApi(admin(config))
    metadata: dict[str, Any] = {"name": name}
    if finalizer:
        metadata["finalizers"] = [FINALIZER]
    body = {"apiVersion": f"{SERVICE_GROUP}/{SERVICE_VERSION}", "kind": "InferenceService",
            "metadata": metadata, "spec": SPEC}  # fmt: skip
    deadline = time.monotonic() + 30
    while True:
        try:
            objects.create_namespaced_custom_object(
                SERVICE_GROUP, SERVICE_VERSION, namespace, SERVICE_PLURAL, body
            )
            return
        except kubernetes.client.exceptions.ApiException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)  # served a moment after Established


def service_names(config: Path, namespace: str) -> list[str]:
    objects = kubernetes.client.CustomObjectsApi(admin(config))
    listed = objects.list_namespaced_custom_object(
        SERVICE_GROUP, SERVICE_VERSION, namespace, SERVICE_PLURAL
    )
    return sorted(item["metadata"]["name"] for item in listed["items"])  # type: ignore[index]


def test_apply_crds_names_a_crd_the_cluster_lacks_and_may_not_create_it(kubeconfig: Path) -> None:
    hook = as_account(kubeconfig, f"{RELEASE}-operator-crds")
    with pytest.raises(
        cluster.HookRefused, match="CRD clusterkopfpeerings.kopf.dev does not exist"
    ):
        cluster.apply_crds(hook, crds.chart_crds(chart_crd_files()), timeout_seconds=30)
    # Checked before anything changed: the installed CRD is as it was.
    assert read_crd(kubeconfig, CRD_NAME)["spec"]["names"]["shortNames"] == ["fisold"]


def test_apply_crds_upgrades_the_installed_crds_as_the_hook_account(kubeconfig: Path) -> None:
    api = admin(kubeconfig)
    extensions = kubernetes.client.ApiextensionsV1Api(api)
    for document in crds.chart_crds(chart_crd_files()):  # the peerings, as helm installs them
        if document["metadata"]["name"] != CRD_NAME:
            extensions.create_custom_resource_definition(document)
    assert read_crd(kubeconfig, CRD_NAME)["spec"]["names"]["shortNames"] == ["fisold"]

    hook = as_account(kubeconfig, f"{RELEASE}-operator-crds")
    names = cluster.apply_crds(hook, crds.chart_crds(chart_crd_files()), timeout_seconds=60)

    assert names == [CRD_NAME, "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"]
    upgraded = read_crd(kubeconfig, CRD_NAME)
    assert upgraded["spec"]["names"]["shortNames"] == ["fis"]
    assert upgraded["status"]["acceptedNames"]["shortNames"] == ["fis"]
    columns = [c["name"] for c in upgraded["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert "Dropped" not in columns and "Ready" in columns  # a dropped field is dropped
    managers = {entry["manager"] for entry in upgraded["metadata"]["managedFields"]}
    assert cluster.FIELD_MANAGER in managers
    # The new short name is served: the changed field took effect.
    resources = kubernetes.client.CustomObjectsApi(api).get_api_resources(
        SERVICE_GROUP, SERVICE_VERSION
    )
    assert any(r.short_names == ["fis"] for r in resources.resources)


def test_the_apply_crds_command_reads_the_mounted_files_and_exits_by_outcome(
    kubeconfig: Path, tmp_path: Path
) -> None:
    def command(crds_dir: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "fusebox_operator.chart_hooks", "--kubeconfig",
             str(kubeconfig), "apply-crds", "--crds-dir", str(crds_dir)],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip

    done = command(CHART / "crds")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        f"applied and Established: {CRD_NAME}, clusterkopfpeerings.kopf.dev, kopfpeerings.kopf.dev"
    )
    (tmp_path / "extra.yaml").write_text("apiVersion: v1\nkind: Secret\nmetadata: {name: x}\n")
    refused = command(tmp_path)
    assert refused.returncode == 3  # a file the chart ships would fail every retry
    assert "extra.yaml: a Secret is not an apiextensions.k8s.io/v1 CustomResourceDefinition" in (
        refused.stderr
    )


def test_apply_crds_reports_a_crd_the_api_server_refuses_by_name(kubeconfig: Path) -> None:
    """Refused (exit 3, no retry), and before any CRD changed: every apply is tried as a
    dry run first, so a valid CRD listed before the refused one is left as it was."""
    crd, peering, *_ = crds.chart_crds(chart_crd_files())
    changed = copy.deepcopy(crd)
    changed["spec"]["names"]["shortNames"] = ["fisnew"]
    bad = copy.deepcopy(peering)
    bad["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["type"] = "sometimes"
    before = read_crd(kubeconfig, CRD_NAME)["spec"]["names"]["shortNames"]
    hook = as_account(kubeconfig, f"{RELEASE}-operator-crds")
    with pytest.raises(cluster.HookRefused) as refused:
        cluster.apply_crds(hook, [changed, bad], timeout_seconds=30)
    message = str(refused.value)
    name = peering["metadata"]["name"]
    assert message.startswith(f"CRD {name}: the API server refused the upgrade (Invalid)")
    assert "sometimes" in message
    # Nothing was changed: neither the refused CRD nor the valid one before it.
    assert (
        read_crd(kubeconfig, name)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["type"]
        == "object"
    )
    assert read_crd(kubeconfig, CRD_NAME)["spec"]["names"]["shortNames"] == before != ["fisnew"]


def guard_account(config: Path) -> kubernetes.client.ApiClient:
    return as_account(config, f"{RELEASE}-operator-uninstall-guard")


def test_guard_uninstall_refuses_naming_the_services_where_the_operator_watches(
    kubeconfig: Path,
) -> None:
    create_service(kubeconfig, "prod", "chat")
    create_service(kubeconfig, "prod", "embed")
    create_service(kubeconfig, "other", "unwatched")
    scope = services.namespace_scope(("prod", "empty"))
    with pytest.raises(cluster.HookError) as refused:
        cluster.guard_uninstall(
            guard_account(kubeconfig), scope, RELEASE, RELEASE_NAMESPACE, False, 10
        )
    message = str(refused.value)
    assert "2 InferenceServices remain" in message and "prod/chat, prod/embed." in message
    assert "unwatched" not in message
    assert service_names(kubeconfig, "prod") == ["chat", "embed"]  # nothing deleted

    # The Job's command: exit 3 (refused: the Job's podFailurePolicy fails it at once),
    # the same message on stderr with the revision to roll back to.
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    result = subprocess.run(
        [sys.executable, "-m", "fusebox_operator.chart_hooks", "--kubeconfig", str(kubeconfig),
         "guard-uninstall", f"--release={RELEASE}", f"--release-namespace={RELEASE_NAMESPACE}",
         "--revision=7", "--watch-namespaces=prod"],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 3, result.stderr
    assert "prod/chat, prod/embed" in result.stderr
    assert f"helm rollback {RELEASE} 7 -n {RELEASE_NAMESPACE}" in result.stderr


def test_guard_uninstall_passes_when_no_service_remains(kubeconfig: Path) -> None:
    scope = services.namespace_scope(("empty",))
    deleted = cluster.guard_uninstall(
        guard_account(kubeconfig), scope, RELEASE, RELEASE_NAMESPACE, False, 10
    )
    assert deleted == []


def test_delete_services_deletes_them_and_waits_for_the_finalizer_release(
    kubeconfig: Path,
) -> None:
    create_service(kubeconfig, "empty", "held", finalizer=True)
    create_service(kubeconfig, "empty", "free")
    scope = services.namespace_scope(("empty",))
    # Without delete rights (the default guard's role) the deletion is refused, named.
    with pytest.raises(cluster.HookError, match="deleting InferenceService empty/free failed"):
        cluster.guard_uninstall(
            guard_account(kubeconfig), scope, RELEASE, RELEASE_NAMESPACE, True, 5
        )
    # The chart's rules with uninstall.deleteServices, bound to the same account.
    deleting = rendered_hooks("watchNamespaces={empty}", "uninstall.deleteServices=true")
    for document in deleting:
        if document["kind"] in ("Role", "RoleBinding"):
            document["metadata"]["name"] += "-deleting"
            if document["kind"] == "RoleBinding":
                document["roleRef"]["name"] += "-deleting"
    create_rbac(kubeconfig, [d for d in deleting if d["kind"] in ("Role", "RoleBinding")])

    objects = kubernetes.client.CustomObjectsApi(admin(kubeconfig))

    def operator_releases_finalizer() -> None:
        """What the running operator does for a deleted service: drop its finalizer."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            held = objects.get_namespaced_custom_object(
                SERVICE_GROUP, SERVICE_VERSION, "empty", SERVICE_PLURAL, "held"
            )
            if held["metadata"].get("deletionTimestamp"):  # type: ignore[index]
                objects.patch_namespaced_custom_object(
                    SERVICE_GROUP, SERVICE_VERSION, "empty", SERVICE_PLURAL, "held",
                    {"metadata": {"finalizers": None}},
                )  # fmt: skip
                return
            time.sleep(0.2)

    operator = threading.Thread(target=operator_releases_finalizer)
    operator.start()
    try:
        deleted = cluster.guard_uninstall(
            guard_account(kubeconfig), scope, RELEASE, RELEASE_NAMESPACE, True, 30
        )
    finally:
        operator.join(timeout=40)
    assert [str(s) for s in deleted] == ["empty/free", "empty/held"]
    assert service_names(kubeconfig, "empty") == []


def test_delete_services_names_those_whose_finalizer_is_never_released(
    kubeconfig: Path,
) -> None:
    create_service(kubeconfig, "empty", "stuck", finalizer=True)
    scope = services.namespace_scope(("empty",))
    try:
        with pytest.raises(cluster.HookError) as waited:
            cluster.guard_uninstall(
                guard_account(kubeconfig), scope, RELEASE, RELEASE_NAMESPACE, True, 2
            )
        assert "after 2s 1 still exist: empty/stuck" in str(waited.value)
    finally:
        kubernetes.client.CustomObjectsApi(admin(kubeconfig)).patch_namespaced_custom_object(
            SERVICE_GROUP, SERVICE_VERSION, "empty", SERVICE_PLURAL, "stuck",
            {"metadata": {"finalizers": None}},
        )  # fmt: skip


def test_every_hook_object_passes_the_api_servers_validation_and_restricted_admission(
    kubeconfig: Path,
) -> None:
    """Server-side dry runs of each rendered hook object, and of a Pod made from each
    hook Job's template in a namespace that enforces restricted Pod Security (the
    admission checks Pods, not the Jobs that make them)."""
    namespace = "hooks-restricted"
    kubernetes.client.CoreV1Api(admin(kubeconfig)).create_namespace(
        {"metadata": {"name": namespace,
                      "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}
    )  # fmt: skip
    args = [str(BINARIES / "helm"), "template", "dry", str(CHART), "-n", namespace]
    for sets in ((), ("watchNamespaces={prod}", "uninstall.deleteServices=true")):
        pairs = [part for pair in sets for part in ("--set", pair)]
        rendered = subprocess.run(
            [*args, *pairs], capture_output=True, text=True, check=True, timeout=120
        ).stdout
        documents = [
            d
            for d in yaml.safe_load_all(rendered)
            if d and "helm.sh/hook" in (d["metadata"].get("annotations") or {})
        ]
        pods = [
            {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": f"{job['metadata']['name']}-pod", "namespace": namespace},
             "spec": job["spec"]["template"]["spec"]}
            for job in documents
            if job["kind"] == "Job"
        ]  # fmt: skip
        assert len(pods) == 2
        # A Pod's admission needs its ServiceAccount to exist: those are created.
        accounts = [d for d in documents if d["kind"] == "ServiceAccount"]
        create_rbac(kubeconfig, accounts)
        documents = [d for d in documents if d["kind"] != "ServiceAccount"]
        result = subprocess.run(
            [str(BINARIES / "kubectl"), f"--kubeconfig={kubeconfig}", "create",
             "--dry-run=server", "-f", "-"],
            input=yaml.safe_dump_all([*documents, *pods]),
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert "Warning" not in result.stderr, result.stderr
