"""Whether the node has the CPU the e2e suite needs, and who holds it if not.

The suite runs on the one node localcluster gives it. On this project's 2-core
machine its peak is its own operator release and two 600m service pods, plus the
monitoring addon when that is not installed yet. Anything else running there
(`make demo` leaves two pods sized to fill the node) can leave the suite's pods
Pending for "Insufficient cpu": every test would then time out on its own.
Pure, so the unit tier checks it: the e2e session asks it once, before its
first install, and stops with one message naming the holders.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

SUITE_NAMESPACE_PREFIXES = ("e2e-", "fusebox-e2e-", "helm-e2e-", "standin-demo-")
MONITORING_NAMESPACE = "monitoring"
SUITE_CPU_MILLIS = 100 + 2 * 600  # the suite's operator, then two service pods at once
MONITORING_CPU_MILLIS = 170  # the addon's Prometheus and its operator, until installed


def cpu_millis(quantity: str) -> int:
    """A Kubernetes CPU quantity ("2", "1500m", "0.5") in millicores."""
    if quantity.endswith("m"):
        return int(quantity[:-1])
    return round(float(quantity) * 1000)


def is_suite_namespace(namespace: str) -> bool:
    return namespace.startswith(SUITE_NAMESPACE_PREFIXES)


def held_cpu(pods: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Millicores requested per namespace by the pods that hold CPU on a node.

    Finished pods hold none; the suite's own namespaces are left out (a run
    that was killed leaves them for the next run's cleanup, not a refusal).
    """
    held: dict[str, int] = {}
    for pod in pods:
        namespace = pod["metadata"]["namespace"]
        phase = pod.get("status", {}).get("phase")
        if phase in ("Succeeded", "Failed") or is_suite_namespace(namespace):
            continue
        spec = pod.get("spec", {})
        pod_level = spec.get("resources", {}).get("requests", {}).get("cpu")
        containers = [*spec.get("containers", []), *spec.get("initContainers", [])]
        requested = (
            cpu_millis(pod_level)
            if pod_level
            else sum(
                cpu_millis(c.get("resources", {}).get("requests", {}).get("cpu", "0"))
                for c in containers
            )
        )
        if requested:
            held[namespace] = held.get(namespace, 0) + requested
    return held


def shortfall(allocatable: str, pods: Iterable[Mapping[str, Any]]) -> str | None:
    """None when the suite fits next to what runs; else why not, naming the holders."""
    held = held_cpu(pods)
    need = SUITE_CPU_MILLIS + (0 if MONITORING_NAMESPACE in held else MONITORING_CPU_MILLIS)
    free = cpu_millis(allocatable) - sum(held.values())
    if free >= need:
        return None
    holders = ", ".join(f"{ns} {m}m" for ns, m in sorted(held.items(), key=lambda i: -i[1]))
    return (
        f"the e2e suite needs {need}m of the node's CPU and {max(free, 0)}m of its "
        f"{cpu_millis(allocatable)}m allocatable is free; requests held: {holders}. "
        "If `make demo` is running (namespaces fusebox-demo and fusebox-system), stop it "
        "first with `make demo-down` (`make demo` brings it back in about 90 s); the suite "
        "never scales or deletes what it did not create"
    )


def scheduled_cpu_millis(pod: Mapping[str, Any]) -> int:
    """The CPU the scheduler counts for a pod: its pod-level request, else the larger of
    what runs (its containers and its native sidecars) and its init containers' peak
    (each one with the sidecars started before it: those run on beside it)."""
    spec = pod.get("spec", {})
    pod_level = spec.get("resources", {}).get("requests", {}).get("cpu")
    if pod_level:
        return cpu_millis(pod_level)

    def request(container: Mapping[str, Any]) -> int:
        return cpu_millis(container.get("resources", {}).get("requests", {}).get("cpu", "0"))

    sidecars = 0
    init_peak = 0
    for container in spec.get("initContainers", []):
        if container.get("restartPolicy") == "Always":
            sidecars += request(container)
            init_peak = max(init_peak, sidecars)
        else:
            init_peak = max(init_peak, sidecars + request(container))
    running = sum(request(c) for c in spec.get("containers", [])) + sidecars
    return max(running, init_peak)


def free_cpu_millis(allocatable: str, pods: Iterable[Mapping[str, Any]]) -> int:
    """The node's allocatable CPU less what its pods hold: every pod not finished,
    terminating ones too (their requests count until they are gone)."""
    held = sum(
        scheduled_cpu_millis(p)
        for p in pods
        if p.get("status", {}).get("phase") not in ("Succeeded", "Failed")
    )
    return cpu_millis(allocatable) - held
