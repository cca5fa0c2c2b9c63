"""The fake fleet's control plane on loopback: etcd, kube-apiserver, the real
kube-scheduler and kube-controller-manager, and kwok for the nodes' kubelets.

Why these and not kwok alone: kwok plays kubelets (node heartbeats, pods
Running with an address from the node's podCIDR), but it neither schedules nor
turns Deployments into pods. The operator's pods must go through the real
path a cluster gives them (Deployment -> ReplicaSet -> scheduler on the GPU
nodes' labels and `nvidia.com/gpu` capacity), so the scheduler and the
controller manager run from the same cached binaries as localcluster, with
only the controllers this path needs. etcd and the API server come from the
integration tests' loopback_apiserver, unchanged.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
BINARIES = REPO / ".cache" / "bin"
TOKEN = "fleet-admin-token"
# Every service has a ClusterIP Service: 2,000 fleet and 1,000 status services need
# more than the test default's /24.
SERVICE_CIDR = "10.96.0.0/16"
CONTROLLERS = (
    "deployment-controller",
    "replicaset-controller",
    "serviceaccount-controller",
    "garbage-collector-controller",
    "namespace-controller",
    # The operator's Ready reads each Service's EndpointSlices (docs/decisions/endpoint-slices.md).
    "endpointslice-controller",
)


def _loopback_module() -> ModuleType:
    path = REPO / "tests" / "integration" / "operator" / "loopback_apiserver.py"
    spec = importlib.util.spec_from_file_location("fleet_loopback_apiserver", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def kwok_binary() -> Path:
    """Build kwok on first use (localcluster/build-kwok.sh, cached by its pins)."""
    script = REPO / "localcluster" / "build-kwok.sh"
    out = subprocess.run([str(script)], check=True, capture_output=True, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


def kubectl(kubeconfig: Path, *args: str, input_text: str | None = None) -> str:
    done = subprocess.run(
        [str(BINARIES / "kubectl"), f"--kubeconfig={kubeconfig}", *args],
        input=input_text,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr.strip()[-2000:]}")
    return done.stdout


def apply_objects(kubeconfig: Path, objects: list[dict[str, object]]) -> None:
    """Create many objects in one kubectl call (a List), server-side."""
    listed = {"apiVersion": "v1", "kind": "List", "items": objects}
    kubectl(
        kubeconfig,
        "apply",
        "--server-side",
        "--field-manager=fleet-bench",
        "-f",
        "-",
        input_text=json.dumps(listed),
    )


@contextlib.contextmanager
def control_plane(work: Path) -> Iterator[tuple[Path, list[subprocess.Popen[bytes]]]]:
    """The API server's kubeconfig and the scheduler, controller manager and kwok
    processes (the caller reads their CPU); everything stops when the block ends."""
    loopback = _loopback_module()
    with loopback.loopback_apiserver(
        work,
        token=TOKEN,
        user="fleet-admin",
        authorization_mode="RBAC",
        service_cidr=SERVICE_CIDR,
    ) as kubeconfig:
        config = str(kubeconfig)
        commands = [
            [
                str(BINARIES / "kube-scheduler"),
                f"--kubeconfig={config}",
                "--leader-elect=false",
                "--secure-port=0",
            ],
            [
                str(BINARIES / "kube-controller-manager"),
                f"--kubeconfig={config}",
                "--leader-elect=false",
                "--secure-port=0",
                f"--controllers={','.join(CONTROLLERS)}",
                "--concurrent-deployment-syncs=20",
                "--concurrent-replicaset-syncs=20",
                "--kube-api-qps=200",
                "--kube-api-burst=400",
            ],
            [
                str(kwok_binary()),
                f"--config={REPO / 'localcluster' / 'kwok' / 'stages.yaml'}",
                f"--kubeconfig={config}",
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                "--node-lease-duration-seconds=40",
                "--cidr=127.63.0.0/16",
                "--node-ip=127.0.0.1",
                "--server-address=",
            ],
        ]
        processes = []
        logs = []
        try:
            for command in commands:
                log = (work / f"{Path(command[0]).name}.log").open("wb")
                logs.append(log)
                processes.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log))
            yield kubeconfig, processes
        finally:
            for process in reversed(processes):
                process.terminate()
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
            for log in logs:
                log.close()


if __name__ == "__main__":  # a smoke run: python -m bench.fleet.cluster WORKDIR
    import time

    with control_plane(Path(sys.argv[1])) as (config, _):
        print(config, flush=True)
        time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 30)
