"""Which timer wakes a service, and how early a wake-up may scrape (cadence.py).

The default 5 s scrape interval and every multiple of 2.5 s get the coarse 2.5 s
timer; any other interval the 1 s one; the applied spec decides while a later edit is
refused or waits. kopf's `when` filters of the two timers never both match, nor
both miss, so every service is ticked by exactly one.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from fusebox_operator import handlers
from fusebox_operator.cadence import (
    COARSE_TICK_SECONDS,
    FINE_TICK_SECONDS,
    coarse_ticks,
    tick_slack_seconds,
    watched_scrape_interval,
)
from fusebox_operator.memo import ServiceMemo

from .conftest import REPO

T0 = 1_800_000_000.0


def spec(interval: Any = None) -> dict[str, Any]:
    raw: dict[str, Any] = {"model": {"name": "chat", "source": "pvc://m/chat"}}
    if interval is not None:
        raw["telemetry"] = {"scrapeIntervalSeconds": interval}
    return raw


@pytest.mark.parametrize(
    ("interval", "coarse"),
    [(None, True), (5, True), (10, True), (60, True), (7.5, True), (2.5, True), (1, False),
     (3, False), (12, False), (1.25, False)],
)  # fmt: skip
def test_multiples_of_two_and_a_half_seconds_tick_coarsely_and_the_rest_every_second(
    interval: Any, coarse: bool
) -> None:
    assert coarse_ticks(spec(interval), {}) is coarse
    kwargs = {"spec": spec(interval), "status": {}}
    assert (handlers._coarse_ticks(**kwargs), handlers._fine_ticks(**kwargs)) == (
        coarse,
        not coarse,
    )


def test_the_applied_spec_picks_the_timer_while_an_edit_is_not_applied() -> None:
    status = {"appliedSpec": json.dumps(spec(2))}
    assert watched_scrape_interval(spec(10), status) == 2.0
    assert coarse_ticks(spec(10), status) is False
    assert coarse_ticks(spec(2), {"appliedSpec": json.dumps(spec(10))}) is True
    assert watched_scrape_interval(spec(2), {"appliedSpec": "{not json"}) == 2.0


def test_a_coarse_wake_up_a_little_early_still_scrapes() -> None:
    memo = ServiceMemo()
    memo.scraped(T0, 5.0)
    assert memo.scrape_due(T0 + 4.99, slack_seconds=1.25)  # the timer's clock ran ahead
    assert not memo.scrape_due(T0 + 2.5, slack_seconds=1.25)  # the grid point between
    assert not memo.scrape_due(T0 + 4.99)  # without slack it would wait for the next tick


def scrape_gaps(interval: float, tick_seconds: float, jitter: float = 0.01) -> set[float]:
    """The seconds between scrapes of a timer ticking every `tick_seconds`, each wake-up
    a little early or late, as kopf's are."""
    memo = ServiceMemo()
    scrapes: list[float] = []
    for k in range(60):
        now = T0 + k * tick_seconds + (jitter if k % 2 else -jitter)
        if memo.scrape_due(now, tick_slack_seconds(tick_seconds)):
            memo.scraped(now, interval)
            scrapes.append(now)
    gaps = [b - a for a, b in zip(scrapes, scrapes[1:], strict=False)]
    return {round(gap) if tick_seconds == 1 else round(gap, 1) for gap in gaps}


def test_an_interval_off_the_coarse_grid_takes_effect_rounded_to_a_whole_second_as_described() -> (
    None
):
    assert scrape_gaps(3.2, FINE_TICK_SECONDS) == {3}
    assert scrape_gaps(3.7, FINE_TICK_SECONDS) == {4}
    assert scrape_gaps(1.5, FINE_TICK_SECONDS) <= {1, 2}  # a half goes either way
    assert scrape_gaps(7.5, COARSE_TICK_SECONDS) == {7.5}  # on the coarse grid: exact
    crd = yaml.safe_load((REPO / "crds" / "inferenceservice.yaml").read_text(encoding="utf-8"))
    spec_schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    telemetry = spec_schema["properties"]["telemetry"]["properties"]
    described = telemetry["scrapeIntervalSeconds"]["description"]
    assert "A multiple of 2.5 s is kept exactly" in described
    assert "rounded to the nearest whole second" in described
