"""The chart against a real API server: strict server-side validation of what
it renders, then a real install whose operator pod becomes Ready, reconciles
the examples, and goes away on uninstall.

The release here is this test's own, watching only its helm-e2e-* namespace
(tests/e2e/helm/conftest.py): the suite's operator release (tests/e2e/operator)
watches e2e-*, so the two never act on the same InferenceService, whatever the
order the tests run in.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ...unit.helm.names import cluster_scoped_name
from ..conftest import helm, wait_established, wait_for

REPO = Path(__file__).resolve().parents[3]
# The Prometheus Operator's own CRDs, copied out of its module by build-binaries.sh.
MONITORING_CRDS = REPO / ".cache" / "monitoring" / "crds"
CHART = REPO / "helm" / "fusebox"
ALL_OPTIONS = REPO / "tests" / "unit" / "helm" / "values" / "all-options.yaml"
EXAMPLES = REPO / "crds" / "examples"


CHART_CRD_NAMES = (
    "inferenceservices.fusebox.dev",
    "clusterkopfpeerings.kopf.dev",
    "kopfpeerings.kopf.dev",
    "podmonitors.monitoring.coreos.com",
    "servicemonitors.monitoring.coreos.com",
)


@pytest.fixture(scope="module")
def chart_crds(cluster: Any) -> Iterator[None]:
    """The chart's CRDs (what `helm install` would create) and the Prometheus Operator's;
    afterwards the ones this module created are deleted (someone else's stay)."""
    existing = {
        name
        for name in CHART_CRD_NAMES
        if cluster.kubectl("get", "crd", name, check=False).returncode == 0
    }
    for path in sorted((CHART / "crds").glob("*.yaml")):
        cluster.kubectl("apply", "-f", str(path))  # as the operator tests apply it
    for name in sorted(set(CHART_CRD_NAMES) - existing):
        plural, group = name.split(".", 1)
        if group == "monitoring.coreos.com":  # server-side: too large for client-side apply
            cluster.kubectl(
                "apply", "--server-side", "-f", str(MONITORING_CRDS / f"{group}_{plural}.yaml")
            )
    wait_established(cluster, *CHART_CRD_NAMES)
    try:
        yield
    finally:
        for name in CHART_CRD_NAMES:
            if name not in existing:
                cluster.kubectl("delete", "crd", name, "--wait=true", "--timeout=60s", check=False)


@pytest.fixture
def second_namespace(cluster: Any) -> Iterator[str]:
    name = f"e2e-helm-b-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def server_dry_run(cluster: Any, namespace: str, *values_args: str) -> str:
    rendered = helm(
        cluster, "template", "fusebox", str(CHART), "--namespace", namespace, *values_args
    )
    applied = cluster.kubectl(
        "apply",
        "--dry-run=server",
        "--validate=strict",
        "-f",
        "-",
        input=rendered.stdout,
        check=False,
    )
    assert applied.returncode == 0, applied.stderr
    return str(applied.stdout)


def test_default_render_passes_strict_server_side_validation(
    cluster: Any, chart_crds: None, namespace: str
) -> None:
    out = server_dry_run(cluster, namespace)
    for kind_name in (
        "serviceaccount/fusebox-operator",
        # Cluster-scoped names carry the release's namespace (two teams, one release name).
        "clusterrole.rbac.authorization.k8s.io/"
        + cluster_scoped_name("fusebox-operator", namespace),
        "deployment.apps/fusebox-operator",
        "service/fusebox-operator",
    ):
        assert f"{kind_name} " in out, out


def test_all_options_render_passes_strict_server_side_validation(
    cluster: Any, chart_crds: None, namespace: str, second_namespace: str
) -> None:
    out = server_dry_run(
        cluster,
        namespace,
        "--values",
        str(ALL_OPTIONS),
        "--set",
        f"watchNamespaces={{{namespace},{second_namespace}}}",
    )
    for kind_name in (
        "podmonitor.monitoring.coreos.com/fusebox-all-inference",
        "configmap/fusebox-all-dashboard",
        "kopfpeering.kopf.dev/fusebox-peers",
        "role.rbac.authorization.k8s.io/fusebox-all",
        "clusterrole.rbac.authorization.k8s.io/"
        + cluster_scoped_name("fusebox-all", namespace, "cluster"),
    ):
        assert f"{kind_name} " in out, out


def operator_pods(cluster: Any, namespace: str, release: str) -> list[dict[str, Any]]:
    out = cluster.kubectl(
        "-n",
        namespace,
        "get",
        "pods",
        "-l",
        f"app.kubernetes.io/name=fusebox-operator,app.kubernetes.io/instance={release}",
        "-o",
        "json",
    ).stdout
    return list(json.loads(out)["items"])


def test_install_runs_the_operator_which_reconciles_the_examples_and_uninstall_removes_it(
    cluster: Any, chart_crds: None, namespace: str, model_claim: str
) -> None:
    if not cluster.local:
        pytest.fail("this test loads images and PVs through localcluster; run it there")
    release = f"fbx-{uuid.uuid4().hex[:6]}"
    try:
        helm(
            cluster,
            "install",
            release,
            str(CHART),
            "--namespace",
            namespace,
            "--set",
            f"watchNamespaces={{{namespace}}}",
            "--set",
            "monitoring.scrapeNamespace=",
            # The chart's upgrade and uninstall hooks stay off here, as before they
            # existed (tests/unit/helm and tests/integration/operator test them); the
            # `finally` below must uninstall even when a failed step left services.
            "--set",
            "crds.upgradeOnHelmUpgrade=false",
            "--set",
            "uninstall.guard=false",
            "--wait",
            "--timeout",
            "4m",
        )
        pods = operator_pods(cluster, namespace, release)
        assert len(pods) == 1
        ready = {c["type"]: c["status"] for c in pods[0]["status"]["conditions"]}
        assert ready["Ready"] == "True"
        assert pods[0]["spec"]["containers"][0]["image"] == "localhost/fusebox/operator:dev"

        names = []
        for example in sorted(EXAMPLES.glob("*.yaml")):
            document = yaml.safe_load(example.read_text())
            document["metadata"]["namespace"] = namespace
            cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(document, allow_unicode=True))
            names.append(document["metadata"]["name"])
        for name in names:
            wait_for(
                f"deployment/{name} created by the operator",
                lambda name=name: cluster.kubectl(
                    "-n", namespace, "get", "deployment", name, "-o", "name", check=False
                ).stdout.strip(),
                timeout=180,
            )
            owner = cluster.kubectl(
                "-n",
                namespace,
                "get",
                "deployment",
                name,
                "-o",
                "jsonpath={.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}",
            ).stdout
            assert owner == f"InferenceService/{name}"

        # The operator in the pod acts on them: it is the only one watching this
        # namespace, so its reconcile handler made the Deployments above.
        def acted() -> bool:
            log = cluster.kubectl("-n", namespace, "logs", pods[0]["metadata"]["name"]).stdout
            lines = log.splitlines()
            return all(
                any(
                    f"{namespace}/{name}]" in line and "Handler 'reconcile" in line
                    for line in lines
                )
                for name in names
            )

        wait_for("the installed operator's handlers to run on the examples", acted, timeout=120)
        # Least privilege as the API server sees it: namespaced rights only here.
        account = f"system:serviceaccount:{namespace}:{release}-operator"
        for verb, resource, where, allowed in (
            ("delete", "pods", namespace, "yes"),
            ("delete", "pods", "kube-system", "no"),
            ("get", "secrets", namespace, "yes"),
            ("list", "secrets", namespace, "no"),
            ("create", "pods", namespace, "no"),
            ("list", "nodes", "", "yes"),
        ):
            scope = ["-n", where] if where else []
            answer = cluster.kubectl(
                "auth", "can-i", verb, resource, *scope, f"--as={account}", check=False
            ).stdout.strip()
            assert answer == allowed, (verb, resource, where, answer)
        # kopf's finalizer needs the operator: delete the services while it runs.
        for name in names:
            cluster.kubectl("-n", namespace, "delete", "fis", name, "--wait=true", "--timeout=90s")
        helm(cluster, "uninstall", release, "--namespace", namespace, "--wait", "--timeout", "2m")
        wait_for(
            "the operator pods to be gone after helm uninstall",
            lambda: not operator_pods(cluster, namespace, release) or None,
            timeout=120,
        )
        assert (
            cluster.kubectl(
                "-n", namespace, "get", "deployment", f"{release}-operator", check=False
            ).returncode
            != 0
        )
        assert (
            cluster.kubectl(
                "get",
                "clusterrole",
                cluster_scoped_name(f"{release}-operator", namespace, "cluster"),
                check=False,
            ).returncode
            != 0
        )
    finally:
        helm_bin = cluster.bin_dir / "helm"
        subprocess.run(
            [
                str(helm_bin),
                f"--kubeconfig={cluster.kubeconfig}",
                "uninstall",
                release,
                "-n",
                namespace,
            ],
            capture_output=True,
            check=False,
            timeout=120,
        )
        for name in ("cpu-chat", "llama-chat", "tiny-chat"):  # only if a step above failed
            cluster.kubectl(
                "-n",
                namespace,
                "patch",
                "fis",
                name,
                "--type",
                "merge",
                "-p",
                '{"metadata":{"finalizers":null}}',
                check=False,
            )
            cluster.kubectl("-n", namespace, "delete", "fis", name, "--wait=false", check=False)
