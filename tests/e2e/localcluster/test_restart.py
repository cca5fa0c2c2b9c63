"""`restart COMPONENT` and `up` after a daemon died keep the cluster's state.

One namespace holds a ConfigMap and a running pod for the whole module. Each
component is restarted in turn; after each, the ConfigMap still holds its
data, the pod is the same pod (same UID), its container was never restarted
(same restartCount, same container id), it still answers, and `status`
exits 0. Last, etcd is killed with SIGKILL: `status` fails, `up` restarts
only etcd, and every object is still there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]
STATE_ROOT = Path(os.environ.get("FUSEBOX_LOCALCLUSTER_DIR") or "/var/lib/fusebox-localcluster")
NAME = os.environ.get("FUSEBOX_LOCALCLUSTER_NAME") or "fusebox"

# Every component a user can restart, as they would type it.
COMPONENTS = (
    "etcd",
    "apiserver",
    "controller-manager",
    "scheduler",
    "containerd",
    "kubelet",
    "kube-proxy",
    "coredns",
)


def _localcluster(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "localcluster", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )


class Survivors:
    """The objects that must outlive every restart, and how they looked at first."""

    def __init__(self, kube: Any) -> None:
        self.kube = kube
        self.first: dict[str, Any] = {}

    def observe(self) -> dict[str, Any]:
        config_map = self.kube.get("configmap", "survivor")
        pod = self.kube.get("pod", "survivor")
        (container,) = pod["status"]["containerStatuses"]
        return {
            "configmap data": config_map["data"],
            "pod uid": pod["metadata"]["uid"],
            "restartCount": container["restartCount"],
            "containerID": container["containerID"],
            "pod ip": pod["status"]["podIP"],
        }

    def answers(self) -> str:
        ip = self.first["pod ip"]
        return str(self.kube.http_get_json(f"http://{ip}:8080/")["pod"])


@pytest.fixture(scope="module")
def survivors(cluster: Any, module_kube: Any) -> Survivors:
    if not cluster.local:
        pytest.fail("restart tests need localcluster (FUSEBOX_KUBECONFIG names another cluster)")
    kube = module_kube
    kube("create", "configmap", "survivor", "--from-literal=kept=yes")
    kube.apply(kube.testapp_pod("survivor"))
    kube.wait("pod/survivor", "condition=Ready")
    found = Survivors(kube)
    found.first = found.observe()
    return found


def _assert_kept(survivors: Survivors) -> None:
    survivors.kube.wait("pod/survivor", "condition=Ready", timeout_seconds=60)
    assert survivors.observe() == survivors.first
    assert survivors.answers() == "survivor"
    status = _localcluster("status", timeout=120)
    assert status.returncode == 0, status.stdout + status.stderr


@pytest.mark.parametrize("component", COMPONENTS)
def test_restart_keeps_objects_and_running_pods(survivors: Survivors, component: str) -> None:
    restarted = _localcluster("restart", component)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    assert "Traceback" not in restarted.stderr
    _assert_kept(survivors)


def test_restart_refuses_an_unknown_component_and_names_the_known_ones() -> None:
    refused = _localcluster("restart", "dockerd", timeout=60)
    assert refused.returncode == 1
    assert "unknown component dockerd" in refused.stderr
    assert "kube-apiserver" in refused.stderr


def test_up_restarts_a_killed_etcd_and_keeps_every_object(survivors: Survivors) -> None:
    pid_file = STATE_ROOT / NAME / "pids" / "etcd.pid"
    pid = int(pid_file.read_text().split()[0])
    os.kill(pid, signal.SIGKILL)
    dead = _localcluster("status", timeout=120)
    assert dead.returncode == 1
    assert any(line.split() == ["etcd", "stopped"] for line in dead.stdout.splitlines())

    recovered = _localcluster("up")
    assert recovered.returncode == 0, recovered.stderr[-3000:]
    assert "etcd not running; restarting, keeping every object" in recovered.stderr
    assert "wiping" not in recovered.stderr
    assert int(pid_file.read_text().split()[0]) != pid
    _assert_kept(survivors)
    events = json.loads(survivors.kube("get", "events", "-o", "json").stdout)["items"]
    assert not [e for e in events if e.get("reason") == "Killing"], "a container was killed"
