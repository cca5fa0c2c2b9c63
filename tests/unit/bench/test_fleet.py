"""The fleet simulator's pure pieces: address blocks, fake nodes, memory curves, the
bench's reaction and request arithmetic."""

from __future__ import annotations

import ipaddress

import pytest

from bench.fleet.curves import GIB, CurveSettings, MemoryCurve, Shape
from bench.fleet.plan import POD_NETWORK, fake_node, hangs, node_blocks, shape_of
from bench.operator_scale_bench import operator_requests, percentile, reaction_delays
from fusebox_contract.names import ActionType

pytestmark = pytest.mark.unit


def test_node_blocks_are_disjoint_loopback_blocks_inside_the_pod_network() -> None:
    blocks = [ipaddress.ip_network(b) for b in node_blocks(200)]
    assert len(blocks) == 200
    assert all(block.subnet_of(POD_NETWORK) for block in blocks)
    assert all(block.is_loopback for block in blocks)
    assert not any(a.overlaps(b) for i, a in enumerate(blocks) for b in blocks[i + 1 :])


def test_node_blocks_refuse_more_nodes_than_fit_at_a_slash_24() -> None:
    with pytest.raises(ValueError, match="do not fit"):
        node_blocks(2**14 + 1)


def test_a_fake_node_carries_its_block_the_gpu_capacity_and_the_gfd_labels() -> None:
    node = fake_node(3, "127.64.0.0/18", gpus=8)
    assert node["spec"]["podCIDR"] == "127.64.0.0/18"
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "8"
    labels = node["metadata"]["labels"]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert int(labels["nvidia.com/gpu.memory"]) > 80_000
    assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"


def test_about_five_percent_of_pods_leak_and_each_pod_always_draws_the_same() -> None:
    addresses = [str(POD_NETWORK[i]) for i in range(1, 20_001)]
    leaking = sum(shape_of(a) is Shape.LEAK for a in addresses)
    assert 0.04 < leaking / len(addresses) < 0.06
    assert [shape_of(a) for a in addresses[:50]] == [shape_of(a) for a in addresses[:50]]


def test_a_leak_crosses_its_threshold_when_the_curve_says_and_only_a_reload_cures_it() -> None:
    settings = CurveSettings(limit_bytes=4 * GIB, leak_mib_per_minute=1024)
    curve = MemoryCurve(Shape.LEAK, started_at=1000.0, settings=settings)
    crossed = curve.crosses_threshold_at()
    assert crossed == pytest.approx(1060.0)  # 1 GiB from 50% to 75% at 1 GiB/min
    assert curve.rss_bytes(crossed + 1) / settings.limit_bytes > 0.75
    curve.act(ActionType.GC, crossed + 1)
    assert curve.rss_bytes(crossed + 2) / settings.limit_bytes > 0.75  # gc frees no leak
    before, after = curve.act(ActionType.UNLOAD, crossed + 2)
    curve.act(ActionType.LOAD, crossed + 2)
    assert after < before
    assert curve.rss_bytes(crossed + 2) == curve.baseline_bytes


def test_gc_frees_a_spike_and_a_steady_pod_never_crosses() -> None:
    spike = MemoryCurve(Shape.SPIKE, started_at=0.0)
    assert spike.rss_bytes(1.0) > spike.baseline_bytes
    spike.act(ActionType.GC, 1.0)
    assert spike.rss_bytes(2.0) == spike.baseline_bytes
    steady = MemoryCurve(Shape.STEADY, started_at=0.0)
    assert steady.crosses_threshold_at() is None
    assert steady.rss_bytes(10_000.0) == steady.baseline_bytes


def test_reaction_delays_count_unanswered_leaks_and_skip_those_crossing_too_late() -> None:
    pods = [
        {"shape": "leak", "crossed_at": 100.0, "first_action_at": 105.0, "actions": 1},
        {"shape": "leak", "crossed_at": 100.0, "first_action_at": None, "actions": 0},
        {"shape": "leak", "crossed_at": 199.0, "first_action_at": None, "actions": 0},
        {"shape": "steady", "crossed_at": None, "first_action_at": None, "actions": 2},
        {"shape": "leak", "crossed_at": 90.0, "first_action_at": None, "actions": 0, "hung": True},
    ]
    delays = reaction_delays({"at": 200.0, "pods": pods}, interval=5.0, settle_seconds=15.0)
    assert delays["acted_on"] == 1
    assert delays["not_acted_on"] == 1
    assert delays["first_action_p99_intervals"] == 1.0
    assert delays["non_leaking_pods_acted_on"] == 1


def test_operator_requests_are_the_difference_between_windows_per_service_minute() -> None:
    with_operator = {"PATCH inferenceservices": 2.0, "LIST deployments": 1.0, "GET leases": 1.0}
    without = {"GET leases": 1.0}
    figures = operator_requests(with_operator, without, services=60)
    assert figures["per_service_per_minute"] == 3.0
    assert figures["child_lists_per_service_per_minute"] == {"LIST deployments": 1.0}
    assert figures["periodic_child_list_per_service"] is True


def test_percentile_is_nearest_rank() -> None:
    assert percentile([], 0.99) is None
    assert percentile([float(i) for i in range(1, 101)], 0.99) == 99.0


def test_every_bench_script_the_fleet_added_has_a_suite_entry() -> None:
    from bench.suite import SUITE, scripts_without_an_entry

    assert scripts_without_an_entry() == []
    fleet = next(b for b in SUITE if b.script == "operator_scale_bench.py")
    assert fleet.command({})[-1] == "--quick"


def test_the_simulators_metrics_read_as_a_pod_sample_by_the_operators_own_parser() -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "operator"))
    from bench.fleet.simulator import Fleet, metrics_text
    from fusebox_operator.telemetry import parse_metrics, sample_from_metrics

    fleet = Fleet(CurveSettings())
    pod = fleet.pod("127.64.0.7", now=0.0)
    assert pod is not None
    assert fleet.pod("10.0.0.7", now=0.0) is None  # only the loopback pod network
    sample = sample_from_metrics("p", parse_metrics(metrics_text(pod, 1.0)), 1.0, "ttft")
    assert sample.rss_bytes == pod.curve.rss_bytes(1.0)
    assert sample.memory_limit_bytes == CurveSettings().limit_bytes
    assert sample.latency_p99_seconds == 0.05
    assert sample.model_loaded is True
    assert sample.heartbeat_age_seconds is not None
    # A healthy sidecar's report of its server: valid stats, RSS measured at the scrape.
    assert sample.stats_valid is True and sample.stats_observed
    assert sample.rss_measured is True


def test_a_reload_keeps_the_first_crossing_it_ended_for_the_reaction_figure() -> None:
    curve = MemoryCurve(Shape.LEAK, started_at=0.0, settings=CurveSettings())
    assert curve.first_crossing(59.0) is None
    curve.act(ActionType.UNLOAD, 61.0)
    curve.act(ActionType.LOAD, 61.0)
    assert curve.first_crossing(61.0) == pytest.approx(60.0)  # not the next cycle's 121 s


def test_the_hung_share_is_a_stable_draw_of_its_own() -> None:
    addresses = [str(POD_NETWORK[i]) for i in range(1, 10_001)]
    hung = [a for a in addresses if hangs(a, 0.9)]
    assert 0.88 < len(hung) / len(addresses) < 0.92
    assert not any(hangs(a, 0.0) for a in addresses)
