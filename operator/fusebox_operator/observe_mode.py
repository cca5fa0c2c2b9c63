"""`spec.mode: Observe`: what a tick records in place of the actions it does not take.

Why: a team adopting Fusebox first wants to see what it would do to their
pods, with the figures, before it does anything. The tick decides exactly as
in Enforce; at the one place where decisions become calls (tick.run_tick) it
takes none of them and hands them here instead, to become WouldAct events and
`status.lastWouldAct`. Breaker, tier and scale changes are decisions too (the
pods would be told, the Deployment scaled), so their events are reworded the
same way. Pure: no client, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from fusebox_contract.names import DegradationTier, EventReason, Variant
from fusebox_operator.autoscaling import ScaleDecision
from fusebox_operator.observations import PodSample
from fusebox_operator.policy_state import Action, PolicyState
from fusebox_operator.status import EventRecord, action_entry, iso

NOT_ACTED = "not acted: spec.mode is Observe"
"""The result a would-be action records (status.lastWouldAct.result)."""

ACTING_REASONS: frozenset[EventReason] = frozenset(
    {
        EventReason.BREAKER_OPENED,
        EventReason.BREAKER_HALF_OPEN,
        EventReason.BREAKER_CLOSED,
        EventReason.DEGRADED,
        EventReason.RECOVERED,
        EventReason.SWAPPED_TO_FALLBACK,
        EventReason.RESTORED_PRIMARY,
        EventReason.SCALED_UP,
        EventReason.SCALED_DOWN,
    }
)
"""Events that tell of a change the operator makes to the pods or the Deployment:
in Observe each is a change it would make, posted as WouldAct (save one marked
`EventRecord.observation`: Degraded for quality with no remedy acts on nothing)."""


def observed(
    actions: Sequence[Action],
    events: Sequence[EventRecord],
    scale: ScaleDecision | None,
    previous: Mapping[str, Any],
    now: float,
    why: str = NOT_ACTED,
) -> tuple[list[EventRecord], dict[str, Any] | None]:
    """The tick's events as Observe posts them, and `status.lastWouldAct` (None: the
    tick would have done nothing).

    `actions`: what the policy decided and the tick did not run; `events`: the
    tick's own (breaker, tier and observation events); `scale`: the autoscaler's
    decision, which the Deployment does not get. A scale is told once per target
    count: the count never moves in Observe, so the autoscaler asks every tick.
    `why`: the result each records (a pause by annotation gives its own).
    """
    changes = [(event, "") for event in events if _acting(event)]
    kept = [event for event in events if not _acting(event)]
    if scale is not None and _new_scale(scale, previous):
        assert scale.reason is not None  # _new_scale: a scale up or down
        changes.append((EventRecord("Normal", scale.reason, scale.message), scale_id(scale)))
    posted = [*kept, *(_would(event) for event, _ in changes), *action_events(actions, why)]
    if actions:
        return posted, action_entry(actions[-1], why)
    if changes:
        event, change_id = changes[-1]
        entry = {
            "id": change_id,
            "type": event.reason.value,
            "pod": "",
            "at": iso(now),
            "reason": event.message,
            "result": why,
        }
        return posted, entry
    return posted, None


def after_observing(state: PolicyState) -> PolicyState:
    """The policy the first Enforce tick after Observe starts from.

    Nothing decided in Observe was done: the pods hold no rung, breaker state,
    tier or swap of it, and its cooldowns timed actions never taken. So the
    ladders, breaker and tier start over (the first rung can act at once),
    while what was measured (memory and latency history, the pods seen) and
    the action id sequence carry over: an id is never issued twice. The
    ladder's swaps are kept for `swaps_as_reported` to check against the pods:
    one Enforce made before a pause is still served, and forgotten it would
    hold the pod out of service (and every other pod's remedy) for good.
    """
    return PolicyState(
        state.service_id,
        memory_limit_bytes=state.memory_limit_bytes,
        sequence=state.sequence,
        variants=dict(state.variants),
        swapped_at=dict(state.swapped_at),
        last_counts=state.last_counts,
        history=state.history,
        latency_history=state.latency_history,
        first_seen=state.first_seen,
        last_fresh=state.last_fresh,
        served_once=state.served_once,
    )


def swaps_as_reported(
    state: PolicyState, samples: Mapping[str, PodSample], now: float
) -> PolicyState:
    """The ladder's swaps as the pods report them, at the first tick after holding.

    A swap Enforce made before the hold is still served; one decided while
    holding was never made. Each pod's report tells which: a pod serving the
    fallback at a level below the fallback tier was swapped by the ladder (a
    swap the memory lost gets its cool-off from now, so `_restore_primary`
    still brings it back), and a pod serving the primary holds no swap. A pod
    that reported nothing clear (a failed scrape, still loading) keeps what
    the memory says until the cool-off ends it.
    """
    variants, swapped_at = dict(state.variants), dict(state.swapped_at)
    for pod, sample in samples.items():
        if not sample.ok or sample.variant is None or sample.model_loaded is False:
            continue
        if sample.converging:
            continue
        by_level = (sample.degradation_level or 0) >= DegradationTier.FALLBACK_MODEL.level
        if sample.variant == Variant.FALLBACK and not by_level:
            variants[pod] = Variant.FALLBACK
            swapped_at.setdefault(pod, now)
        else:
            variants.pop(pod, None)
            swapped_at.pop(pod, None)
    return replace(state, variants=variants, swapped_at=swapped_at)


def action_events(actions: Sequence[Action], why: str = NOT_ACTED) -> list[EventRecord]:
    """One WouldAct per action, naming the rung (the action's kind) and its figures."""
    return [
        EventRecord(
            "Normal",
            EventReason.WOULD_ACT,
            f"would {action.kind.value} {action.pod}: {action.reason} ({why}) [{action.id}]",
        )
        for action in actions
    ]


def _acting(event: EventRecord) -> bool:
    """A change the operator makes (WouldAct in Observe); not an observation such as
    quality failing with no tier to remedy it, which Enforce posts as the same Warning."""
    return event.reason in ACTING_REASONS and not event.observation


def _would(event: EventRecord) -> EventRecord:
    return EventRecord(
        "Normal", EventReason.WOULD_ACT, f"would {event.reason.value}: {event.message}"
    )


def scale_id(scale: ScaleDecision) -> str:
    return f"scale-to-{scale.replicas}"


def _new_scale(scale: ScaleDecision, previous: Mapping[str, Any]) -> bool:
    if scale.reason not in (EventReason.SCALED_UP, EventReason.SCALED_DOWN) or scale.blocked:
        return False
    return bool((previous.get("lastWouldAct") or {}).get("id") != scale_id(scale))
