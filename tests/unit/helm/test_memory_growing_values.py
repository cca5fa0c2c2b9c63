"""FuseboxMemoryGrowing's trend window and hold time are values (a test shortens them)."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import Render, one

ENABLED = "monitoring.prometheusRule.enabled=true"


def memory_growing(render: Render, *sets: str) -> dict[str, Any]:
    rule = one(render(sets=(ENABLED, *sets)), "PrometheusRule")
    (alert,) = [
        r
        for g in rule["spec"]["groups"]
        for r in g["rules"]
        if r["alert"] == "FuseboxMemoryGrowing"
    ]
    return dict(alert)


def test_by_default_a_fifteen_minute_trend_held_ten_minutes(render: Render) -> None:
    alert = memory_growing(render)
    assert "fusebox_process_resident_memory_bytes[15m]" in alert["expr"]
    assert alert["for"] == "10m"
    assert "15m" in alert["annotations"]["description"]


def test_the_window_and_the_hold_follow_the_values(render: Render) -> None:
    alert = memory_growing(
        render,
        "monitoring.prometheusRule.memoryGrowingWindow=1m",
        "monitoring.prometheusRule.memoryGrowingFor=15s",
    )
    assert "fusebox_process_resident_memory_bytes[1m]" in alert["expr"]
    assert alert["for"] == "15s"
    assert "1m" in alert["annotations"]["description"]


@pytest.mark.parametrize("key", ["memoryGrowingWindow", "memoryGrowingFor"])
def test_a_value_that_is_no_duration_is_refused(render: Render, key: str) -> None:
    with pytest.raises(AssertionError, match="memoryGrowing"):
        render(sets=(ENABLED, f"monitoring.prometheusRule.{key}=soon"))
