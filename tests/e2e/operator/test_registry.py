"""Issue 35, a private registry as platform teams have: localcluster runs an OCI
registry with htpasswd auth and TLS from the cluster's CA (localcluster/registry.py),
which every node's containerd trusts but holds no credentials for. The operator's
image and its chart are pushed there; the operator is installed from the `oci://`
chart and pulled by digest with the chart's imagePullSecrets (as every release of the
suite is: conftest.LabRegistry); an InferenceService whose image lives there and that
names no pull secret is refused by the registry, which its Ready condition names, and
pulls once its spec.pod.imagePullSecrets names one.

The service runs the operator's image as its server, the smallest one there: what is
under test is the pull, so the pod is expected to pull and then fail as a server,
never to serve (docs/day-one.md's walk serves from the registry's inference image).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from fusebox_contract.names import ConditionType

from ..conftest import Cluster, fresh_namespace, local_claim, wait_for
from .conftest import PULL_SECRET as SECRET
from .conftest import OperatorRelease, apply_service, base_spec, lab_registry

CHART_VERSION_FILE = Path(__file__).resolve().parents[3] / "helm" / "fusebox" / "Chart.yaml"


def chart_version() -> str:
    for line in CHART_VERSION_FILE.read_text().splitlines():
        if line.startswith("version:"):
            return line.split(":", 1)[1].strip().strip('"')
    raise AssertionError(f"no version in {CHART_VERSION_FILE}")


def pull_failure(message: str, image: str) -> bool:
    """Whether a Ready message names a refused pull of `image` (the kubelet's reason,
    ErrImagePull or ImagePullBackOff, with the image; its long cause is cut short)."""
    return "ImagePull" in message and image in message


def refused_for_credentials(cluster: Cluster, namespace: str) -> bool:
    """The kubelet said why: the registry wants credentials the pod did not bring."""
    events = cluster.kubectl("-n", namespace, "get", "events", "-o", "json").stdout
    return any(
        "no basic auth credentials" in e.get("message", "")
        for e in json.loads(events)["items"]
        if e["involvedObject"]["kind"] == "Pod"
    )


def test_the_operator_comes_from_the_registry_and_a_service_pulls_only_with_its_secret(
    cluster: Cluster, crd: None, model_root: Path
) -> None:
    if not cluster.local:
        pytest.skip("the registry is localcluster's own; an external cluster brings its own")
    registry = lab_registry()
    address = registry.address
    assert registry.chart_version == chart_version()  # the checkout's chart was pushed
    suffix = uuid.uuid4().hex[:6]
    with (
        fresh_namespace(cluster, f"reg-{suffix}") as namespace,
        local_claim(cluster, namespace, "models", model_root),
    ):
        release = OperatorRelease(cluster, namespace, f"reg-{suffix}")
        try:
            release.install(*("--set", f"watchNamespaces={{{namespace}}}"))
            (operator_pod,) = release.pods()
            image = operator_pod["spec"]["containers"][0]["image"]
            assert image == f"{address}/fusebox/operator@{registry.operator_digest}", image
            assert operator_pod["spec"]["imagePullSecrets"] == [{"name": SECRET}]
            statuses = operator_pod["status"]["containerStatuses"]
            assert all(s["imageID"].startswith(f"{address}/") for s in statuses), statuses

            private_image = f"{address}/fusebox/operator:dev"
            spec = base_spec(pod={"image": private_image})
            service = apply_service(cluster, namespace, "private", spec)

            def ready_message() -> str:
                return str(service.condition(ConditionType.READY).get("message", ""))

            refused = wait_for(
                "Ready to name the refused pull",
                lambda: pull_failure(ready_message(), private_image) and ready_message(),
                timeout=240,
                diagnose=service.diagnose,
            )
            assert service.condition(ConditionType.READY)["status"] == "False", refused
            assert refused_for_credentials(cluster, namespace), service.diagnose()

            service.kubectl(
                "patch",
                "inferenceservice",
                service.name,
                "--type=merge",
                "-p",
                json.dumps({"spec": {"pod": {"imagePullSecrets": [{"name": SECRET}]}}}),
            )
            wait_for(
                "a pod of the new template pulling with the secret",
                lambda: pulled_with_secret(service.pods()),
                timeout=240,
                diagnose=service.diagnose,
            )
            wait_for(
                "Ready to stop naming a refused pull",
                lambda: not pull_failure(ready_message(), private_image),
                timeout=240,
                diagnose=service.diagnose,
            )
        finally:
            release.uninstall_with_services()


def pulled_with_secret(pods: list[dict[str, Any]]) -> bool:
    """Some pod names the secret and its server container got past the pull: it has an
    image ID, whether it then runs, waits or ended (the image is no server)."""
    return any(
        {"name": SECRET} in (pod["spec"].get("imagePullSecrets") or [])
        and any(
            s.get("imageID")
            for kind in ("initContainerStatuses", "containerStatuses")  # the sidecar is native
            for s in pod["status"].get(kind) or []
        )
        for pod in pods
    )
