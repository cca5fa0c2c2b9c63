"""bench/gpu_realistic_budget.py: how one device call's seconds are shared among the phases,
the peer settings, the rounds and the admission probe's levels."""

from __future__ import annotations

import pytest

from bench import gpu_realistic_budget as sharing
from bench.gpu_realistic_config import for_gpu


def test_a_round_sends_at_least_one_request_per_client() -> None:
    assert sharing.round_requests(64, 2.0) == 128
    assert sharing.round_requests(32, 0.5) == 32
    assert sharing.round_requests(4, 1.5) == 6


def test_a_phase_gets_its_weights_part_of_what_is_left_after_the_reserve() -> None:
    assert sharing.phase_seconds(115.0, [3.0, 1.0, 6.0], reserve=15.0) == pytest.approx(30.0)
    assert sharing.phase_seconds(10.0, [1.0], reserve=15.0) == 0.0
    assert sharing.phase_seconds(100.0, [], reserve=0.0) == 0.0


def test_a_short_budget_measures_the_first_peer_settings_and_cuts_the_last() -> None:
    # 150 s for 4 settings of at least 75 s: the first two get 75 s each, none is left.
    assert sharing.setting_seconds(150.0, 4, minimum=75.0) == 75.0
    assert sharing.setting_seconds(75.0, 3, minimum=75.0) == 75.0
    assert sharing.setting_seconds(0.0, 2, minimum=75.0) == 0.0
    # A budget that covers every setting shares it equally.
    assert sharing.setting_seconds(400.0, 4, minimum=75.0) == 100.0


def test_the_admission_probe_stops_when_the_next_level_would_not_fit() -> None:
    assert sharing.next_level_fits(None, 1.0, growth=2.0)
    assert not sharing.next_level_fits(None, 0.0, growth=2.0)
    assert sharing.next_level_fits(10.0, 20.0, growth=2.0)
    assert not sharing.next_level_fits(10.0, 19.0, growth=2.0)


def test_a_request_may_outlive_its_rounds_sending_time_by_the_rest_of_the_round() -> None:
    gpu = for_gpu()
    assert sharing.request_timeout(gpu, 100.0) == pytest.approx(50.0)
    assert sharing.request_timeout(gpu, 4.0) == sharing.MIN_REQUEST_TIMEOUT_SECONDS
    assert sharing.request_timeout(gpu, 10_000.0) == gpu.request_timeout_seconds


def test_a_phase_shares_what_is_left_with_the_chosen_phases_after_it() -> None:
    weights = sharing.PHASE_WEIGHTS
    rest = weights["engine"] + weights["generate"]
    everything = list(sharing.PHASES)

    assert sharing.phase_share(115.0, "engine", everything) == pytest.approx(
        100.0 * weights["engine"] / rest
    )
    # Chosen alone, the last phase gets all but the reserve; a spent budget gives nothing.
    assert sharing.phase_share(115.0, "generate", ["generate"]) == pytest.approx(100.0)
    assert sharing.phase_share(10.0, "generate", everything) == 0.0
