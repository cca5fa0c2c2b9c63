"""The ladder's grow-limit rung: an in-place resize of the server's memory limit."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fusebox_operator.manifests import memory_resize_patch
from fusebox_operator.observations import PodSample
from fusebox_operator.policy import decide
from fusebox_operator.policy_state import Action, ActionKind, PolicyState
from fusebox_operator.spec import InferenceServiceSpec, parse_spec

from .test_policy import COOLDOWN, INTERVAL, LIMIT, MIB, T0, make_spec

GROWS = make_spec()
GROWS = replace(GROWS, memory=replace(GROWS.memory, max_growth_ratio=1.5))


def spec_with(**memory: Any) -> InferenceServiceSpec:
    base = make_spec()
    return replace(base, memory=replace(base.memory, **memory))


def climb(
    spec: InferenceServiceSpec, seconds: float = 120, limit: float = LIMIT
) -> tuple[PolicyState, list[Action]]:
    """A steady leak from 80 % of `limit`; the pod's cgroup limit follows each grow."""
    state = PolicyState("svc", memory_limit_bytes=LIMIT)
    actions: list[Action] = []
    t = 0.0
    while t <= seconds:
        now = T0 + t
        rss = 0.80 * LIMIT + 600 * MIB * t / 60
        grown = [a.memory_limit_bytes for a in actions if a.kind is ActionKind.GROW_LIMIT]
        current = grown[-1] if grown and grown[-1] else limit
        sample = PodSample("p", now, rss_bytes=rss, memory_limit_bytes=current,
                           stats_age_seconds=1.0, heartbeat_age_seconds=0.5)  # fmt: skip
        state, new = decide(state, [sample], now, spec)
        actions.extend(new)
        t += INTERVAL
    return state, actions


def test_growth_comes_after_the_cheap_steps_and_before_a_reload() -> None:
    _, actions = climb(GROWS, seconds=200)
    kinds = [a.kind for a in actions]
    assert kinds[:3] == [ActionKind.GC, ActionKind.EMPTY_CACHE, ActionKind.GROW_LIMIT]
    grow = actions[2]
    assert grow.memory_limit_bytes == int(LIMIT * 1.5)
    # Grown once to the cap: a leak that keeps going then gets the reload.
    assert kinds.count(ActionKind.GROW_LIMIT) == 1
    assert ActionKind.RELOAD in kinds[3:]
    assert all(b.at - a.at >= COOLDOWN for a, b in zip(actions, actions[1:], strict=False))


def test_off_by_default_and_never_with_swap() -> None:
    assert parse_spec({"model": {"name": "m", "source": "pvc://m/x"}}).memory.max_growth_ratio == 1
    for spec in (make_spec(), spec_with(max_growth_ratio=2.0, allow_swap=True)):
        _, actions = climb(spec)
        assert ActionKind.GROW_LIMIT not in [a.kind for a in actions]
        assert [a.kind for a in actions][:3] == [
            ActionKind.GC,
            ActionKind.EMPTY_CACHE,
            ActionKind.RELOAD,
        ]


def test_a_pod_already_at_the_cap_is_not_grown_again() -> None:
    _, actions = climb(GROWS, limit=LIMIT * 1.5)
    assert ActionKind.GROW_LIMIT not in [a.kind for a in actions]


def test_gpu_memory_never_grows_a_limit() -> None:
    # GPU memory at 95% of VRAM and growing: VRAM cannot be resized.
    state = PolicyState("svc", memory_limit_bytes=LIMIT)
    actions: list[Action] = []
    for i in range(40):
        now = T0 + i * INTERVAL
        used = (0.90 + 0.002 * i) * 8192 * MIB
        sample = PodSample("p", now, rss_bytes=0.1 * LIMIT, memory_limit_bytes=LIMIT,
                           gpu_memory_used_bytes=used, gpu_memory_total_bytes=8192 * MIB,
                           stats_age_seconds=1.0, heartbeat_age_seconds=0.5)  # fmt: skip
        state, new = decide(state, [sample], now, GROWS)
        actions.extend(new)
    assert actions and ActionKind.GROW_LIMIT not in [a.kind for a in actions]


def test_the_target_survives_a_restart_through_status() -> None:
    action = Action("id", ActionKind.GROW_LIMIT, "p", "r", T0, memory_limit_bytes=3 * 1024**3)
    assert Action.from_status(action.to_status()) == action
    plain = Action("id", ActionKind.GC, "p", "r", T0)
    assert "memoryLimitBytes" not in plain.to_status()


def test_the_resize_patch_moves_the_request_with_the_limit_only_for_guaranteed_pods() -> None:
    guaranteed = memory_resize_patch(3 * 1024**3, with_request=True)
    (server,) = guaranteed["spec"]["containers"]
    assert server == {
        "name": "server",
        "resources": {"limits": {"memory": "3Gi"}, "requests": {"memory": "3Gi"}},
    }
    burstable = memory_resize_patch(3 * 1024**3, with_request=False)
    assert burstable["spec"]["containers"][0]["resources"] == {"limits": {"memory": "3Gi"}}
