"""bench/gpu_bench.py's pure parts: the order of rounds, the budget's trimming rules,
the per-round ratios against each baseline, and the verdict per target."""

from __future__ import annotations

import pytest

from bench.gpu_bench import (
    CB_PREFIX,
    FUSEBOX,
    STATIC_BATCH,
    TARGETS,
    Budget,
    compare,
    fits,
    for_dry_run,
    for_gpu,
    next_round_fits,
    paired_ratios,
    peer_variants,
    phase_share,
    round_order,
    verdicts,
)

CB = CB_PREFIX
CB_GRAPH = f"{CB_PREFIX}_cuda_graph"


def test_rounds_rotate_so_each_setting_leads_once_per_cycle() -> None:
    settings = ["a", "b", "c"]

    orders = [round_order(settings, index) for index in range(4)]

    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    assert round_order([], 3) == []


def test_the_budget_counts_from_its_start_on_the_given_clock() -> None:
    now = [100.0]
    budget = Budget(480, clock=lambda: now[0])

    now[0] = 130.0

    assert budget.elapsed() == 30.0
    assert budget.left() == 450.0


def test_each_phase_gets_an_equal_share_of_what_is_left_after_the_reserve() -> None:
    assert phase_share(seconds_left=220, phases_left=2, reserve=20) == 100
    assert phase_share(seconds_left=10, phases_left=2, reserve=20) == 0
    assert phase_share(seconds_left=120, phases_left=0, reserve=20) == 100


def test_a_round_runs_only_when_it_fits_in_the_phase_share() -> None:
    assert fits(estimate=30, spent_in_phase=60, share=90)
    assert not fits(estimate=31, spent_in_phase=60, share=90)


def test_the_first_round_needs_only_the_whole_budget_later_ones_the_phase_share() -> None:
    # A warm-up that took 90 s (graph capture) of a 100 s share still gets one round
    # while the whole budget has room for it; the second must fit the share.
    assert next_round_fits(0, estimate=90, spent_in_phase=90, share=100, seconds_left=200)
    assert not next_round_fits(0, estimate=90, spent_in_phase=90, share=100, seconds_left=100)
    assert not next_round_fits(1, estimate=20, spent_in_phase=90, share=100, seconds_left=200)
    assert next_round_fits(1, estimate=10, spent_in_phase=90, share=100, seconds_left=200)


def test_ratios_pair_rounds_by_index_and_skip_failed_rounds() -> None:
    assert paired_ratios([100, 200, None, 90], [50, None, 40, 30]) == [2.0, 3.0]


def test_fusebox_is_compared_with_each_baseline_and_the_best_continuous_batching_setting() -> None:
    per_setting: dict[str, list[float | None]] = {
        FUSEBOX: [600, 660, 630],
        CB: [400, 440, 420],
        CB_GRAPH: [1200, 1100, 1000],
        STATIC_BATCH: [3000, 3300, None],
    }

    comparison = compare(per_setting)

    assert comparison["median_tokens_per_second"][CB_GRAPH] == 1100
    assert comparison["best_continuous_batching"] == CB_GRAPH
    assert comparison["vs_best_continuous_batching"] == pytest.approx(0.6)
    assert comparison["fusebox_ratio_vs"][CB]["median_ratio"] == pytest.approx(1.5)
    assert comparison["vs_static_batch_generate"] == pytest.approx(0.2)  # 600/3000, 660/3300


def test_without_a_peer_or_a_baseline_the_comparison_says_none() -> None:
    comparison = compare({FUSEBOX: [500.0], STATIC_BATCH: [None]})

    assert comparison["best_continuous_batching"] is None
    assert comparison["vs_best_continuous_batching"] is None
    assert comparison["vs_static_batch_generate"] is None


def test_each_target_passes_or_fails_per_concurrency_and_an_unmeasured_one_fails() -> None:
    comparisons = {
        64: {"vs_best_continuous_batching": 1.19, "vs_static_batch_generate": 0.6},
        32: {"vs_best_continuous_batching": 1.3, "vs_static_batch_generate": None},
    }

    lines = verdicts(comparisons, latency_ratio=1.05)

    assert [(line["target"], line["pass"]) for line in lines] == [
        ("c32_vs_best_continuous_batching_at_least", True),
        ("c32_vs_static_batch_generate_at_least", False),
        ("c64_vs_best_continuous_batching_at_least", False),
        ("c64_vs_static_batch_generate_at_least", True),
        ("latency_c1_p50_ratio_at_most", True),
    ]
    assert lines[0]["bound"] == TARGETS["vs_best_continuous_batching_at_least"]
    assert verdicts({}, latency_ratio=None)[-1]["pass"] is False


def test_the_gpu_run_measures_both_peer_variants_on_a_shared_card_at_32_and_64_clients() -> None:
    config = for_gpu()

    assert config.concurrencies == (32, 64)
    assert (config.device, config.dtype, config.new_tokens) == ("cuda", "bfloat16", 64)
    assert config.peer_variants[CB_GRAPH] == ["--cb-use-cuda-graph"]
    assert config.peer_variants[CB] == []
    assert "--cb-max-memory-percent" in config.peer_common_flags


def test_the_dry_run_records_the_cuda_graph_variant_as_skipped_with_its_reason() -> None:
    config = for_dry_run()

    assert config.device == "cpu"
    assert CB_GRAPH not in config.peer_variants
    assert "CUDA" in config.skipped_variants[CB_GRAPH]


def test_a_peer_variant_spec_names_a_continuous_batching_setting_and_its_flags() -> None:
    variants = peer_variants(["graph_bt16k=--cb-use-cuda-graph --cb-max-batch-tokens 16384"])

    assert variants == {
        f"{CB_PREFIX}_graph_bt16k": ["--cb-use-cuda-graph", "--cb-max-batch-tokens", "16384"]
    }
    with pytest.raises(ValueError, match="NAME=FLAGS"):
        peer_variants(["--cb-use-cuda-graph"])
