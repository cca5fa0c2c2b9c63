"""Pure decisions: half-open admission, the memory guard, quality checks, fault parsing."""

from __future__ import annotations

import pytest

from fusebox_server.config import QualitySettings
from fusebox_server.control.breaker import Breaker, admits
from fusebox_server.control.guard import (
    MemoryReading,
    next_guard_state,
    pressure_ratio,
    sheds_prefix_cache,
)
from fusebox_server.control.quality import QualitySampler, check_response
from fusebox_server.errors import Forbidden
from fusebox_server.model.faults import Faults, parse_faults

GIB = 1 << 30


@pytest.mark.parametrize("percent", [0, 5, 20, 33, 100])
def test_half_open_admits_exactly_the_share(percent: int) -> None:
    assert sum(admits(i, percent) for i in range(1000)) == 10 * percent


def test_breaker_states() -> None:
    breaker = Breaker()
    assert breaker.admit()
    breaker.set("open", None)
    assert not any(breaker.admit() for _ in range(10))
    breaker.set("half_open", 50)
    assert [breaker.admit() for _ in range(4)].count(True) == 2
    breaker.set("closed", None)
    assert breaker.admit_percent == 100 and breaker.admit()


def test_pressure_is_the_highest_ratio_to_its_limit() -> None:
    reading = MemoryReading(
        rss_bytes=GIB,
        cgroup_usage_bytes=GIB // 2,
        cgroup_limit_bytes=2 * GIB,
        cuda_reserved_bytes=9 * GIB,
        cuda_total_bytes=10 * GIB,
    )
    assert pressure_ratio(reading) == pytest.approx(0.9)
    assert pressure_ratio(MemoryReading(GIB, None, None, None, None)) is None


def test_guard_engages_at_the_ratio_and_releases_five_points_under() -> None:
    assert not next_guard_state(False, 0.94, 0.95)
    assert next_guard_state(False, 0.95, 0.95)
    assert next_guard_state(True, 0.91, 0.95)
    assert not next_guard_state(True, 0.89, 0.95)
    assert not next_guard_state(True, None, 0.95)


def test_the_prefix_cache_is_shed_ten_points_before_the_guard_would_trip() -> None:
    assert not sheds_prefix_cache(0.84, 0.95)
    assert sheds_prefix_cache(0.85, 0.95)
    assert sheds_prefix_cache(0.99, 0.95)
    assert not sheds_prefix_cache(None, 0.95)


def test_quality_check_names_each_failure() -> None:
    defaults = QualitySettings()
    assert check_response('{"a": 1}', True, 10, 5, defaults).ok
    assert check_response("not json", True, 10, 5, defaults).reasons == ("invalid_json",)
    assert check_response("x", False, 2, 500, defaults).reasons == ("output_input_ratio",)
    assert check_response("x", False, 2, 500, QualitySettings(max_output_input_ratio=300)).ok
    blocked = QualitySettings(blocked_terms=("secret",))
    assert check_response("Some SECRET here", False, 10, 5, blocked).reasons == ("blocked_term",)


def test_quality_sampler_samples_the_rate_it_is_given_and_windows_the_ratio() -> None:
    sampler = QualitySampler(window_seconds=60)
    assert sum(sampler.should_sample(0.25) for _ in range(100)) == 25
    # A new rate (the quality file changed) applies from the next response on.
    assert sum(sampler.should_sample(1.0) for _ in range(10)) == 10
    assert sum(sampler.should_sample(0.0) for _ in range(10)) == 0
    assert sampler.failure_ratio(now=1000) is None
    sampler.record(check_response("x", True, 1, 1, QualitySettings()), now=1000)
    sampler.record(check_response("{}", True, 1, 1, QualitySettings()), now=1000)
    assert sampler.failure_ratio(now=1001) == 0.5
    assert sampler.failure_ratio(now=1100) is None
    assert (sampler.sampled_total, sampler.failed_total) == (2, 1)


def test_faults_parse_and_only_armed_ones_change() -> None:
    assert parse_faults("leak:64,slow:100,wedge") == {"leak": 64, "slow": 100, "wedge": 0}
    assert parse_faults("") == {}
    with pytest.raises(ValueError):
        parse_faults("explode:1")
    with pytest.raises(Forbidden):
        Faults({}).update({"leak": 1})
    faults = Faults({"slow": 0})
    with pytest.raises(Forbidden):
        faults.update({"leak": 1})
    assert faults.update({"slow": 5}) == {"slow": 5}
    assert faults.value("slow") == 5 and faults.value("leak") == 0
