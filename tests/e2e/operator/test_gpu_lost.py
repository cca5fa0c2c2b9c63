"""Issue 13, GPU lost: the device plugin reports a pod's GPU Unhealthy; the operator
drains that pod and its replacement runs on a healthy GPU, with an event and a condition.

The GPU is simulated at the hardware edge only (localcluster's device plugin);
the health travels the real path: plugin -> kubelet -> the pod's
allocatedResourcesStatus -> the operator.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from typing import Any

from fusebox_contract.names import ConditionType, EventReason
from fusebox_contract.wiring import GPU_VISIBLE_DEVICES_ENV

from .conftest import REPO, Service, ServiceFactory, base_spec, wait_for


def localcluster_gpu(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "localcluster", "gpu", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def gpu_index(device_id: str) -> int:
    for line in localcluster_gpu("list").splitlines():
        index, listed, _ = line.split()
        if listed == device_id:
            return int(index)
    raise AssertionError(f"{device_id} is not among the simulated GPUs")


def visible_gpu(service: Service, pod: dict[str, Any]) -> str:
    read = f"import os; print(os.environ['{GPU_VISIBLE_DEVICES_ENV}'])"
    result = service.kubectl(
        "exec", pod["metadata"]["name"], "-c", "server", "--", "/opt/venv/bin/python", "-c", read
    )
    return str(result.stdout).strip()


def test_a_pod_whose_gpu_turns_unhealthy_is_drained_to_a_healthy_gpu(
    inference_service: ServiceFactory, two_gpus: None
) -> None:
    spec = base_spec(gpu={"count": 1})
    spec.pop("memory")  # sized by the operator from the (simulated) GPU
    service = inference_service("gpu-lost", spec)
    (pod,) = wait_for(
        "one ready pod", service.ready_pods, timeout=300, diagnose=service.diagnose_pods
    )
    sick = visible_gpu(service, pod)
    index = gpu_index(sick)
    marked_at = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    localcluster_gpu("unhealthy", str(index))
    try:
        message = wait_for(
            "a GPUUnhealthy event",
            lambda: next(
                (
                    e["message"]
                    for e in service.events()
                    if e["reason"] == EventReason.GPU_UNHEALTHY
                ),
                None,
            ),
            timeout=120,
        )
        assert pod["metadata"]["name"] in message and sick in message, message

        def replaced() -> dict[str, Any] | None:
            ready = [
                p for p in service.ready_pods() if p["metadata"]["uid"] != pod["metadata"]["uid"]
            ]
            return ready[0] if ready and len(service.pods()) == 1 else None

        new = wait_for(
            "a replacement pod, ready, and the old one gone",
            replaced,
            timeout=300,
            diagnose=service.diagnose_pods,
        )
        assert visible_gpu(service, new) != sick
        # The condition went False while the pod was on the sick GPU, and back since.
        healthy = wait_for(
            "GPUHealthy True again",
            lambda: (
                (c := service.condition(ConditionType.GPU_HEALTHY)).get("status") == "True" and c
            ),
            timeout=60,
        )
        assert healthy["lastTransitionTime"] >= marked_at, healthy
        drains = [e for e in service.events() if e["reason"] == EventReason.GPU_UNHEALTHY]
        assert len(drains) == 1 and drains[0]["type"] == "Warning", drains
    finally:
        localcluster_gpu("healthy", str(index))
