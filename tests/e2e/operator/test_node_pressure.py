"""Node memory pressure from another tenant: the operator acts before any OOMKill.

stress-ng (Debian's, in the `stress` image) runs in a pod of its own and holds
anonymous memory, so the node's MemAvailable falls while the inference pod
stays far inside its own limit: the per-pod ladder sees nothing. The service's
`memory.nodeAvailableFloor` is set from the MemAvailable its sidecar reports
at the start, `CROSS_BYTES` below it, and stress-ng takes `STRESS_BYTES`, so
the node goes under the floor by a bounded amount (about 2 GiB) and comes back
above it with room to spare (about 2 GiB) once stress-ng is gone.

SAFETY: the node is this host, shared with everything else running here. The
test refuses to start unless MemAvailable stays above `HOST_MIN_AVAILABLE`
after stress-ng took its share; the stress pod has a memory limit of its own
as a backstop; a watchdog deletes it at once should the host's MemAvailable
fall below `HOST_MIN_AVAILABLE` anyway (others allocating meanwhile); and it
is deleted in a finally.

Proves: condition NodeMemoryPressure True (reason BelowFloor) and a
NodeMemoryPressure event naming the node while stress-ng holds the memory;
only gc and empty_cache ran (no reload, swap or restart; the model was not
loaded again), and empty_cache gave the node back what the pod's allocator held
(heap holes left by the `leak_allocator` fault before the pressure, which
`malloc_trim` returns); a chat request during the pressure gets a 200; the inference
pod (Guaranteed QoS) was never OOMKilled, evicted or restarted; and the
condition clears, with a NodeMemoryRecovered event, after stress-ng is gone.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from fusebox_contract.metrics import Metric
from fusebox_contract.names import ConditionType, EventReason, Fault
from fusebox_contract.wiring import FAULTS_ENV, Port

from .conftest import ServiceFactory, base_spec, chat, http_reply, pod_url, wait_for
from .test_leak_kinds import Pod, freed_mib

pytestmark = pytest.mark.chaos

MIB = 1024**2
GIB = 1024**3
STRESS_BYTES = 4 * GIB  # what stress-ng holds
# The floor, below MemAvailable at the start: ~2 GiB under it with stress-ng, ~2 GiB above
# it without, so others on this host allocating or freeing a GiB meanwhile change nothing.
CROSS_BYTES = 2 * GIB
STRESS_LIMIT = "4352Mi"  # the stress pod's own limit: stress-ng's share plus its own overhead
HOST_MIN_AVAILABLE = 3 * GIB  # never take the host below this
# Before the pressure, the pod's allocator keeps freed memory as heap holes (16 MiB a
# request, ~85% returned by malloc_trim): what empty_cache can give back to the node.
HOLES_MIB_PER_REQUEST = 16
HOLES_REQUESTS = 8
STRESS_IMAGE = "localhost/fusebox/stress:latest"
STRESS_POD = "other-tenant"
FORBIDDEN = (
    EventReason.MODEL_UNLOADED,
    EventReason.MODEL_RELOADED,
    EventReason.SWAPPED_TO_FALLBACK,
    EventReason.POD_RESTARTED,
    EventReason.MEMORY_LIMIT_GROWN,
)


def host_available_bytes() -> int:
    """This host's MemAvailable: the node is this host."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemAvailable in /proc/meminfo")


def sidecar_node_available(pod: Pod) -> float:
    """MemAvailable as the pod's sidecar exports it: what the operator compares."""
    reply = http_reply("GET", f"{pod_url(pod.raw, Port.METRICS)}/metrics")
    assert reply.status == 200, reply
    name = Metric.NODE_MEMORY_AVAILABLE_BYTES.sample
    found = re.search(rf"^{name} (\S+)$", str(reply.body), flags=re.MULTILINE)
    assert found, f"{name} not exported"
    return float(found.group(1))


def stress_pod(namespace: str) -> dict[str, Any]:
    """stress-ng holding STRESS_BYTES of anonymous memory (written once, then kept while
    the worker sleeps), Burstable (request far below the limit), restricted PSS."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": STRESS_POD, "namespace": namespace},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "stress-ng",
                    "image": STRESS_IMAGE,
                    "imagePullPolicy": "Never",
                    # One worker writes its buffer once, then sleeps holding it (--vm-hang 0).
                    "args": (
                        f"--vm 1 --vm-bytes {STRESS_BYTES // MIB}M --vm-keep --vm-hang 0 "
                        "--timeout 600s --temp-path /tmp --metrics-brief"
                    ).split(),
                    "resources": {
                        "requests": {"memory": "64Mi", "cpu": "50m"},
                        "limits": {"memory": STRESS_LIMIT, "cpu": "1"},
                    },
                    "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                        "runAsUser": 65532,
                        "runAsGroup": 65532,
                    },
                }
            ],
            "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "16Mi"}}],
        },
    }


@contextmanager
def other_tenant(cluster: Any, namespace: str) -> Iterator[dict[str, bool]]:
    """The stress pod, watched: deleted at once if the host's MemAvailable falls below
    HOST_MIN_AVAILABLE, and always deleted on the way out."""
    breached = {"host_low": False}
    stop = threading.Event()

    def delete() -> None:
        cluster.kubectl(
            "-n", namespace, "delete", "pod", STRESS_POD,
            "--grace-period=0", "--force", "--ignore-not-found", check=False,
        )  # fmt: skip

    def watchdog() -> None:
        while not stop.wait(0.5):
            if host_available_bytes() < HOST_MIN_AVAILABLE:
                breached["host_low"] = True
                delete()
                return

    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(stress_pod(namespace)))
    thread = threading.Thread(target=watchdog, daemon=True)
    thread.start()
    try:
        yield breached
    finally:
        stop.set()
        thread.join(timeout=5)
        delete()
        cluster.kubectl(
            "-n", namespace, "wait", "--for=delete", f"pod/{STRESS_POD}", "--timeout=60s",
            check=False,
        )  # fmt: skip


def stress_phase(cluster: Any, namespace: str) -> str:
    out = cluster.kubectl(
        "-n", namespace, "get", "pod", STRESS_POD, "-o", "jsonpath={.status.phase}"
    ).stdout
    return str(out).strip()


def events_of(service: Any, reasons: tuple[str, ...]) -> list[dict[str, Any]]:
    return [e for e in service.events() if e["reason"] in reasons]


def server_status(pod: dict[str, Any]) -> dict[str, Any]:
    statuses = pod["status"].get("containerStatuses") or []
    return next(s for s in statuses if s["name"] == "server")


def test_another_tenant_eating_the_node_gets_caches_shed_and_no_oom_kill(
    cluster: Any, namespace: str, inference_service: ServiceFactory
) -> None:
    spec = base_spec()
    spec["server"]["env"] = [{"name": FAULTS_ENV, "value": f"{Fault.LEAK_ALLOCATOR.value}:0"}]
    service = inference_service("node-pressure", spec)
    pod = Pod(service)
    assert pod.raw["status"]["qosClass"] == "Guaranteed"  # the kubelet evicts others first
    node = pod.raw["spec"]["nodeName"]
    uid = pod.raw["metadata"]["uid"]
    loads_before = pod.model_loads()
    pod.set_leak(Fault.LEAK_ALLOCATOR, HOLES_MIB_PER_REQUEST)
    assert all(chat(service.service_url(), max_tokens=2) == 200 for _ in range(HOLES_REQUESTS))
    pod.set_leak(Fault.LEAK_ALLOCATOR, 0)

    start = sidecar_node_available(pod)
    if host_available_bytes() - STRESS_BYTES < HOST_MIN_AVAILABLE:
        pytest.fail(
            f"this host has {host_available_bytes() / GIB:.1f} GiB available: taking "
            f"{STRESS_BYTES / GIB:.1f} GiB more would leave under {HOST_MIN_AVAILABLE / GIB} GiB"
        )
    floor_mib = int((start - CROSS_BYTES) // MIB)
    service.kubectl(
        "patch", "inferenceservice", service.name, "--type=merge",
        "-p", f'{{"spec": {{"memory": {{"nodeAvailableFloor": "{floor_mib}Mi"}}}}}}',
    )  # fmt: skip
    wait_for(
        "NodeMemoryPressure False before the other tenant starts",
        lambda: service.condition(ConditionType.NODE_MEMORY_PRESSURE).get("status") == "False",
        timeout=60,
        diagnose=service.diagnose,
    )

    with other_tenant(cluster, namespace) as breached:
        wait_for("stress-ng running", lambda: stress_phase(cluster, namespace) == "Running")
        pressure = wait_for(
            "NodeMemoryPressure True while stress-ng holds the memory",
            lambda: (
                (c := service.condition(ConditionType.NODE_MEMORY_PRESSURE)).get("status") == "True"
                and c
            ),
            timeout=120,
            diagnose=service.diagnose,
        )
        assert pressure["reason"] == "BelowFloor"
        assert f"node {node}: MemAvailable" in pressure["message"]
        (warning,) = events_of(service, (EventReason.NODE_MEMORY_PRESSURE,))
        assert warning["type"] == "Warning" and f"node {node}" in warning["message"]
        shed = wait_for(
            "gc and empty_cache on the pod for node pressure",
            lambda: (
                (
                    found := [
                        e["reason"]
                        for e in events_of(
                            service, (EventReason.GARBAGE_COLLECTED, EventReason.CACHE_EMPTIED)
                        )
                        if "node memory pressure" in e["message"]
                    ]
                )
                and len(set(found)) == 2
                and found
            ),
            timeout=30,
            diagnose=service.diagnose,
        )
        assert set(shed) == {EventReason.GARBAGE_COLLECTED, EventReason.CACHE_EMPTIED}
        print(f"start {start / GIB:.2f} GiB, floor {floor_mib} Mi: {warning['message']}")
        assert chat(service.service_url()) == 200
        assert not breached["host_low"], "the watchdog had to delete the stress pod"
        # stress-ng held its memory all along: what went under was its doing.
        assert stress_phase(cluster, namespace) == "Running"

    recovered = wait_for(
        "NodeMemoryPressure False after stress-ng is gone",
        lambda: (
            (c := service.condition(ConditionType.NODE_MEMORY_PRESSURE)).get("status") == "False"
            and c
        ),
        timeout=120,
        diagnose=service.diagnose,
    )
    assert recovered["reason"] == "AboveFloor"
    (normal,) = events_of(service, (EventReason.NODE_MEMORY_RECOVERED,))
    print(normal["message"])
    for event in events_of(service, (EventReason.GARBAGE_COLLECTED, EventReason.CACHE_EMPTIED)):
        print(f"{event['reason']}: {event['message']}")
    # The pod gave the node back what its allocator held: at least half the holes.
    (emptied,) = events_of(service, (EventReason.CACHE_EMPTIED,))
    assert freed_mib(emptied["message"]) >= HOLES_MIB_PER_REQUEST * HOLES_REQUESTS / 2
    assert normal["type"] == "Normal" and f"node {node}" in normal["message"]

    # Only the cheap steps: nothing took the model or the pod out of service.
    assert events_of(service, FORBIDDEN) == []
    kinds = {a["type"] for a in service.status().get("recentActions") or []}
    assert kinds == {"gc", "empty_cache"}, kinds
    assert pod.model_loads() == loads_before
    (after,) = service.pods()
    assert after["metadata"]["uid"] == uid and after["status"]["phase"] == "Running"
    assert after["status"].get("reason") != "Evicted"
    server = server_status(after)
    assert server["restartCount"] == 0
    assert "terminated" not in (server.get("lastState") or {}), server["lastState"]
