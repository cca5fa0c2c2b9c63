"""A hub for hf:// model sources inside the cluster: the olah mirror as a pod.

olah (PyPI 0.5.4, the image localcluster/images/olah/ builds from the same pins as
the integration tier's host copy) serves the Hugging Face hub's model, revision and
tree APIs and file downloads from local git repositories, offline. The repository is
made on the host (the tiny model, one commit, tagged), handed to the pod read-only
through a `local` PersistentVolume, and reached by the pods' model-fetch containers
through a Service, exactly as they reach the hub through `HF_ENDPOINT`.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..model_repository import commit_model
from .conftest import Cluster, local_claim, wait_for

IMAGE = "localhost/fusebox/olah:latest"
NAME = "hub"
PORT = 8090
ORG, REPO, TAG = "fusebox", "tiny", "v1"
RESTRICTED = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}


@dataclass(frozen=True)
class Hub:
    endpoint: str  # http://hub.<namespace>.svc:8090, what HF_ENDPOINT would be
    repo: str  # ORG/NAME
    tag: str
    commit: str  # what the tag points at


def make_repository(mirrors: Path, model_dir: Path) -> str:
    """`mirrors/models/ORG/REPO`: a git repository holding `model_dir`'s files in one
    commit tagged TAG, readable by any user; returns the commit."""
    commit = commit_model(mirrors / "models" / ORG / REPO, model_dir, TAG)
    for path in [mirrors, *mirrors.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return commit


def config(netloc: str) -> str:
    """olah's configuration: offline, serving /mirrors, and naming itself by the
    Service's address in the URLs it hands out."""
    return (
        "[basic]\n"
        'host = "0.0.0.0"\n'
        f"port = {PORT}\n"
        'repos-path = "/cache/repos"\n'
        'mirrors-path = ["/mirrors"]\n'
        f'mirror-netloc = "{netloc}"\n'
        f'mirror-lfs-netloc = "{netloc}"\n'
        "[accessibility]\n"
        "offline = true\n"
    )


def manifests(namespace: str, claim: str) -> list[dict[str, Any]]:
    labels = {"app": NAME}
    netloc = f"{NAME}.{namespace}.svc:{PORT}"
    container = {
        "name": "olah",
        "image": IMAGE,
        "imagePullPolicy": "Never",
        "args": ["-c", "/etc/olah/olah.toml"],
        "workingDir": "/cache",  # it writes ./logs beside its cache
        # The repository belongs to the host's user: git reads it only when told to trust it.
        "env": [
            {"name": "GIT_CONFIG_COUNT", "value": "1"},
            {"name": "GIT_CONFIG_KEY_0", "value": "safe.directory"},
            {"name": "GIT_CONFIG_VALUE_0", "value": "*"},
        ],
        "ports": [{"containerPort": PORT}],
        "readinessProbe": {
            "httpGet": {"path": f"/api/models/{ORG}/{REPO}/revision/main", "port": PORT},
            "periodSeconds": 1,
        },
        "resources": {"requests": {"cpu": "10m", "memory": "128Mi"}},
        "securityContext": RESTRICTED,
        "volumeMounts": [
            {"name": "config", "mountPath": "/etc/olah", "readOnly": True},
            {"name": "mirrors", "mountPath": "/mirrors", "readOnly": True},
            {"name": "cache", "mountPath": "/cache"},
        ],
    }
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": NAME, "namespace": namespace},
            "data": {"olah.toml": config(netloc)},
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": NAME, "namespace": namespace, "labels": labels},
            "spec": {
                "containers": [container],
                "volumes": [
                    {"name": "config", "configMap": {"name": NAME}},
                    {
                        "name": "mirrors",
                        "persistentVolumeClaim": {"claimName": claim, "readOnly": True},
                    },
                    {"name": "cache", "emptyDir": {}},
                ],
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": NAME, "namespace": namespace},
            "spec": {"selector": labels, "ports": [{"port": PORT}]},
        },
    ]


@contextmanager
def serve_hub(cluster: Cluster, namespace: str, model_dir: Path) -> Iterator[Hub]:
    """olah in `namespace` serving `model_dir` as hf://ORG/REPO@TAG; yields it once it
    answers the revision API. The host directory and the volume go afterwards."""
    root = Path(tempfile.mkdtemp(prefix="fusebox-e2e-hub-", dir="/var/tmp"))
    try:
        commit = make_repository(root, model_dir)
        with local_claim(cluster, namespace, "hub-mirrors", root) as _volume:
            for manifest in manifests(namespace, "hub-mirrors"):
                cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))

            def ready() -> bool:
                pod = json.loads(
                    cluster.kubectl("-n", namespace, "get", "pod", NAME, "-o", "json").stdout
                )
                conditions = pod.get("status", {}).get("conditions", [])
                return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

            wait_for(
                "the hub mirror Ready",
                ready,
                timeout=120,
                every=1,
                diagnose=lambda: (
                    cluster.kubectl(
                        "-n", namespace, "logs", NAME, "--tail", "30", check=False
                    ).stdout
                ),
            )
            yield Hub(f"http://{NAME}.{namespace}.svc:{PORT}", f"{ORG}/{REPO}", TAG, commit)
    finally:
        shutil.rmtree(root, ignore_errors=True)
