"""Issue 35, models from S3 on a real cluster: a service whose source is `s3://` gets
its model from a real S3 server in the cluster (versitygw, its own image) through the
pods' model-fetch init container, two replicas sharing one cache claim cause one
download, and a bucket that does not exist is named in ModelReady and Ready without
the server ever starting (no crash loop).

The model is uploaded from the test host with the MinIO client, as a platform team's
pipeline would fill its bucket.
"""

from __future__ import annotations

import json
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from minio import Minio
from prometheus_client.parser import text_string_to_metric_families

from fusebox_contract.metrics import Metric
from fusebox_contract.model_fetch import FETCH_CONTAINER, SecretKey
from fusebox_contract.names import ConditionType, EventReason
from fusebox_contract.wiring import HttpPath, Port
from fusebox_operator.manifests import SERVER_CONTAINER

from ..conftest import Cluster, local_claim, wait_for
from .conftest import (
    OPERATOR_IMAGE,
    Service,
    ServiceFactory,
    base_spec,
    chat_reply,
)

GATEWAY = "s3"
GATEWAY_PORT = 7070
SLOW_STORE = "s3-slow"
SLOW_BYTES_PER_SECOND = 128 * 1024
# "pod-x 1.2Mi of 6.1Mi (20%) at 128.0Ki/s": a download under way as ModelReady tells it.
LIVE_FIGURES = re.compile(
    r" \d+(\.\d)?(B|Ki|Mi|Gi) of \d+(\.\d)?(Ki|Mi|Gi) \(\d+%\) at \d+(\.\d)?(B|Ki|Mi)/s"
)
BUCKET = "models"
ACCESS_KEY = "fusebox-e2e"
SECRET_KEY = "fusebox-e2e-secret-key"  # noqa: S105 - a throwaway key of a test server
RESTRICTED = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def gateway_manifests(namespace: str) -> list[dict[str, Any]]:
    labels = {"app": GATEWAY}
    pod_spec = {
        "containers": [
            {
                "name": "versitygw",
                "image": "localhost/fusebox/versitygw:latest",
                "imagePullPolicy": "Never",
                "args": [
                    "--port",
                    f":{GATEWAY_PORT}",
                    "--access",
                    ACCESS_KEY,
                    "--secret",
                    SECRET_KEY,
                    "--quiet",
                    "posix",
                    "--sidecar",
                    "/meta",
                    "/data",
                ],  # fmt: skip
                "ports": [{"containerPort": GATEWAY_PORT}],
                "readinessProbe": {"tcpSocket": {"port": GATEWAY_PORT}, "periodSeconds": 1},
                "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}},
                "securityContext": RESTRICTED,
                "volumeMounts": [
                    {"name": "data", "mountPath": "/data"},
                    {"name": "meta", "mountPath": "/meta"},
                ],
            }
        ],
        "volumes": [{"name": "data", "emptyDir": {}}, {"name": "meta", "emptyDir": {}}],
    }
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": GATEWAY, "namespace": namespace, "labels": labels},
            "spec": pod_spec,
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": GATEWAY, "namespace": namespace},
            "spec": {"selector": labels, "ports": [{"port": GATEWAY_PORT}]},
        },
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "model-store", "namespace": namespace},
            "stringData": {
                SecretKey.S3_ACCESS_KEY.value: ACCESS_KEY,
                SecretKey.S3_SECRET_KEY.value: SECRET_KEY,
            },
        },
    ]


@pytest.fixture
def bucket(cluster: Cluster, namespace: str, model_root: Path) -> str:
    """versitygw running in the namespace, the tiny model uploaded to s3://models/tiny."""
    return upload_model(cluster, namespace, model_root)


def upload_model(cluster: Cluster, namespace: str, model_root: Path) -> str:
    """Start versitygw in the namespace and upload the tiny model to s3://models/tiny,
    as a team's pipeline fills its bucket; returns the endpoint pods reach it at."""
    for manifest in gateway_manifests(namespace):
        cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))

    def gateway_ip() -> str | None:
        found = cluster.kubectl("get", "pod", GATEWAY, "-n", namespace, "-o", "json")
        pod = json.loads(found.stdout)
        ready = any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in pod.get("status", {}).get("conditions", [])
        )
        ip: str | None = pod["status"].get("podIP")
        return ip if ready else None

    ip = wait_for("versitygw Ready", gateway_ip, timeout=120, every=1)
    client = Minio(f"{ip}:{GATEWAY_PORT}", ACCESS_KEY, SECRET_KEY, secure=False)
    client.make_bucket(BUCKET)
    for path in sorted((model_root / "tiny").iterdir()):
        client.fput_object(BUCKET, f"tiny/{path.name}", str(path))
    return f"http://{GATEWAY}.{namespace}.svc:{GATEWAY_PORT}"


@pytest.fixture
def cache_claim(cluster: Cluster, namespace: str) -> Iterator[str]:
    """A node-local PV (writable by the pods' user) and the PVC `model-cache` over it."""
    root = Path("/var/tmp") / f"fusebox-e2e-cache-{uuid.uuid4().hex[:8]}"
    root.mkdir()
    root.chmod(0o777)  # past the umask: the fetcher runs as uid 65532
    try:
        with local_claim(cluster, namespace, "model-cache", root):
            yield "model-cache"
    finally:
        shutil.rmtree(root, ignore_errors=True)


def model_ready(service: Service) -> dict[str, Any] | None:
    conditions = service.status().get("conditions") or []
    return next((c for c in conditions if c["type"] == ConditionType.MODEL_READY), None)


def fetch_statuses(service: Service) -> list[dict[str, Any]]:
    return [
        s
        for pod in service.pods()
        for s in pod.get("status", {}).get("initContainerStatuses", [])
        if s["name"] == FETCH_CONTAINER
    ]


Sample = tuple[str, dict[str, str], float]


def sidecars_up(service: Service) -> list[dict[str, Any]]:
    """The service's pods whose native sidecar runs."""
    return [
        pod
        for pod in service.pods()
        if any(
            s["name"] == "sidecar" and "running" in s.get("state", {})
            for s in pod.get("status", {}).get("initContainerStatuses", [])
        )
    ]


def sidecar_metrics(cluster: Cluster, pod: dict[str, Any]) -> list[Sample]:
    """What a pod's sidecar serves on /metrics, asked from inside the sidecar: kubectl
    port-forward refuses a pod still in its init containers."""
    fetched = cluster.kubectl(
        "-n", pod["metadata"]["namespace"], "exec", pod["metadata"]["name"], "-c", "sidecar",
        "--", "/opt/venv/bin/python", "-c",
        "import urllib.request, sys; sys.stdout.write(urllib.request.urlopen("
        f"'http://127.0.0.1:{int(Port.METRICS)}{HttpPath.METRICS.value}').read().decode())",
        check=False,
    )  # fmt: skip
    if fetched.returncode != 0:
        return []  # the pod moved on (its sidecar restarted, the pod deleted): ask again
    return [
        (sample.name, dict(sample.labels), sample.value)
        for family in text_string_to_metric_families(fetched.stdout)
        for sample in family.samples
    ]


def slow_store(cluster: Cluster, namespace: str) -> str:
    """The gateway behind slow_proxy.py (SLOW_BYTES_PER_SECOND for all connections), in a
    pod of the operator's image; returns the endpoint pods reach it at."""
    script = (Path(__file__).resolve().parents[1] / "slow_proxy.py").read_text()
    labels = {"app": SLOW_STORE}
    manifests: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": SLOW_STORE, "namespace": namespace},
            "data": {"slow_proxy.py": script},
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": SLOW_STORE, "namespace": namespace, "labels": labels},
            "spec": {
                "containers": [
                    {
                        "name": "proxy",
                        "image": OPERATOR_IMAGE,
                        "imagePullPolicy": "Never",
                        "command": ["/opt/venv/bin/python", "/proxy/slow_proxy.py"],
                        "args": [
                            str(GATEWAY_PORT),
                            GATEWAY,
                            str(GATEWAY_PORT),
                            str(SLOW_BYTES_PER_SECOND),
                        ],  # fmt: skip
                        "ports": [{"containerPort": GATEWAY_PORT}],
                        "readinessProbe": {"tcpSocket": {"port": GATEWAY_PORT}, "periodSeconds": 1},
                        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
                        "securityContext": RESTRICTED | {"runAsUser": 65532},
                        "volumeMounts": [{"name": "proxy", "mountPath": "/proxy"}],
                    }
                ],
                "volumes": [{"name": "proxy", "configMap": {"name": SLOW_STORE}}],
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": SLOW_STORE, "namespace": namespace},
            "spec": {"selector": labels, "ports": [{"port": GATEWAY_PORT}]},
        },
    ]
    for manifest in manifests:
        cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    cluster.kubectl(
        "-n", namespace, "wait", "--for=condition=Ready", f"pod/{SLOW_STORE}", "--timeout=120s"
    )
    return f"http://{SLOW_STORE}.{namespace}.svc:{GATEWAY_PORT}"


def test_a_model_from_s3_is_told_while_it_downloads_fetched_once_for_two_replicas_and_served(
    cluster: Cluster,
    namespace: str,
    inference_service: ServiceFactory,
    bucket: str,
    cache_claim: str,
) -> None:
    model = {
        "name": "chat",
        "source": f"s3://{BUCKET}/tiny",
        # The store answers at SLOW_BYTES_PER_SECOND: the tiny model takes about 50 s.
        "endpoint": slow_store(cluster, namespace),
        "credentials": {"secretName": "model-store"},
        "cache": {"claimName": cache_claim},
    }
    service = inference_service("from-s3", base_spec(model=model, replicas=2))

    # While the fetcher runs, its figures come through the pod's sidecar (started before
    # it), with when they were read; Ready says what it waits for; and the sidecar
    # serves them to Prometheus (read from inside it: port-forward refuses a pod still
    # in its init containers).
    def under_way() -> tuple[dict[str, Any], list[Sample]] | None:
        conditions = {c["type"]: c for c in service.status().get("conditions") or []}
        condition = conditions.get(ConditionType.MODEL_READY)
        ready = conditions.get(ConditionType.READY) or {}
        running = any("running" in s.get("state", {}) for s in fetch_statuses(service))
        if not (running and condition and condition["reason"] == "Downloading"):
            return None
        figures = LIVE_FIGURES.search(condition["message"])
        waits = "its model downloading (ModelReady)" in ready.get("message", "")
        if not (figures and waits):
            return None
        exported = [s for pod in sidecars_up(service) for s in sidecar_metrics(cluster, pod)]
        downloading = any(
            name == Metric.MODEL_FETCH_INFO and labels.get("reason") == "Downloading"
            for name, labels, _ in exported
        )
        moved = any(
            name == Metric.MODEL_FETCH_DOWNLOADED_BYTES and value > 0 for name, _, value in exported
        )
        return (condition, exported) if downloading and moved else None

    told, exported = wait_for(
        "ModelReady with a download's figures", under_way, timeout=240, diagnose=service.diagnose
    )
    assert "(read 20" in told["message"], told  # the time they were read, in UTC
    print(f"ModelReady while downloading: {told['message']}")
    assert any(name == Metric.MODEL_FETCH_TOTAL_BYTES for name, _, _ in exported), exported

    def verified() -> dict[str, Any] | None:
        condition = model_ready(service)
        ready = len(service.ready_pods()) == 2
        return condition if ready and condition and condition["status"] == "True" else None

    condition = wait_for(
        "ModelReady and two pods", verified, timeout=300, diagnose=service.diagnose
    )
    assert condition["reason"] == "Verified", condition
    # The replicas share the claim: one pod downloaded, the other found the verified copy.
    assert "2 pod(s) verified" in condition["message"], condition
    assert "1 from the shared cache" in condition["message"], condition
    assert chat_reply(service.service_url(), max_tokens=4).status == 200
    assert EventReason.MODEL_VERIFIED in service.event_reasons()


def test_a_missing_bucket_is_named_and_the_server_never_starts(
    inference_service: ServiceFactory, bucket: str
) -> None:
    model = {
        "name": "chat",
        "source": "s3://no-such-bucket/tiny",
        "endpoint": bucket,
        "credentials": {"secretName": "model-store"},
    }
    service = inference_service("missing-bucket", base_spec(model=model))

    def named() -> dict[str, Any] | None:
        condition = model_ready(service)
        return condition if condition and condition["reason"] == "NotFound" else None

    condition = wait_for("ModelReady NotFound", named, timeout=180, diagnose=service.diagnose)
    assert condition["status"] == "False" and "no-such-bucket" in condition["message"]

    # Ready names the pod's failure: the fetcher's, the container that cannot run.
    def failing() -> dict[str, Any] | None:
        conditions = service.status().get("conditions") or []
        ready = next((c for c in conditions if c["type"] == ConditionType.READY), None)
        return ready if ready and ready["reason"] == EventReason.PODS_FAILING else None

    ready = wait_for("Ready PodsFailing", failing, timeout=120, diagnose=service.diagnose)
    assert ready["status"] == "False" and FETCH_CONTAINER in ready["message"], ready
    wait_for(
        "a ModelFetchFailed event",
        lambda: EventReason.MODEL_FETCH_FAILED in service.event_reasons(),
        timeout=60,
    )
    # The fetcher is retried with the kubelet's back-off; the server never ran.
    assert fetch_statuses(service), service.diagnose()
    for pod in service.pods():
        servers = [
            s
            for s in pod.get("status", {}).get("containerStatuses", [])
            if s["name"] == SERVER_CONTAINER
        ]
        assert all(s["restartCount"] == 0 and not s.get("started") for s in servers), servers
