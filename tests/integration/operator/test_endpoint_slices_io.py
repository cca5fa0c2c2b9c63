"""The EndpointSlice watch against a real kube-apiserver and the real slice controller.

Etcd, the API server and kube-controller-manager running only its EndpointSlice
controller, on loopback; a Node and pods made through the API (no kubelet: a
pod's Ready and IP are written to its status as a kubelet would). The operator's
own Kube watches the slices as the operator's ServiceAccount, impersonated, so
only the role in operator/rbac/ applies:
- the controller's slices of the Service the operator renders carry its
  `fusebox.dev/service` label, so the watch's selector finds them, and list the
  pod by targetRef: the serving pod is not missing;
- with the controller stopped, a pod made Ready after it is in no slice, and
  the judgement names it (the outage this check exists for); reading the store
  asks the API server nothing;
- a role without the endpointslices rule is refused, and the store says so in
  the words Ready carries.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from fusebox_operator import manifests
from fusebox_operator.endpoints import EndpointMemory, judge_endpoints
from fusebox_operator.kube import Kube
from fusebox_operator.pod_view import pod_view
from fusebox_operator.settings import OperatorSettings

from .loopback_apiserver import (
    BINARIES,
    REPO,
    free_port,
    kube_as,
    loopback_apiserver,
    skip_without_binaries,
)
from .loopback_apiserver import kubectl_ok as kubectl

pytestmark = pytest.mark.integration

TOKEN = "endpoint-slices-test-token"
NAMESPACE = "ml"
NAME = "chat"
OPERATOR = "system:serviceaccount:fusebox-system:fusebox-operator"
UNGRANTED = "system:serviceaccount:fusebox-system:no-slices"


def wait_for(what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def make_ready_pod(config: Path, name: str, ip: str) -> None:
    """A pod of the service on node n1, then its status as the kubelet would post it."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"fusebox.dev/service": NAME}},
        "spec": {
            "nodeName": "n1",
            "containers": [
                {"name": "server", "image": "x", "ports": [{"name": "http", "containerPort": 8000}]}
            ],
        },
    }
    kubectl(config, "apply", "-f", "-", stdin=json.dumps(pod))
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status = {
        "status": {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}],
        }
    }
    kubectl(
        config, "-n", NAMESPACE, "patch", "pod", name, "--subresource=status",
        "--type=merge", "-p", json.dumps(status),
    )  # fmt: skip


def requests(config: Path, resource: str) -> float:
    """apiserver_request_total of one resource, every verb, from the server."""
    text = kubectl(config, "get", "--raw", "/metrics")
    total = 0.0
    for line in text.splitlines():
        if line.startswith("apiserver_request_total{") and f'resource="{resource}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    skip_without_binaries("kubectl", "kube-controller-manager")
    with loopback_apiserver(
        tmp_path_factory.mktemp("apiserver"), token=TOKEN, user="admin", authorization_mode="RBAC"
    ) as config:
        kubectl(config, "create", "namespace", NAMESPACE)
        # No ServiceAccount controller runs: the pods' default account, made by hand.
        kubectl(config, "-n", NAMESPACE, "create", "serviceaccount", "default")
        kubectl(config, "create", "namespace", "fusebox-system")
        for part in ("serviceaccount", "clusterrole", "clusterrolebinding"):
            kubectl(config, "apply", "-f", str(REPO / "operator" / "rbac" / f"{part}.yaml"))
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}
        kubectl(config, "apply", "-f", "-", stdin=json.dumps(node))
        service = manifests.build_service(NAME, NAMESPACE)  # the child the operator renders
        kubectl(config, "apply", "-f", "-", stdin=yaml.safe_dump(service))
        yield config


@pytest.fixture(scope="module")
def slice_controller(
    kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[subprocess.Popen[bytes]]:
    """kube-controller-manager with the EndpointSlice controller alone; a test stops it."""
    log = (tmp_path_factory.mktemp("controller") / "controller.log").open("w")
    controller = subprocess.Popen(
        [
            str(BINARIES / "kube-controller-manager"),
            f"--kubeconfig={kubeconfig}",
            "--controllers=endpointslice-controller",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
            f"--cert-dir={tmp_path_factory.mktemp('controller-certs')}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    try:
        yield controller
    finally:
        controller.terminate()
        controller.wait(timeout=30)
        log.close()


def watching_as(config: Path, user: str) -> Kube:
    kube = kube_as(config, user)
    kube.watch_endpoints(OperatorSettings.from_env({}))  # every namespace, as the chart's default
    return kube


def test_the_slice_controllers_slices_reach_the_watch_and_a_pod_made_after_it_stopped_does_not(
    kubeconfig: Path, slice_controller: subprocess.Popen[bytes]
) -> None:
    make_ready_pod(kubeconfig, "chat-a", "10.1.0.1")
    kube = watching_as(kubeconfig, OPERATOR)
    try:

        def listed(pod: str) -> bool:
            read = kube.service_endpoints(NAMESPACE, NAME)
            assert read is not None
            return read.endpoints is not None and pod in read.endpoints.pods

        wait_for("the controller's slice listing chat-a", lambda: listed("chat-a"))
        read = kube.service_endpoints(NAMESPACE, NAME)
        assert read is not None and read.unread_since is None
        # The labels the watch selects on are the Service's, copied by the controller.
        labels = json.loads(
            kubectl(kubeconfig, "-n", NAMESPACE, "get", "endpointslices", "-o", "json")
        )["items"][0]["metadata"]["labels"]
        assert labels["fusebox.dev/service"] == NAME
        assert labels["kubernetes.io/service-name"] == NAME

        slice_controller.terminate()
        slice_controller.wait(timeout=30)
        make_ready_pod(kubeconfig, "chat-b", "10.1.0.2")
        time.sleep(2)  # what the controller would have taken, had it run
        pods = json.loads(kubectl(kubeconfig, "-n", NAMESPACE, "get", "pods", "-o", "json"))[
            "items"
        ]
        views = sorted((pod_view(pod) for pod in pods), key=lambda view: view.name)
        assert [(v.name, v.serving) for v in views] == [("chat-a", True), ("chat-b", True)]
        read = kube.service_endpoints(NAMESPACE, NAME)
        assert read is not None and read.endpoints is not None
        assert read.endpoints.lists(views[0]) and not read.endpoints.lists(views[1])
        gaps, _ = judge_endpoints(read, views, EndpointMemory(), time.time() + 60)
        assert set(gaps.missing) == {"chat-b"}
        assert gaps.note().startswith("1 of 2 Ready pod(s) missing from Service chat's ready")
        # Reads ask the API server nothing: a tick's read costs no request at any scale.
        before = requests(kubeconfig, "endpointslices")
        for _ in range(100):
            kube.service_endpoints(NAMESPACE, NAME)
        assert requests(kubeconfig, "endpointslices") == before
    finally:
        kube.stop_watching()


def test_a_role_without_the_endpointslices_rule_is_said_in_the_words_ready_carries(
    kubeconfig: Path,
) -> None:
    role = yaml.safe_load((REPO / "operator" / "rbac" / "clusterrole.yaml").read_text())
    role["metadata"]["name"] = "no-slices"
    role["rules"] = [r for r in role["rules"] if "endpointslices" not in r["resources"]]
    kubectl(kubeconfig, "apply", "-f", "-", stdin=json.dumps(role))
    kubectl(kubeconfig, "-n", "fusebox-system", "create", "serviceaccount", "no-slices")
    kubectl(
        kubeconfig, "create", "clusterrolebinding", "no-slices", "--clusterrole=no-slices",
        "--serviceaccount=fusebox-system:no-slices",
    )  # fmt: skip
    kube = watching_as(kubeconfig, UNGRANTED)
    try:

        def refused() -> bool:
            read = kube.service_endpoints(NAMESPACE, NAME)
            return read is not None and "403" in read.cause

        wait_for("the watch's LIST refused", refused)
        read = kube.service_endpoints(NAMESPACE, NAME)
        assert read is not None and read.endpoints is None and read.unread_since is not None
        assert read.cause == (
            "the API server answered 403 Forbidden: the operator may not list and watch "
            "endpointslices.discovery.k8s.io"
        )
        gaps, _ = judge_endpoints(read, [], EndpointMemory(), read.unread_since + 30)
        assert gaps.unread.startswith("the API server answered 403 Forbidden")
    finally:
        kube.stop_watching()
