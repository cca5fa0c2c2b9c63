"""Whether the Service sends traffic to the pods that serve: its EndpointSlices, read.

Why: a pod the kubelet calls Ready and whose server accepts requests still gets
no traffic while the Service's EndpointSlices do not list it as a ready
endpoint: the EndpointSlice controller (kube-controller-manager) is down while
pods are replaced, so the new pods' IPs never reach the slices; the slices
were deleted and nothing made them again. A status built on the pods alone
said Ready True for a Service refusing every connection. So a serving pod the
slices have not listed for ENDPOINTS_GRACE_SECONDS does not count as serving
(serving.outside_service), and slices the operator cannot read make Ready say
so rather than pass.

The grace covers the slice controller's lag: it lists a pod a second or so
after the kubelet calls it Ready, and puts back a slice deleted by hand as
quickly. It runs from when the pod became Ready (its Ready condition's
lastTransitionTime) for a pod never seen listed, so an operator restarted in
the middle of an outage says so at its first tick, and from when it was first
seen missing for one that was listed before.

Pure: the slices come in as the API's JSON (kube.EndpointSliceWatch keeps
them in an endpoint_store.EndpointStore), the clock is the caller's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fusebox_operator.observations import PodView

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
"""The label the EndpointSlice controller puts on each slice: the Service it serves."""
ENDPOINTS_GRACE_SECONDS = 30.0
"""How long a serving pod may be missing from the ready endpoints, or the slices be
unread, before status says so: well past the slice controller's usual second."""
MAX_PODS_NAMED = 3


@dataclass(frozen=True)
class SliceEndpoints:
    """Of one EndpointSlice, what the judgement reads: its Service and ready endpoints."""

    service: str
    pods: frozenset[str] = frozenset()  # ready endpoints' targetRef pods, by name
    addresses: frozenset[str] = frozenset()  # ready endpoints' addresses with no targetRef


def slice_endpoints(item: Mapping[str, Any]) -> SliceEndpoints:
    """One slice as the API serves it (JSON). An endpoint counts when its `ready`
    condition is not False: the API reads an absent one as ready, as kube-proxy does.
    A pod is matched by the endpoint's targetRef; an endpoint without one (a slice
    someone wrote by hand) by its addresses."""
    labels = (item.get("metadata") or {}).get("labels") or {}
    pods: set[str] = set()
    addresses: set[str] = set()
    for endpoint in item.get("endpoints") or []:
        if (endpoint.get("conditions") or {}).get("ready") is False:
            continue
        target = endpoint.get("targetRef") or {}
        if target.get("kind") == "Pod" and target.get("name"):
            pods.add(str(target["name"]))
        elif not target:
            addresses.update(str(a) for a in endpoint.get("addresses") or [])
    return SliceEndpoints(
        str(labels.get(SERVICE_NAME_LABEL) or ""), frozenset(pods), frozenset(addresses)
    )


@dataclass(frozen=True)
class ServiceEndpoints:
    """The ready endpoints of every slice of one Service."""

    pods: frozenset[str] = frozenset()
    addresses: frozenset[str] = frozenset()

    def lists(self, pod: PodView) -> bool:
        return pod.name in self.pods or (bool(pod.ip) and pod.ip in self.addresses)


def merged(slices: Iterable[SliceEndpoints]) -> ServiceEndpoints:
    pods: set[str] = set()
    addresses: set[str] = set()
    for one in slices:
        pods |= one.pods
        addresses |= one.addresses
    return ServiceEndpoints(frozenset(pods), frozenset(addresses))


@dataclass(frozen=True)
class EndpointsRead:
    """What the EndpointSlice watch holds for one Service at a tick."""

    service: str
    # Its slices' ready endpoints as last listed or watched; None before the first LIST.
    endpoints: ServiceEndpoints | None
    # None while the watch is current; else since when it is not (its start, or the
    # failure that lost its place), and why.
    unread_since: float | None = None
    cause: str = ""


@dataclass(frozen=True)
class EndpointMemory:
    """What the judgement carries between ticks (the tick's memory keeps it)."""

    listed: frozenset[str] = frozenset()  # serving pods this operator has seen listed
    missing_since: Mapping[str, float] = field(default_factory=dict)  # serving pod -> since


@dataclass(frozen=True)
class EndpointGaps:
    """This tick's finding: serving pods the Service sends no traffic to, or why the
    slices could not tell."""

    service: str = ""
    serving: int = 0  # the pods judged: Ready, and their servers accept requests
    missing: Mapping[str, float] = field(default_factory=dict)  # pod -> seconds missing
    unread: str = ""  # past the grace, why the slices are not known ("" when they are)

    def detail(self, pod: str) -> str:
        """A missing pod's words in status.pods[] and Ready's message."""
        return f"not among Service {self.service}'s ready endpoints for {self.missing[pod]:.0f} s"

    def note(self) -> str:
        """`1 of 2 Ready pod(s) missing from Service chat's ready endpoints (EndpointSlices):
        chat-b for 45 s`."""
        names = sorted(self.missing)
        shown = ", ".join(f"{pod} for {self.missing[pod]:.0f} s" for pod in names[:MAX_PODS_NAMED])
        more = len(names) - MAX_PODS_NAMED
        return (
            f"{len(names)} of {self.serving} Ready pod(s) missing from Service "
            f"{self.service}'s ready endpoints (EndpointSlices): {shown}"
            + (f" and {more} more" if more > 0 else "")
        )


def judge_endpoints(
    read: EndpointsRead | None,
    serving: Sequence[PodView],
    memory: EndpointMemory,
    now: float,
    grace_seconds: float = ENDPOINTS_GRACE_SECONDS,
) -> tuple[EndpointGaps, EndpointMemory]:
    """The serving pods missing from the ready endpoints past the grace, and the memory
    for the next tick. `read` None: the caller read no slices, and nothing is said.

    Slices not current (the watch starting, or lost) are still used for the grace, as
    last seen; past it the finding is that they are unread, never a verdict on pods.
    """
    if read is None:
        return EndpointGaps(), EndpointMemory()
    if read.unread_since is not None and now - read.unread_since >= grace_seconds:
        unread = f"{read.cause or 'not listed'} for {now - read.unread_since:.0f} s"
        return EndpointGaps(read.service, len(serving), unread=unread), memory
    if read.endpoints is None:  # not listed yet: nothing to say within the grace
        return EndpointGaps(read.service, len(serving)), memory
    listed: set[str] = set()
    since: dict[str, float] = {}
    for pod in serving:
        if read.endpoints.lists(pod):
            listed.add(pod.name)
        elif pod.name in memory.missing_since:
            since[pod.name] = memory.missing_since[pod.name]
        elif pod.name in memory.listed:
            since[pod.name] = now  # listed before, dropped now: the controller may put it back
        else:  # never seen listed: missing since it became Ready, as far as anyone knows
            since[pod.name] = min(now, pod.ready_since if pod.ready_since is not None else now)
    names = {pod.name for pod in serving}
    remembered = EndpointMemory(frozenset(listed | (memory.listed & names)), since)
    missing = {pod: now - at for pod, at in since.items() if now - at >= grace_seconds}
    return EndpointGaps(read.service, len(serving), missing), remembered
