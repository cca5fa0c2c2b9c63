"""Manual control during an incident: the `fusebox.dev/` annotations a person sets.

Why: in an incident the person on call needs to stop the operator acting on a
service, close a breaker it holds open, or hold a degradation tier, without
editing the spec (which rolls pods and is undone by the next GitOps sync).
Annotations are the Kubernetes way to tell a controller something about one
object. Three are read here, each a plain function of the annotations, the
previous status and the policy state:

- `fusebox.dev/pause-actions: "<why>"`: the tick scrapes and decides as ever
  and posts WouldAct records as Observe does, and takes no action;
- `fusebox.dev/reset-breaker: "<token>"`: a one-shot, honoured once per
  distinct value (status keeps the value honoured, so a restarted operator
  and an annotation left in place never reset twice);
- `fusebox.dev/pin-tier: "<tier>"`: the degradation tier is held at it while
  the annotation is there (`none` holds full service).

Each is an event when seen and when removed and is listed in
`status.incident.controls` (annotation, value, since when, effect) until
removed; a bad value is a named event and entry, never a crash. The tick
(`tick.run_tick`) stays the one place decisions become calls: a pause is the
same gate as Observe. Pure: no client, no I/O.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fusebox_contract.names import BreakerState, EventReason
from fusebox_operator.observations import RequestCounts
from fusebox_operator.policy_state import PolicyState
from fusebox_operator.spec import InferenceServiceSpec
from fusebox_operator.status import TIER_NAMES, EventRecord, iso, tier_name

PREFIX = "fusebox.dev/"
PAUSE_ACTIONS = f"{PREFIX}pause-actions"
RESET_BREAKER = f"{PREFIX}reset-breaker"
PIN_TIER = f"{PREFIX}pin-tier"
INCIDENT_ANNOTATIONS = (PAUSE_ACTIONS, RESET_BREAKER, PIN_TIER)
# kopf keeps its own state under the same prefix (handlers.configure): not a typo of ours.
KOPF_ANNOTATIONS = frozenset({f"{PREFIX}last-handled-configuration"})
NO_REASON = "no reason given"
LEVEL_BY_TIER: dict[str, int] = {name: level for level, name in TIER_NAMES.items()}

# Reasons of the entries of status.incident.controls (the events' reasons, where one is posted).
PAUSED = EventReason.ACTIONS_PAUSED
PINNED = EventReason.TIER_PINNED
RESET = EventReason.BREAKER_RESET
INVALID = EventReason.INVALID_INCIDENT_ANNOTATION
ALREADY_HONOURED = "AlreadyHonoured"  # a reset-breaker value honoured before: nothing reset


@dataclass(frozen=True)
class Refusal:
    """An incident annotation the operator does not act on, and why."""

    annotation: str
    value: str
    why: str


@dataclass(frozen=True)
class IncidentControls:
    """What the annotations ask for; None: not asked. `refused`: the bad ones."""

    paused: str | None = None  # the reason given
    reset_token: str | None = None
    pinned_level: int | None = None
    refused: tuple[Refusal, ...] = ()
    values: Mapping[str, str] = field(default_factory=dict)  # every incident annotation set

    @property
    def not_acted(self) -> str:
        """The result a would-be action records while paused (status.lastWouldAct.result)."""
        return f"not acted: paused by {PAUSE_ACTIONS} ({self.paused})"


def parse_controls(annotations: Mapping[str, str], spec: InferenceServiceSpec) -> IncidentControls:
    """The incident controls the object's annotations set, with the refused ones named."""
    values = {key: str(annotations[key]) for key in INCIDENT_ANNOTATIONS if key in annotations}
    refused = [_misspelt(key, str(value)) for key, value in annotations.items()]
    kept = [r for r in refused if r is not None]
    paused = values.get(PAUSE_ACTIONS)
    if paused is not None:
        paused = paused.strip() or NO_REASON  # paused all the same: a pause is never refused
    token = values.get(RESET_BREAKER)
    if token is not None and not token.strip():
        kept.append(Refusal(RESET_BREAKER, token, "needs a value (any new one resets once)"))
        token = None
    level: int | None = None
    if PIN_TIER in values:
        level, why = pinnable_level(values[PIN_TIER], spec)
        if why:
            kept.append(Refusal(PIN_TIER, values[PIN_TIER], why))
    return IncidentControls(paused, token, level, tuple(kept), values)


def pinnable_level(value: str, spec: InferenceServiceSpec) -> tuple[int | None, str]:
    """The level a pin-tier value holds, or why it cannot: a tier the service lists, or none."""
    name = value.strip()
    allowed = ["none", *spec.degradation.tiers]
    if name not in LEVEL_BY_TIER:
        return None, f"unknown tier {value!r}: one of {', '.join(allowed)}"
    if name not in allowed:
        return None, (
            f"tier {name} is not in spec.degradation.tiers ({', '.join(allowed[1:])}): "
            f"one of {', '.join(allowed)}"
        )
    return LEVEL_BY_TIER[name], ""


def _misspelt(key: str, value: str) -> Refusal | None:
    """A `fusebox.dev/` annotation that looks like one of ours and is not: told, not ignored."""
    if not key.startswith(PREFIX) or key in INCIDENT_ANNOTATIONS or key in KOPF_ANNOTATIONS:
        return None
    close = difflib.get_close_matches(key, INCIDENT_ANNOTATIONS, n=1, cutoff=0.8)
    if not close:
        return None
    return Refusal(key, value, f"not an incident annotation: did you mean {close[0]}?")


# ----- what a tick does with them ------------------------------------------------------------


@dataclass(frozen=True)
class IncidentStep:
    """The state after a reset, the events the annotations' changes post, status.incident."""

    state: PolicyState
    events: list[EventRecord]
    status: dict[str, Any] | None  # None: no annotation now or before, nothing to write


def incident_step(
    controls: IncidentControls,
    previous: Mapping[str, Any],
    state: PolicyState,
    spec: InferenceServiceSpec,
    now: float,
) -> IncidentStep:
    """Apply a reset-breaker not yet honoured; tell what was set, changed or removed."""
    before = previous.get("incident") or {}
    honoured = before.get("breakerResetHonoured")
    told = {
        (str(e.get("annotation")), str(e.get("value"))): e
        for e in before.get("controls") or []
        if isinstance(e, Mapping)
    }
    entries: dict[str, dict[str, Any]] = {}
    events: list[EventRecord] = []
    reset_now = controls.reset_token is not None and controls.reset_token != _value(honoured)
    if reset_now:
        assert controls.reset_token is not None
        state, message = reset_breaker(state, controls.reset_token, now)
        honoured = {"value": controls.reset_token, "at": iso(now)}
        events.append(EventRecord("Normal", RESET, message))
        entries[RESET_BREAKER] = _entry(RESET_BREAKER, controls.reset_token, RESET, message)
    for refusal in controls.refused:
        message = f"{refusal.annotation}={refusal.value!r} ignored: {refusal.why}"
        entries[refusal.annotation] = _entry(refusal.annotation, refusal.value, INVALID, message)
    for annotation, value in controls.values.items():
        if annotation in entries:
            continue
        reason, message = _effect(annotation, value, controls, spec, honoured)
        entries[annotation] = _entry(annotation, value, reason, message)
    for key, entry in entries.items():
        earlier = told.get((key, entry["value"]))
        entry["since"] = str(earlier.get("since")) if earlier else iso(now)
        if earlier is None and not (key == RESET_BREAKER and reset_now):
            kind = "Normal" if entry["reason"] in (RESET, ALREADY_HONOURED) else "Warning"
            reason = RESET if entry["reason"] == ALREADY_HONOURED else EventReason(entry["reason"])
            events.append(EventRecord(kind, reason, entry["message"]))
    for (annotation, value), was in sorted(told.items()):
        if annotation not in entries:  # a new value of the same one was told above as set
            events.append(_removed(annotation, value, str(was.get("reason", ""))))
    controls_list = [entries[key] for key in sorted(entries)]
    if not controls_list and not before:
        return IncidentStep(state, events, None)
    status: dict[str, Any] = {"controls": controls_list}
    if honoured:
        status["breakerResetHonoured"] = honoured
    return IncidentStep(state, events, status)


def _value(honoured: Any) -> str | None:
    return str(honoured.get("value")) if isinstance(honoured, Mapping) else None


def _entry(annotation: str, value: str, reason: str, message: str) -> dict[str, Any]:
    return {"annotation": annotation, "value": value, "reason": str(reason), "message": message}


def _effect(
    annotation: str,
    value: str,
    controls: IncidentControls,
    spec: InferenceServiceSpec,
    honoured: Any,
) -> tuple[str, str]:
    if annotation == PAUSE_ACTIONS:
        return PAUSED, (
            f"actions paused ({controls.paused}): scraping and deciding, posting WouldAct, "
            "taking no action; remove the annotation to resume"
        )
    if annotation == PIN_TIER:
        assert controls.pinned_level is not None  # a bad value is refused before
        return PINNED, (
            f"degradation tier held at {tier_name(controls.pinned_level)} "
            f"(level {controls.pinned_level}) while the annotation is set"
        )
    at = honoured.get("at") if isinstance(honoured, Mapping) else None
    return ALREADY_HONOURED, (
        f"{RESET_BREAKER}={value!r} was honoured at {at}: nothing reset "
        "(set a new value to reset again)"
    )


def _removed(annotation: str, value: str, reason: str) -> EventRecord:
    if annotation == PAUSE_ACTIONS and reason == PAUSED:
        text = f"{PAUSE_ACTIONS} removed: acting again from this tick, the ladder starting over"
        return EventRecord("Normal", EventReason.ACTIONS_RESUMED, text)
    if annotation == PIN_TIER and reason == PINNED:
        text = f"{PIN_TIER}={value} removed: the policy steps the tier again"
        return EventRecord("Normal", EventReason.TIER_UNPINNED, text)
    text = f"{annotation}={value!r} removed"
    return EventRecord("Normal", EventReason.INCIDENT_ANNOTATION_REMOVED, text)


def reset_breaker(state: PolicyState, token: str, now: float) -> tuple[PolicyState, str]:
    """The state with the latency breaker closed and its counts started over.

    Trips are kept (they are history); the degradation tier is left to its own
    cool-off (or to pin-tier), since the breaker is what the person asked about.
    """
    after = copy.deepcopy(state)
    after.breaker, after.breaker_since = BreakerState.CLOSED, now
    after.breaker_reason = f"reset by {RESET_BREAKER}={token}"
    after.slow_since, after.slow_calls = None, 0.0
    after.half_open_counts = RequestCounts()
    message = (
        f"breaker {state.breaker.status_name} -> Closed by {RESET_BREAKER}={token!r}; "
        f"its slow-latency count starts over (trips so far: {state.trips})"
    )
    return after, message


def hold_tier(state: PolicyState, controls: IncidentControls, now: float) -> None:
    """Hold the pinned tier over whatever the policy decided this tick (in place)."""
    level = controls.pinned_level
    if level is None:
        return
    if state.level != level:
        state.level, state.level_since = level, now
    state.level_reason = f"pinned by {PIN_TIER}={tier_name(level)}"


def was_paused(status: Mapping[str, Any]) -> bool:
    """Whether the last tick ran paused (status.incident lists an honoured pause)."""
    entries: Sequence[Any] = (status.get("incident") or {}).get("controls") or []
    honoured = [e for e in entries if isinstance(e, Mapping) and e.get("reason") == PAUSED]
    return any(e.get("annotation") == PAUSE_ACTIONS for e in honoured)
