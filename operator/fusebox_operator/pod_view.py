"""A PodView from a pod as the API serves it (camelCase JSON), never a typed client object.

Why: the pod watch hands every pod event to this reader, and turning an event
into the client's typed `V1Pod` first cost 1.0-1.2 ms of CPU for a running
pod's 10 KiB (its spec's every nested model, its timestamps parsed) against
0.05 ms for the JSON alone, to read a dozen fields. A new service's pods bring five to
ten events each (docs/decisions/operator-memory.md, "The pod watch reads
JSON"). Pure: no client, no I/O.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from fusebox_contract.model_fetch import FETCH_CONTAINER
from fusebox_contract.wiring import GPU_RESOURCE, DeviceHealth
from fusebox_operator.manifests import SERVER_CONTAINER, SIDECAR_CONTAINER
from fusebox_operator.observations import CANNOT_START_REASONS, NodeNotReady, PodView, fetch_state

Json = Mapping[str, Any]

# The kubelet's waiting reasons that do not clear by waiting (ContainerCreating and
# PodInitializing do): a user must see them on the service, not only on the pod.
FAILING_WAIT_REASONS = CANNOT_START_REASONS | {"CrashLoopBackOff"}
FAILING_TEXT_CHARS = 160
# The label a Deployment puts on its ReplicaSets' pods, which ends each ReplicaSet's name.
TEMPLATE_HASH_LABEL = "pod-template-hash"
# How the kubelet names a ResourceClaim's devices in allocatedResourcesStatus.
CLAIM_RESOURCE_PREFIX = "claim:"


def pod_view(pod: Json) -> PodView:
    """What the telemetry loop needs of one pod."""
    metadata: Json = pod.get("metadata") or {}
    status: Json = pod.get("status") or {}
    init_statuses: list[Json] = status.get("initContainerStatuses") or []
    # The sidecar is a native sidecar: its status is among the init containers'.
    containers: list[Json] = status.get("containerStatuses") or []
    statuses = {s.get("name"): s for s in [*init_statuses, *containers]}
    server = statuses.get(SERVER_CONTAINER)
    sidecar = statuses.get(SIDECAR_CONTAINER)
    fetch = statuses.get(FETCH_CONTAINER)
    conditions: list[Json] = status.get("conditions") or []
    ready_condition = next((c for c in conditions if c.get("type") == "Ready"), {})
    ready = ready_condition.get("status") == "True"
    unschedulable = next(
        (
            c.get("message") or c.get("reason") or "Unschedulable"
            for c in conditions
            if c.get("type") == "PodScheduled"
            and c.get("status") == "False"
            and c.get("reason") == "Unschedulable"
        ),
        "",
    )
    last_ended = _ended(server, "lastState") if server is not None else None
    deleting = metadata.get("deletionTimestamp")
    name = str(metadata.get("name") or "")
    return PodView(
        name=name,
        uid=str(metadata.get("uid") or ""),
        ip=str(status.get("podIP") or ""),
        phase=str(status.get("phase") or ""),
        ready=ready,
        sidecar_ready=bool(sidecar and sidecar.get("ready")),
        server_started=bool(server and server.get("started")),
        server_restarts=int(server.get("restartCount") or 0) if server else 0,
        terminating=deleting is not None,
        oom_killed=last_ended is not None and last_ended.get("reason") == "OOMKilled",
        unschedulable=unschedulable,
        unhealthy_gpus=_unhealthy_gpus(server),
        node=str((pod.get("spec") or {}).get("nodeName") or ""),
        # The fetcher first: while it fails, the server never starts.
        failing=_failing([s for s in (fetch, server, sidecar) if s is not None]),
        grace_ends_at=_epoch_seconds(deleting),
        fetch=fetch_state(name, init_statuses) if fetch is not None else None,
        ready_since=_epoch_seconds(ready_condition.get("lastTransitionTime")) if ready else None,
    )


def with_node_readiness(
    pods: Sequence[PodView], not_ready: Mapping[str, NodeNotReady]
) -> list[PodView]:
    """The pods, each carrying its node's NotReady (`not_ready`: node -> its condition, as
    the Nodes were last read). A pod's own status cannot say it: when a node's kubelet
    stops posting, the node controller sets the pod's Ready False and leaves its
    containers' `ready` as the kubelet last posted it, so the pod looked scrapable but
    unseen and a network fault was suspected instead of the node."""
    return [
        replace(pod, node_not_ready=not_ready.get(pod.node) if pod.node else None) for pod in pods
    ]


def controlling_deployment(pod: Json) -> str:
    """The Deployment whose ReplicaSet controls the pod, "" for any other pod.

    Why: a service's pods are found by its label, and anyone who may create pods
    in the namespace can put that label on one. The operator sends such a pod
    the admin token, reads its figures into status and acts on it; so a pod
    counts only when its controller is a ReplicaSet the Deployment made: named
    `<deployment>-<pod-template-hash>`, the hash the pod carries as a label.
    """
    metadata: Json = pod.get("metadata") or {}
    template_hash = (metadata.get("labels") or {}).get(TEMPLATE_HASH_LABEL)
    if not template_hash:
        return ""
    suffix = f"-{template_hash}"
    for owner in metadata.get("ownerReferences") or []:
        name = str(owner.get("name") or "")
        if (
            owner.get("controller")
            and owner.get("kind") == "ReplicaSet"
            and owner.get("apiVersion") == "apps/v1"
            and name.endswith(suffix)
        ):
            return name[: -len(suffix)]
    return ""


def current_count(pods: Sequence[PodView]) -> int:
    """Pods that exist and are not on their way out, ready or not (a Deployment's
    status.replicas): an evicted or finished pod no longer counts."""
    return sum(1 for pod in pods if not pod.terminating and not pod.ended)


def _ended(status: Json, which: str) -> Json | None:
    """`state.terminated` or `lastState.terminated` of a container status, if any."""
    ended = (status.get(which) or {}).get("terminated")
    return ended if isinstance(ended, Mapping) else None


def _epoch_seconds(moment: str | None) -> float | None:
    """An RFC 3339 timestamp as the API serves it ("2026-12-06T09:00:00Z") as epoch
    seconds (None stays None)."""
    return dt.datetime.fromisoformat(moment).timestamp() if moment else None


def _failing(statuses: Sequence[Json]) -> str:
    """The first stuck container, as `server CrashLoopBackOff (last exit 1: Error): ...`.

    A crash loop passes through three states: just exited (terminated, non-zero),
    waiting in back-off, and running again; the first and the last, while not
    ready after a failed run, are still the same failure (otherwise the service
    would flap between PodsFailing and PodsNotReady on every retry). The text
    ends with the container's own last words where it left any (its termination
    message: the log's tail, as the operator's pods ask the kubelet to keep),
    else the kubelet's.
    """
    for status in statuses:
        name = status.get("name")
        state: Json = status.get("state") or {}
        waiting: Json | None = state.get("waiting")
        last = _ended(status, "lastState")
        last_text = ""
        if last is not None:
            last_text = f"last exit {last.get('exitCode')}: {last.get('reason') or 'terminated'}"
        last_words = _last_line(last.get("message")) if last else ""
        if waiting is not None and waiting.get("reason") in FAILING_WAIT_REASONS:
            text = f"{name} {waiting['reason']}" + (f" ({last_text})" if last_text else "")
            said = last_words or _last_line(waiting.get("message"))
            return text + (f": {said}" if said else "")
        ended = _ended(status, "state")
        if ended is not None and ended.get("exitCode") != 0:
            # Just exited: the kubelet has not yet put it in back-off.
            text = f"{name} exited {ended.get('exitCode')}: {ended.get('reason') or 'terminated'}"
            said = _last_line(ended.get("message"))
            return text + (f": {said}" if said else "")
        retrying = state.get("running") is not None
        if retrying and last is not None and last.get("exitCode") != 0 and not status.get("ready"):
            restarts = int(status.get("restartCount") or 0)
            text = f"{name} restarted {restarts} time(s) ({last_text})"
            return text + (f": {last_words}" if last_words else "")
    return ""


def _last_line(message: str | None) -> str:
    """The last non-blank line of a termination or waiting message, cut to fit a condition."""
    lines = [line.strip() for line in (message or "").splitlines() if line.strip()]
    return lines[-1][:FAILING_TEXT_CHARS] if lines else ""


def _unhealthy_gpus(server: Json | None) -> tuple[str, ...]:
    """The GPU ids of the server container whose health the kubelet reports Unhealthy.

    Through the device plugin the status is named nvidia.com/gpu; through a
    ResourceClaim (the pod's only one, spec.gpu.deviceClassName) claim:<name>.
    """
    reported: list[Json] = (server.get("allocatedResourcesStatus") or []) if server else []
    return tuple(
        sorted(
            str(health.get("resourceID"))
            for status in reported
            if status.get("name") == GPU_RESOURCE
            or str(status.get("name") or "").startswith(CLAIM_RESOURCE_PREFIX)
            for health in status.get("resources") or []
            if health.get("health") == DeviceHealth.UNHEALTHY
        )
    )
