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

Pure: a function of the pods, their samples, what earlier ticks remembered
(`NodePressure`, in the tick's memory), the policy state (for action ids) and
the clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fusebox_contract.names import ConditionType, EventReason
from fusebox_operator.observations import PodSample, PodView
from fusebox_operator.policy_state import Action, ActionKind, PolicyState, next_action_id
from fusebox_operator.spec import InferenceServiceSpec
from fusebox_operator.status import EventRecord, human_bytes, set_condition

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
        total = f" of {human_bytes(self.total_bytes)}" if self.total_bytes else ""
        text = (
            f"node {self.node}: MemAvailable {human_bytes(self.available_bytes)}{total}, "
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


@dataclass
class NodePressure:
    """What node-pressure handling remembers between ticks (in memory only: after an
    operator restart a node still under its floor is announced and relieved once more)."""

    # Node -> its reading when it went below the floor: the condition's figures stay
    # put while it is under, so the status is not rewritten on every scrape.
    under: dict[str, NodeReading] = field(default_factory=dict)
    relieved_at: dict[str, float] = field(default_factory=dict)  # pod UID -> last relief
    measured: bool = False  # some sidecar reported its node's memory


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
) -> tuple[list[Action], list[EventRecord]]:
    """This tick's cache shedding on pods of nodes below their floor, and the events.

    A node goes under below its floor and comes back `RECOVERY_MARGIN_BYTES`
    above it; each crossing is one event. Every ready pod on a node under
    its floor gets gc then empty_cache, once per `RELIEF_REPEAT_SECONDS`;
    pods in `busy` (an action of their own this tick or in flight) wait for
    the next tick.
    """
    readings = node_readings(pods, samples, spec)
    memory.measured = memory.measured or bool(readings)
    on_node: dict[str, list[PodView]] = {}
    for pod in pods:
        if pod.node:
            on_node.setdefault(pod.node, []).append(pod)
    events: list[EventRecord] = []
    for node, reading in sorted(readings.items()):
        if node in memory.under and reading.recovered:
            del memory.under[node]
            events.append(
                EventRecord(
                    "Normal",
                    EventReason.NODE_MEMORY_RECOVERED,
                    f"{reading.describe()}: back above the floor; the pods refill their "
                    "caches with traffic",
                )
            )
        elif node not in memory.under and reading.below_floor:
            names = ", ".join(sorted(p.name for p in on_node.get(node, [])))
            events.append(
                EventRecord(
                    "Warning",
                    EventReason.NODE_MEMORY_PRESSURE,
                    f"{reading.describe()}: below the floor; gc and empty_cache on "
                    f"{names} (never a reload or restart for another tenant's memory); "
                    "the kubelet evicts at its memory.available threshold, "
                    "Guaranteed pods last",
                )
            )
            memory.under[node] = reading
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
        now_reading = readings.get(pod.node, entered)
        reason = f"node memory pressure ({now_reading.describe()}): shedding this pod's caches"
        for kind in RELIEF_STEPS:
            actions.append(Action(next_action_id(state, kind), kind, pod.name, reason, now))
        memory.relieved_at[pod.uid] = now
    return actions, events


def node_condition(
    conditions: Sequence[Mapping[str, Any]],
    memory: NodePressure,
    generation: int,
    now: float,
) -> list[dict[str, Any]]:
    """`NodeMemoryPressure`: True naming each node below its floor with its figures when
    it went under; False once every node is back. Left out until some sidecar reports
    its node's memory (a sidecar from before it never does)."""
    if memory.under:
        message = "; ".join(r.describe() for _, r in sorted(memory.under.items()))
        return set_condition(
            conditions,
            ConditionType.NODE_MEMORY_PRESSURE,
            True,
            BELOW_FLOOR,
            f"{message} (when it went under): shedding the pods' caches",
            generation,
            now,
        )
    if not memory.measured:
        return [dict(c) for c in conditions]
    return set_condition(
        conditions,
        ConditionType.NODE_MEMORY_PRESSURE,
        False,
        ABOVE_FLOOR,
        "every node's MemAvailable is above its floor",
        generation,
        now,
    )
