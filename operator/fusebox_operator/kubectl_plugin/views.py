"""What `kubectl fusebox` prints and writes: pure functions of the objects it reads.

Why: the plugin's worth is in what it tells the person on call, so that is
kept apart from the API calls (cli.py) and tested against status dicts the
operator's own builders produce. Everything here reads an InferenceService
as the API server returns it (a dict) and its Events (dicts as the API
returns them); the thresholds come from the spec the operator watches the
pods with (`spec.watched_spec`, defaults filled), never from a pod.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from fusebox_contract.names import EventReason
from fusebox_operator.incident import PAUSE_ACTIONS, PIN_TIER, RESET_BREAKER, pinnable_level
from fusebox_operator.memory_trend import HARD_RATIO
from fusebox_operator.policy import LADDER
from fusebox_operator.policy_state import ActionKind, seconds
from fusebox_operator.spec import InferenceServiceSpec, watched_spec
from fusebox_operator.status import human_bytes, human_seconds

WHY_WIDTH = 70
# A pod's relayed figures are older than its scrape by the stats file's age; said past this.
STATS_AGE_TOLD_SECONDS = 30.0
# Events worth a line in `history`: what was done, would have been, was held back
# (a scale the window or the GPUs kept from happening), or a person set.
HISTORY_REASONS = frozenset(
    {
        EventReason.WOULD_ACT,
        EventReason.BREAKER_OPENED,
        EventReason.BREAKER_HALF_OPEN,
        EventReason.BREAKER_CLOSED,
        EventReason.DEGRADED,
        EventReason.RECOVERED,
        EventReason.ACTIONS_PAUSED,
        EventReason.ACTIONS_RESUMED,
        EventReason.BREAKER_RESET,
        EventReason.TIER_PINNED,
        EventReason.TIER_UNPINNED,
        EventReason.INVALID_INCIDENT_ANNOTATION,
        EventReason.INCIDENT_ANNOTATION_REMOVED,
        EventReason.SCALED_UP,
        EventReason.SCALED_DOWN,
        EventReason.SCALE_UP_BLOCKED,
        EventReason.SCALE_DOWN_HELD,
    }
)


def _status(body: Mapping[str, Any]) -> Mapping[str, Any]:
    return body.get("status") or {}


def _name(body: Mapping[str, Any]) -> tuple[str, str]:
    meta = body.get("metadata") or {}
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


def controls(body: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """status.incident.controls by annotation."""
    entries = (_status(body).get("incident") or {}).get("controls") or []
    return {str(e.get("annotation")): e for e in entries if isinstance(e, Mapping)}


def mode_text(body: Mapping[str, Any]) -> str:
    """Enforce / Observe, with a pause or a pin the operator honours."""
    status = _status(body)
    mode = str(status.get("mode") or (body.get("spec") or {}).get("mode") or "Enforce")
    held = controls(body)
    notes = []
    if (held.get(PAUSE_ACTIONS) or {}).get("reason") == EventReason.ACTIONS_PAUSED:
        notes.append("paused")
    if (held.get(PIN_TIER) or {}).get("reason") == EventReason.TIER_PINNED:
        notes.append(f"pinned:{held[PIN_TIER].get('value')}")
    return ",".join([mode, *notes])


def last_action(status: Mapping[str, Any]) -> tuple[str, str]:
    """The last thing done (or, later, decided and not done) and why."""
    done = status.get("lastAction") or {}
    would = status.get("lastWouldAct") or {}
    latest = done
    if would and (seconds(would.get("at")) or 0) >= (seconds(done.get("at")) or 0):
        latest = would
    if not latest:
        return "-", ""
    pod = f" {latest['pod']}" if latest.get("pod") else ""
    what = f"{'would ' if latest is would else ''}{latest.get('type')}{pod}"
    return what, str(latest.get("reason", ""))


def status_table(bodies: Sequence[Mapping[str, Any]], now: float) -> str:
    """`kubectl fusebox status`: one line per service, with SEEN: how old its oldest
    figure is (summary.observedAt), as the printer column of the same name."""
    header = (
        "NAMESPACE", "NAME", "MODE", "BREAKER", "TIER", "VARIANT", "READY", "SEEN", "LAST", "WHY"
    )  # fmt: skip
    rows = [header]
    for body in sorted(bodies, key=_name):
        status = _status(body)
        namespace, name = _name(body)
        what, why = last_action(status)
        summary = status.get("summary") or {}
        rows.append(
            (
                namespace,
                name,
                mode_text(body),
                _text((status.get("breaker") or {}).get("state")),
                _text((status.get("degradation") or {}).get("tier")),
                _text(status.get("activeVariant")),
                _text(summary.get("ready")),
                _age(summary.get("observedAt"), now),
                what,
                _clip(why, WHY_WIDTH),
            )
        )
    if len(rows) == 1:
        return "No InferenceServices found."
    return _table(rows)


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(line.rstrip() for line in lines)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _text(value: Any, absent: str = "-") -> str:
    """A status field as printed: absent or null (a merge patch's deletion) as `absent`."""
    return absent if value is None or value == "" else str(value)


def _age(moment: Any, now: float) -> str:
    """How long ago a persisted moment was: 40s, 12m, 3h; "-" when absent."""
    when = seconds(moment)
    return "-" if when is None else human_seconds(max(0.0, now - when))


# ----- explain ---------------------------------------------------------------------------------


def watched(body: Mapping[str, Any]) -> InferenceServiceSpec | None:
    """The spec the operator protects the pods with (status.appliedSpec), defaults filled."""
    meta = body.get("metadata") or {}
    found = watched_spec(body.get("spec") or {}, _status(body), int(meta.get("generation") or 0))
    return found[0] if found else None


def _at(moment: Any, now: float) -> str:
    """A persisted moment as `2026-12-05T03:10:00Z (40s ago)`, or `in 20s`."""
    when = seconds(moment)
    if when is None:
        return "-"
    text = dt.datetime.fromtimestamp(when, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    delta = now - when
    relative = f"{human_seconds(delta)} ago" if delta >= 0 else f"in {human_seconds(-delta)}"
    return f"{text} ({relative})"


def explain(body: Mapping[str, Any], now: float) -> str:
    """`kubectl fusebox explain`: the figures and thresholds behind the current state."""
    status = _status(body)
    namespace, name = _name(body)
    spec = watched(body)
    lines = [f"InferenceService {namespace}/{name}: mode {mode_text(body)}"]
    written = status.get("updatedAt")
    lines.append(
        f"Status written {_at(written, now)}; each figure as of its own scrape"
        if written
        else "Status not written by the control loop yet: nothing observed"
    )
    if spec is None:
        lines.append("  no spec applied yet: the operator watches no pods of it")
        return "\n".join(lines)
    lines += _incident_lines(body, now)
    lines += _breaker_lines(status, spec, now)
    lines += _tier_lines(status, spec, now)
    lines += _ladder_lines(status, spec, now)
    what, why = last_action(status)
    if what != "-":
        lines.append(f"Last: {what}: {why}")
    return "\n".join(lines)


def _incident_lines(body: Mapping[str, Any], now: float) -> list[str]:
    held = controls(body)
    if not held:
        return []
    lines = ["Incident controls:"]
    for annotation, entry in sorted(held.items()):
        lines.append(
            f"  {annotation}={entry.get('value')!r} since {_at(entry.get('since'), now)}: "
            f"{entry.get('message', '')}"
        )
    return lines


def _breaker_lines(status: Mapping[str, Any], spec: InferenceServiceSpec, now: float) -> list[str]:
    breaker = status.get("breaker") or {}
    state = _text(breaker.get("state"), "Closed")
    latency, half = spec.breaker.latency, spec.breaker.half_open
    lines = [
        f"Breaker: {state} since {_at(breaker.get('since'), now)}, "
        f"{breaker.get('trips') or 0} trip(s): {breaker.get('reason') or '-'}",
        f"  trips when p99 {latency.metric.value} > {latency.p99_threshold_millis:g} ms for "
        f"{latency.for_seconds:g} s over >= {latency.min_requests} requests; "
        + _p99_text(_pods(status), now),
        f"  open {spec.breaker.open_seconds:g} s, then half-open admits {half.admit_percent}% "
        f"until {half.min_requests} requests; closes at p99 < {half.p99_recovery_millis:g} ms "
        f"and success >= {half.min_success_rate:.1%}",
    ]
    slow_since = seconds((status.get("policy") or {}).get("slowSince"))
    if state == "Closed" and slow_since is not None:
        lines.append(
            f"  over the threshold since {_at(slow_since, now)}: trips at "
            f"{_at(slow_since + latency.for_seconds, now)} if it stays over with the requests"
        )
    since = seconds(breaker.get("since"))
    if state == "Open" and since is not None:
        lines.append(f"  next: half-open at {_at(since + spec.breaker.open_seconds, now)}")
    return lines


def _pods(status: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [p for p in status.get("pods") or [] if isinstance(p, Mapping)]


def _p99_text(pods: Sequence[Mapping[str, Any]], now: float) -> str:
    """The highest pod's p99 and when it was measured (the server's stats are relayed:
    their age is said when it is more than a scrape's)."""
    reported = [
        p for p in pods if p.get("scraped") is not False and _number(p.get("p99Millis")) is not None
    ]
    if not reported:
        return "no p99 reported"
    highest = max(reported, key=lambda p: float(p["p99Millis"]))
    return (
        f"as of {_at(highest.get('sampledAt'), now)}{_stats_age(highest)}: "
        f"p99 {float(highest['p99Millis']):g} ms (highest pod, {highest.get('name')})"
    )


def _number(value: Any) -> float | None:
    """A status figure as a number; None when absent, null or not a number."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _stats_age(pod: Mapping[str, Any]) -> str:
    """The age of the server's stats the pod's figures were relayed from, when it is more
    than a scrape's (`, its server's stats 6m40s old`); else nothing."""
    age = _number(pod.get("statsAgeSeconds"))
    if age is None or age < STATS_AGE_TOLD_SECONDS:
        return ""
    return f", its server's stats {human_seconds(age)} old"


def _tier_lines(status: Mapping[str, Any], spec: InferenceServiceSpec, now: float) -> list[str]:
    degradation = status.get("degradation") or {}
    level = int(_number(degradation.get("level")) or 0)
    tiers = ", ".join(spec.degradation.tiers) or "none listed"
    lines = [
        f"Tier: {_text(degradation.get('tier'), 'none')} (level {level}) of [{tiers}]: "
        f"{degradation.get('reason') or '-'}"
    ]
    policy = status.get("policy") or {}
    if str(degradation.get("reason") or "").startswith(f"pinned by {PIN_TIER}"):
        lines.append(f"  held by {PIN_TIER}: the policy steps it again once that is removed")
    elif level > 0:
        healthy = seconds(policy.get("healthySince"))
        level_since = seconds(policy.get("levelSince")) or 0.0
        cool_off = spec.degradation.cool_off_seconds
        if healthy is None:
            lines.append(f"  steps down after {cool_off:g} s healthy (breaker closed, quality ok)")
        else:
            due = max(healthy, level_since) + cool_off
            lines.append(f"  steps down at {_at(due, now)} if it stays healthy")
    return lines


def _ladder_lines(status: Mapping[str, Any], spec: InferenceServiceSpec, now: float) -> list[str]:
    resource = spec.breaker.resource
    lines = [
        f"Memory ladder ({' -> '.join(k.value for k in LADDER)}): acts when a pod's RSS > "
        f"{resource.rss.ratio:.0%} of its limit and growing > "
        f"{resource.rss.growth_mib_per_minute:g} MiB/min (GPU memory: "
        f"{resource.gpu_memory.ratio:.0%} of VRAM, > {resource.gpu_memory.growth_mib_per_minute:g}"
        f" MiB/min), or > {HARD_RATIO:.0%} at once; one rung per {resource.cooldown_seconds:g} s"
    ]
    ladders = {str(v.get("key")): v for v in (status.get("policy") or {}).get("ladders") or []}
    for pod in _pods(status):
        pod_name = _text(pod.get("name"), "?")
        lines.append(f"  {pod_name}: {_pod_figures(pod, now)}")
        for key in sorted(k for k in ladders if k.split("/", 1)[0] == pod_name):
            lines.append("    " + _rung_line(key, ladders[key], resource.cooldown_seconds, now))
    return lines


def _pod_figures(pod: Mapping[str, Any], now: float) -> str:
    """A pod's memory figures as of their scrape; a failed scrape says when the pod was
    last seen answering and why not now, never figures."""
    if pod.get("scraped") is False:
        seen = pod.get("lastSeenAt")
        since = f"since {_at(seen, now)}" if seen else "(never seen answering)"
        return f"not scraped {since}: {pod.get('error') or 'no reason given'}"
    rss, limit = pod.get("rssBytes"), pod.get("memoryLimitBytes")
    rss_bytes, limit_bytes = _number(rss), _number(limit)
    share = f" ({rss_bytes / limit_bytes:.0%})" if rss_bytes and limit_bytes else ""
    gpu = pod.get("gpuMemoryBytes")
    figures = f"RSS {human_bytes(rss)} of {human_bytes(limit)}{share}"
    if gpu is not None:
        figures += f", GPU memory {human_bytes(gpu)}"
    oom = pod.get("timeToOOMSeconds")
    if oom is not None:
        figures += f", time to OOM {human_seconds(oom)}"
    return f"as of {_at(pod.get('sampledAt'), now)}{_stats_age(pod)}: {figures}"


def _rung_line(key: str, ladder: Mapping[str, Any], cooldown: float, now: float) -> str:
    step = int(ladder.get("step", 0))
    last = seconds(ladder.get("lastActionAt"))
    resource = key.split("/", 1)[1] if "/" in key else key
    if step >= len(LADDER):
        return f"{resource}: ladder climbed to its top ({ActionKind.RESTART.value})"
    rung = LADDER[step].value
    when = "now, if still over" if last is None else _at(last + cooldown, now) + ", if still over"
    done = ", ".join(k.value for k in LADDER[:step]) or "none yet"
    return f"{resource}: next rung {rung} at {when} (tried: {done})"


# ----- history ---------------------------------------------------------------------------------


def history(body: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> str:
    """`kubectl fusebox history`: actions with memory before -> after, and the events."""
    status = _status(body)
    namespace, name = _name(body)
    lines = [f"InferenceService {namespace}/{name}: recent actions (oldest first)"]
    actions = list(status.get("recentActions") or [])
    if not actions:
        lines.append("  none")
    for entry in actions:
        lines.append(
            f"  {entry.get('at')}  {entry.get('type')} {entry.get('pod')}  [{entry.get('id')}]"
        )
        lines.append(f"      why:    {entry.get('reason', '')}")
        lines.append(f"      result: {entry.get('result', '')}")
    would = status.get("lastWouldAct")
    if would:
        lines.append(
            f"Last not acted: {would.get('at')}  {would.get('type')} {would.get('pod') or ''}"
            f": {would.get('reason', '')} ({would.get('result', '')})"
        )
    told = [e for e in events if e.get("reason") in HISTORY_REASONS]
    if told:
        lines.append("Events:")
        for event in sorted(told, key=_event_time):
            count = int(event.get("count") or 1)
            times = f" (x{count})" if count > 1 else ""
            lines.append(
                f"  {_event_time(event)}  {event.get('type')} {event.get('reason')}{times}: "
                f"{event.get('message', '')}"
            )
    return "\n".join(lines)


def _event_time(event: Mapping[str, Any]) -> str:
    return str(
        event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp") or ""
    )


# ----- the annotations the control commands write ---------------------------------------------


def annotation_patch(annotation: str, value: str | None) -> dict[str, Any]:
    """A merge patch setting (or, with None, removing) one annotation."""
    return {"metadata": {"annotations": {annotation: value}}}


def pause_patch(reason: str) -> dict[str, Any]:
    return annotation_patch(PAUSE_ACTIONS, reason)


def resume_patch() -> dict[str, Any]:
    return annotation_patch(PAUSE_ACTIONS, None)


def reset_patch(token: str) -> dict[str, Any]:
    """A new token each time: the operator resets once per distinct value."""
    return annotation_patch(RESET_BREAKER, token)


def pin_patch(body: Mapping[str, Any], tier: str) -> dict[str, Any]:
    """Pin a tier the service lists (or none); a bad one is refused here, before writing."""
    spec = watched(body)
    if spec is not None:
        _, why = pinnable_level(tier, spec)
        if why:
            raise ValueError(f"{PIN_TIER}: {why}")
    return annotation_patch(PIN_TIER, tier)


def unpin_patch() -> dict[str, Any]:
    return annotation_patch(PIN_TIER, None)
