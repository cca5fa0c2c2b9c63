"""The chart's hooks as a platform team meets them: `helm install` with its CRDs, then
`helm upgrade` (the pre-upgrade Job re-applies crds/), an upgrade to a chart whose CRDs
the API server refuses (refused at once, nothing changed), then `helm uninstall` while an
InferenceService is left (the pre-delete Job refuses at once, naming it, and helm shows
why), then the way on its message gives: `helm rollback` (a refused uninstall leaves
the release "uninstalling", which `helm upgrade` refuses), `helm upgrade --set
uninstall.deleteServices=true` and uninstall again (the Job deletes the service while
the operator still runs).

Every step runs the hook Jobs as Jobs: the operator's image pulled by the kubelet, the
chart's ServiceAccounts, RBAC and NetworkPolicy, in-cluster credentials, restricted Pod
Security. The units (tests/unit/helm, tests/integration/operator/test_chart_hooks_io.py)
prove the rendered objects and the module's calls; only this proves they meet.

It runs on the multinode cluster, the side lane's (scripts/test-all.sh), before the
modules that stop its nodes; it leaves no CRD it created, so the operator modules after
it start as they would alone.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ..conftest import Cluster, helm, remove_inference_services, wait_for
from ..localcluster.conftest import Kube
from ..operator.conftest import CHART, OperatorRelease, base_spec

pytestmark = [pytest.mark.e2e]

CHART_CRDS = sorted((CHART / "crds").glob("*.yaml"))
SERVICES_CRD = "inferenceservices.fusebox.dev"
HOOK_TIMEOUT = "4m"


def crd_names() -> list[str]:
    return [
        document["metadata"]["name"]
        for path in CHART_CRDS
        for document in yaml.safe_load_all(path.read_text())
        if document
    ]


def chart_short_names() -> list[str]:
    for path in CHART_CRDS:
        for document in yaml.safe_load_all(path.read_text()):
            if document and document["metadata"]["name"] == SERVICES_CRD:
                return list(document["spec"]["names"]["shortNames"])
    raise AssertionError(f"{SERVICES_CRD} is not in {CHART / 'crds'}")


@pytest.fixture
def chart_crds_left_as_found(multinode: Cluster) -> Iterator[None]:
    """`helm install` creates the chart's CRDs; afterwards those it created are deleted."""
    existing = {
        name
        for name in crd_names()
        if multinode.kubectl("get", "crd", name, check=False).returncode == 0
    }
    try:
        yield
    finally:
        for name in sorted(set(crd_names()) - existing):
            multinode.kubectl(
                "delete", "crd", name, "--wait=true", "--timeout=60s", check=False, timeout=90
            )


def run_helm(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    """helm, its failure returned rather than raised (a refused uninstall is the point)."""
    return subprocess.run(
        [str(cluster.bin_dir / "helm"), f"--kubeconfig={cluster.kubeconfig}", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=420,
    )


def crd(cluster: Cluster, name: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(
        cluster.kubectl("get", "crd", name, "--show-managed-fields", "-o", "json").stdout
    )
    return document


def broken_chart(folder: Path) -> Path:
    """The chart with the InferenceService CRD's short names changed (valid) and the
    kopfpeerings CRD's schema made invalid: listed in that order, the valid one first."""
    chart = folder / "fusebox"
    shutil.copytree(CHART, chart)
    services = chart / "crds" / "inferenceservice.yaml"
    text = services.read_text()
    assert "shortNames: [fis]\n" in text, "the CRD's short names are written another way now"
    services.write_text(text.replace("shortNames: [fis]\n", "shortNames: [fisnew]\n"))
    peerings = chart / "crds" / "kopf-peerings.yaml"
    documents = [d for d in yaml.safe_load_all(peerings.read_text()) if d]
    for document in documents:
        if document["metadata"]["name"] == "kopfpeerings.kopf.dev":
            document["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["type"] = "sometimes"
    peerings.write_text(yaml.safe_dump_all(documents))
    return chart


def assert_failed_at_once(job: dict[str, Any]) -> None:
    """A refusal is not retried (exit 3, the Job's podFailurePolicy): one pod, one log."""
    assert job["status"].get("failed") == 1, job["status"]
    failed = [c for c in job["status"]["conditions"] if c["type"] == "Failed"]
    assert failed and failed[0]["reason"] == "PodFailurePolicy", job["status"]


def test_upgrade_reapplies_the_crds_and_uninstall_is_guarded_by_hook_jobs(
    multinode: Cluster,
    inference_nodes: list[str],  # every node holds the operator's image (the hooks' image)
    chart_crds_left_as_found: None,
    mkube: Kube,
    tmp_path: Path,
) -> None:
    suffix = uuid.uuid4().hex[:6]
    release = OperatorRelease(multinode, mkube.namespace, f"fbx-hooks-{suffix}")
    service = f"hooked-{suffix}"
    values = ("--set-json", f"watchNamespaces={json.dumps([mkube.namespace])}")
    try:
        # A day-one install: the chart's CRDs from crds/, its hooks on (the default).
        helm(
            multinode,
            *("install", release.release, str(CHART), "--namespace", mkube.namespace),
            *values,
            *("--wait", "--timeout", HOOK_TIMEOUT),
            timeout=420,
        )
        wait_for(
            "the operator pod Ready", release.ready_pod, timeout=120, diagnose=release.describe
        )
        assert crd(multinode, SERVICES_CRD)["spec"]["names"]["shortNames"] == chart_short_names()

        # Someone edits the CRD by hand; the next `helm upgrade` puts crds/ back first.
        edit = [{"op": "replace", "path": "/spec/names/shortNames", "value": ["fisold"]}]
        multinode.kubectl("patch", "crd", SERVICES_CRD, "--type=json", "-p", json.dumps(edit))
        upgraded = run_helm(
            multinode,
            *("upgrade", release.release, str(CHART), "--namespace", mkube.namespace),
            *("--reuse-values", "--wait", "--timeout", HOOK_TIMEOUT),
        )
        assert upgraded.returncode == 0, f"helm upgrade: {upgraded.stderr}\n{release.describe()}"
        applied = crd(multinode, SERVICES_CRD)
        assert applied["spec"]["names"]["shortNames"] == chart_short_names()
        managers = {entry["manager"] for entry in applied["metadata"]["managedFields"]}
        assert "fusebox-chart" in managers, managers
        # hook-succeeded: the Job and its objects are gone after a success.
        left = mkube("get", "jobs,configmaps,serviceaccounts", "-o", "name").stdout.split()
        assert not [name for name in left if name.endswith(f"{release.release}-operator-crds")]

        # A chart whose CRDs the API server refuses: the upgrade fails at once, helm's
        # output names the CRD and the reason, and no CRD changed (each apply is tried
        # as a dry run first), not even the valid one applied before the refused one.
        refused_upgrade = run_helm(
            multinode,
            *("upgrade", release.release, str(broken_chart(tmp_path)), "-n", mkube.namespace),
            *("--reuse-values", "--wait", "--timeout", HOOK_TIMEOUT),
        )
        assert refused_upgrade.returncode != 0, refused_upgrade.stdout
        assert "CRD kopfpeerings.kopf.dev: the API server refused the upgrade (Invalid)" in (
            refused_upgrade.stderr
        ), refused_upgrade.stderr
        assert crd(multinode, SERVICES_CRD)["spec"]["names"]["shortNames"] == chart_short_names()
        assert_failed_at_once(mkube.get("job", f"{release.release}-operator-crds"))
        assert release.ready_pod() is not None, "a refused upgrade left the operator running"
        history = helm(multinode, "history", release.release, "-n", mkube.namespace, "-o", "json")
        states = [(entry["revision"], entry["status"]) for entry in json.loads(history.stdout)]
        assert states[-2:] == [(2, "deployed"), (3, "failed")], states

        # A service the operator holds (kopf's finalizer): uninstall must not strand it.
        mkube.apply(
            {
                "apiVersion": "fusebox.dev/v1alpha1",
                "kind": "InferenceService",
                "metadata": {"name": service},
                "spec": base_spec(),
            }
        )
        wait_for(
            f"the operator's finalizer on {service}",
            lambda: mkube.get("inferenceservice", service)["metadata"].get("finalizers"),
            timeout=120,
            diagnose=release.logs,
        )
        refused = run_helm(
            multinode, "uninstall", release.release, "--namespace", mkube.namespace, "--wait"
        )
        assert refused.returncode != 0, refused.stdout
        # helm prints the failed hook's log (hook-output-log-policy: hook-failed).
        assert f"{mkube.namespace}/{service}" in refused.stderr, refused.stderr
        assert "uninstall.deleteServices" in refused.stderr, refused.stderr
        assert release.ready_pod() is not None, "a refused uninstall left the operator running"
        assert mkube.get("inferenceservice", service)["metadata"]["name"] == service
        assert_failed_at_once(mkube.get("job", f"{release.release}-operator-uninstall-guard"))

        # Asked to, the guard deletes it while the operator runs, then helm goes on. The
        # refusal left the release "uninstalling", which `helm upgrade` refuses: first
        # the rollback the message names, to the revision being uninstalled (the last in
        # the history: the refused upgrade's, 3, which changed nothing but its record).
        rollback = re.search(r"`(helm rollback \S+ (\d+) -n \S+)`", refused.stderr)
        assert rollback and rollback.group(2) == "3", refused.stderr
        helm(multinode, *rollback.group(1).split()[1:], "--wait", timeout=300)
        upgraded = run_helm(
            multinode,
            *("upgrade", release.release, str(CHART), "--namespace", mkube.namespace),
            *("--reuse-values", "--set", "uninstall.deleteServices=true"),
            *("--wait", "--timeout", HOOK_TIMEOUT),
        )
        assert upgraded.returncode == 0, f"helm upgrade: {upgraded.stderr}\n{release.describe()}"
        removed = run_helm(
            multinode, "uninstall", release.release, "--namespace", mkube.namespace, "--wait"
        )
        assert removed.returncode == 0, f"helm uninstall: {removed.stderr}"
        listed = mkube("get", "inferenceservices", "-o", "name").stdout.split()
        assert listed == [], listed
        wait_for(
            "the operator pods gone after helm uninstall",
            lambda: not release.pods() or None,
            timeout=120,
        )
    finally:
        remove_inference_services(multinode, mkube.namespace)
        run_helm(
            multinode, "uninstall", release.release, "--namespace", mkube.namespace,
            "--no-hooks", "--wait",
        )  # fmt: skip
