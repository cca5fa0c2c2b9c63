"""`kubectl fusebox`: what it prints and writes, from objects the operator's own builders made.

Each service body is what the API server would return: the reconcile's status
(reconcile_status.applied_status, with the applied spec) under the status whole
ticks wrote (tick.run_tick, an actuator answering with the server's own result
shape), so a change to the status the operator writes shows up here.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import pytest

from fusebox_contract import admin
from fusebox_contract.names import ActionType, BreakerState, EventReason, Variant
from fusebox_operator.actuator import ActionResult, RuntimeCall, outcome
from fusebox_operator.incident import PAUSE_ACTIONS, PIN_TIER, RESET_BREAKER
from fusebox_operator.kubectl_plugin import views
from fusebox_operator.kubectl_plugin.cli import parser
from fusebox_operator.observations import PodSample, PodView
from fusebox_operator.policy_state import Action, PolicyState
from fusebox_operator.reconcile_status import applied_status
from fusebox_operator.sizing import size_memory
from fusebox_operator.spec import parse_spec
from fusebox_operator.status import human_bytes
from fusebox_operator.tick import TickInputs, TickMemory, run_tick

T0 = 1_800_000_000.0
LIMIT = 4 * 1024**3
FREED = 700 * 1024**2
RAW: dict[str, Any] = {
    "model": {"name": "chat", "source": "pvc://models/tiny"},
    "gpu": {"count": 0},
    "breaker": {"resource": {"cooldownSeconds": 60}},
}
SPEC = parse_spec(RAW)
POD = PodView("chat-0", "uid-0", "10.0.0.1", "Running", True, True, True, 0, False, False)


class ServerLikeActuator:
    """Answers each action as the server's admin API does, through the actuator's own
    conversion (actuator.outcome): the result line status and events carry."""

    async def execute(
        self, namespace: str, pod: PodView | None, token: str, action: Action
    ) -> ActionResult:
        before = admin.MemoryFigures(rss_bytes=int(0.97 * LIMIT))
        after = admin.MemoryFigures(rss_bytes=int(0.97 * LIMIT) - FREED)
        answer = admin.ActionResult(
            action.id, ActionType.GC, Variant.PRIMARY, Variant.PRIMARY, True, before, after, 0.2
        )
        return outcome(answer)

    async def reconcile_runtime(self, *args: Any) -> RuntimeCall:
        return RuntimeCall(changed=True)


def leaking(at: float) -> PodSample:
    return PodSample(
        "chat-0",
        at,
        stats_age_seconds=1.0,
        heartbeat_age_seconds=0.5,
        rss_bytes=0.97 * LIMIT,
        memory_limit_bytes=LIMIT,
        latency_p99_seconds=0.25,
        variant=Variant.PRIMARY,  # as a server reports it (status shows no variant unseen)
    )


def service(
    annotations: dict[str, str] | None = None,
    status: dict[str, Any] | None = None,
    ticks: int = 1,
    scraped: Callable[[float, int], PodSample] = lambda now, step: leaking(now),
) -> dict[str, Any]:
    """A service as the API server returns it after a reconcile and `ticks` ticks
    (`scraped`: what the pod's scrape at each tick, by time and number, gives)."""
    current = {**applied_status({}, RAW, size_memory(SPEC, []), "chat", 1, T0), **(status or {})}
    memory = TickMemory()
    for step in range(ticks):
        now = T0 + 5 * step

        async def scrape(
            pods: Sequence[PodView], now: float = now, step: int = step
        ) -> list[PodSample]:
            return [scraped(now, step)]

        inputs = TickInputs("prod", "svc", SPEC, current, [POD], "t", 1, annotations or {})
        result = asyncio.run(
            run_tick(inputs, memory, scrape, ServerLikeActuator(), lambda now=now: now)
        )
        current = {**current, **result.status_patch}
    meta = {"name": "chat", "namespace": "prod", "generation": 1, "annotations": annotations or {}}
    return {"metadata": meta, "spec": RAW, "status": current}


def stamp(moment: float) -> str:
    return dt.datetime.fromtimestamp(moment, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ----- status ----------------------------------------------------------------------------------


def test_status_lists_each_service_with_its_last_action_and_why() -> None:
    other = service()
    other["metadata"] = {**other["metadata"], "name": "embed", "namespace": "batch"}
    lines = views.status_table([service(), other], T0 + 10).splitlines()
    assert lines[0].split() == [
        "NAMESPACE", "NAME", "MODE", "BREAKER", "TIER", "VARIANT", "READY", "SEEN", "LAST", "WHY",
    ]  # fmt: skip
    assert [line.split()[:2] for line in lines[1:]] == [["batch", "embed"], ["prod", "chat"]]
    row = lines[2].split()
    assert row[2:8] == ["Enforce", "Closed", "none", "primary", "1/1", "11s"]  # stats 1 s old
    assert row[8:10] == ["gc", "chat-0"] and row[10] == "RSS"  # why: the figures behind it


def test_status_of_a_paused_and_pinned_service_says_so_and_shows_what_it_would_do() -> None:
    body = service({PAUSE_ACTIONS: "INC-7", PIN_TIER: "no-streaming"})
    row = views.status_table([body], T0).splitlines()[1].split()
    assert row[2] == "Enforce,paused,pinned:no-streaming"
    assert row[4] == "no-streaming"
    assert row[8:11] == ["would", "gc", "chat-0"]


def test_status_shows_no_variant_once_no_pod_is_observed_reporting_one() -> None:
    def unseen_after_the_first(now: float, step: int) -> PodSample:
        if step == 0:
            return replace(leaking(now), variant=Variant.FALLBACK)
        return PodSample("chat-0", now, ok=False, error="connection refused")

    seen = service(ticks=1, scraped=unseen_after_the_first)
    assert views.status_table([seen], T0).splitlines()[1].split()[5] == "fallback"
    unseen = service(ticks=3, scraped=unseen_after_the_first)
    assert views.status_table([unseen], T0 + 10).splitlines()[1].split()[5] == "-"


def test_status_with_no_services_says_so() -> None:
    assert views.status_table([], T0) == "No InferenceServices found."


# ----- explain ---------------------------------------------------------------------------------


def test_explain_gives_the_thresholds_of_the_applied_spec_and_the_figures() -> None:
    text = views.explain(service(), T0 + 10)
    latency = SPEC.breaker.latency
    assert f"trips when p99 ttft > {latency.p99_threshold_millis:g} ms" in text
    assert f"over >= {latency.min_requests} requests" in text
    assert f"as of {stamp(T0)} (10s ago): p99 250 ms (highest pod, chat-0)" in text
    assert f"RSS > {SPEC.breaker.resource.rss.ratio:.0%} of its limit" in text
    assert "one rung per 60 s" in text
    figures = f"RSS {human_bytes(0.97 * LIMIT)} of {human_bytes(LIMIT)} (97%)"
    assert f"chat-0: as of {stamp(T0)} (10s ago): {figures}" in text
    assert "now" not in text  # every figure is as of its scrape


def test_an_hour_old_status_shows_its_age_in_explain_and_status() -> None:
    # The operator stopped writing an hour ago: nothing may read as current.
    body = service()
    later = T0 + 3600
    text = views.explain(body, later)
    assert (
        text.splitlines()[1]
        == f"Status written {stamp(T0)} (60m ago); each figure as of its own scrape"
    )
    assert f"as of {stamp(T0)} (60m ago): p99 250 ms" in text
    assert f"chat-0: as of {stamp(T0)} (60m ago): RSS" in text
    row = views.status_table([body], later).splitlines()[1].split()
    assert row[7] == "60m"  # SEEN: the age of the oldest figure (summary.observedAt)


def test_explain_tells_relayed_figures_older_than_the_scrape() -> None:
    def stale(now: float, step: int) -> PodSample:
        return replace(leaking(now), stats_age_seconds=400.0)

    text = views.explain(service(scraped=stale), T0 + 10)
    assert f"as of {stamp(T0)} (10s ago), its server's stats 7m old: p99 250 ms" in text


def test_explain_shows_a_pod_whose_scrape_failed_by_when_it_was_last_seen_and_why() -> None:
    def refused_later(now: float, step: int) -> PodSample:
        if step == 0:
            return leaking(now)
        return PodSample("chat-0", now, ok=False, error="connection refused")

    # Unanswered for 35 s: the operator writes the pod as it last saw it.
    text = views.explain(service(ticks=8, scraped=refused_later), T0 + 40)
    assert f"chat-0: not scraped since {stamp(T0)} (40s ago): connection refused" in text
    assert "chat-0: as of" not in text and "no p99 reported" in text  # no figure shown


def test_explain_and_status_take_absent_and_null_fields() -> None:
    # A merge patch deletes with null: the API can hand back any field as null.
    body = service()
    body["status"].update(
        {"degradation": {"level": None, "tier": None}, "breaker": None, "pods": [{}, None]}
    )
    body["status"]["summary"] = None
    text = views.explain(body, T0 + 10)
    assert "Tier: none (level 0)" in text and "Breaker: Closed since -" in text
    row = views.status_table([body], T0 + 10).splitlines()[1].split()
    assert row[3:8] == ["-", "-", "primary", "-", "-"]
    unwritten = service()
    del unwritten["status"]["updatedAt"]
    assert "Status not written by the control loop yet" in views.explain(unwritten, T0)


def test_explain_names_the_ladder_s_next_rung_and_when() -> None:
    # gc ran at T0 with a cooldown of 60 s: empty_cache is next, due at T0 + 60.
    text = views.explain(service(), T0 + 10)
    assert f"rss: next rung empty_cache at {stamp(T0 + 60)} (in 50s), if still over" in text
    assert "(tried: gc)" in text
    assert "Last: gc chat-0: RSS " in text


def test_explain_an_open_breaker_says_when_it_goes_half_open() -> None:
    state = PolicyState("svc", breaker=BreakerState.OPEN, breaker_since=T0 - 5, trips=2)
    status = {
        "breaker": {"state": "Open", "reason": "p99 ttft 900 ms > 500 ms", "trips": 2},
        "policy": state.to_status(),
    }
    body = service(status=status)
    body["status"]["breaker"]["since"] = stamp(T0 - 5)
    text = views.explain(body, T0)
    assert "Breaker: Open since" in text and "2 trip(s)" in text
    assert f"next: half-open at {stamp(T0 - 5 + SPEC.breaker.open_seconds)}" in text


def test_explain_tells_the_incident_controls_and_a_held_tier() -> None:
    text = views.explain(service({PIN_TIER: "no-streaming", RESET_BREAKER: "r1"}), T0 + 1)
    assert f"{PIN_TIER}='no-streaming' since {stamp(T0)}" in text
    assert f"{RESET_BREAKER}='r1'" in text
    assert f"held by {PIN_TIER}" in text


def test_explain_before_any_spec_was_applied_says_so() -> None:
    body = {"metadata": {"name": "new", "namespace": "prod"}, "spec": RAW, "status": {}}
    assert "no spec applied yet" in views.explain(body, T0)


# ----- history ---------------------------------------------------------------------------------


def event(reason: str, message: str, at: str, count: int = 1) -> dict[str, Any]:
    return {
        "type": "Normal",
        "reason": reason,
        "message": message,
        "lastTimestamp": at,
        "count": count,
    }


def test_history_shows_each_action_with_memory_before_and_after() -> None:
    text = views.history(service(ticks=1), [])
    before, after = human_bytes(int(0.97 * LIMIT)), human_bytes(int(0.97 * LIMIT) - FREED)
    assert f"result: RSS {before} -> {after} (freed {human_bytes(FREED)})" in text
    assert "why:    RSS " in text and "of the memory limit" in text


def test_history_lists_the_story_events_in_time_order_and_leaves_out_the_rest() -> None:
    events = [
        event(EventReason.TIER_PINNED, "held at no-streaming", "2027-01-15T08:02:00Z"),
        event(EventReason.ACTIONS_PAUSED, "paused (INC-7)", "2027-01-15T08:01:00Z", count=3),
        event(EventReason.MEMORY_SIZED, "limit 4Gi", "2027-01-15T08:00:00Z"),
    ]
    lines = views.history(service(), events).splitlines()
    told = lines[lines.index("Events:") + 1 :]
    assert told == [
        "  2027-01-15T08:01:00Z  Normal ActionsPaused (x3): paused (INC-7)",
        "  2027-01-15T08:02:00Z  Normal TierPinned: held at no-streaming",
    ]


def test_history_tells_the_scale_changes_held_back_beside_those_made() -> None:
    events = [
        event(EventReason.SCALED_UP, "1 -> 2 replicas", "2027-01-15T08:00:00Z"),
        event(EventReason.SCALE_UP_BLOCKED, "2 pods Pending for GPUs", "2027-01-15T08:01:00Z"),
        event(EventReason.SCALE_DOWN_HELD, "2 -> 1 held until 08:07", "2027-01-15T08:02:00Z"),
    ]
    lines = views.history(service(), events).splitlines()
    told = lines[lines.index("Events:") + 1 :]
    assert told == [
        "  2027-01-15T08:00:00Z  Normal ScaledUp: 1 -> 2 replicas",
        "  2027-01-15T08:01:00Z  Normal ScaleUpBlocked: 2 pods Pending for GPUs",
        "  2027-01-15T08:02:00Z  Normal ScaleDownHeld: 2 -> 1 held until 08:07",
    ]


def test_history_of_a_paused_service_shows_what_was_not_acted() -> None:
    text = views.history(service({PAUSE_ACTIONS: "INC-7"}), [])
    assert "recent actions (oldest first)\n  none" in text
    assert f"not acted: paused by {PAUSE_ACTIONS} (INC-7)" in text


# ----- the control commands --------------------------------------------------------------------


def test_pause_resume_reset_and_unpin_write_one_annotation_each() -> None:
    assert views.pause_patch("INC-7") == {"metadata": {"annotations": {PAUSE_ACTIONS: "INC-7"}}}
    assert views.resume_patch() == {"metadata": {"annotations": {PAUSE_ACTIONS: None}}}
    assert views.reset_patch("r2") == {"metadata": {"annotations": {RESET_BREAKER: "r2"}}}
    assert views.unpin_patch() == {"metadata": {"annotations": {PIN_TIER: None}}}


def test_pin_writes_a_tier_the_service_lists() -> None:
    patch = views.pin_patch(service(), "canned-answers")
    assert patch == {"metadata": {"annotations": {PIN_TIER: "canned-answers"}}}


@pytest.mark.parametrize(
    ("tier", "why"),
    [("turbo", "unknown tier 'turbo'"), ("fallback-model", "not in spec.degradation.tiers")],
)
def test_pin_refuses_a_tier_the_service_cannot_take_before_writing(tier: str, why: str) -> None:
    # The sample service has no fallback, so fallback-model is not one of its tiers.
    with pytest.raises(ValueError, match=why):
        views.pin_patch(service(), tier)


def test_the_command_line_takes_kubectl_s_flags_and_each_command() -> None:
    args = parser().parse_args(["--context", "prod", "-n", "ml", "pin", "chat", "none"])
    assert (args.context, args.namespace, args.command, args.service, args.tier) == (
        "prod",
        "ml",
        "pin",
        "chat",
        "none",
    )
    assert parser().parse_args(["status", "-A"]).all_namespaces
    with pytest.raises(SystemExit):
        parser().parse_args(["pin", "chat"])  # a tier is required


def test_explain_a_slow_service_says_when_the_breaker_would_trip() -> None:
    # p99 250 ms over the default threshold from the first tick: the breaker counts.
    text = views.explain(service(), T0 + 10)
    latency = SPEC.breaker.latency
    assert latency.p99_threshold_millis < 250  # the sample is slow under the defaults
    assert f"over the threshold since {stamp(T0)}" in text
    assert f"trips at {stamp(T0 + latency.for_seconds)}" in text


@pytest.mark.parametrize(
    ("argv", "namespace"),
    [
        (["explain", "chat", "-n", "team"], "team"),  # after the command, as kubectl takes it
        (["-n", "team", "explain", "chat"], "team"),
        (["--namespace", "root", "explain", "chat", "-n", "team"], "team"),  # the last wins
        (["explain", "chat"], None),
    ],
)
def test_kubectl_flags_are_taken_before_or_after_the_command(
    argv: list[str], namespace: str | None
) -> None:
    args = parser().parse_args(argv)
    assert (args.command, args.service, args.namespace) == ("explain", "chat", namespace)
    assert parser().parse_args(["status", "--context", "lab"]).context == "lab"
