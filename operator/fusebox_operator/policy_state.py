"""What `decide` remembers between ticks, and the actions it emits.

Why: the policy's memory outlives the operator's process (`status.policy`),
and an action's id must come from that memory, so a restarted operator sends
the same id again and the server's idempotency turns the repeat into a
no-op. The state, its persisted form and the action vocabulary live here;
the decisions that change them live in `policy`. Moments are persisted as
RFC 3339 UTC text to the microsecond (`2026-12-02T13:10:05.123456Z`), so
`kubectl describe` shows times, not `1.7961020037328715e+09`; a number (what
an older operator wrote) is read as Unix seconds.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from fusebox_contract.names import BreakerState, Variant
from fusebox_operator.latency import Buckets, Snapshot
from fusebox_operator.observations import RequestCounts


class ActionKind(enum.StrEnum):
    GC = "gc"
    EMPTY_CACHE = "empty_cache"
    GROW_LIMIT = "grow_limit"  # resize the server's memory limit in place (no restart)
    RELOAD = "reload"  # unload, then load the same variant
    SWAP_FALLBACK = "swap_fallback"
    RESTORE_PRIMARY = "restore_primary"
    RESTART = "restart"  # delete the pod; the Deployment replaces it
    DRAIN = "drain"  # delete a pod whose GPU went Unhealthy; its replacement gets a healthy one


DISRUPTIVE: frozenset[ActionKind] = frozenset(
    {ActionKind.RELOAD, ActionKind.SWAP_FALLBACK, ActionKind.RESTORE_PRIMARY, ActionKind.RESTART}
)
"""Actions that take a pod out of service: they roll through the pods one at a time."""
MAX_ATTEMPTS = 5
"""An action whose outcome stays unknown is retried (same id) at most this often."""


@dataclass(frozen=True)
class Action:
    id: str
    kind: ActionKind
    pod: str
    reason: str
    at: float
    variant: Variant = Variant.PRIMARY  # the variant a reload loads / a swap targets
    attempts: int = 1  # how often it was sent; a retry reuses the id
    memory_limit_bytes: int | None = None  # the limit a grow-limit action resizes to

    def to_status(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "id": self.id,
            "kind": self.kind.value,
            "pod": self.pod,
            "reason": self.reason,
            "at": instant(self.at),
            "variant": self.variant.value,
            "attempts": self.attempts,
        }
        if self.memory_limit_bytes is not None:
            entry["memoryLimitBytes"] = self.memory_limit_bytes
        return entry

    @classmethod
    def from_status(cls, raw: Mapping[str, Any]) -> Action:
        return cls(
            id=str(raw["id"]),
            kind=ActionKind(raw["kind"]),
            pod=str(raw["pod"]),
            reason=str(raw.get("reason", "")),
            at=seconds(raw.get("at")) or 0.0,
            variant=Variant(raw.get("variant", Variant.PRIMARY)),
            attempts=int(raw.get("attempts", 1)),
            memory_limit_bytes=(
                int(raw["memoryLimitBytes"]) if raw.get("memoryLimitBytes") is not None else None
            ),
        )


@dataclass
class Ladder:
    """Where one pod stands on the ladder for one resource (rss, gpu, wedge)."""

    step: int = 0  # the next rung to try
    last_action_at: float | None = None
    calm_since: float | None = None
    acted_step: int | None = None  # the rung of the last action, until it is judged


@dataclass
class PolicyState:
    """Everything decide() remembers. `to_status` keeps what must survive a restart."""

    service_id: str
    memory_limit_bytes: float | None = None
    sequence: int = 0
    breaker: BreakerState = BreakerState.CLOSED
    breaker_since: float = 0.0
    breaker_reason: str = ""
    trips: int = 0
    slow_since: float | None = None
    slow_calls: float = 0.0
    half_open_counts: RequestCounts = RequestCounts()
    level: int = 0
    level_since: float = 0.0
    level_reason: str = ""
    healthy_since: float | None = None
    ladders: dict[str, Ladder] = field(default_factory=dict)  # key "pod/resource"
    variants: dict[str, Variant] = field(default_factory=dict)  # pods swapped by the ladder
    swapped_at: dict[str, float] = field(default_factory=dict)
    last_counts: dict[str, RequestCounts] = field(default_factory=dict)
    last_restart_at: float | None = None
    # Sent, outcome unknown (the call timed out): retried with the same id,
    # and the pod gets no other action until it settles.
    in_flight: dict[str, Action] = field(default_factory=dict)
    # In memory only: rebuilt after a restart by fresh scrapes.
    history: dict[str, list[tuple[float, float | None, float | None]]] = field(default_factory=dict)
    latency_history: dict[str, list[Snapshot]] = field(default_factory=dict)  # pod -> buckets
    # Pod -> its histogram when the breaker went half-open: the half-open requests are
    # what it gained since. After a restart, a pod counts from its next scrape.
    half_open_buckets: dict[str, Buckets] = field(default_factory=dict)
    first_seen: dict[str, float] = field(default_factory=dict)
    last_fresh: dict[str, float] = field(default_factory=dict)
    served_once: set[str] = field(default_factory=set)  # pods whose stats were fresh once
    stale_pods: set[str] = field(default_factory=set)
    quality_ratio: float | None = None
    # Why quality failures have nothing to degrade to ("" when they have, or quality
    # is fine). In memory only: recomputed at the next fresh scrape after a restart.
    quality_unremedied: str = ""
    p99_millis: float | None = None
    # Pods whose server cannot swap to the spec's fallback -> its reason. In memory
    # only: a new entry is one FallbackUnavailable event, so after an operator
    # restart each such pod is named once more.
    fallback_unavailable: dict[str, str] = field(default_factory=dict)
    # Pod -> the soonest its memory reaches a limit at the current growth, in seconds;
    # absent while nothing grows. In memory only (status shows it, refreshed each tick).
    time_to_oom: dict[str, float] = field(default_factory=dict)

    def to_status(self) -> dict[str, Any]:
        """The persisted part (status.policy), JSON-safe."""
        return {
            "sequence": self.sequence,
            # 0.0 is "never" (a new state): absent, not 1970.
            "breakerSince": instant(self.breaker_since or None),
            "slowSince": instant(self.slow_since),
            "slowCalls": self.slow_calls,
            "halfOpenCounts": list(self.half_open_counts.as_tuple()),
            "levelSince": instant(self.level_since or None),
            "healthySince": instant(self.healthy_since),
            # Lists, not maps: a merge patch replaces a list whole, so an entry
            # dropped here is dropped from the stored status too.
            # An entry's absent value is an absent key, never null: the API server
            # prunes nulls from a list's entries, the stored status then differs from
            # the patch, and kopf warns "Merge-patching finished with inconsistencies".
            "ladders": [
                without_nulls(
                    {
                        "key": key,
                        "step": lad.step,
                        "lastActionAt": instant(lad.last_action_at),
                        "calmSince": instant(lad.calm_since),
                        "actedStep": lad.acted_step,
                    }
                )
                for key, lad in sorted(self.ladders.items())
            ],
            "pods": [
                without_nulls(
                    {
                        "pod": pod,
                        "variant": self.variants.get(pod),
                        "swappedAt": instant(self.swapped_at.get(pod)),
                        "counts": list(self.last_counts[pod].as_tuple())
                        if pod in self.last_counts
                        else None,
                    }
                )
                for pod in sorted(set(self.variants) | set(self.last_counts))
            ],
            "lastRestartAt": instant(self.last_restart_at),
            "inFlight": [action.to_status() for _, action in sorted(self.in_flight.items())],
        }

    @classmethod
    def from_status(
        cls, service_id: str, status: Mapping[str, Any], memory_limit_bytes: float | None = None
    ) -> PolicyState:
        """Rebuild after an operator restart from the object's status (missing parts default)."""
        policy = status.get("policy") or {}
        pods = [p for p in policy.get("pods") or [] if isinstance(p, Mapping) and "pod" in p]
        breaker = status.get("breaker") or {}
        degradation = status.get("degradation") or {}
        try:
            breaker_state = BreakerState.from_status_name(
                breaker.get("state", BreakerState.CLOSED.status_name)
            )
        except ValueError:
            breaker_state = BreakerState.CLOSED
        in_flight = []
        for raw in policy.get("inFlight") or []:
            try:
                in_flight.append(Action.from_status(raw))
            except (KeyError, TypeError, ValueError):
                continue  # an entry this version cannot read is dropped, not fatal
        return cls(
            service_id=service_id,
            memory_limit_bytes=memory_limit_bytes,
            sequence=int(policy.get("sequence", 0)),
            breaker=breaker_state,
            breaker_since=seconds(policy.get("breakerSince")) or 0.0,
            breaker_reason=str(breaker.get("reason", "")),
            trips=int(breaker.get("trips", 0)),
            slow_since=seconds(policy.get("slowSince")),
            slow_calls=float(policy.get("slowCalls", 0.0)),
            half_open_counts=RequestCounts(*policy.get("halfOpenCounts", (0, 0, 0, 0))),
            level=int(degradation.get("level", 0)),
            level_since=seconds(policy.get("levelSince")) or 0.0,
            level_reason=str(degradation.get("reason", "")),
            healthy_since=seconds(policy.get("healthySince")),
            ladders={
                str(v["key"]): Ladder(
                    int(v.get("step", 0)),
                    seconds(v.get("lastActionAt")),
                    seconds(v.get("calmSince")),
                    v.get("actedStep"),
                )
                for v in (policy.get("ladders") or [])
                if isinstance(v, Mapping) and "key" in v
            },
            variants={
                str(p["pod"]): Variant(p["variant"])
                for p in pods
                if p.get("variant") in tuple(Variant)
            },
            swapped_at={
                str(p["pod"]): moment
                for p in pods
                if (moment := seconds(p.get("swappedAt"))) is not None
            },
            last_counts={
                str(p["pod"]): RequestCounts(*p["counts"])
                for p in pods
                if p.get("counts") is not None
            },
            last_restart_at=seconds(policy.get("lastRestartAt")),
            in_flight={action.id: action for action in in_flight},
        )

    def pod_variant(self, pod: str) -> Variant:
        """The variant the ladder left this pod on (primary unless it swapped it)."""
        return self.variants.get(pod, Variant.PRIMARY)

    def busy_pods(self) -> set[str]:
        """Pods with an action in flight: they get no other action until it settles."""
        return {action.pod for action in self.in_flight.values()}

    def settle(self, action: Action, settled: bool) -> bool:
        """Record an executed action: settled, or in flight for a retry with the same id.

        True when it is done with (settled, or given up after MAX_ATTEMPTS).
        """
        if settled and action.kind in (ActionKind.RESTART, ActionKind.DRAIN):
            # The pod is gone: whatever was in flight on it died with it.
            for action_id in [i for i, a in self.in_flight.items() if a.pod == action.pod]:
                del self.in_flight[action_id]
        if settled or action.attempts >= MAX_ATTEMPTS:
            self.in_flight.pop(action.id, None)
            return True
        self.in_flight[action.id] = replace(action, attempts=action.attempts + 1)
        return False


def instant(moment: float | None) -> str | None:
    """Unix seconds as persisted: RFC 3339 UTC to the microsecond."""
    if moment is None:
        return None
    return dt.datetime.fromtimestamp(moment, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def seconds(raw: object) -> float | None:
    """A persisted moment back to Unix seconds: RFC 3339 text, or a number from an older operator.

    Anything else (absent, null, unreadable) is None: a timer that starts again,
    never a failed rebuild.
    """
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int | float):
        return float(raw)
    if isinstance(raw, str):
        try:
            moment = dt.datetime.fromisoformat(raw)
        except ValueError:
            return None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=dt.UTC)
        return moment.timestamp()
    return None


def without_nulls(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The entry without its None values (a list entry of status.policy)."""
    return {key: value for key, value in entry.items() if value is not None}


def next_action_id(state: PolicyState, kind: ActionKind) -> str:
    """A new idempotency id: the service, the persisted sequence and the kind."""
    state.sequence += 1
    return f"{state.service_id}-{state.sequence:06d}-{kind.value.replace('_', '-')}"
