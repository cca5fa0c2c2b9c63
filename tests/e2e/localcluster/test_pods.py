"""Pods behave as on a real node: Pod Security, GPUs, memory limits, volumes, probes, signals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]


def _container_status(kube: Any, pod: str, container: str = "app") -> dict[str, Any]:
    statuses = kube.get("pod", pod).get("status", {}).get("containerStatuses", [])
    return next((s for s in statuses if s["name"] == container), {})


def test_restricted_namespace_rejects_privileged_pod_and_runs_compliant_one(kube: Any) -> None:
    bad = kube.testapp_pod("privileged")
    bad["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    refused = kube.apply(bad, check=False)
    assert refused.returncode != 0
    assert 'violates PodSecurity "restricted:latest"' in refused.stderr
    assert "privileged" in refused.stderr
    assert kube("get", "pod", "privileged", check=False).returncode != 0

    kube.apply(kube.testapp_pod("compliant"))
    kube.wait("pod/compliant", "condition=Ready")
    # It really runs as the non-root user its image and spec name.
    assert kube("exec", "compliant", "--", "id", "-u").stdout.strip() == "65532"


def test_gpu_requests_beyond_the_node_stay_pending_and_one_gpu_runs(
    cluster: Any, kube: Any
) -> None:
    node = json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"][0]
    gpus = int(node["status"]["allocatable"].get("nvidia.com/gpu", "0"))
    assert gpus >= 1, "the node advertises no nvidia.com/gpu"

    def gpu_pod(name: str, count: int) -> dict[str, Any]:
        container = kube.testapp_container()
        container["resources"]["limits"]["nvidia.com/gpu"] = str(count)
        return kube.testapp_pod(name, containers=[container])

    kube.apply(gpu_pod("too-many", gpus + 1), gpu_pod("one", 1))
    kube.wait("pod/one", "condition=Ready")

    def unschedulable_message() -> str:
        conditions = kube.get("pod", "too-many").get("status", {}).get("conditions", [])
        scheduled = next((c for c in conditions if c["type"] == "PodScheduled"), {})
        return str(scheduled.get("message", "")) if scheduled.get("status") == "False" else ""

    message = kube.eventually(unschedulable_message, what="too-many to be unschedulable")
    assert "Insufficient nvidia.com/gpu" in message
    assert kube.get("pod", "too-many")["status"]["phase"] == "Pending"


def test_container_exceeding_its_memory_limit_is_oom_killed_and_neighbours_survive(
    kube: Any,
) -> None:
    kube.apply(kube.testapp_pod("neighbour"))
    kube.wait("pod/neighbour", "condition=Ready")
    hog = kube.testapp_container(
        command=[
            "python3",
            "-c",
            "b = bytearray(300 * 1024 * 1024)\n"
            "for i in range(0, len(b), 4096): b[i] = 1\n"
            "import time; time.sleep(3600)",
        ],
        readinessProbe=None,
    )
    hog["resources"]["limits"]["memory"] = "64Mi"
    kube.apply(kube.testapp_pod("hog", containers=[hog]))

    def oom_killed() -> dict[str, Any] | None:
        status = _container_status(kube, "hog")
        terminated = status.get("lastState", {}).get("terminated", {})
        return status if terminated and status.get("restartCount", 0) >= 1 else None

    status = kube.eventually(oom_killed, timeout_seconds=120, what="hog to be OOM-killed")
    terminated = status["lastState"]["terminated"]
    assert terminated["reason"] == "OOMKilled"
    assert terminated["exitCode"] == 137
    neighbour = _container_status(kube, "neighbour")
    assert neighbour["restartCount"] == 0
    assert neighbour["ready"] is True


@pytest.fixture
def host_dir() -> Iterator[Path]:
    """A directory on this machine for a local PV, writable by the pods' uid."""
    base = Path(os.environ.get("FUSEBOX_CACHE", Path.home() / ".cache" / "fusebox")) / "e2e-pv"
    base.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(dir=base))
    path.chmod(0o777)
    yield path
    subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=False)


@pytest.fixture
def local_claim(cluster: Any, kube: Any, host_dir: Path) -> Iterator[tuple[str, Path]]:
    """A PVC bound (on first use) to a `local` PV over host_dir, made with `localcluster pv`."""
    if not cluster.local:
        pytest.fail("local PVs need localcluster (FUSEBOX_KUBECONFIG names another cluster)")
    pv_name = f"e2e-{uuid.uuid4().hex[:8]}"
    made = subprocess.run(
        [
            sys.executable,
            "-m",
            "localcluster",
            "pv",
            pv_name,
            "--path",
            str(host_dir),
            "--size",
            "1Gi",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data"},
        "spec": {
            "storageClassName": "local",
            "accessModes": ["ReadWriteOnce"],
            "volumeName": pv_name,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    kube.apply(claim)
    yield "data", host_dir
    kube("delete", "pod", "--all", "--wait=true", "--timeout=60s", check=False)
    kube("delete", "pvc", "data", "--wait=false", check=False)
    cluster.kubectl("delete", "pv", pv_name, "--wait=false", check=False)


def test_configmap_secret_emptydir_and_local_pvc_are_mounted_and_processes_are_shared(
    kube: Any, local_claim: tuple[str, Path]
) -> None:
    claim, host_path = local_claim
    (host_path / "model.txt").write_text("weights from the host\n")
    (host_path / "model.txt").chmod(0o644)
    kube("create", "configmap", "settings", "--from-literal=greeting=hello from a configmap")
    kube("create", "secret", "generic", "token", "--from-literal=token=s3cret-value")
    app = kube.testapp_container(
        volumeMounts=[
            {"name": "settings", "mountPath": "/etc/settings", "readOnly": True},
            {"name": "token", "mountPath": "/etc/token", "readOnly": True},
            {"name": "scratch", "mountPath": "/scratch"},
            {"name": "data", "mountPath": "/data"},
        ]
    )
    sidecar = kube.testapp_container(
        "sidecar", command=["sleep", "3600"], ports=[], readinessProbe=None
    )
    pod = kube.testapp_pod(
        "volumes",
        shareProcessNamespace=True,
        containers=[app, sidecar],
        volumes=[
            {"name": "settings", "configMap": {"name": "settings"}},
            {"name": "token", "secret": {"secretName": "token"}},
            {"name": "scratch", "emptyDir": {}},
            {"name": "data", "persistentVolumeClaim": {"claimName": claim}},
        ],
    )
    kube.apply(pod)
    kube.wait("pod/volumes", "condition=Ready")
    seen = json.loads(
        kube.exec_python(
            "volumes",
            (
                "import json, pathlib\n"
                "pathlib.Path('/scratch/note').write_text('written in the pod')\n"
                "pathlib.Path('/data/from-pod.txt').write_text('written to the PV')\n"
                "sleep = [p for p in pathlib.Path('/proc').iterdir() if p.name.isdigit()\n"
                "         and (p / 'cmdline').read_bytes().startswith(b'sleep')]\n"
                "print(json.dumps({\n"
                " 'configmap': open('/etc/settings/greeting').read(),\n"
                " 'secret': open('/etc/token/token').read(),\n"
                " 'emptydir': open('/scratch/note').read(),\n"
                " 'pvc': open('/data/model.txt').read(),\n"
                " 'sidecar_status': (sleep[0] / 'status').read_text() if sleep else ''}))\n"
            ),
        )
    )
    assert seen["configmap"] == "hello from a configmap"
    assert seen["secret"] == "s3cret-value"
    assert seen["emptydir"] == "written in the pod"
    assert seen["pvc"] == "weights from the host\n"
    assert "Name:\tsleep" in seen["sidecar_status"]
    assert (host_path / "from-pod.txt").read_text() == "written to the PV"


def test_readiness_gates_ready_and_failing_liveness_restarts(kube: Any) -> None:
    app = kube.testapp_container(
        env=[{"name": "START_READY", "value": "false"}],
        readinessProbe={"httpGet": {"path": "/readyz", "port": 8080}, "periodSeconds": 1},
        livenessProbe={
            "httpGet": {"path": "/healthz", "port": 8080},
            "periodSeconds": 1,
            "failureThreshold": 2,
        },
    )
    kube.apply(kube.testapp_pod("probed", containers=[app]))
    kube.wait("pod/probed", "jsonpath={.status.containerStatuses[0].started}=true")
    post = (
        "import urllib.request as u; u.urlopen(u.Request('http://127.0.0.1:8080{}', method='POST'))"
    )
    assert _container_status(kube, "probed")["ready"] is False
    kube.exec_python("probed", post.format("/ready?value=true"))
    kube.wait("pod/probed", "condition=Ready", timeout_seconds=60)
    assert _container_status(kube, "probed")["restartCount"] == 0

    kube.exec_python("probed", post.format("/fail-liveness"))
    restarted = kube.eventually(
        lambda: _container_status(kube, "probed").get("restartCount", 0) >= 1,
        what="the liveness probe to restart the container",
    )
    assert restarted
    status = _container_status(kube, "probed")
    assert "terminated" in status["lastState"]
    # A new process: its readiness starts off again, so readiness gates it anew.
    assert status["ready"] is False


def test_deleting_a_pod_sends_sigterm_and_honours_the_grace_period(
    kube: Any, local_claim: tuple[str, Path]
) -> None:
    claim, host_path = local_claim

    def recorder(name: str, delay_seconds: int, grace_seconds: int) -> dict[str, Any]:
        app = kube.testapp_container(
            env=[
                {"name": "SIGTERM_RECORD", "value": f"/record/{name}"},
                {"name": "TERM_DELAY_SECONDS", "value": str(delay_seconds)},
            ],
            volumeMounts=[{"name": "record", "mountPath": "/record"}],
        )
        return kube.testapp_pod(
            name,
            terminationGracePeriodSeconds=grace_seconds,
            containers=[app],
            volumes=[{"name": "record", "persistentVolumeClaim": {"claimName": claim}}],
        )

    # "patient" needs 2 s after SIGTERM and is given 30; "stubborn" wants 120 but gets 2.
    kube.apply(recorder("patient", 2, 30), recorder("stubborn", 120, 2))
    kube.wait("pod/patient", "condition=Ready")
    kube.wait("pod/stubborn", "condition=Ready")
    kube("delete", "pod", "patient", "stubborn", "--wait=true", "--timeout=90s", timeout=120)
    patient = (host_path / "patient").read_text().splitlines()
    stubborn = (host_path / "stubborn").read_text().splitlines()
    assert patient[0].startswith("sigterm ") and patient[-1] == "exit"
    assert stubborn[0].startswith("sigterm ") and "exit" not in stubborn


def test_deleting_a_deployment_garbage_collects_its_replicaset_and_pods(kube: Any) -> None:
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "owned"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "owned"}},
            "template": {"metadata": {"labels": {"app": "owned"}}, "spec": kube.testapp_pod_spec()},
        },
    }
    kube.apply(deployment)
    kube.wait("deployment/owned", "condition=Available")
    assert kube.get("replicasets", "-l", "app=owned")["items"]
    assert kube.get("pods", "-l", "app=owned")["items"]
    kube("delete", "deployment", "owned", "--wait=true")

    def all_gone() -> bool:
        left = kube.get("replicasets,pods", "-l", "app=owned")["items"]
        return not left

    assert kube.eventually(all_gone, what="the ReplicaSet and pods to be collected")


# Run in a pod: who does the API server say we are, given the mounted token?
SELF_SUBJECT_REVIEW = """
import json, os, ssl, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
host = os.environ["KUBERNETES_SERVICE_HOST"]
body = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
request = urllib.request.Request(
    f"https://{host}/apis/authentication.k8s.io/v1/selfsubjectreviews",
    data=json.dumps(body).encode(),
    headers={"Authorization": "Bearer " + open(sa + "/token").read(),
             "Content-Type": "application/json"},
)
context = ssl.create_default_context(cafile=sa + "/ca.crt")
print(urllib.request.urlopen(request, context=context, timeout=10).read().decode())
"""


def test_logs_exec_and_the_service_account_token_reach_the_apiserver(kube: Any) -> None:
    kube.apply(kube.testapp_pod("talker"))
    kube.wait("pod/talker", "condition=Ready")
    assert "testapp listening" in kube("logs", "talker").stdout
    assert kube("exec", "talker", "--", "python3", "-c", "print(6 * 7)").stdout.strip() == "42"
    review = json.loads(kube.exec_python("talker", SELF_SUBJECT_REVIEW))
    username = review["status"]["userInfo"]["username"]
    assert username == f"system:serviceaccount:{kube.namespace}:default"
