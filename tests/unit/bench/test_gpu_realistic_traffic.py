"""bench/gpu_realistic_traffic.py: the requests every server gets, their trip to a child
process, and the figures of one round."""

from __future__ import annotations

import pytest

from bench import gpu_realistic_traffic as realistic_traffic
from bench.gpu_realistic_budget import round_requests
from bench.gpu_realistic_config import for_dry_run
from bench.gpu_realistic_verdicts import round_tokens_per_second
from bench.serving_metrics import ResponseRecord


def _fake_tokens(text: str) -> int:
    """A character a token: additive, so the workload's lengths land exactly."""
    return len(text)


def test_the_traffic_is_the_workload_at_the_configured_scale() -> None:
    dry = for_dry_run()
    traffic = realistic_traffic.make_traffic(dry, _fake_tokens)

    assert sorted(traffic.closed) == sorted(dry.clients)
    for count, workload in traffic.closed.items():
        closed = workload.describe()
        assert closed["scale"] == 8
        assert closed["prompt_tokens_range"] == [32, 256]
        assert closed["output_tokens_range"] == [8, 64]
        assert len(workload.requests) == round_requests(count, dry.requests_per_client)
        assert all(8 <= r.max_tokens <= 64 for r in workload.requests)
    assert sorted(traffic.open) == ["1", "2", "4"]
    # The admission probe's prompts are all of the longest length, with no system prompt.
    assert len(traffic.admission.requests) == max(dry.admission_levels)
    assert {r.max_tokens for r in traffic.admission.requests} == {dry.admission_new_tokens}
    assert all(r.system is None for r in traffic.admission.requests)
    assert all(abs(r.prompt_tokens - 256) <= 2 for r in traffic.admission.requests)
    assert len(traffic.c1.requests) == dry.c1_requests + 1  # the first is a warm-up


def test_no_prompt_repeats_across_rounds_but_the_system_prompt_is_the_deployments() -> None:
    traffic = realistic_traffic.make_traffic(for_dry_run(), _fake_tokens)
    rounds = [*traffic.closed.values(), *traffic.open.values()]

    users = [request.user for workload in rounds for request in workload.requests]
    assert len(users) == len(set(users))
    systems = {request.system for w in rounds for request in w.requests} - {None}
    assert systems == {traffic.warmup.system_prompt}


def test_a_request_survives_the_trip_to_a_child_process() -> None:
    traffic = realistic_traffic.make_traffic(for_dry_run(), _fake_tokens)
    request = traffic.closed[4].requests[0]
    assert (
        realistic_traffic.request_from_json(realistic_traffic.request_to_json(request)) == request
    )


def test_a_round_counts_what_was_not_sent_and_what_its_end_cut() -> None:
    done = ResponseRecord(0, scheduled=0.0, chunk_times=[0.5, 1.0], finished=2.0)
    done.completion_tokens = 10
    cut = ResponseRecord(1, scheduled=0.0, finished=3.0, error="timeout: no end within 10 s")
    figures = realistic_traffic.round_figures([done, cut], offered=4)

    assert (figures["offered"], figures["not_sent"], figures["timeouts"]) == (4, 2, 1)
    assert figures["completion_tokens"] == 10 and figures["errors"] == 1
    assert round_tokens_per_second(figures) == pytest.approx(5.0)
