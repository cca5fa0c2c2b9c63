"""Helpers for localcluster's own e2e tests: restricted pods of the test app, waits, HTTP.

`kube` binds the session's cluster to the test's namespace; `testapp_pod`
builds a pod that passes the `restricted` Pod Security Standard and runs
localhost/fusebox/testapp (localcluster/images/testapp). `module_kube` is
the same for a namespace that lives as long as the test module, for tests
that share objects made once (restarts keep them; each policy check reuses
the pods).
"""

from __future__ import annotations

import copy
import json
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from localcluster.addons import RESTRICTED_CONTAINER_SECURITY

from ..conftest import wait_for

TESTAPP_IMAGE = "localhost/fusebox/testapp:latest"


def testapp_container(name: str = "app", **extra: Any) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": name,
        "image": TESTAPP_IMAGE,
        "imagePullPolicy": "Never",
        "ports": [{"containerPort": 8080}],
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        ],
        "securityContext": copy.deepcopy(RESTRICTED_CONTAINER_SECURITY),
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "96Mi"}},
        # Ready only once the app answers: by then its SIGTERM handler is installed
        # and its start-up line logged.
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": 8080}, "periodSeconds": 1},
    }
    container.update(extra)
    # None removes a default (e.g. the probe from a container running another command).
    return {k: v for k, v in container.items() if v is not None}


def testapp_pod_spec(**extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 5,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "runAsGroup": 65532,
            "fsGroup": 65532,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [testapp_container()],
    }
    spec.update(extra)
    return spec


def testapp_pod(name: str, labels: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {"app": name}},
        "spec": testapp_pod_spec(**extra),
    }


def eventually(
    probe: Callable[[], Any],
    *,
    timeout_seconds: float = 90,
    interval_seconds: float = 1.0,
    what: str = "condition",
) -> Any:
    """Poll probe until it returns something truthy; fail with the last value."""
    return wait_for(what, probe, timeout=timeout_seconds, every=interval_seconds)


def http_get_json(url: str, timeout_seconds: float = 5) -> dict[str, Any]:
    # Straight to the pod or Service: never through a proxy from the environment.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout_seconds) as response:
        result: dict[str, Any] = json.loads(response.read())
        return result


class Kube:
    """kubectl in one namespace, plus the builders and waits the tests need.

    The builders hang off this fixture because test modules cannot import a
    conftest under --import-mode=importlib.
    """

    testapp_pod = staticmethod(testapp_pod)
    testapp_container = staticmethod(testapp_container)
    testapp_pod_spec = staticmethod(testapp_pod_spec)
    eventually = staticmethod(eventually)
    http_get_json = staticmethod(http_get_json)

    def __init__(self, cluster: Any, namespace: str) -> None:
        self.cluster = cluster
        self.namespace = namespace

    def __call__(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> Any:
        return self.cluster.kubectl(
            "-n", self.namespace, *args, input=input, check=check, timeout=timeout
        )

    def apply(self, *objects: dict[str, Any], check: bool = True) -> Any:
        body = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
        return self("apply", "-f", "-", input=body, check=check)

    def get(self, *args: str) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self("get", *args, "-o", "json").stdout)
        return result

    def wait(self, target: str, condition: str, timeout_seconds: int = 120) -> None:
        self(
            "wait",
            f"--for={condition}",
            target,
            f"--timeout={timeout_seconds}s",
            timeout=timeout_seconds + 30,
        )

    def exec_python(self, pod: str, code: str, container: str | None = None) -> str:
        where = ["-c", container] if container else []
        return str(self("exec", pod, *where, "--", "python3", "-c", code).stdout)


@pytest.fixture
def kube(cluster: Any, namespace: str) -> Kube:
    return Kube(cluster, namespace)


def new_namespace(cluster: Any, stem: str) -> str:
    """A fresh namespace enforcing `restricted`, ready for pods (its ServiceAccount exists)."""
    name = f"e2e-{stem}-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl(
        "label",
        "namespace",
        name,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/warn=restricted",
    )
    cluster.kubectl("-n", name, "wait", "--for=create", "serviceaccount/default", "--timeout=60s")
    return name


@pytest.fixture(scope="module")
def module_kube(cluster: Any, request: pytest.FixtureRequest) -> Iterator[Kube]:
    stem = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_").replace("_", "-")
    name = new_namespace(cluster, stem[:30])
    try:
        yield Kube(cluster, name)
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="module")
def more_namespaces(cluster: Any) -> Iterator[Callable[[str], Kube]]:
    """Make further namespaces (as Kube) on demand; all deleted when the module ends."""
    made: list[str] = []

    def make(stem: str) -> Kube:
        made.append(new_namespace(cluster, stem))
        return Kube(cluster, made[-1])

    try:
        yield make
    finally:
        for name in made:
            cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
