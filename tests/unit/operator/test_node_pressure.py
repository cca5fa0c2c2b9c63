"""node_pressure: a node below its MemAvailable floor gets its pods' caches shed (gc then
empty_cache, never a reload or restart), one event per crossing, and a condition."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client import V1ObjectMeta, V1Pod, V1PodSpec, V1PodStatus

from fusebox_contract.names import ConditionType, EventReason
from fusebox_operator.node_pressure import (
    GIB,
    KUBELET_EVICTION_HARD_BYTES,
    MIB,
    RECOVERY_MARGIN_BYTES,
    RELIEF_REPEAT_SECONDS,
    KubeletPressure,
    NodePressure,
    floor_bytes,
    node_condition,
    node_readings,
    relieve_nodes,
)
from fusebox_operator.observations import PodSample, PodView
from fusebox_operator.policy_state import ActionKind, PolicyState
from fusebox_operator.spec import SpecError, parse_spec
from fusebox_operator.status import EventRecord
from fusebox_operator.telemetry import parse_metrics, sample_from_metrics

from .served import view_of

T0 = 1_800_000_000.0
MODEL = {"name": "chat", "source": "pvc://models/tiny"}
FLOOR = 10 * GIB
SPEC = parse_spec({"model": MODEL, "memory": {"nodeAvailableFloor": "10Gi"}})
TOTAL = 24 * GIB


def view(name: str, node: str = "n1", ready: bool = True, terminating: bool = False) -> PodView:
    return PodView(name, f"uid-{name}", "10.0.0.1", "Running", ready, True, True, 0,
                   terminating, False, "", (), node)  # fmt: skip


def sample(name: str, available: float | None, **extra: Any) -> PodSample:
    return PodSample(name, T0, node_available_bytes=available, node_total_bytes=TOTAL, **extra)


def tick(
    pods: list[PodView],
    samples: list[PodSample],
    memory: NodePressure,
    now: float = T0,
    busy: frozenset[str] = frozenset(),
    state: PolicyState | None = None,
    kubelet: dict[str, KubeletPressure] | None = None,
) -> tuple[list[tuple[ActionKind, str]], list[EventRecord]]:
    actions, events = relieve_nodes(
        pods,
        {s.pod: s for s in samples},
        memory,
        state or PolicyState("svc"),
        SPEC,
        now,
        set(busy),
        kubelet,
    )
    return [(a.kind, a.pod) for a in actions], events


def test_the_floor_is_the_specs_or_the_kubelets_threshold_plus_a_margin() -> None:
    assert floor_bytes(SPEC, TOTAL) == FLOOR
    auto = parse_spec({"model": MODEL})
    # 5% of a 24 GiB node is 1.2 GiB; on a small node the margin is at least 1 GiB.
    assert floor_bytes(auto, TOTAL) == KUBELET_EVICTION_HARD_BYTES + 0.05 * TOTAL
    assert floor_bytes(auto, 8 * GIB) == KUBELET_EVICTION_HARD_BYTES + GIB
    assert floor_bytes(auto, None) == KUBELET_EVICTION_HARD_BYTES + GIB
    # Above the kubelet's localcluster threshold (200Mi) too: it acts before the kubelet.
    assert floor_bytes(auto, 8 * GIB) > 200 * MIB


def test_the_spec_field_takes_a_quantity_or_auto() -> None:
    assert SPEC.memory.node_available_floor_bytes == FLOOR
    auto = parse_spec({"model": MODEL, "memory": {"nodeAvailableFloor": "auto"}})
    assert auto.memory.node_available_floor_bytes is None
    with pytest.raises(SpecError):
        parse_spec({"model": MODEL, "memory": {"nodeAvailableFloor": "lots"}})


def test_a_node_above_its_floor_gets_nothing_and_the_condition_says_so() -> None:
    memory = NodePressure()
    actions, events = tick([view("a")], [sample("a", FLOOR + GIB)], memory)
    assert (actions, events) == ([], [])
    (condition,) = node_condition([], memory, 1, T0)
    assert condition["type"] == ConditionType.NODE_MEMORY_PRESSURE
    assert condition["status"] == "False" and condition["reason"] == "AboveFloor"


def test_no_condition_until_a_sidecar_reports_its_nodes_memory() -> None:
    memory = NodePressure()
    tick([view("a")], [sample("a", None)], memory)
    assert node_condition([], memory, 1, T0) == []


def test_below_the_floor_every_ready_pod_on_that_node_sheds_its_caches_once() -> None:
    memory = NodePressure()
    pods = [view("a"), view("b"), view("c", node="n2"), view("d", ready=False)]
    samples = [sample("a", FLOOR - GIB, node_pressure_some=0.021), sample("c", FLOOR + GIB)]
    actions, events = tick(pods, samples, memory)
    assert actions == [
        (ActionKind.GC, "a"),
        (ActionKind.EMPTY_CACHE, "a"),
        (ActionKind.GC, "b"),
        (ActionKind.EMPTY_CACHE, "b"),
    ]
    (event,) = events
    assert event.type == "Warning" and event.reason is EventReason.NODE_MEMORY_PRESSURE
    assert "node n1: MemAvailable 9.0Gi of 24.0Gi, floor 10.0Gi" in event.message
    assert "some 2.1%" in event.message and "a, b, d" in event.message
    (condition,) = node_condition([], memory, 1, T0)
    assert condition["status"] == "True" and condition["reason"] == "BelowFloor"
    assert "node n1" in condition["message"] and "n2" not in condition["message"]
    # Still under on the next scrapes: no second event, no second relief for a while.
    assert tick(pods, samples, memory, T0 + 2) == ([], [])
    assert node_condition([condition], memory, 1, T0 + 2) == [condition]
    again, _ = tick(pods, samples, memory, T0 + RELIEF_REPEAT_SECONDS)
    assert {kind for kind, _ in again} == {ActionKind.GC, ActionKind.EMPTY_CACHE}


def test_only_cheap_steps_ever_however_deep_the_node_falls() -> None:
    memory = NodePressure()
    kinds = set()
    for step in range(10):
        now = T0 + step * RELIEF_REPEAT_SECONDS
        actions, _ = tick([view("a")], [sample("a", 100 * MIB)], memory, now)
        kinds |= {kind for kind, _ in actions}
    assert kinds == {ActionKind.GC, ActionKind.EMPTY_CACHE}


def test_a_busy_pod_waits_for_the_next_tick() -> None:
    memory = NodePressure()
    pods = [view("a"), view("b")]
    samples = [sample("a", FLOOR - GIB)]
    actions, _ = tick(pods, samples, memory, busy=frozenset({"a"}))
    assert [pod for _, pod in actions] == ["b", "b"]
    actions, _ = tick(pods, samples, memory, T0 + 2)
    assert [pod for _, pod in actions] == ["a", "a"]


def test_recovery_needs_a_margin_above_the_floor_then_one_event() -> None:
    memory = NodePressure()
    pods = [view("a")]
    tick(pods, [sample("a", FLOOR - GIB)], memory)
    # Just above the floor is not recovered: a node hovering there posts no event pairs.
    assert tick(pods, [sample("a", FLOOR + 1)], memory, T0 + 2) == ([], [])
    assert memory.under
    actions, events = tick(pods, [sample("a", FLOOR + RECOVERY_MARGIN_BYTES)], memory, T0 + 4)
    assert actions == []
    (event,) = events
    assert event.type == "Normal" and event.reason is EventReason.NODE_MEMORY_RECOVERED
    (condition,) = node_condition([], memory, 1, T0 + 4)
    assert condition["status"] == "False"
    # A new episode relieves the pods again at once.
    actions, events = tick(pods, [sample("a", FLOOR - GIB)], memory, T0 + 6)
    assert len(actions) == 2 and len(events) == 1


def test_the_lowest_report_of_a_node_counts_and_failed_scrapes_say_nothing() -> None:
    pods = [view("a"), view("b"), view("c")]
    samples = {
        "a": sample("a", 12 * GIB),
        "b": sample("b", 9 * GIB),
        "c": PodSample("c", T0, ok=False, error="timeout"),
    }
    readings = node_readings(pods, samples, SPEC)
    assert list(readings) == ["n1"] and readings["n1"].available_bytes == 9 * GIB


def test_a_node_without_pods_of_this_service_is_forgotten() -> None:
    memory = NodePressure()
    tick([view("a")], [sample("a", FLOOR - GIB)], memory)
    tick([view("b", node="n2")], [sample("b", FLOOR + GIB)], memory, T0 + 2)
    assert memory.under == {} and memory.relieved_at == {}


def test_the_sidecars_node_metrics_become_the_samples_figures() -> None:
    text = (
        "fusebox_node_memory_available_bytes 2.5e9\n"
        "fusebox_node_memory_total_bytes 2.4e10\n"
        'fusebox_node_memory_pressure_ratio{stall="some"} 0.125\n'
        'fusebox_node_memory_pressure_ratio{stall="full"} 0.04\n'
    )
    parsed = sample_from_metrics("a", parse_metrics(text), T0, "ttft")
    assert parsed.node_available_bytes == 2.5e9 and parsed.node_total_bytes == 2.4e10
    assert (parsed.node_pressure_some, parsed.node_pressure_full) == (0.125, 0.04)


def test_the_pod_view_names_its_node() -> None:
    pod = V1Pod(
        metadata=V1ObjectMeta(name="p", uid="u"),
        spec=V1PodSpec(containers=[], node_name="worker-1"),
        status=V1PodStatus(phase="Running"),
    )
    assert view_of(pod).node == "worker-1"


# ----- the kubelet's own signal (issue 36): MemoryPressure on one node of several -----

N2_PRESSURE = KubeletPressure("n2", T0 - 30, "kubelet has insufficient memory available")
ABOVE = FLOOR + GIB  # every sidecar's reading: the host is fine, as on localcluster


def test_one_node_under_kubelet_pressure_of_two_sheds_only_its_pods_caches() -> None:
    memory = NodePressure()
    pods = [view("a"), view("b", node="n2"), view("c", node="n2")]
    samples = [sample("a", ABOVE), sample("b", ABOVE), sample("c", ABOVE)]
    actions, events = tick(pods, samples, memory, kubelet={"n2": N2_PRESSURE})
    assert actions == [
        (ActionKind.GC, "b"),
        (ActionKind.EMPTY_CACHE, "b"),
        (ActionKind.GC, "c"),
        (ActionKind.EMPTY_CACHE, "c"),
    ]
    (event,) = events
    assert event.type == "Warning" and event.reason is EventReason.NODE_MEMORY_PRESSURE
    assert event.message.startswith("node n2: the kubelet reports MemoryPressure since ")
    assert "(kubelet has insufficient memory available)" in event.message
    assert "MemAvailable 11.0Gi of 24.0Gi, floor 10.0Gi" in event.message  # figures when known
    assert "below the floor" not in event.message and "n1" not in event.message
    assert "b, c" in event.message and "a," not in event.message
    (condition,) = node_condition([], memory, 1, T0)
    assert condition["status"] == "True" and condition["reason"] == "KubeletMemoryPressure"
    assert "node n2: the kubelet reports MemoryPressure" in condition["message"]
    assert "n1" not in condition["message"]
    # Still reported: no second event, and no relief again before the repeat interval.
    assert tick(pods, samples, memory, T0 + 2, kubelet={"n2": N2_PRESSURE}) == ([], [])


def test_kubelet_pressure_on_a_node_without_pods_of_this_service_is_not_ours() -> None:
    memory = NodePressure()
    far = KubeletPressure("n9", T0, "")
    assert tick([view("a")], [sample("a", ABOVE)], memory, kubelet={"n9": far}) == ([], [])
    (condition,) = node_condition([], memory, 1, T0)
    assert condition["status"] == "False"
    assert condition["message"] == (
        "every node's MemAvailable is above its floor and no node's kubelet reports MemoryPressure"
    )


def test_kubelet_pressure_recovers_when_the_kubelet_says_false_and_memavailable_agrees() -> None:
    memory = NodePressure()
    pods = [view("a"), view("b", node="n2")]
    tick(pods, [sample("a", ABOVE), sample("b", ABOVE)], memory, kubelet={"n2": N2_PRESSURE})
    # The kubelet says False, but the sidecar reads the node just above its floor: not yet.
    near = [sample("a", ABOVE), sample("b", FLOOR + 1)]
    assert tick(pods, near, memory, T0 + 2, kubelet={}) == ([], [])
    assert list(memory.under) == ["n2"]
    actions, events = tick(
        pods, [sample("a", ABOVE), sample("b", ABOVE)], memory, T0 + 4, kubelet={}
    )
    assert actions == []
    (event,) = events
    assert event.type == "Normal" and event.reason is EventReason.NODE_MEMORY_RECOVERED
    assert event.message.startswith("node n2: MemAvailable 11.0Gi of 24.0Gi, floor 10.0Gi")
    assert "the kubelet reports no MemoryPressure" in event.message
    (condition,) = node_condition([], memory, 1, T0 + 4)
    assert condition["status"] == "False" and condition["reason"] == "AboveFloor"


def test_without_sidecar_figures_the_kubelet_alone_ends_its_own_episode() -> None:
    memory = NodePressure()
    pods = [view("b", node="n2")]
    actions, events = tick(pods, [sample("b", None)], memory, kubelet={"n2": N2_PRESSURE})
    assert len(actions) == 2 and events[0].message == (
        "node n2: the kubelet reports MemoryPressure since 2027-01-15T07:59:30Z "
        "(kubelet has insufficient memory available): gc and empty_cache on b (never a "
        "reload or restart for another tenant's memory); the kubelet evicts at its "
        "memory.available threshold, Guaranteed pods last"
    )
    # Still reported: the kubelet's pressure outlasts anything the sidecar says.
    assert tick(pods, [sample("b", None)], memory, T0 + 2, kubelet={"n2": N2_PRESSURE})[1] == []
    _, events = tick(pods, [sample("b", None)], memory, T0 + 4, kubelet={})
    (event,) = events
    assert event.message == (
        "node n2: the kubelet reports no MemoryPressure; the pods refill their caches with traffic"
    )
    (condition,) = node_condition([], memory, 1, T0 + 4)
    assert condition["reason"] == "NoKubeletMemoryPressure"
    assert condition["message"] == "no node's kubelet reports MemoryPressure"


def test_a_floor_episode_never_ends_on_the_kubelets_word_without_figures() -> None:
    memory = NodePressure()
    pods = [view("a")]
    tick(pods, [sample("a", FLOOR - GIB)], memory, kubelet={})
    # A failed scrape: no figures. The kubelet says False, but it was the floor that
    # put the node under, and only MemAvailable above the floor takes it back.
    failed = [PodSample("a", T0, ok=False, error="timeout")]
    assert tick(pods, failed, memory, T0 + 2, kubelet={}) == ([], [])
    assert list(memory.under) == ["n1"]


def test_unreadable_nodes_leave_the_floor_alone_to_decide() -> None:
    memory = NodePressure()
    pods = [view("a"), view("b", node="n2")]
    # No kubelet signal (None): a node above its floor is not under, whatever its kubelet.
    assert tick(pods, [sample("a", ABOVE), sample("b", ABOVE)], memory, kubelet=None) == ([], [])
    (condition,) = node_condition([], memory, 1, T0)
    assert condition["message"] == "every node's MemAvailable is above its floor"
    # A node under by its kubelet, then the Nodes unreadable: its MemAvailable decides.
    tick(
        pods, [sample("a", ABOVE), sample("b", ABOVE)], memory, T0 + 2, kubelet={"n2": N2_PRESSURE}
    )
    _, events = tick(pods, [sample("a", ABOVE), sample("b", ABOVE)], memory, T0 + 4, kubelet=None)
    (event,) = events
    assert event.reason is EventReason.NODE_MEMORY_RECOVERED
    assert event.message == (
        "node n2: MemAvailable 11.0Gi of 24.0Gi, floor 10.0Gi: back above the floor; the "
        "pods refill their caches with traffic"
    )
