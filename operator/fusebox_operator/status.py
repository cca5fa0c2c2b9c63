"""The InferenceService status: conditions, breaker block, pods, printer fields.

Why: `kubectl get` and `kubectl describe` are the operator's user interface,
and a status rewritten on every scrape would flood the API server and make
every watch client wake up. So the status is computed purely from the policy
state and the latest samples, a condition's lastTransitionTime moves only when
its status flips, and `should_write` lets through only real changes, the
per-pod figures when they moved (at most every 30 s), and otherwise a refresh
every 60 s. Every figure carries when it was measured (sampledAt, lastSeenAt,
summary.observedAt), so a figure not rewritten shows its true age (SEEN).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from fusebox_contract.names import (
    BreakerState,
    ConditionType,
    DegradationLevel,
    DegradationTier,
    EventReason,
    Variant,
)
from fusebox_operator.autoscaling import ScaleDecision, WindowHold
from fusebox_operator.endpoints import EndpointGaps
from fusebox_operator.observations import PodSample
from fusebox_operator.policy_state import Action, ActionKind, PolicyState
from fusebox_operator.serving import ServiceView, ServingReason, service_reason
from fusebox_operator.spec import InferenceServiceSpec

REFRESH_SECONDS = 30.0  # figures that moved are rewritten at most this often
QUIET_REFRESH_SECONDS = 60.0  # figures that did not move are rewritten this often
MAX_PODS_LISTED = 20
MAX_RECENT_ACTIONS = 10
MAX_TROUBLED_PODS_LISTED = 3  # stuck pods named in Ready's message
NOT_READY = ServingReason.NOT_READY
SPEC_VALID = "SpecValid"  # InvalidSpec's reason once a spec is accepted
SCALE_LIMIT_GPU = "PodsPendingForGPU"  # ScalingLimited's reason while scale-up is held
NO_QUALITY_REMEDY = "NoQualityRemedy"  # Degraded's reason: quality fails, no tier helps
# Degraded's reason while the memory ladder's swap (not a tier) has pods on the fallback.
SWAPPED_TO_FALLBACK = "SwappedToFallback"
# TelemetryFresh's and Ready's reason while status.appliedSpec cannot be read: no tick runs.
APPLIED_SPEC_UNREADABLE = "AppliedSpecUnreadable"
PODS_NOT_LISTED = "PodsNotListed"  # the tick could not list the pods: nothing observed
NO_READY_ENDPOINTS = ServingReason.NO_READY_ENDPOINTS
MAX_PROBLEM_CHARS = 200
TIER_NAMES: dict[int, str] = {int(DegradationLevel.NONE): "none"} | {
    int(tier.level): tier.value for tier in DegradationTier
}

# Parts of the status that change on every scrape; refreshed as should_write says.
VOLATILE_KEYS = ("pods", "policy", "updatedAt")
VOLATILE_SUMMARY_KEYS = ("gpuMemory", "rss", "timeToOOM", "observedAt")
# A pod entry's keys that move with every scrape whether or not the pod changed.
SCRAPE_STAMPS = ("sampledAt", "lastSeenAt", "heartbeatAgeSeconds", "statsAgeSeconds")
# Byte figures compared as the columns print them: a few KiB of RSS is no news.
PRINTED_BYTES = ("gpuMemoryBytes", "rssBytes")

ACTION_EVENT_REASONS: dict[ActionKind, tuple[EventReason, ...]] = {
    ActionKind.GC: (EventReason.GARBAGE_COLLECTED,),
    ActionKind.EMPTY_CACHE: (EventReason.CACHE_EMPTIED,),
    ActionKind.GROW_LIMIT: (EventReason.MEMORY_LIMIT_GROWN,),
    ActionKind.RELOAD: (EventReason.MODEL_UNLOADED, EventReason.MODEL_RELOADED),
    ActionKind.SWAP_FALLBACK: (EventReason.SWAPPED_TO_FALLBACK,),
    ActionKind.RESTORE_PRIMARY: (EventReason.RESTORED_PRIMARY,),
    ActionKind.RESTART: (EventReason.POD_RESTARTED,),
    ActionKind.DRAIN: (EventReason.GPU_UNHEALTHY,),
}
BREAKER_EVENT_REASONS: dict[BreakerState, EventReason] = {
    BreakerState.OPEN: EventReason.BREAKER_OPENED,
    BreakerState.HALF_OPEN: EventReason.BREAKER_HALF_OPEN,
    BreakerState.CLOSED: EventReason.BREAKER_CLOSED,
}


@dataclass(frozen=True)
class EventRecord:
    type: str  # Normal | Warning
    reason: EventReason
    message: str
    # Tells of something observed, not of a change the operator makes to the pods:
    # posted as is in every mode (observe_mode never rewords it as WouldAct).
    observation: bool = False


def iso(timestamp: float) -> str:
    moment = dt.datetime.fromtimestamp(timestamp, tz=dt.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def human_bytes(size_bytes: float | None) -> str:
    if size_bytes is None:
        return "-"
    for unit, factor in (("Gi", 1024**3), ("Mi", 1024**2), ("Ki", 1024)):
        if size_bytes >= factor:
            return f"{size_bytes / factor:.1f}{unit}"
    return f"{size_bytes:.0f}B"


def human_seconds(seconds: float | None) -> str:
    """A time to OOM for the printer column: 40s, 12m, 3h; "-" while nothing grows."""
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.0f}h"


def set_condition(
    conditions: Sequence[Mapping[str, Any]],
    type_: ConditionType,
    status: bool | None,
    reason: str,
    message: str,
    generation: int,
    now: float,
) -> list[dict[str, Any]]:
    """Upsert one metav1.Condition; lastTransitionTime moves only when status flips.

    `status` None is "Unknown": the operator could not observe what the condition
    is about, and says so rather than repeating what it last saw.
    """
    status_text = "Unknown" if status is None else "True" if status else "False"
    updated: list[dict[str, Any]] = []
    found = False
    for condition in conditions:
        if condition.get("type") != type_:
            updated.append(dict(condition))
            continue
        found = True
        flipped = condition.get("status") != status_text
        transition = iso(now) if flipped else condition.get("lastTransitionTime", iso(now))
        updated.append(
            {
                "type": type_,
                "status": status_text,
                "reason": reason,
                "message": message,
                "observedGeneration": generation,
                "lastTransitionTime": transition,
            }
        )
    if not found:
        updated.append(
            {
                "type": type_,
                "status": status_text,
                "reason": reason,
                "message": message,
                "observedGeneration": generation,
                "lastTransitionTime": iso(now),
            }
        )
    return updated


def drop_condition(
    conditions: Sequence[Mapping[str, Any]], type_: ConditionType
) -> list[dict[str, Any]]:
    """The conditions without `type_`: one whose feature is off says nothing true.

    The status patch carries the whole list, so a condition left out here is
    gone from the stored status too.
    """
    return [dict(c) for c in conditions if c.get("type") != type_]


def rebase_conditions(
    base: Sequence[Mapping[str, Any]],
    ours: Sequence[Mapping[str, Any]],
    theirs: Sequence[Mapping[str, Any]],
) -> list[dict[str, Any]]:
    """`ours`, computed from `base`, laid over `theirs`, the list stored since.

    A status patch carries the whole list, so a tick that read the object before
    a reconcile wrote its conditions would put the old ones back. Per type: what
    this writer changed (or added) wins; what it left as it found it takes the
    stored one; one it dropped stays dropped unless the other writer changed it.
    """
    base_by_type = {c.get("type"): c for c in base}
    ours_by_type = {c.get("type"): c for c in ours}

    def changed_by_us(kind: Any) -> bool:
        return kind in ours_by_type and ours_by_type[kind] != base_by_type.get(kind)

    merged: list[dict[str, Any]] = []
    for stored in theirs:
        kind = stored.get("type")
        if changed_by_us(kind):
            merged.append(dict(ours_by_type[kind]))
        elif kind in ours_by_type or stored != base_by_type.get(kind):
            merged.append(dict(stored))
    stored_types = {c.get("type") for c in theirs}
    merged += [
        dict(c) for c in ours if c.get("type") not in stored_types and changed_by_us(c.get("type"))
    ]
    return merged


def unreadable_record_conditions(
    status: Mapping[str, Any], problem: str, now: float
) -> list[dict[str, Any]] | None:
    """TelemetryFresh False and Ready Unknown naming a `status.appliedSpec` this operator
    cannot read; None when the conditions say so already.

    Why: the ticks watch the pods of the applied spec, so without it none runs, and
    Ready, Available and the breaker stayed as last written, an observation nobody
    made any more, with nothing logged. A record refused only by a check added since
    it was applied is still read (`spec.placement_as_applied`); this is for the rest.
    """
    message = (
        f"status.appliedSpec cannot be read by this operator ({problem[:MAX_PROBLEM_CHARS]}): "
        "its pods are not watched until a reconcile applies the spec again (edit the spec)"
    )
    return _no_tick_conditions(status, APPLIED_SPEC_UNREADABLE, message, now)


def unlisted_pods_conditions(
    status: Mapping[str, Any], problem: str, now: float
) -> list[dict[str, Any]] | None:
    """TelemetryFresh False and Ready Unknown naming why the service's pods could not be
    listed (the API server unreachable, a refused LIST); None when they say so already.

    Why: without the pods no tick runs (no scrape, no decision, no action), and Ready
    and the figures stayed as last written, an observation nobody made any more. The
    message holds no time, so a spell writes it once; `summary.observedAt` keeps the
    time of the last figures.
    """
    message = (
        f"the pods could not be listed ({problem[:MAX_PROBLEM_CHARS]}): nothing is scraped, "
        "decided or acted on until they are; the figures are the last observed (observedAt)"
    )
    return _no_tick_conditions(status, PODS_NOT_LISTED, message, now)


def _no_tick_conditions(
    status: Mapping[str, Any], reason: str, message: str, now: float
) -> list[dict[str, Any]] | None:
    """TelemetryFresh False and Ready Unknown with `reason` and `message` (a tick that
    cannot run); None when TelemetryFresh says so already, so a spell is written once."""
    conditions = list(status.get("conditions") or [])
    said = any(
        c.get("type") == ConditionType.TELEMETRY_FRESH
        and c.get("reason") == reason
        and c.get("message") == message
        for c in conditions
    )
    if said:
        return None
    generation = int(status.get("appliedGeneration") or 0)
    for type_, state in ((ConditionType.TELEMETRY_FRESH, False), (ConditionType.READY, None)):
        conditions = set_condition(conditions, type_, state, reason, message, generation, now)
    return conditions


def pod_entry(sample: PodSample, state: PolicyState, seen: ServiceView) -> dict[str, Any]:
    """One pod's line: this tick's figures (none when its scrape failed), its verdict,
    and when it was last seen answering."""
    entry: dict[str, Any] = {
        "name": sample.pod,
        "sampledAt": iso(sample.sampled_at),
        "scraped": sample.ok,
    }
    if sample.variant is not None:  # as the pod reports it; what was asked is not seen
        entry["variant"] = sample.variant.value
    verdict = seen.verdict(sample.pod)
    if verdict is not None:
        entry["serving"] = verdict.reason.value
    if sample.pod in seen.last_seen:
        entry["lastSeenAt"] = iso(seen.last_seen[sample.pod])
    figures = {
        "gpuMemoryBytes": sample.gpu_memory_used_bytes,
        "rssBytes": sample.rss_bytes,
        "memoryLimitBytes": sample.memory_limit_bytes,
        "queueLength": sample.queue_length,
        "tokenizerCacheEntries": sample.tokenizer_cache_entries,
        "cudaContexts": sample.cuda_contexts,
        "heartbeatAgeSeconds": sample.heartbeat_age_seconds,
        "statsAgeSeconds": sample.stats_age_seconds,
    }
    for key, value in figures.items():
        if value is not None:
            entry[key] = (
                int(value)
                if key.endswith(("Bytes", "Length", "Entries", "Contexts"))
                else round(value, 3)
            )
    if sample.latency_p99_seconds is not None:
        entry["p99Millis"] = round(sample.latency_p99_seconds * 1000, 1)
    if sample.pod in state.time_to_oom:
        entry["timeToOOMSeconds"] = round(state.time_to_oom[sample.pod], 1)
    if sample.error:
        entry["error"] = sample.error[:200]
    return entry


def action_entry(action: Action, result: str) -> dict[str, Any]:
    return {
        "id": action.id,
        "type": action.kind.value,
        "pod": action.pod,
        "at": iso(action.at),
        "reason": action.reason,
        "result": result,
    }


def tier_name(level: int) -> str:
    return TIER_NAMES.get(level, str(level))


def active_variant(figures: Sequence[PodSample]) -> str | None:
    """What the observed pods report serving: fallback when any pod serves it.

    Not what the operator asked for: a level whose swap is still rolling
    through the pods, or a service without a fallback, shows primary. None (no
    VARIANT shown) while no observed pod reports one: neither a guess (primary)
    nor the last value reported by pods nobody sees any more.
    """
    reported = {s.variant for s in figures if s.variant is not None}
    if Variant.FALLBACK in reported:
        return Variant.FALLBACK.value
    if reported:
        return Variant.PRIMARY.value
    return None


def agreed(values: Iterable[str | None]) -> str | None:
    """The one value the pods that report one agree on; None when none reports one or
    two disagree (a rollout under way), as for status.modelRevision."""
    reported = {value for value in values if value}
    return reported.pop() if len(reported) == 1 else None


def model_entry(
    spec: InferenceServiceSpec, figures: Sequence[PodSample], previous: Mapping[str, Any]
) -> dict[str, str | None]:
    """status.model: the name served, and the revision and dtype as the observed pods
    report them (fusebox_model_info), never as the spec asks for them. A field no pod
    vouches for is left out: deleted with a null while the stored status has it (a
    merge patch keeps a key it does not name)."""
    entry: dict[str, str | None] = {"name": spec.model.name}
    stored = previous.get("model") or {}
    served = {
        "revision": agreed(s.model_revision for s in figures),
        "dtype": agreed(s.model_dtype for s in figures),
    }
    for key, value in served.items():
        if value is not None:
            entry[key] = value
        elif stored.get(key) is not None:
            entry[key] = None
    return entry


def fallback_note(state: PolicyState, spec: InferenceServiceSpec) -> str:
    """At the fallback tier, the pods it cannot swap (their servers cannot load it)."""
    stuck = sorted(state.fallback_unavailable)
    if not spec.degrades_to_fallback or state.level < DegradationLevel.FALLBACK_MODEL or not stuck:
        return ""
    listed = ", ".join(stuck[:MAX_PODS_LISTED])
    return f"; the fallback tier cannot swap on {listed} (no usable fallback): primary serves"


def pods_note(problems: Mapping[str, str], what: str) -> str:
    """The pods named with their trouble (the first few), e.g. `p-1 unschedulable: ...`."""
    listed = sorted(problems.items())[:MAX_TROUBLED_PODS_LISTED]
    more = len(problems) - len(listed)
    text = "; ".join(f"{pod} {what}: {message}" for pod, message in listed)
    return text + (f"; and {more} more" if more > 0 else "")


def not_serving_note(seen: ServiceView) -> str:
    """The pods that do not serve though the kubelet calls them Ready, with the evidence;
    those the Service's endpoints leave out counted first, as one."""
    troubled = [v for v in seen.verdicts if not v.serving and v.reason is not NOT_READY]
    if seen.endpoints.missing:
        others = [v for v in troubled if v.reason is not NO_READY_ENDPOINTS]
        rest = not_serving_note(replace(seen, verdicts=tuple(others), endpoints=EndpointGaps()))
        return seen.endpoints.note() + (f"; {rest}" if rest else "")
    listed = "; ".join(v.describe() for v in troubled[:MAX_TROUBLED_PODS_LISTED])
    more = len(troubled) - MAX_TROUBLED_PODS_LISTED
    return listed + (f"; and {more} more" if more > 0 else "")


def ready_explanation(
    state: PolicyState,
    seen: ServiceView,
    desired_pods: int,
    unschedulable: Mapping[str, str],
    failing: Mapping[str, str],
    breaker_sent: bool = True,
    starting: Mapping[str, str] | None = None,
) -> tuple[bool | None, str, str]:
    """Ready's status, reason and message: what keeps the service from serving, by name.

    Ready means the pods serve, as observed (serving.py): a pod the kubelet calls
    Ready but whose server refuses every request (its memory guard, no model, a
    wedged loop) does not count, and its cause is the reason. Pods the operator
    cannot see make Ready Unknown, never True. A pod the scheduler cannot place
    (no free GPU, a claim no device satisfies, too little memory on any node) or
    a container the kubelet cannot run (crash loop, image pull, bad config)
    never becomes ready by waiting, so it is named with the scheduler's or the
    kubelet's own words rather than counted as "not ready".
    `breaker_sent`: False while holding (Observe, pause-actions): the breaker's
    state never reached the pods, so an open one refuses nothing.
    `starting`: pod -> what it does before it can serve (its model downloading), told
    with PodsNotReady so the message says what is being waited for.
    A pod the Service's EndpointSlices leave out gets no traffic, so it does not serve
    (NoReadyEndpoints, serving.outside_service); slices that could not be read keep
    Ready from True: Unknown, EndpointsUnread, for what the pods say was observed and
    whether traffic reaches them was not.
    """
    serving = seen.serving
    counted = f"{serving}/{desired_pods} pods serving"
    if state.breaker is BreakerState.OPEN and breaker_sent:
        return False, "BreakerOpen", state.breaker_reason
    if serving >= desired_pods and serving > 0 and seen.endpoints.unread:
        unread = (
            f"{counted}; the EndpointSlices of Service {seen.endpoints.service} could not be "
            f"read ({seen.endpoints.unread}): whether traffic reaches the pods is not observed"
        )
        return None, EventReason.ENDPOINTS_UNREAD, unread
    if serving >= desired_pods:
        return True, "PodsReady", counted
    if unschedulable:
        note = pods_note(unschedulable, "unschedulable")
        return False, EventReason.PODS_UNSCHEDULABLE, f"{counted}; {note}"
    if failing:
        return False, EventReason.PODS_FAILING, f"{counted}; {pods_note(failing, 'failing')}"
    cause = service_reason([v for v in seen.verdicts if v.reason is not NOT_READY])
    if cause is None:
        # A pod not Ready for a known cause (its node NotReady: serving.judge_pod) is named.
        why = {v.pod: v.detail for v in seen.verdicts if v.reason is NOT_READY and v.detail}
        note = f"; {pods_note(why, 'not ready')}" if why else ""
        note += f"; {pods_note(starting, 'starting')}" if starting else ""
        return False, "PodsNotReady", counted + note
    known = serving + seen.unobserved < desired_pods or not cause.unobserved
    return (False if known else None), cause.value, f"{counted}; {not_serving_note(seen)}"


def available_explanation(
    state: PolicyState, seen: ServiceView, breaker_sent: bool = True
) -> tuple[bool | None, str, str]:
    """Available: at least one pod serves. Unknown while the only candidates are unseen.
    `breaker_sent`: as for `ready_explanation`."""
    serving = seen.serving
    if state.breaker is BreakerState.OPEN and breaker_sent:
        return False, "BreakerOpen", f"{serving} pod(s) up, the breaker refuses requests"
    if serving > 0:
        return True, "MinimumPodsReady", f"{serving} pod(s) serving"
    cause = service_reason([v for v in seen.verdicts if v.reason is not NOT_READY])
    if cause is None:
        return False, "NoPodReady", "0 pod(s) serving"
    unknown = cause.unobserved
    return (None if unknown else False), cause.value, f"0 pod(s) serving; {not_serving_note(seen)}"


def breaker_column(state: PolicyState, seen: ServiceView) -> str:
    """What the BREAKER column says: whether requests get through.

    The latency breaker's state, except that a closed breaker is not shown over
    pods that all refuse (Refusing) or that the operator cannot see (Unknown):
    "Closed" would promise traffic that nothing serves.
    """
    if state.breaker is not BreakerState.CLOSED or seen.serving > 0:
        return state.breaker.status_name
    up = [v for v in seen.verdicts if v.reason is not NOT_READY]
    if any(v.reason.refusing for v in up):
        return "Refusing"
    if up:
        return "Unknown"
    return state.breaker.status_name


def measured_at(sample: PodSample) -> float:
    """When the oldest of a pod's summary figures was measured: its scrape, or for one
    relayed from the server's stats file, when the server wrote that file."""
    times = [sample.sampled_at]
    if sample.gpu_memory_used_bytes is not None:
        times.append(sample.gpu_memory_measured_at)
    if sample.rss_bytes is not None:
        times.append(sample.rss_measured_at)
    return min(times)


def figure(values: Sequence[float], seen: ServiceView) -> str:
    """A summary figure (the largest of the observed pods'), marked "?" when some Ready
    pod is not observed: its figure, maybe the largest, is missing."""
    shown = human_bytes(max(values)) if values else ""
    if seen.unobserved:
        return f"{shown}?" if shown else "?"
    return shown or "-"


# Ready's reasons that name pods stuck for good, or traffic that does not reach them (or
# cannot be told to): each gets a Warning when it starts.
WARNED_READY_REASONS = frozenset(
    {
        EventReason.PODS_UNSCHEDULABLE,
        EventReason.PODS_FAILING,
        EventReason.NO_READY_ENDPOINTS,
        EventReason.ENDPOINTS_UNREAD,
    }
)


def blind_events(before: Collection[tuple[str, str]], seen: ServiceView) -> list[EventRecord]:
    """A Warning when the operator loses sight of a pod or cannot call its admin API,
    with the cause, once per spell (`before`: the (reason, pod) pairs already told).

    Memory actions on an unseen pod wait for fresh figures (the policy holds them
    after three intervals), and no action reaches a pod whose admin API does not
    answer: each event says both what is wrong and what follows.
    """
    events: list[EventRecord] = []
    for verdicts, reason, follows in (
        (
            seen.blind,
            EventReason.TELEMETRY_STALE,
            "status shows it unobserved and memory actions on it are held",
        ),
        (
            seen.unreachable,
            EventReason.ADMIN_UNREACHABLE,
            "the operator cannot act on it (breaker, tier, ladder) until a call gets through",
        ),
    ):
        lost = [v for v in verdicts if (v.reason.value, v.pod) not in before]
        if lost:
            named = "; ".join(v.describe() for v in lost[:MAX_TROUBLED_PODS_LISTED])
            events.append(EventRecord("Warning", reason, f"{named}; {follows}"))
    return events


def stuck_pod_events(previous: Mapping[str, Any], new: Mapping[str, Any]) -> list[EventRecord]:
    """A Warning when Ready turns to one of WARNED_READY_REASONS (PodsUnschedulable,
    PodsFailing, NoReadyEndpoints, EndpointsUnread), once per spell.

    Read from the conditions, so an operator restart in the middle of a spell
    (its previous status already says so) posts nothing twice.
    """

    def ready_of(status: Mapping[str, Any]) -> Mapping[str, Any]:
        conditions = status.get("conditions") or []
        return next((c for c in conditions if c.get("type") == ConditionType.READY), {})

    reason = str(ready_of(new).get("reason") or "")
    if reason not in WARNED_READY_REASONS or ready_of(previous).get("reason") == reason:
        return []
    return [EventRecord("Warning", EventReason(reason), str(ready_of(new).get("message")))]


FULL_SERVICE = "primary model, every feature on"


def degradation_explanation(
    state: PolicyState, spec: InferenceServiceSpec
) -> tuple[bool, str, str]:
    """Degraded's status, reason and message: the tier and breaker the operator set."""
    unremedied = state.quality_unremedied
    swapped = swap_note(
        pod for pod, variant in state.variants.items() if variant == Variant.FALLBACK
    )
    if state.level >= DegradationLevel.FALLBACK_MODEL:
        swapped = ""  # the tier has every pod on the fallback: the message says so
    tiered = state.level > 0 or state.breaker is not BreakerState.CLOSED
    if not (tiered or unremedied or swapped):
        return False, "FullService", FULL_SERVICE
    if not tiered and not unremedied:
        return True, SWAPPED_TO_FALLBACK, swapped
    message = (
        f"tier {tier_name(state.level)} (level {state.level}); breaker {state.breaker.status_name}"
        + fallback_note(state, spec)
        + (f"; {swapped}" if swapped else "")
        + (f"; {unremedied}" if unremedied else "")
    )
    return True, NO_QUALITY_REMEDY if unremedied else "Degraded", message


def swap_note(pods: Iterable[str]) -> str:
    """Pods the memory ladder swapped to the fallback (not a tier): they serve the
    quantized model until the cool-off brings the primary back; "" for none."""
    listed = sorted(pods)
    if not listed:
        return ""
    more = len(listed) - MAX_PODS_LISTED
    names = ", ".join(listed[:MAX_PODS_LISTED]) + (f" and {more} more" if more > 0 else "")
    return (
        f"{names} serve{'s' if len(listed) == 1 else ''} the fallback model (the memory "
        "ladder's swap; the primary comes back after degradation.coolOffSeconds)"
    )


def held_degradation(state: PolicyState, samples: Sequence[PodSample]) -> tuple[bool, str, str]:
    """Degraded while holding (Observe, pause-actions): what the pods report they run,
    for the operator set nothing; what it would set follows in the message.

    A tier or breaker Enforce left on the pods (a pause in the middle of an
    incident) is still theirs, and quality failing with no tier to help is
    observed whatever the mode."""
    reported = [sample for sample in samples if sample.ok]
    level = max((sample.degradation_level or 0 for sample in reported), default=0)
    refusing = sorted(
        sample.pod for sample in reported if sample.breaker_state not in (None, BreakerState.CLOSED)
    )
    unremedied = state.quality_unremedied
    swapped = swap_note(
        sample.pod
        for sample in reported
        if sample.variant == Variant.FALLBACK
        and (sample.degradation_level or 0) < DegradationLevel.FALLBACK_MODEL
    )
    parts = []
    if level > 0:
        parts.append(f"pods report tier {tier_name(level)} (level {level})")
    if refusing:
        parts.append(f"breaker not closed on {', '.join(refusing)}")
    if swapped:
        parts.append(swapped)
    if unremedied:
        parts.append(unremedied)
    degraded = bool(parts)
    only_swapped = degraded and parts == [swapped]
    if state.level > 0 or state.breaker is not BreakerState.CLOSED:
        parts.append(
            f"held: the operator would set tier {tier_name(state.level)} (level {state.level}), "
            f"breaker {state.breaker.status_name}"
        )
    if not degraded:
        return False, "FullService", "; ".join([FULL_SERVICE, *parts])
    if only_swapped:
        return True, SWAPPED_TO_FALLBACK, "; ".join(parts)
    return True, NO_QUALITY_REMEDY if unremedied else "Degraded", "; ".join(parts)


def build_status(
    previous: Mapping[str, Any],
    state: PolicyState,
    samples: Sequence[PodSample],
    executed: Sequence[tuple[Action, str]],
    seen: ServiceView,
    spec: InferenceServiceSpec,
    generation: int,
    now: float,
    desired_pods: int | None = None,
    unschedulable: Mapping[str, str] | None = None,
    failing: Mapping[str, str] | None = None,
    holding: bool = False,
    starting: Mapping[str, str] | None = None,
    held: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The whole telemetry-owned status, from the policy state and this scrape.

    `samples`: this tick's scrapes (failed ones included); `seen`: the verdict on
    every pod and the figures still fresh enough to show (serving.observe).
    `desired_pods`: the count the Deployment is set to run; None means `spec.replicas`.
    `unschedulable`: pod -> the scheduler's message, for pods it cannot place;
    `failing`: pod -> the container the kubelet cannot run, and why.
    `starting`: pod -> what a pod not ready yet is doing (its model downloading).
    `held`: pod -> its ladder step the rollout holds, and by what (MemoryPressure).
    `holding`: the tick sent nothing to the pods (Observe, pause-actions): the
    breaker is what the operator would hold (status.breaker, the BREAKER column),
    and Ready and Available say what the pods do, which is not to refuse for it.
    """
    desired_pods = spec.replicas if desired_pods is None else desired_pods
    conditions: list[dict[str, Any]] = list(previous.get("conditions") or [])
    ready, ready_reason, ready_message = ready_explanation(
        state, seen, desired_pods, unschedulable or {}, failing or {}, not holding, starting or {}
    )
    conditions = set_condition(
        conditions, ConditionType.READY, ready, ready_reason, ready_message, generation, now
    )
    available, available_reason, available_message = available_explanation(state, seen, not holding)
    conditions = set_condition(
        conditions,
        ConditionType.AVAILABLE,
        available,
        available_reason,
        available_message,
        generation,
        now,
    )
    if holding:
        degraded, degraded_reason, degraded_message = held_degradation(state, samples)
    else:
        degraded, degraded_reason, degraded_message = degradation_explanation(state, spec)
    conditions = set_condition(
        conditions,
        ConditionType.DEGRADED,
        degraded,
        degraded_reason,
        degraded_message,
        generation,
        now,
    )
    cut_off = (*seen.blind, *seen.unreachable)
    named = [v.describe() for v in cut_off[:MAX_TROUBLED_PODS_LISTED]]
    more = len(cut_off) - len(named)
    conditions = set_condition(
        conditions,
        ConditionType.TELEMETRY_FRESH,
        not cut_off,
        cut_off[0].reason.value if cut_off else "Scraped",
        "; ".join(named) + (f"; and {more} more" if more > 0 else "")
        if cut_off
        else f"{len(seen.figures)} pod(s) scraped, every admin call answered",
        generation,
        now,
    )
    pressured = sorted({k.split("/", 1)[0] for k in state.ladders if not k.endswith("/wedge")})
    conditions = set_condition(
        conditions,
        ConditionType.MEMORY_PRESSURE,
        bool(pressured),
        "LadderActive" if pressured else "WithinLimits",
        f"resource ladder active on {', '.join(pressured)}"
        + "".join(f"; {words}" for _, words in sorted((held or {}).items()))
        if pressured
        else "every pod under its thresholds",
        generation,
        now,
    )
    recent = list(previous.get("recentActions") or [])
    for action, result in executed:
        recent.append(action_entry(action, result))
    recent = recent[-MAX_RECENT_ACTIONS:]
    pods = [pod_entry(sample, state, seen) for sample in sorted(samples, key=lambda s: s.pod)]
    pods = pods[:MAX_PODS_LISTED]
    figures = seen.figures
    gpu_values = [s.gpu_memory_used_bytes for s in figures if s.gpu_memory_used_bytes is not None]
    rss_values = [s.rss_bytes for s in figures if s.rss_bytes is not None]
    soonest_oom = [state.time_to_oom[s.pod] for s in figures if s.pod in state.time_to_oom]
    previous_breaker = previous.get("breaker") or {}
    since = (
        previous_breaker.get("since")
        if previous_breaker.get("state") == state.breaker.status_name
        and previous_breaker.get("since")
        else iso(state.breaker_since or now)
    )
    status: dict[str, Any] = {
        "conditions": conditions,
        "breaker": {
            "state": state.breaker.status_name,
            "reason": state.breaker_reason,
            "since": since,
            "trips": state.trips,
        },
        "degradation": {
            "level": state.level,
            "tier": tier_name(state.level),
            "reason": state.level_reason,
            "tiers": list(spec.degradation.tiers),
        },
        "model": model_entry(spec, figures, previous),
        "pods": pods,
        "recentActions": recent,
        "summary": {
            "ready": f"{seen.serving}/{desired_pods}",
            "breaker": breaker_column(state, seen),
            "gpuMemory": figure(gpu_values, seen),
            "rss": figure(rss_values, seen),
            "timeToOOM": human_seconds(min(soonest_oom) if soonest_oom else None),
        },
        "policy": state.to_status(),
        "updatedAt": iso(now),
    }
    # The oldest figure shown: the SEEN column is its age, counted by kubectl at
    # display time, so it grows on its own when the operator stops writing. A figure
    # the sidecar relays from the server's stats file is as old as that file, not the
    # scrape (a wedged server's last GPU memory is not news). With no figure fresh
    # enough to show, the last ones' time stands: their age goes on.
    observed_at = (
        iso(min(measured_at(s) for s in figures))
        if figures
        else (previous.get("summary") or {}).get("observedAt")
    )
    if observed_at:
        status["summary"]["observedAt"] = observed_at
    # Deleted with a null while the stored status has it (a merge patch keeps a key it
    # does not name), as model_entry's fields.
    variant = active_variant(figures)
    if variant is not None or previous.get("activeVariant") is not None:
        status["activeVariant"] = variant
    if recent:
        status["lastAction"] = recent[-1]
    return status


def _significant(status: Mapping[str, Any]) -> dict[str, Any]:
    kept = {k: v for k, v in status.items() if k not in VOLATILE_KEYS}
    summary = dict(kept.get("summary") or {})
    for key in VOLATILE_SUMMARY_KEYS:
        summary.pop(key, None)
    kept["summary"] = summary
    if kept.get("autoscaling"):
        # The load's value moves every scrape; whether any was measured is news.
        autoscaling = kept["autoscaling"]
        kept["autoscaling"] = {k: v for k, v in autoscaling.items() if k != "load"}
        kept["autoscaling"]["measured"] = autoscaling.get("load") is not None
    return kept


def scaling_events(previous: Mapping[str, Any], scale: ScaleDecision) -> list[EventRecord]:
    """Every change of the count is an event; a held scale-up once, when it starts."""
    if scale.reason is None:
        return []
    if scale.blocked:
        limited: Mapping[str, Any] = next(
            (
                c
                for c in previous.get("conditions") or []
                if c.get("type") == ConditionType.SCALING_LIMITED
            ),
            {},
        )
        if limited.get("status") == "True" and limited.get("reason") == SCALE_LIMIT_GPU:
            return []
        return [EventRecord("Warning", scale.reason, scale.message)]
    return [EventRecord("Normal", scale.reason, scale.message)]


def scale_down_held_events(
    told: WindowHold | None, scale: ScaleDecision
) -> tuple[list[EventRecord], WindowHold | None]:
    """One ScaleDownHeld per hold of the scale-down window; the hold told, for the next tick.

    Told when the load asks for fewer pods and the window keeps the count: at the hold's
    first such tick, and again only when the count held or the count wanted changes. A
    tick whose load asks for the count again goes on with the hold told (a load hovering
    at a boundary is not a stream of events); the hold ends, and the next one is told,
    when the count changes or the window keeps no lower count.
    """
    hold = scale.window_hold
    if hold is None:
        return [], None
    if hold.wanted is None or (
        told is not None and (told.replicas, told.wanted) == (hold.replicas, hold.wanted)
    ):
        return [], told
    message = (
        f"{hold.replicas} replicas held, load asks for {hold.wanted}: the scale-down "
        f"window ({hold.window_seconds:g} s) keeps the highest count asked for in it; "
        f"the count can go down after {iso(hold.allowed_after)} if the load stays low"
    )
    return [EventRecord("Normal", EventReason.SCALE_DOWN_HELD, message)], hold


def add_autoscaling_status(
    status: dict[str, Any],
    previous: Mapping[str, Any],
    scale: ScaleDecision,
    spec: InferenceServiceSpec,
    generation: int,
    now: float,
) -> None:
    """status.autoscaling and the ScalingLimited condition, from this tick's decision."""
    assert spec.autoscaling is not None
    earlier = previous.get("autoscaling") or {}
    entry: dict[str, Any] = {
        "replicas": scale.replicas,
        "recommendedReplicas": scale.recommended,
        "metric": spec.autoscaling.metric.value,
        "targetPerReplica": spec.autoscaling.target_per_replica,
    }
    if scale.load is not None:
        entry["load"] = round(scale.load, 3)
    elif earlier.get("load") is not None:
        # Nothing measured: a merge patch keeps a key it does not name, so the last
        # figure would stand as current for ever; only a null deletes it.
        entry["load"] = None
    changed = scale.reason is not None and not scale.blocked
    last = iso(now) if changed else earlier.get("lastScaleTime")
    if last:
        entry["lastScaleTime"] = last
    status["autoscaling"] = entry
    if scale.blocked:
        limited, reason, message = True, SCALE_LIMIT_GPU, scale.message
    elif scale.hold is not None:
        limited, reason, message = True, scale.hold.value, scale.message
    elif scale.recommended >= spec.autoscaling.max_replicas and scale.replicas >= scale.recommended:
        limited, reason = True, "AtMaxReplicas"
        message = f"at maxReplicas {spec.autoscaling.max_replicas}"
    else:
        limited, reason = False, "WithinRange"
        message = (
            f"{scale.replicas} replica(s) within {spec.autoscaling.min_replicas}.."
            f"{spec.autoscaling.max_replicas}"
        )
    status["conditions"] = set_condition(
        status.get("conditions") or [],
        ConditionType.SCALING_LIMITED,
        limited,
        reason,
        message,
        generation,
        now,
    )


def drop_autoscaling_status(status: dict[str, Any], previous: Mapping[str, Any]) -> None:
    """Without spec.autoscaling: no ScalingLimited, and status.autoscaling deleted.

    A merge patch leaves a key it does not name where it was, so the block an
    autoscaled past left behind is deleted with an explicit null (only while
    the stored status still has it, so a service never autoscaled writes nothing).
    """
    status["conditions"] = drop_condition(
        status.get("conditions") or [], ConditionType.SCALING_LIMITED
    )
    if previous.get("autoscaling") is not None:
        status["autoscaling"] = None


def acting_operator(previous: Mapping[str, Any], pod: str, now: float) -> dict[str, str]:
    """status.operator: the replica that acts on the service, and since when.

    With several operator replicas one acts at a time (kopf peering); a
    handover shows here at the new replica's first tick, and `since` moves
    only when the pod does.
    """
    before = previous.get("operator") or {}
    since = before.get("since") if before.get("pod") == pod else None
    return {"pod": pod, "since": str(since or iso(now))}


def observed_yet(status: Mapping[str, Any]) -> bool:
    """Whether the telemetry's status was ever written (`updatedAt` is its key alone):
    until then a reconcile makes the first observation itself (tick.first_observation)."""
    return bool(status.get("updatedAt"))


def should_write(previous: Mapping[str, Any], new: Mapping[str, Any], now: float) -> bool:
    """Write on a real change; figures that moved at most every REFRESH_SECONDS; else
    every QUIET_REFRESH_SECONDS.

    The quiet refresh was every 30 s for every service, two status PATCHes per
    service per minute, most of them carrying the same figures with new stamps
    (decisions/operator-api-cost.md). A figure not rewritten keeps the time it was
    measured, so SEEN shows its age and never claims a fresher one.
    """
    # Only the keys this writer owns: observedGeneration and memory belong to reconcile.
    owned_previous = {k: v for k, v in previous.items() if k in new}
    if _significant(owned_previous) != _significant(new):
        return True
    updated_at = previous.get("updatedAt")
    if not updated_at:
        return True
    try:
        last = dt.datetime.strptime(str(updated_at), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return True
    age = now - last.timestamp()
    if age >= QUIET_REFRESH_SECONDS:
        return True
    return age >= REFRESH_SECONDS and _figures(owned_previous) != _figures(new)


def _figures(status: Mapping[str, Any]) -> dict[str, Any]:
    """The volatile part as a reader sees it: no scrape stamps, bytes as printed."""
    summary = status.get("summary") or {}
    pods = []
    for entry in status.get("pods") or []:
        if not isinstance(entry, Mapping):
            continue
        shown = {k: v for k, v in entry.items() if k not in SCRAPE_STAMPS}
        for key in PRINTED_BYTES:
            if key in shown:
                shown[key] = human_bytes(shown[key])
        if "timeToOOMSeconds" in shown:
            shown["timeToOOMSeconds"] = human_seconds(shown["timeToOOMSeconds"])
        pods.append(shown)
    return {
        "pods": pods,
        "policy": _without_request_counts(status.get("policy")),
        "summary": {k: summary.get(k) for k in ("gpuMemory", "rss", "timeToOOM")},
    }


def _without_request_counts(policy: Any) -> Any:
    """status.policy as stored, less each pod's request counters.

    A serving pod moves its counters on every scrape: they are kept for a restart
    to count calls from (a minute's more calls in that first count changes no
    ratio the breakers read), not news. A null is how the merge patch deletes a
    key, so the stored policy has no null where the built one does: none is
    compared.
    """
    if not isinstance(policy, Mapping):
        return policy
    pods = [
        {k: v for k, v in entry.items() if k != "counts"} if isinstance(entry, Mapping) else entry
        for entry in policy.get("pods") or []
    ]
    return {k: v for k, v in {**policy, "pods": pods}.items() if v is not None}


def transition_events(
    before: PolicyState,
    after: PolicyState,
    executed: Sequence[tuple[Action, str]],
    has_fallback: bool = True,
) -> list[EventRecord]:
    """One event per breaker/tier transition and per executed action, with the numbers,
    and one per pod found unable to swap to the fallback (once: the state remembers it)."""
    events: list[EventRecord] = []
    if before.breaker is not after.breaker:
        kind = "Normal" if after.breaker is BreakerState.CLOSED else "Warning"
        events.append(EventRecord(kind, BREAKER_EVENT_REASONS[after.breaker], after.breaker_reason))
    if before.level != after.level:
        direction = EventReason.DEGRADED if after.level > before.level else EventReason.RECOVERED
        message = (
            f"degradation {tier_name(before.level)} -> {tier_name(after.level)} "
            f"(level {after.level}): {after.level_reason}"
        )
        events.append(
            EventRecord(
                "Warning" if direction is EventReason.DEGRADED else "Normal", direction, message
            )
        )
        fallback = DegradationLevel.FALLBACK_MODEL
        if has_fallback and before.level < fallback <= after.level:
            events.append(
                EventRecord(
                    "Warning",
                    EventReason.SWAPPED_TO_FALLBACK,
                    f"service swaps to the fallback, one pod at a time: {message}",
                )
            )
        if has_fallback and after.level < fallback <= before.level:
            events.append(
                EventRecord(
                    "Normal",
                    EventReason.RESTORED_PRIMARY,
                    f"service swaps back to the primary, one pod at a time: {message}",
                )
            )
    for pod in sorted(set(after.fallback_unavailable) - set(before.fallback_unavailable)):
        events.append(
            EventRecord(
                "Warning",
                EventReason.FALLBACK_UNAVAILABLE,
                f"{pod} cannot swap to the fallback: {after.fallback_unavailable[pod]}; "
                "it takes the degradation level and keeps serving the primary",
            )
        )
    if after.quality_unremedied and not before.quality_unremedied:
        events.append(
            EventRecord(
                "Warning",
                EventReason.DEGRADED,
                f"{after.quality_unremedied}; list fallback-model (with spec.fallback) or "
                "canned-answers in degradation.tiers for the quality breaker to act",
                observation=True,  # no remedy: nothing Enforce would do, so no WouldAct
            )
        )
    for action, result in executed:
        for reason in ACTION_EVENT_REASONS[action.kind]:
            kind = "Warning" if action.kind in (ActionKind.RESTART, ActionKind.DRAIN) else "Normal"
            events.append(
                EventRecord(
                    kind, reason, f"{action.pod}: {action.reason} -> {result} [{action.id}]"
                )
            )
    return events
