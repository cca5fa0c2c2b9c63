"""Status never claims more than was observed: Ready, the columns and TelemetryFresh
follow what the pods' servers report and whether the operator can see them at all.

The ticks run the real control loop (tick.run_tick) without kopf; each scrape
answers what a sidecar would, or fails as a NetworkPolicy that does not admit
the operator makes it fail.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from fusebox_contract.names import BreakerState, ConditionType, EventReason, Variant
from fusebox_operator.actuator import ActionResult, RuntimeCall
from fusebox_operator.observations import NodeNotReady, PodSample, PodView
from fusebox_operator.serving import (
    PodServing,
    ServingReason,
    Sighting,
    judge_pod,
    observe,
    unreachable_cause,
    update_sightings,
)
from fusebox_operator.spec import parse_spec
from fusebox_operator.status import iso
from fusebox_operator.tick import TickInputs, TickMemory, TickOutcome, run_tick

T0 = 1_800_000_000.0
INTERVAL = 5.0
SPEC_RAW: dict[str, Any] = {"model": {"name": "chat", "source": "pvc://models/tiny"}, "replicas": 1}
SPEC = parse_spec(SPEC_RAW)
TWO = parse_spec({"model": {"name": "chat", "source": "pvc://models/tiny"}, "replicas": 2})
REFUSED = (
    "ClientConnectorError: Cannot connect to host 10.0.0.1:9400 ssl:default "
    "[Connect call failed ('10.0.0.1', 9400)]"
)
MIB = 1024**2


def pod(name: str = "a", ready: bool = True) -> PodView:
    return PodView(name, f"uid-{name}", "10.0.0.1", "Running", ready, True, True, 0, False, False)


def answer(name: str, at: float, **extra: Any) -> PodSample:
    values: dict[str, Any] = {
        "model_loaded": True,
        "degradation_level": 0,
        "variant": Variant.PRIMARY,
        "stats_valid": True,
        "stats_age_seconds": 1.0,
        "rss_bytes": 800 * MIB,
        "rss_measured": True,  # the sidecar reads /proc (a shared process namespace)
        "memory_guard_active": False,
    }
    values.update(extra)
    return PodSample(name, at, **values)


def refused(name: str, at: float) -> PodSample:
    return PodSample(name, at, ok=False, error=REFUSED)


class IdleActuator:
    async def execute(self, *_: Any) -> ActionResult:
        return ActionResult("pod deleted; the Deployment replaces it")

    async def reconcile_runtime(self, *_: Any) -> RuntimeCall:
        return RuntimeCall()


class UnreachableAdmin(IdleActuator):
    """An admin port a NetworkPolicy agent has not opened to the operator yet."""

    def __init__(self) -> None:
        self.open = False

    async def reconcile_runtime(self, *_: Any) -> RuntimeCall:
        if self.open:
            return RuntimeCall(changed=True)
        return RuntimeCall(error=REFUSED.replace("9400", "8001"))


class Service:
    """One InferenceService's ticks, its status merged as the API server would."""

    def __init__(
        self, spec: Any = SPEC, pods: Sequence[PodView] = (pod(),), actuator: Any = None
    ) -> None:
        self.spec = spec
        self.pods = list(pods)
        self.actuator = actuator or IdleActuator()
        self.memory = TickMemory()
        self.status: dict[str, Any] = {}
        self.events: list[Any] = []
        self.now = T0

    def tick(self, *answers: PodSample) -> TickOutcome:
        async def scrape(targets: Sequence[PodView]) -> list[PodSample]:
            by_pod = {a.pod: a for a in answers}
            return [by_pod.get(t.name) or refused(t.name, self.now) for t in targets]

        inputs = TickInputs("ns", "svc", self.spec, self.status, self.pods, "token", 1)
        clock = self.now
        outcome = asyncio.run(run_tick(inputs, self.memory, scrape, self.actuator, lambda: clock))
        # kopf's merge patch: a null deletes the key.
        merged = {**self.status, **outcome.status_patch}
        self.status = {key: value for key, value in merged.items() if value is not None}
        self.events += outcome.events
        self.now += INTERVAL
        return outcome

    def condition(self, kind: ConditionType) -> dict[str, Any]:
        return next(c for c in self.status["conditions"] if c["type"] == kind)

    def ready(self) -> tuple[str, str]:
        ready = self.condition(ConditionType.READY)
        return ready["status"], ready["reason"]


def test_a_ready_pod_whose_memory_guard_refuses_makes_the_service_not_ready() -> None:
    service = Service()
    service.tick(answer("a", T0))
    assert service.ready() == ("True", "PodsReady")
    service.tick(answer("a", service.now, memory_guard_active=True, rss_bytes=4000 * MIB))
    assert service.ready() == ("False", "MemoryGuard")
    ready = service.condition(ConditionType.READY)
    assert "a memory guard refusing" in ready["message"] and "0/1 pods serving" in ready["message"]
    available = service.condition(ConditionType.AVAILABLE)
    assert (available["status"], available["reason"]) == ("False", "MemoryGuard")
    assert service.status["summary"]["breaker"] == "Refusing"
    assert service.status["summary"]["rss"] == "3.9Gi"  # the figure as it is now
    assert service.status["pods"][0]["serving"] == "MemoryGuard"
    # The guard lets go: serving again.
    service.tick(answer("a", service.now))
    assert service.ready() == ("True", "PodsReady")
    assert service.status["summary"]["breaker"] == "Closed"


def test_a_pod_without_a_model_or_with_a_wedged_server_does_not_serve() -> None:
    service = Service()
    service.tick(answer("a", T0, model_loaded=False, converging=True))
    assert service.ready() == ("False", "ModelUnavailable")
    assert (
        "no model loaded (loading or swapping)" in service.condition(ConditionType.READY)["message"]
    )
    restarted = service.tick(answer("a", service.now, stats_age_seconds=40.0))
    # Wedged, it is restarted at once: deleted, it no longer counts (PodRestarted says why).
    assert service.ready() == ("False", "PodsNotReady")
    assert [e.reason for e in restarted.events] == [EventReason.POD_RESTARTED]


def test_an_operator_that_cannot_scrape_says_unknown_within_two_intervals_and_why() -> None:
    service = Service()
    service.tick(answer("a", T0))
    assert service.ready() == ("True", "PodsReady")
    service.tick()  # one lost scrape is forgiven
    assert service.ready() == ("True", "PodsReady")
    assert service.condition(ConditionType.TELEMETRY_FRESH)["status"] == "True"
    outcome = service.tick()  # the second in a row: unobserved, said at once
    assert service.ready() == ("Unknown", "MetricsUnreachable")
    fresh = service.condition(ConditionType.TELEMETRY_FRESH)
    assert (fresh["status"], fresh["reason"]) == ("False", "MetricsUnreachable")
    assert "a not scraped for 5 s (2 tries): connection refused" in fresh["message"]
    assert "NetworkPolicy" in fresh["message"]
    assert service.condition(ConditionType.AVAILABLE)["status"] == "Unknown"
    summary = service.status["summary"]
    assert (summary["breaker"], summary["rss"], summary["gpuMemory"]) == ("Unknown", "?", "?")
    # The last figures' time stays as written: the SEEN column counts their age on.
    assert summary["observedAt"] == iso(T0)
    stale = [e for e in outcome.events if e.reason == EventReason.TELEMETRY_STALE]
    assert len(stale) == 1 and "connection refused" in stale[0].message
    assert outcome.status_patch, "a change of what is known is written at once"
    # Still blind: no second event; seen again: Ready and fresh.
    assert not [e for e in service.tick().events if e.reason == EventReason.TELEMETRY_STALE]
    service.tick(answer("a", service.now))
    assert service.ready() == ("True", "PodsReady")
    assert service.condition(ConditionType.TELEMETRY_FRESH)["status"] == "True"


def test_a_restarted_operator_claims_nothing_before_its_first_good_scrape() -> None:
    service = Service()
    service.tick(answer("a", T0))
    restarted = Service()
    restarted.status, restarted.now = service.status, service.now
    restarted.tick()
    assert restarted.ready() == ("Unknown", "MetricsUnreachable")
    assert restarted.status["summary"]["rss"] == "?"


def test_one_unseen_pod_of_two_marks_the_figures_incomplete_and_ready_unknown() -> None:
    service = Service(TWO, [pod("a"), pod("b")])
    service.tick(answer("a", T0), answer("b", T0, rss_bytes=2048 * MIB))
    assert service.status["summary"]["rss"] == "2.0Gi"
    service.tick(answer("a", service.now))
    service.tick(answer("a", service.now))
    summary = service.status["summary"]
    assert summary["rss"] == "800.0Mi?"  # b's figure, maybe the largest, is missing
    assert summary["breaker"] == "Closed"  # a serves: requests get through
    assert service.ready() == ("Unknown", "MetricsUnreachable")
    assert service.condition(ConditionType.AVAILABLE)["status"] == "True"


def test_a_refusing_pod_beside_an_unseen_one_is_known_not_ready() -> None:
    service = Service(TWO, [pod("a"), pod("b")])
    service.tick(answer("a", T0), answer("b", T0))
    service.tick(answer("a", service.now, memory_guard_active=True))
    service.tick(answer("a", service.now, memory_guard_active=True))
    assert service.ready() == ("False", "MemoryGuard")
    message = service.condition(ConditionType.READY)["message"]
    assert "a memory guard refusing" in message and "b not scraped" in message


def test_the_seen_column_is_the_age_of_the_oldest_figure_shown() -> None:
    service = Service(TWO, [pod("a"), pod("b")])
    service.tick(answer("a", T0 - 3), answer("b", T0 - 1))
    assert service.status["summary"]["observedAt"] == iso(T0 - 3)


def test_a_breaker_the_operator_opened_shows_open_whatever_the_pods_say() -> None:
    service = Service()
    service.tick(answer("a", T0))
    assert service.memory.policy is not None
    service.memory.policy.breaker = BreakerState.OPEN
    service.memory.policy.breaker_since = service.now
    service.tick(answer("a", service.now, breaker_state=BreakerState.OPEN))
    assert service.status["summary"]["breaker"] == "Open"
    assert service.ready() == ("False", "BreakerOpen")


def test_an_admin_port_the_operator_cannot_reach_is_named_while_the_pod_serves() -> None:
    admin = UnreachableAdmin()
    service = Service(actuator=admin)
    service.tick(answer("a", T0))  # the first call fails: forgiven
    fresh = service.condition(ConditionType.TELEMETRY_FRESH)
    assert fresh["status"] == "True"
    outcome = service.tick(answer("a", service.now))
    fresh = service.condition(ConditionType.TELEMETRY_FRESH)
    assert (fresh["status"], fresh["reason"]) == ("False", "AdminUnreachable")
    assert "a admin API not reached for 5 s (2 calls): connection refused" in fresh["message"]
    assert service.ready() == ("True", "PodsReady")  # it serves; it cannot be acted on
    told = [e for e in outcome.events if e.reason == EventReason.ADMIN_UNREACHABLE]
    assert len(told) == 1 and "cannot act on it" in told[0].message
    assert not service.tick(answer("a", service.now)).events  # once per spell
    admin.open = True
    service.tick(answer("a", service.now))
    assert service.condition(ConditionType.TELEMETRY_FRESH)["status"] == "True"


# ----- the pure verdicts ----------------------------------------------------------------


def test_unreachable_causes_name_the_network_policy_suspect() -> None:
    assert unreachable_cause(REFUSED).startswith("connection refused")
    assert "NetworkPolicy" in unreachable_cause("ClientConnectorError: [No route to host]")
    assert "drops" in unreachable_cause("TimeoutError: ")
    assert unreachable_cause("HTTP 503") == "the sidecar answered HTTP 503"


def test_a_pod_the_kubelet_calls_unready_is_judged_by_the_kubelet_alone() -> None:
    sighting = Sighting(last_ok=answer("a", T0))
    verdict = judge_pod(pod(ready=False), sighting, 15, T0)
    assert verdict == PodServing("a", ServingReason.NOT_READY)


def test_an_unscraped_pod_is_a_miss_and_a_leaving_one_is_forgotten() -> None:
    sightings = {"a": Sighting(last_ok=answer("a", T0)), "gone": Sighting()}
    pods = [pod("a")]
    after = update_sightings(sightings, pods, {}, T0 + 5)
    assert set(after) == {"a"} and after["a"].misses.count == 1
    assert after["a"].misses.last_error == "not scraped"
    unready = update_sightings(sightings, [replace(pod("a"), sidecar_ready=False)], {}, T0 + 5)
    assert unready["a"].misses.last_error == "sidecar not ready"
    seen = observe(pods, after, 15, T0 + 5)
    assert seen.serving == 1 and [s.pod for s in seen.figures] == ["a"]


def starting(name: str = "a") -> PodView:
    """A native sidecar Ready while the pod is Pending: its server container not started."""
    return PodView(name, f"uid-{name}", "10.0.0.1", "Pending", False, True, False, 0, False, False)


def test_a_pod_whose_sidecar_is_ready_before_its_server_started_is_not_called_blind() -> None:
    service = Service(pods=[starting()])
    for _ in range(3):
        service.tick()
    assert EventReason.TELEMETRY_STALE not in [e.reason for e in service.events]
    assert service.ready() == ("False", "PodsNotReady")
    assert service.memory.sightings["a"].misses.last_error == "pod Pending, its server not started"
    # Running now: scraped, and the first answer is good news, not a stale spell's end.
    service.pods = [pod()]
    service.tick(answer("a", service.now))
    assert service.ready() == ("True", "PodsReady")
    assert EventReason.TELEMETRY_STALE not in [e.reason for e in service.events]


def test_a_running_pod_never_scraped_successfully_is_still_named_blind() -> None:
    service = Service(pods=[pod()])
    service.tick()
    service.tick()
    stale = [e for e in service.events if e.reason == EventReason.TELEMETRY_STALE]
    assert len(stale) == 1 and "a not scraped" in stale[0].message


GIB = 1024**3


def test_a_relayed_figure_is_shown_as_old_as_the_stats_file_it_came_from() -> None:
    """No NVML in the sidecar: GPU memory is the server's, as it last wrote its stats
    file 20 s ago; SEEN counts from then, not from the scrape."""
    service = Service(parse_spec({**SPEC_RAW, "telemetry": {"wedgeAfterSeconds": 60}}))
    service.tick(
        answer(
            "a",
            T0,
            stats_age_seconds=20.0,
            gpu_memory_used_bytes=30 * GIB,
            gpu_memory_measured=False,
        )
    )
    summary = service.status["summary"]
    assert (summary["gpuMemory"], summary["observedAt"]) == ("30.0Gi", iso(T0 - 20))
    # Measured by the sidecar's own NVML at this scrape: as fresh as the scrape.
    measured = Service(service.spec)
    measured.tick(
        answer(
            "a",
            T0,
            stats_age_seconds=20.0,
            gpu_memory_used_bytes=30 * GIB,
            gpu_memory_measured=True,
        )
    )
    assert measured.status["summary"]["observedAt"] == iso(T0)


def test_a_wedged_servers_last_figures_carry_their_age() -> None:
    """In Observe no restart clears a wedge: its last relayed RSS still shows, as old as it is."""
    service = Service(parse_spec({**SPEC_RAW, "mode": "Observe"}))
    service.tick(answer("a", T0, stats_age_seconds=600.0, rss_measured=False))
    assert service.ready() == ("False", "ServerWedged")
    summary = service.status["summary"]
    assert (summary["rss"], summary["observedAt"]) == ("800.0Mi", iso(T0 - 600))


def never_valid(name: str, at: float, **extra: Any) -> PodSample:
    """What the real sidecar answers while the server's stats file has never been valid:
    fusebox_stats_valid 0, no age, nothing relayed; its own /proc and NVML readings only."""
    return PodSample(name, at, stats_valid=False, **extra)


def test_a_ready_pod_whose_stats_file_was_never_valid_is_not_called_serving() -> None:
    service = Service()
    outcome = service.tick(
        never_valid("a", T0, gpu_memory_used_bytes=GIB, gpu_memory_measured=True)
    )
    assert service.ready() == ("Unknown", "StatsInvalid")
    assert service.condition(ConditionType.AVAILABLE)["status"] == "Unknown"
    fresh = service.condition(ConditionType.TELEMETRY_FRESH)
    assert (fresh["status"], fresh["reason"]) == ("False", "StatsInvalid")
    assert fresh["message"].startswith("a stats file never valid")
    summary = service.status["summary"]
    assert (summary["ready"], summary["breaker"], summary["gpuMemory"]) == ("0/1", "Unknown", "?")
    assert service.status["pods"][0]["serving"] == "StatsInvalid"
    (stale,) = [e for e in outcome.events if e.reason is EventReason.TELEMETRY_STALE]
    assert stale.message.startswith("a stats file never valid")
    # The server writes its stats again: serving, telemetry fresh.
    service.tick(answer("a", service.now))
    assert service.ready() == ("True", "PodsReady")
    assert service.condition(ConditionType.TELEMETRY_FRESH)["status"] == "True"


def test_a_scrape_without_a_stats_age_says_nothing_of_the_server() -> None:
    """Something answers on the metrics port with none of the server's figures."""
    service = Service()
    service.tick(PodSample("a", T0))
    assert service.ready() == ("Unknown", "StatsInvalid")
    fresh = service.condition(ConditionType.TELEMETRY_FRESH)
    assert (fresh["status"], fresh["reason"]) == ("False", "StatsInvalid")
    assert "no stats age" in fresh["message"]


def test_a_stats_file_that_goes_bad_is_unknown_then_wedged() -> None:
    service = Service()
    service.tick(answer("a", T0))
    service.tick(never_valid("a", service.now, stats_age_seconds=6.0))
    assert service.ready() == ("Unknown", "StatsInvalid")
    message = service.condition(ConditionType.TELEMETRY_FRESH)["message"]
    assert "stats file invalid (fusebox_stats_valid 0), last valid 6 s ago" in message
    restarted = service.tick(never_valid("a", service.now, stats_age_seconds=40.0))
    assert service.ready() == ("False", "PodsNotReady")  # restarted: on its way out
    assert [e.reason for e in restarted.events] == [EventReason.POD_RESTARTED]


def test_no_memory_action_on_a_pod_whose_server_stats_are_not_seen() -> None:
    """RSS at 99% of the limit, measured by the sidecar: with the server's stats the
    ladder acts at once; without them it holds."""
    over = {"rss_bytes": 0.99 * 4 * GIB, "rss_measured": True, "memory_limit_bytes": 4 * GIB}
    acted = Service().tick(answer("a", T0, **over))
    assert acted.state.in_flight or acted.state.ladders
    held = Service().tick(never_valid("a", T0, **over))
    assert not held.state.in_flight and not held.state.ladders


def test_a_starting_pod_before_its_first_stats_file_reads_as_starting() -> None:
    """Model loading: the kubelet says not Ready and the server has written no stats yet.
    Not serving, and no telemetry alarm: then Ready once loaded."""
    service = Service(pods=[pod("a", ready=False)])
    outcome = service.tick(never_valid("a", T0))
    assert service.ready() == ("False", "PodsNotReady")
    assert service.condition(ConditionType.TELEMETRY_FRESH)["status"] == "True"
    assert not [e for e in outcome.events if e.reason is EventReason.TELEMETRY_STALE]
    service.tick(answer("a", service.now, model_loaded=False, converging=True))
    assert service.ready() == ("False", "PodsNotReady")
    service.pods = [pod("a")]
    service.tick(answer("a", service.now))
    assert service.ready() == ("True", "PodsReady")


def test_a_pod_that_reported_nothing_is_listed_without_a_variant() -> None:
    service = Service(TWO, [pod("a"), pod("b")])
    service.tick(answer("a", T0))  # b's sidecar refuses the scrape
    listed = {entry["name"]: entry for entry in service.status["pods"]}
    assert listed["a"]["variant"] == "primary"
    assert "variant" not in listed["b"]  # not observed: no variant claimed for it
    assert listed["b"]["scraped"] is False


def test_the_variant_column_is_empty_while_no_observed_pod_reports_one() -> None:
    service = Service()
    service.tick()  # the pod's sidecar refuses: nothing reported
    assert "activeVariant" not in service.status
    service.tick(answer("a", service.now, variant=Variant.FALLBACK))
    assert service.status["activeVariant"] == "fallback"
    service.tick()  # one refused scrape is forgiven: the pod is still observed
    assert service.status["activeVariant"] == "fallback"
    service.tick()  # unseen now: no variant claimed for it
    assert "activeVariant" not in service.status
    service.tick(answer("a", service.now))
    assert service.status["activeVariant"] == "primary"


def test_the_variant_column_empties_when_the_reporting_pod_is_gone() -> None:
    service = Service(TWO, [pod("a"), pod("b")])
    service.tick(answer("a", T0, variant=Variant.FALLBACK), answer("b", T0, variant=None))
    assert service.status["activeVariant"] == "fallback"
    service.pods = [pod("b")]  # a deleted; b's server reports no variant
    service.tick(answer("b", service.now, variant=None))
    assert "activeVariant" not in service.status


def on_lost_node(name: str, node: str = "n2") -> PodView:
    """A pod whose node stopped posting: the node controller set its Ready False, its
    containers still say ready (the kubelet's last word), and the Node says NotReady."""
    lost = NodeNotReady(node, T0 - 60)
    return replace(pod(name, ready=False), node=node, node_not_ready=lost)


def test_a_pod_on_a_not_ready_node_is_named_with_its_node_not_a_network_guess() -> None:
    service = Service(spec=TWO, pods=[pod("a"), on_lost_node("b")])
    for _ in range(3):
        service.tick(answer("a", service.now))  # b's scrapes time out: its node is gone

    node_words = "node n2 NotReady since " + iso(T0 - 60)
    ready = service.condition(ConditionType.READY)
    assert (ready["status"], ready["reason"]) == ("False", "PodsNotReady")
    assert ready["message"] == f"1/2 pods serving; b not ready: {node_words}"
    fresh = service.condition(ConditionType.TELEMETRY_FRESH)
    assert node_words in fresh["message"] and "NetworkPolicy" not in fresh["message"]
    (stale,) = [e for e in service.events if e.reason is EventReason.TELEMETRY_STALE]
    assert node_words in stale.message and "NetworkPolicy" not in stale.message


def test_a_not_ready_pod_whose_stats_went_stale_is_named_wedged() -> None:
    # A wedged event loop fails /readyz within seconds: the kubelet calls the pod not
    # Ready long before its stats are wedgeAfterSeconds old; its sidecar still answers.
    # Observe mode: the operator's restart (from the tick that deletes it the pod counts
    # as leaving) is only told, so the verdict stays to be read.
    service = Service(spec=parse_spec({**SPEC_RAW, "mode": "Observe"}), pods=[pod()])
    service.tick(answer("a", service.now))
    service.pods = [pod(ready=False)]
    service.tick(answer("a", service.now, stats_age_seconds=5.0))
    assert service.ready() == ("False", "PodsNotReady")  # not stale yet: not ready, no more
    service.tick(answer("a", service.now, stats_age_seconds=40.0))
    assert service.ready() == ("False", "ServerWedged")
    assert "a server stats 40 s old: wedged" in service.condition(ConditionType.READY)["message"]


def test_a_starting_pod_whose_stats_lag_is_not_called_wedged() -> None:
    starting_up = answer("a", T0, model_loaded=False, stats_age_seconds=40.0)
    verdict = judge_pod(pod(ready=False), Sighting(last_ok=starting_up), 15, T0)
    assert verdict == PodServing("a", ServingReason.NOT_READY)
