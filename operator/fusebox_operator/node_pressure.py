"""Node memory pressure: shed the pods' caches before the kubelet evicts anyone.

Why: another tenant on the node can eat its memory while every Fusebox pod
stays well inside its own limit, so the per-pod ladder sees nothing. Below
the kubelet's `memory.available` threshold the kubelet evicts pods (the
Guaranteed inference pods last: the tenant that grew, Burstable or
BestEffort, goes first); faster than the kubelet's housekeeping, the kernel's
global OOM killer picks a process by its own score. Either way the node's
MemAvailable falls through a band first, and in that band the operator makes
its pods as small as they get without leaving service: a full `gc` (what
cycles hold goes back to the allocator) then `empty_cache` (torch's caches,
the prompt cache and `malloc_trim`: the allocator gives it back to the
node). Never a reload, swap or restart: that would cost service for
somebody else's growth, and it would free nothing the kubelet cannot.

The floor is `memory.nodeAvailableFloor`, or by default the kubelet's default
hard threshold (100Mi) plus a margin of 5% of the node's memory (at least
1 GiB): the margin is what the other tenant may take between one scrape and
the kubelet's next pass. The node counts as recovered only
`RECOVERY_MARGIN_BYTES` above the floor, so a node hovering at the floor
posts one pair of events, not one per scrape.

The kubelet's own signal is a second trigger of the same relief: a node whose
kubelet reports `MemoryPressure=True` (its Node's condition, read operator-wide
by `kubelet_pressure`) counts as under exactly like a node below the floor.
The sidecar reads /proc/meminfo, which is the host's: on localcluster every
node is a network namespace on one host and reads the same figure, and under
lxcfs it is the container's, so on both only the kubelet can say that one
node, and only that one, is short. It comes back when the kubelet says False
and the sidecar's MemAvailable, where one is reported, is back above the
floor plus the margin. Without the kubelet's signal (RBAC refuses the read,
the API fails) the sidecar's reading alone decides, as before.

Pure: a function of the pods, their samples, the nodes under kubelet
MemoryPressure, what earlier ticks remembered (`NodePressure`, in the tick's
memory), the policy state (for action ids) and the clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fusebox_contract.names import ConditionType, EventReason
from fusebox_operator.observations import PodSample, PodView
from fusebox_operator.policy_state import Action, ActionKind, PolicyState, next_action_id
from fusebox_operator.spec import InferenceServiceSpec
from fusebox_operator.status import EventRecord, human_bytes, iso, set_condition

MIB = 1024**2
GIB = 1024**3
KUBELET_EVICTION_HARD_BYTES = 100 * MIB
"""The kubelet's default `evictionHard: memory.available<100Mi`."""
MARGIN_SHARE = 0.05
MIN_MARGIN_BYTES = 1 * GIB
RECOVERY_MARGIN_BYTES = 256 * MIB
RELIEF_REPEAT_SECONDS = 300.0
"""While a node stays under its floor, a pod's caches are shed again this often: they
refill with traffic, but shedding them every scrape would only cost latency."""
RELIEF_STEPS: tuple[ActionKind, ...] = (ActionKind.GC, ActionKind.EMPTY_CACHE)
"""In this order: what gc frees goes back to the allocator, which empty_cache then trims."""
BELOW_FLOOR = "BelowFloor"
ABOVE_FLOOR = "AboveFloor"
KUBELET_PRESSURE = "KubeletMemoryPressure"
"""The condition's reason when the kubelet's signal alone holds nodes under."""
NO_KUBELET_PRESSURE = "NoKubeletMemoryPressure"
"""The condition's reason for False when only the kubelet's signal was read (no sidecar
reports its node's memory)."""


@dataclass(frozen=True)
class NodeReading:
    """A node's memory as its pods' sidecars last reported it (the lowest reading)."""

    node: str
    available_bytes: float
    total_bytes: float | None
    floor_bytes: float
    stalled_some: float | None = None  # PSI avg10 share
    stalled_full: float | None = None

    @property
    def below_floor(self) -> bool:
        return self.available_bytes < self.floor_bytes

    @property
    def recovered(self) -> bool:
        return self.available_bytes >= self.floor_bytes + RECOVERY_MARGIN_BYTES

    def describe(self) -> str:
        """'node n1: MemAvailable 1.1Gi of 23.5Gi, floor 1.3Gi, memory stalls (10 s) ...'"""
        return f"node {self.node}: {self.figures()}"

    def figures(self) -> str:
        """'MemAvailable 1.1Gi of 23.5Gi, floor 1.3Gi, memory stalls (10 s) ...'"""
        total = f" of {human_bytes(self.total_bytes)}" if self.total_bytes else ""
        text = (
            f"MemAvailable {human_bytes(self.available_bytes)}{total}, "
            f"floor {human_bytes(self.floor_bytes)}"
        )
        stalls = [
            f"{name} {share:.1%}"
            for name, share in (("some", self.stalled_some), ("full", self.stalled_full))
            if share is not None
        ]
        if stalls:
            text += f", memory stalls over 10 s: {', '.join(stalls)}"
        return text


@dataclass(frozen=True)
class KubeletPressure:
    """A node whose kubelet reports MemoryPressure=True, as its Node's condition says."""

    node: str
    since: float | None  # the condition's lastTransitionTime
    message: str  # the kubelet's own words ("kubelet has insufficient memory available")

    def describe(self) -> str:
        """'the kubelet reports MemoryPressure since 2026-12-06T03:20:11Z (...)'"""
        since = f" since {iso(self.since)}" if self.since is not None else ""
        words = f" ({self.message})" if self.message else ""
        return f"the kubelet reports MemoryPressure{since}{words}"


@dataclass(frozen=True)
class NodeUnder:
    """Why a node counts as under: its sidecars' reading, its kubelet's signal, or both.

    `reading` is the sidecars' figures (below the floor or not: they are shown
    when known); `kubelet` is set when the kubelet reports MemoryPressure."""

    node: str
    reading: NodeReading | None
    kubelet: KubeletPressure | None

    @property
    def below_floor(self) -> bool:
        return self.reading is not None and self.reading.below_floor

    def describe(self) -> str:
        """'node n2: the kubelet reports MemoryPressure since ..., MemAvailable ... floor ...'"""
        parts = [self.kubelet.describe()] if self.kubelet is not None else []
        if self.reading is not None:
            parts.append(self.reading.figures())
        return f"node {self.node}: {', '.join(parts)}"


@dataclass
class NodePressure:
    """What node-pressure handling remembers between ticks (in memory only: after an
    operator restart a node still under is announced and relieved once more)."""

    # Node -> why it went under, with the figures of that moment: the condition's
    # message stays put while it is under, so the status is not rewritten on every scrape.
    under: dict[str, NodeUnder] = field(default_factory=dict)
    relieved_at: dict[str, float] = field(default_factory=dict)  # pod UID -> last relief
    measured: bool = False  # some sidecar reported its node's memory
    # The last tick read the kubelets' signal for the nodes of this service's pods.
    kubelet_read: bool = False


def floor_bytes(spec: InferenceServiceSpec, total_bytes: float | None) -> float:
    """The MemAvailable below which the pods shed caches: the spec's, or the default."""
    if spec.memory.node_available_floor_bytes is not None:
        return float(spec.memory.node_available_floor_bytes)
    margin = max(MIN_MARGIN_BYTES, MARGIN_SHARE * (total_bytes or 0))
    return KUBELET_EVICTION_HARD_BYTES + margin


def node_readings(
    pods: Sequence[PodView], samples: Mapping[str, PodSample], spec: InferenceServiceSpec
) -> dict[str, NodeReading]:
    """Each node's lowest MemAvailable among its pods' good samples this tick."""
    readings: dict[str, NodeReading] = {}
    for pod in pods:
        sample = samples.get(pod.name)
        if not pod.node or sample is None or not sample.ok:
            continue
        if sample.node_available_bytes is None:
            continue
        known = readings.get(pod.node)
        if known is not None and known.available_bytes <= sample.node_available_bytes:
            continue
        readings[pod.node] = NodeReading(
            pod.node,
            sample.node_available_bytes,
            sample.node_total_bytes,
            floor_bytes(spec, sample.node_total_bytes),
            sample.node_pressure_some,
            sample.node_pressure_full,
        )
    return readings


def relieve_nodes(
    pods: Sequence[PodView],
    samples: Mapping[str, PodSample],
    memory: NodePressure,
    state: PolicyState,
    spec: InferenceServiceSpec,
    now: float,
    busy: set[str],
    kubelet: Mapping[str, KubeletPressure] | None = None,
) -> tuple[list[Action], list[EventRecord]]:
    """This tick's cache shedding on pods of nodes under pressure, and the events.

    A node goes under below its floor or when its kubelet reports
    MemoryPressure (`kubelet`: the nodes whose kubelet does; None when the
    operator could not read the Nodes, and then the floor alone decides). It
    comes back when the kubelet no longer reports it and its MemAvailable, if
    reported, is `RECOVERY_MARGIN_BYTES` above the floor; each crossing is one
    event. Every ready pod on a node under gets gc then empty_cache, once per
    `RELIEF_REPEAT_SECONDS`; pods in `busy` (an action of their own this tick
    or in flight) wait for the next tick. Pods on other nodes are never touched.
    """
    readings = node_readings(pods, samples, spec)
    memory.measured = memory.measured or bool(readings)
    on_node: dict[str, list[PodView]] = {}
    for pod in pods:
        if pod.node:
            on_node.setdefault(pod.node, []).append(pod)
    memory.kubelet_read = kubelet is not None and bool(on_node)
    pressured = {n: p for n, p in (kubelet or {}).items() if n in on_node}
    events: list[EventRecord] = []
    for node in sorted(set(readings) | set(pressured) | set(memory.under)):
        reading, signal = readings.get(node), pressured.get(node)
        if node in memory.under:
            if signal is None and _recovered(memory.under[node], reading, kubelet is not None):
                del memory.under[node]
                events.append(_recovered_event(node, reading, kubelet is not None))
            continue
        if signal is None and (reading is None or not reading.below_floor):
            continue
        under = NodeUnder(node, reading, signal)
        names = ", ".join(sorted(p.name for p in on_node.get(node, [])))
        cause = ": below the floor;" if under.below_floor else ":"
        events.append(
            EventRecord(
                "Warning",
                EventReason.NODE_MEMORY_PRESSURE,
                f"{under.describe()}{cause} gc and empty_cache on "
                f"{names} (never a reload or restart for another tenant's memory); "
                "the kubelet evicts at its memory.available threshold, "
                "Guaranteed pods last",
            )
        )
        memory.under[node] = under
    for node in [n for n in memory.under if n not in on_node]:
        del memory.under[node]  # no pod of this service runs there any more
    alive = {pod.uid for pod in pods if pod.node in memory.under}
    for uid in [u for u in memory.relieved_at if u not in alive]:
        del memory.relieved_at[uid]  # gone, or its node recovered: the next episode starts afresh
    actions: list[Action] = []
    for pod in pods:
        entered = memory.under.get(pod.node)
        if entered is None or not pod.ready or pod.terminating or pod.name in busy:
            continue
        last = memory.relieved_at.get(pod.uid)
        if last is not None and now - last < RELIEF_REPEAT_SECONDS:
            continue
        now_under = NodeUnder(
            pod.node,
            readings.get(pod.node, entered.reading),
            pressured.get(pod.node, entered.kubelet),
        )
        reason = f"node memory pressure ({now_under.describe()}): shedding this pod's caches"
        for kind in RELIEF_STEPS:
            actions.append(Action(next_action_id(state, kind), kind, pod.name, reason, now))
        memory.relieved_at[pod.uid] = now
    return actions, events


def _recovered(under: NodeUnder, reading: NodeReading | None, kubelet_read: bool) -> bool:
    """Whether a node under (its kubelet no longer reporting MemoryPressure, or unread)
    is back: its MemAvailable, where reported this tick, `RECOVERY_MARGIN_BYTES` above
    the floor; unreported, only a node that went under by its kubelet alone, once the
    kubelet says False (a failed scrape never ends an episode the floor started)."""
    if reading is not None:
        return reading.recovered
    return kubelet_read and not under.below_floor


def _recovered_event(node: str, reading: NodeReading | None, kubelet_read: bool) -> EventRecord:
    said = []
    if reading is not None:
        said.append(f"{reading.figures()}: back above the floor")
    if kubelet_read:
        said.append("the kubelet reports no MemoryPressure")
    return EventRecord(
        "Normal",
        EventReason.NODE_MEMORY_RECOVERED,
        f"node {node}: {', and '.join(said)}; the pods refill their caches with traffic",
    )


def node_condition(
    conditions: Sequence[Mapping[str, Any]],
    memory: NodePressure,
    generation: int,
    now: float,
) -> list[dict[str, Any]]:
    """`NodeMemoryPressure`: True naming each node under (below its floor, or its kubelet
    reporting MemoryPressure) with its figures when it went under; False once every node
    is back. Left out until some sidecar reports its node's memory or the kubelets'
    signal is read (a sidecar from before the first, an operator refused the Nodes)."""
    if memory.under:
        message = "; ".join(u.describe() for _, u in sorted(memory.under.items()))
        floor = any(u.below_floor for u in memory.under.values())
        return set_condition(
            conditions,
            ConditionType.NODE_MEMORY_PRESSURE,
            True,
            BELOW_FLOOR if floor else KUBELET_PRESSURE,
            f"{message} (when it went under): shedding the pods' caches",
            generation,
            now,
        )
    said = []
    if memory.measured:
        said.append("every node's MemAvailable is above its floor")
    if memory.kubelet_read:
        said.append("no node's kubelet reports MemoryPressure")
    if not said:
        return [dict(c) for c in conditions]
    return set_condition(
        conditions,
        ConditionType.NODE_MEMORY_PRESSURE,
        False,
        ABOVE_FLOOR if memory.measured else NO_KUBELET_PRESSURE,
        " and ".join(said),
        generation,
        now,
    )
