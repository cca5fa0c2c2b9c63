"""bench/gpu_realistic_verdicts.py: the figures as comparisons (Fusebox against the best peer,
its engine in process and compiled `generate`) and pass/fail per target, a figure not measured
failing."""

from __future__ import annotations

from typing import Any

import pytest

from bench import gpu_realistic_verdicts as realistic_verdicts


def _round(tokens_per_second: float, errors: int = 0, timeouts: int = 0) -> dict[str, Any]:
    return {"tokens_per_second": tokens_per_second, "errors": errors, "timeouts": timeouts}


def test_a_round_with_a_failure_other_than_a_cut_has_no_tokens_per_second() -> None:
    assert realistic_verdicts.round_tokens_per_second(_round(100.0, errors=2, timeouts=2)) == 100.0
    assert realistic_verdicts.round_tokens_per_second(_round(100.0, errors=3, timeouts=2)) is None


def test_the_best_peer_per_client_count_ignores_rounds_with_errors() -> None:
    peers = {
        "graphs": {"closed": {"64": _round(900.0), "32": _round(700.0)}},
        "compile": {"closed": {"64": _round(1500.0, errors=3), "32": _round(800.0)}},
        "broken": {"flags": "--x", "failed": "did not start"},
    }
    assert realistic_verdicts.best_peers(peers, [64, 32, 128]) == {
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
    compared = realistic_verdicts.comparisons(_measured_result(), [64, 32])

    row = compared["by_clients"]["64"]
    assert row["best_peer"] == "graphs"
    assert row["tokens_per_second_vs_best_peer"] == pytest.approx(1.5)
    assert row["ttft_p99_vs_best_peer"] == pytest.approx(0.5)
    assert row["http_vs_in_process_engine"] == pytest.approx(1200 / 1400)
    assert compared["by_clients"]["32"]["http_vs_in_process_engine"] is None
    assert compared["c1_latency_vs_compiled_static_generate"] == pytest.approx(1.05)

    verdicts = {line["target"]: line["pass"] for line in realistic_verdicts.verdicts(compared, 64)}
    assert verdicts == {
        "headline_tokens_per_second_vs_best_peer_at_least": True,
        "headline_ttft_p99_vs_best_peer_at_most": True,
        "headline_http_vs_in_process_engine_at_least": True,
        "c1_latency_vs_compiled_static_generate_at_most": True,
    }
    # Read at another client count, the same figures are not there.
    assert not any(line["pass"] for line in realistic_verdicts.verdicts(compared, 128)[:3])


def test_a_target_not_measured_fails() -> None:
    result = _measured_result()
    del result["engine"]
    result["generate"] = {}
    verdicts = {
        line["target"]: (line["value"], line["pass"])
        for line in realistic_verdicts.verdicts(realistic_verdicts.comparisons(result, [64]), 64)
    }
    assert verdicts["headline_http_vs_in_process_engine_at_least"] == (None, False)
    assert verdicts["c1_latency_vs_compiled_static_generate_at_most"] == (None, False)
    assert verdicts["headline_tokens_per_second_vs_best_peer_at_least"][1] is True


def test_greedy_answers_are_compared_request_by_request() -> None:
    ours = [{"index": 1, "text": "a b"}, {"index": 2, "text": "c"}, {"index": 3, "text": "d"}]
    theirs = [{"index": 1, "text": "a b"}, {"index": 2, "text": "x"}, {"index": 9, "text": "d"}]
    assert realistic_verdicts.texts_equal(ours, theirs) == "1/2"
