"""rollout: disruptions roll through the pods one at a time, within the PDB."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fusebox_contract.names import DegradationTier, Variant
from fusebox_operator.rollout import Degradation, PodReadiness, Rollout, pod_degradations


def rollout(ready: dict[str, bool], busy: frozenset[str] = frozenset()) -> Rollout:
    return Rollout(PodReadiness(name, ok, name in busy) for name, ok in ready.items())


def test_a_ready_pod_may_leave_only_when_every_other_pod_is_ready() -> None:
    assert rollout({"a": True, "b": True}).may_disrupt("a")
    assert not rollout({"a": True, "b": False}).may_disrupt("a")
    assert not rollout({"a": True, "b": True}, busy=frozenset({"b"})).may_disrupt("a")


def test_only_one_ready_pod_leaves_per_tick() -> None:
    gate = rollout({"a": True, "b": True, "c": True})
    assert [gate.take(pod) for pod in ("a", "b", "c")] == [True, False, False]
    assert gate.granted == ["a"]


def test_a_pod_already_out_of_service_may_be_acted_on_at_any_time() -> None:
    gate = rollout({"a": False, "b": False, "c": True})
    assert gate.take("a") and gate.take("b")
    assert not gate.take("c")


def test_a_single_replica_may_be_acted_on() -> None:
    assert rollout({"only": True}).take("only")


def test_a_pod_not_listed_is_never_acted_on() -> None:
    assert not rollout({"a": True}).may_disrupt("ghost")


def levels(
    desired: int,
    current: dict[str, int],
    has_fallback: bool,
    gate: Rollout,
    without_fallback: frozenset[str] | set[str] = frozenset(),
) -> dict[str, int]:
    """pod_degradations with every tier listed, as levels."""
    told = pod_degradations(
        Degradation(desired),
        {pod: Degradation(level) for pod, level in current.items()},
        has_fallback,
        gate,
        without_fallback,
    )
    return {pod: degradation.level for pod, degradation in told.items()}


def test_levels_that_swap_no_model_go_to_every_pod_at_once() -> None:
    ready = {"a": True, "b": True, "c": True}
    assert levels(1, dict.fromkeys(ready, 0), True, rollout(ready)) == dict.fromkeys(ready, 1)
    assert levels(3, dict.fromkeys(ready, 2), True, rollout(ready)) == dict.fromkeys(ready, 3)
    assert levels(1, dict.fromkeys(ready, 0), True, rollout(ready)) == dict.fromkeys(ready, 1)


def test_without_a_fallback_no_level_swaps_a_model() -> None:
    ready = {"a": True, "b": True}
    assert Degradation(3).variant(has_fallback=False) == "primary"
    assert levels(3, {"a": 0, "b": 1}, False, rollout(ready)) == {"a": 3, "b": 3}


def test_only_an_engaged_fallback_model_tier_serves_the_fallback() -> None:
    every = Degradation(3)
    skips = Degradation(3, (DegradationTier.NO_STREAMING, DegradationTier.CANNED_ANSWERS))
    assert every.variant(has_fallback=True) is Variant.FALLBACK
    assert skips.variant(has_fallback=True) is Variant.PRIMARY
    assert Degradation(1).variant(has_fallback=True) is Variant.PRIMARY
    # Without the tier, level 3 is no swap from level 1: every pod at once.
    ready = {"a": True, "b": True}
    told = pod_degradations(
        skips, dict.fromkeys(ready, Degradation(1, skips.tiers)), True, rollout(ready)
    )
    assert told == {"a": skips, "b": skips}


def test_the_fallback_level_goes_to_one_pod_and_the_others_keep_theirs() -> None:
    ready = {"a": True, "b": True, "c": True}
    assert levels(2, {"a": 1, "b": 1, "c": 1}, True, rollout(ready)) == {
        "a": 2,
        "b": 1,
        "c": 1,
    }
    # a is still converging (busy): nobody else moves.
    busy = rollout(ready, busy=frozenset({"a"}))
    assert levels(2, {"a": 2, "b": 1, "c": 1}, True, busy) == {"a": 2, "b": 1, "c": 1}


def test_stepping_back_to_primary_rolls_the_same_way() -> None:
    ready = {"a": True, "b": True}
    assert levels(0, {"a": 2, "b": 2}, True, rollout(ready)) == {"a": 0, "b": 2}


def test_a_starting_pod_gets_the_fallback_level_without_holding_a_ready_one_back() -> None:
    gate = rollout({"a": True, "new": False})
    assert levels(2, {"a": 2, "new": 0}, True, gate) == {"a": 2, "new": 2}


# --- property: for any sequence of pod readiness, at most one pod is ever told to leave
# service while another is not Ready ----------------------------------------------------

PODS = ("a", "b", "c")
EVERY_TIER = tuple(DegradationTier)
NO_FALLBACK_TIER = (DegradationTier.NO_STREAMING, DegradationTier.CANNED_ANSWERS)
tick = st.tuples(
    st.fixed_dictionaries({pod: st.booleans() for pod in PODS}),  # Ready condition this tick
    st.sampled_from([0, 1, 2, 3]),  # the service's desired level
    st.sampled_from([EVERY_TIER, NO_FALLBACK_TIER]),  # its tiers (an edit may drop one)
    st.lists(st.sampled_from(PODS), max_size=3),  # pods the ladder wants to restart
    st.integers(min_value=0, max_value=3),  # ticks a swap takes to converge
)


@settings(max_examples=300, deadline=None)
@given(st.lists(tick, min_size=1, max_size=40), st.booleans())
def test_property_at_most_one_pod_leaves_service_while_another_is_not_ready(
    ticks: list[tuple[dict[str, bool], int, tuple[DegradationTier, ...], list[str], int]],
    has_fallback: bool,
) -> None:
    current = dict.fromkeys(PODS, Degradation(0))
    converging_until = dict.fromkeys(PODS, -1)
    for index, (ready, desired, tiers, restarts, swap_ticks) in enumerate(ticks):
        busy = frozenset(pod for pod in PODS if converging_until[pod] >= index)
        gate = rollout(ready, busy)
        in_service = {pod for pod in PODS if ready[pod] and pod not in busy}
        told: list[str] = [pod for pod in restarts if gate.take(pod)]
        pushed = pod_degradations(Degradation(desired, tiers), current, has_fallback, gate)
        for pod in PODS:
            if pushed[pod].variant(has_fallback) != current[pod].variant(has_fallback):
                told.append(pod)
                converging_until[pod] = index + swap_ticks
        current = pushed
        leaving = {pod for pod in told if pod in in_service}
        assert len(leaving) <= 1
        if leaving:
            assert in_service == set(PODS), "a Ready pod left while another was out of service"


def test_a_pod_that_cannot_load_the_fallback_gets_level_two_at_once_and_swaps_nothing() -> None:
    ready = {"a": True, "b": True, "c": True}
    told = levels(2, dict.fromkeys(ready, 1), True, rollout(ready), without_fallback={"b"})
    # b takes no turn (nothing leaves service on it), so a still gets the one turn.
    assert told == {"a": 2, "b": 2, "c": 1}
    everyone = levels(2, dict.fromkeys(ready, 1), True, rollout(ready), set(ready))
    assert everyone == dict.fromkeys(ready, 2)
