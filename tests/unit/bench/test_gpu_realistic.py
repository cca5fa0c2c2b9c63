"""bench/gpu_realistic.py's pure parts: the model it builds, the traffic it sends, how it
shares its budget, and how the figures become comparisons and verdicts. The device run
itself is proven by its --dry-run (bench/results/gpu-dryrun/realistic.json)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import gpu_realistic as realistic
from bench.gpu_bench import Budget
from bench.serving_metrics import ResponseRecord


def test_the_full_configuration_is_llama_3_1_8b() -> None:
    config = realistic.llama_config(realistic.for_gpu().sizes)

    assert config["vocab_size"] == 128256
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (32, 8)
    assert config["rope_parameters"]["rope_type"] == "llama3"
    assert config["eos_token_id"] == [128001, 128008, 128009]
    # Llama-3.1-8B's published parameter count.
    assert realistic.parameter_count(config) == 8_030_261_248


def test_the_dry_run_narrows_width_and_depth_but_keeps_the_vocabulary_and_gqa() -> None:
    dry = realistic.for_dry_run()
    config = realistic.llama_config(dry.sizes, dry.vocab_size)

    assert config["num_hidden_layers"] == 2 and config["hidden_size"] == 128
    assert config["num_attention_heads"] // config["num_key_value_heads"] == 4
    assert config["vocab_size"] == 128256
    assert config["rope_parameters"]["rope_type"] == "llama3"


def test_a_vocabulary_too_small_for_the_tokenizers_special_ids_is_refused() -> None:
    with pytest.raises(ValueError, match="128,256"):
        realistic.llama_config(realistic.DRY_RUN_SIZES, vocab_size=32000)


def test_the_kv_cache_of_an_8b_token_and_what_an_h200_could_hold() -> None:
    config = realistic.llama_config(realistic.LLAMA31_8B_SIZES)
    per_token = realistic.kv_bytes_per_token(config, dtype_bytes=2)
    assert per_token == 2 * 32 * 8 * 128 * 2 == 131072

    weights = 2 * realistic.parameter_count(config)
    limit = realistic.physical_request_limit(141 * 10**9, weights, per_token, 2048 + 32)
    # (141 GB - 16.06 GB of weights) / (131,072 bytes x 2,080 tokens)
    assert limit == 458


def test_the_8b_save_time_is_estimated_at_the_write_rate_the_build_measured() -> None:
    estimate = realistic.build_estimate({"weight_bytes": 10**8, "save_seconds": 0.5})
    assert estimate["save_bytes_per_second"] == pytest.approx(2 * 10**8)
    assert estimate["estimated_8b_save_seconds"] == pytest.approx(2 * 8_030_261_248 / (2 * 10**8))


def test_a_round_sends_at_least_one_request_per_client() -> None:
    assert realistic.round_requests(64, 2.0) == 128
    assert realistic.round_requests(32, 0.5) == 32
    assert realistic.round_requests(4, 1.5) == 6


def test_a_phase_gets_its_weights_part_of_what_is_left_after_the_reserve() -> None:
    assert realistic.phase_seconds(115.0, [3.0, 1.0, 6.0], reserve=15.0) == pytest.approx(30.0)
    assert realistic.phase_seconds(10.0, [1.0], reserve=15.0) == 0.0
    assert realistic.phase_seconds(100.0, [], reserve=0.0) == 0.0


def test_the_run_shares_its_budget_and_a_slow_phase_leaves_less_to_the_next(
    tmp_path: Path,
) -> None:
    now = [0.0]
    budget = Budget(530.0, clock=lambda: now[0])
    run = realistic.Run(realistic.for_gpu(), budget, tmp_path, tmp_path / "out")
    weights = realistic.PHASE_WEIGHTS
    total = sum(weights.values())

    assert run.share("fusebox") == pytest.approx(515.0 * weights["fusebox"] / total)
    now[0] = 400.0  # the servers took longer than their shares
    rest = weights["engine"] + weights["generate"]
    assert run.share("engine") == pytest.approx(115.0 * weights["engine"] / rest)
    now[0] = 520.0
    assert run.share("generate") == 0.0


def test_a_short_budget_measures_the_first_peer_settings_and_cuts_the_last() -> None:
    # 150 s for 4 settings of at least 75 s: the first two get 75 s each, none is left.
    assert realistic.setting_seconds(150.0, 4, minimum=75.0) == 75.0
    assert realistic.setting_seconds(75.0, 3, minimum=75.0) == 75.0
    assert realistic.setting_seconds(0.0, 2, minimum=75.0) == 0.0
    # A budget that covers every setting shares it equally.
    assert realistic.setting_seconds(400.0, 4, minimum=75.0) == 100.0


def test_phases_not_chosen_take_no_share(tmp_path: Path) -> None:
    budget = Budget(115.0, clock=lambda: 0.0)
    run = realistic.Run(realistic.for_gpu(), budget, tmp_path, tmp_path / "out")
    run.result["phases"] = ["peers", "generate"]

    weights = realistic.PHASE_WEIGHTS
    share = 100.0 * weights["peers"] / (weights["peers"] + weights["generate"])
    assert run.share("peers") == pytest.approx(share)


def test_the_admission_probe_stops_when_the_next_level_would_not_fit() -> None:
    assert realistic.next_level_fits(None, 1.0, growth=2.0)
    assert not realistic.next_level_fits(None, 0.0, growth=2.0)
    assert realistic.next_level_fits(10.0, 20.0, growth=2.0)
    assert not realistic.next_level_fits(10.0, 19.0, growth=2.0)


def _fake_tokens(text: str) -> int:
    """A character a token: additive, so the workload's lengths land exactly."""
    return len(text)


def test_the_traffic_is_the_workload_at_the_configured_scale() -> None:
    dry = realistic.for_dry_run()
    traffic = realistic.make_traffic(dry, _fake_tokens)

    assert sorted(traffic.closed) == sorted(dry.clients)
    for count, workload in traffic.closed.items():
        closed = workload.describe()
        assert closed["scale"] == 8
        assert closed["prompt_tokens_range"] == [32, 256]
        assert closed["output_tokens_range"] == [8, 64]
        assert len(workload.requests) == realistic.round_requests(count, dry.requests_per_client)
        assert all(8 <= r.max_tokens <= 64 for r in workload.requests)
    assert sorted(traffic.open) == ["1", "2", "4"]
    # The admission probe's prompts are all of the longest length, with no system prompt.
    assert len(traffic.admission.requests) == max(dry.admission_levels)
    assert {r.max_tokens for r in traffic.admission.requests} == {dry.admission_new_tokens}
    assert all(r.system is None for r in traffic.admission.requests)
    assert all(abs(r.prompt_tokens - 256) <= 2 for r in traffic.admission.requests)
    assert len(traffic.c1.requests) == dry.c1_requests + 1  # the first is a warm-up


def test_no_prompt_repeats_across_rounds_but_the_system_prompt_is_the_deployments() -> None:
    traffic = realistic.make_traffic(realistic.for_dry_run(), _fake_tokens)
    rounds = [*traffic.closed.values(), *traffic.open.values()]

    users = [request.user for workload in rounds for request in workload.requests]
    assert len(users) == len(set(users))
    systems = {request.system for w in rounds for request in w.requests} - {None}
    assert systems == {traffic.warmup.system_prompt}


def test_the_gpu_traffic_is_the_full_shape() -> None:
    gpu = realistic.for_gpu()
    assert gpu.scale == 1 and gpu.clients[0] == realistic.HEADLINE_CLIENTS
    assert sorted(gpu.clients) == [32, 64, 128] and len(gpu.open_rates) == 3


def test_a_request_survives_the_trip_to_a_child_process() -> None:
    traffic = realistic.make_traffic(realistic.for_dry_run(), _fake_tokens)
    request = traffic.closed[4].requests[0]
    assert realistic.request_from_json(realistic.request_to_json(request)) == request


def _round(tokens_per_second: float, errors: int = 0, timeouts: int = 0) -> dict[str, Any]:
    return {"tokens_per_second": tokens_per_second, "errors": errors, "timeouts": timeouts}


def test_a_request_may_outlive_its_rounds_sending_time_by_the_rest_of_the_round() -> None:
    gpu = realistic.for_gpu()
    assert realistic.request_timeout(gpu, 100.0) == pytest.approx(50.0)
    assert realistic.request_timeout(gpu, 4.0) == realistic.MIN_REQUEST_TIMEOUT_SECONDS
    assert realistic.request_timeout(gpu, 10_000.0) == gpu.request_timeout_seconds


def test_a_round_counts_what_was_not_sent_and_what_its_end_cut() -> None:
    done = ResponseRecord(0, scheduled=0.0, chunk_times=[0.5, 1.0], finished=2.0)
    done.completion_tokens = 10
    cut = ResponseRecord(1, scheduled=0.0, finished=3.0, error="timeout: no end within 10 s")
    figures = realistic.round_figures([done, cut], offered=4)

    assert (figures["offered"], figures["not_sent"], figures["timeouts"]) == (4, 2, 1)
    assert figures["completion_tokens"] == 10 and figures["errors"] == 1
    assert realistic._tokens_per_second(figures) == pytest.approx(5.0)


def test_a_round_with_a_failure_other_than_a_cut_has_no_tokens_per_second() -> None:
    assert realistic._tokens_per_second(_round(100.0, errors=2, timeouts=2)) == 100.0
    assert realistic._tokens_per_second(_round(100.0, errors=3, timeouts=2)) is None


def test_the_best_peer_per_client_count_ignores_rounds_with_errors() -> None:
    peers = {
        "graphs": {"closed": {"64": _round(900.0), "32": _round(700.0)}},
        "compile": {"closed": {"64": _round(1500.0, errors=3), "32": _round(800.0)}},
        "broken": {"flags": "--x", "failed": "did not start"},
    }
    assert realistic.best_peers(peers, [64, 32, 128]) == {
        "64": "graphs",
        "32": "compile",
        "128": None,
    }


def _measured_result() -> dict[str, Any]:
    fusebox_64 = _round(1200.0) | {
        "ttft_p99_paired_with": {"graphs": {"requests": 100, "fusebox": 1.5, "peer": 3.0}}
    }
    return {
        "fusebox": {
            "closed": {"64": fusebox_64, "32": _round(800.0)},
            "c1": {"median_latency_seconds": 2.1},
        },
        "peers": {
            "graphs": {"closed": {"64": _round(800.0), "32": _round(700.0)}},
            "default": {"closed": {"64": _round(400.0)}},
        },
        "engine": {"closed": {"64": _round(1400.0)}},
        "generate": {"c1": {"median_latency_seconds": 2.0}},
    }


def test_fusebox_is_compared_with_the_best_peer_its_engine_and_compiled_generate() -> None:
    compared = realistic.comparisons(_measured_result(), [64, 32])

    row = compared["by_clients"]["64"]
    assert row["best_peer"] == "graphs"
    assert row["tokens_per_second_vs_best_peer"] == pytest.approx(1.5)
    assert row["ttft_p99_vs_best_peer"] == pytest.approx(0.5)
    assert row["http_vs_in_process_engine"] == pytest.approx(1200 / 1400)
    assert compared["by_clients"]["32"]["http_vs_in_process_engine"] is None
    assert compared["c1_latency_vs_compiled_static_generate"] == pytest.approx(1.05)

    verdicts = {line["target"]: line["pass"] for line in realistic.verdicts(compared, 64)}
    assert verdicts == {
        "headline_tokens_per_second_vs_best_peer_at_least": True,
        "headline_ttft_p99_vs_best_peer_at_most": True,
        "headline_http_vs_in_process_engine_at_least": True,
        "c1_latency_vs_compiled_static_generate_at_most": True,
    }
    # Read at another client count, the same figures are not there.
    assert not any(line["pass"] for line in realistic.verdicts(compared, 128)[:3])


def test_a_target_not_measured_fails() -> None:
    result = _measured_result()
    del result["engine"]
    result["generate"] = {}
    verdicts = {
        line["target"]: (line["value"], line["pass"])
        for line in realistic.verdicts(realistic.comparisons(result, [64]), 64)
    }
    assert verdicts["headline_http_vs_in_process_engine_at_least"] == (None, False)
    assert verdicts["c1_latency_vs_compiled_static_generate_at_most"] == (None, False)
    assert verdicts["headline_tokens_per_second_vs_best_peer_at_least"][1] is True


def test_the_admission_limit_is_the_devices_memory_over_each_requests_kv_cache() -> None:
    model = {
        "config": realistic.llama_config(realistic.LLAMA31_8B_SIZES),
        "dtype": "bfloat16",
        "device_memory_bytes": 150_000_000_000,
        "weight_bytes": 16_060_522_496,
    }
    limit = realistic.admission_limit(model, prompt_tokens=2048, new_tokens=32)
    assert limit["kv_bytes_per_token"] == 131072
    assert limit["tokens_per_request"] == 2080
    assert limit["physical_limit_requests"] == (150_000_000_000 - 16_060_522_496) // (131072 * 2080)


def test_greedy_answers_are_compared_request_by_request() -> None:
    ours = [{"index": 1, "text": "a b"}, {"index": 2, "text": "c"}, {"index": 3, "text": "d"}]
    theirs = [{"index": 1, "text": "a b"}, {"index": 2, "text": "x"}, {"index": 9, "text": "d"}]
    assert realistic.texts_equal(ours, theirs) == "1/2"
