"""status.policy's moments: readable times in `kubectl describe`, read back to the microsecond."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fusebox_contract.names import Variant
from fusebox_operator.observations import RequestCounts
from fusebox_operator.policy_state import (
    Action,
    ActionKind,
    Ladder,
    PolicyState,
    instant,
    seconds,
)

NOW = 1_796_102_003.7328715  # 2026-12-01 05:13:23 UTC, with more digits than a microsecond holds
RFC3339_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
MOMENT_KEYS = {
    "breakerSince",
    "slowSince",
    "levelSince",
    "healthySince",
    "lastActionAt",
    "calmSince",
    "swappedAt",
    "lastRestartAt",
    "at",
}


def every_timer_set() -> PolicyState:
    state = PolicyState(
        "svc",
        breaker_since=NOW - 50,
        slow_since=NOW - 40,
        level_since=NOW - 30,
        healthy_since=NOW - 20,
        last_restart_at=NOW - 10,
    )
    state.ladders["p/rss"] = Ladder(2, NOW - 5, NOW - 4, 1)
    state.variants["p"] = Variant.FALLBACK
    state.swapped_at["p"] = NOW - 3
    state.last_counts["p"] = RequestCounts(succeeded=3)
    action = Action("svc-000001-reload", ActionKind.RELOAD, "p", "rss", NOW - 2)
    state.in_flight[action.id] = action
    return state


def moments(node: Any) -> list[tuple[str, Any]]:
    """Every (key, value) of a moment key anywhere in the persisted form."""
    found: list[tuple[str, Any]] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in MOMENT_KEYS:
                found.append((key, value))
            found.extend(moments(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(moments(item))
    return found


def test_every_persisted_moment_is_rfc3339_utc_text() -> None:
    persisted = every_timer_set().to_status()
    found = moments(persisted)
    assert {key for key, _ in found} == MOMENT_KEYS
    assert all(isinstance(v, str) and RFC3339_UTC.match(v) for _, v in found), found
    assert persisted["lastRestartAt"] == "2026-12-01T05:13:13.732872Z"


def test_a_rebuilt_state_keeps_every_timer_to_the_microsecond() -> None:
    state = every_timer_set()
    rebuilt = PolicyState.from_status("svc", {"policy": state.to_status()})
    for name in ("breaker_since", "slow_since", "level_since", "healthy_since", "last_restart_at"):
        assert getattr(rebuilt, name) == pytest.approx(getattr(state, name), abs=1e-6), name
    ladder = rebuilt.ladders["p/rss"]
    assert (ladder.step, ladder.acted_step) == (2, 1)
    assert ladder.last_action_at == pytest.approx(NOW - 5, abs=1e-6)
    assert ladder.calm_since == pytest.approx(NOW - 4, abs=1e-6)
    assert rebuilt.swapped_at["p"] == pytest.approx(NOW - 3, abs=1e-6)
    (action,) = rebuilt.in_flight.values()
    assert action.at == pytest.approx(NOW - 2, abs=1e-6)


def test_a_new_state_persists_no_1970() -> None:
    persisted = PolicyState("svc").to_status()
    assert persisted["breakerSince"] is None and persisted["levelSince"] is None
    rebuilt = PolicyState.from_status("svc", {"policy": persisted})
    assert (rebuilt.breaker_since, rebuilt.level_since) == (0.0, 0.0)


def test_numbers_an_older_operator_wrote_are_read_as_unix_seconds() -> None:
    older = {
        "sequence": 4,
        "breakerSince": NOW - 50,
        "healthySince": NOW - 20,
        "ladders": [{"key": "p/rss", "step": 1, "lastActionAt": NOW - 5}],
        "pods": [{"pod": "p", "variant": "fallback", "swappedAt": NOW - 3}],
        "inFlight": [{"id": "svc-000004-gc", "kind": "gc", "pod": "p", "at": NOW - 2}],
    }
    rebuilt = PolicyState.from_status("svc", {"policy": older})
    assert rebuilt.breaker_since == NOW - 50 and rebuilt.healthy_since == NOW - 20
    assert rebuilt.ladders["p/rss"].last_action_at == NOW - 5
    assert rebuilt.swapped_at == {"p": NOW - 3}
    assert rebuilt.in_flight["svc-000004-gc"].at == NOW - 2


@pytest.mark.parametrize("raw", [None, "", "yesterday", True, [], {"s": 1}])
def test_an_unreadable_moment_is_a_timer_that_starts_again(raw: object) -> None:
    assert seconds(raw) is None
    rebuilt = PolicyState.from_status("svc", {"policy": {"slowSince": raw, "breakerSince": raw}})
    assert rebuilt.slow_since is None and rebuilt.breaker_since == 0.0


@given(st.floats(min_value=0, max_value=4_102_444_800))  # up to 2100
def test_instant_and_seconds_round_trip_to_the_microsecond(moment: float) -> None:
    text = instant(moment)
    assert text is not None and RFC3339_UTC.match(text)
    assert seconds(text) == pytest.approx(moment, abs=1e-6)
