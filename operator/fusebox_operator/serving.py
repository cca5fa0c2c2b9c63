"""Which pods serve, as observed: the kubelet's readiness and the server's own report.

Why: a pod can pass its readiness probe and refuse every request. Its memory
guard refuses new work at 95% of a limit, its model is unloaded by a failed
swap, its event loop is wedged: the kubelet still calls it Ready, and a
status built on the kubelet alone told a platform team a service was healthy
through a full outage. So a pod counts as serving only when the kubelet says
Ready *and* a recent scrape of its sidecar says the server accepts requests.
A pod the operator cannot see is neither: it is unobserved, and the status
says Unknown with the cause instead of repeating the last good news.

One lost scrape is forgiven (a sidecar busy for a moment); the second in a
row makes the pod unobserved, so a blind operator says so within two scrape
intervals. A pod that serves still serves nobody while the Service's
EndpointSlices leave it out (endpoints.py, `outside_service`). Pure: the
sightings are carried between ticks by the caller.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from fusebox_contract.names import BreakerState, EventReason
from fusebox_operator.endpoints import EndpointGaps
from fusebox_operator.observations import NodeNotReady, PodSample, PodView

MISSES_FORGIVEN = 1
"""Failed scrapes in a row still judged by the last good one; one more and the pod
is unobserved (within two scrape intervals of losing sight of it)."""
MAX_ERROR_CHARS = 160


class ServingReason(enum.StrEnum):
    """Why a pod serves or not: the reasons Ready and Available carry."""

    SERVING = "Serving"
    NOT_READY = "PodNotReady"  # the kubelet's readiness is False, or the pod is leaving
    MEMORY_GUARD = "MemoryGuard"  # the server's last-resort guard refuses new requests
    MODEL_UNAVAILABLE = "ModelUnavailable"  # no model loaded: every request 503s
    SERVER_WEDGED = "ServerWedged"  # the sidecar answers, the server's stats stopped
    POD_BREAKER_OPEN = "PodBreakerOpen"  # the pod's own breaker refuses every request
    METRICS_UNREACHABLE = "MetricsUnreachable"  # the operator cannot scrape the sidecar
    # The sidecar answers without the server's report: no valid stats file, no age.
    STATS_INVALID = "StatsInvalid"
    # The operator cannot call the pod's admin API: it serves, but cannot be acted on.
    ADMIN_UNREACHABLE = "AdminUnreachable"
    # Ready and serving, but not among the Service's ready endpoints (endpoints.py): no
    # traffic reaches it.
    NO_READY_ENDPOINTS = EventReason.NO_READY_ENDPOINTS.value

    @property
    def refusing(self) -> bool:
        """Requests to it fail: it answers every one with an error, or the Service sends
        it none (a Service with no ready endpoint refuses the connection)."""
        return self in REFUSING

    @property
    def unobserved(self) -> bool:
        """The operator cannot tell whether the pod serves: Unknown, not False."""
        return self in UNOBSERVED


REFUSING = frozenset(
    {
        ServingReason.MEMORY_GUARD,
        ServingReason.MODEL_UNAVAILABLE,
        ServingReason.SERVER_WEDGED,
        ServingReason.POD_BREAKER_OPEN,
        ServingReason.NO_READY_ENDPOINTS,
    }
)
UNOBSERVED = frozenset({ServingReason.METRICS_UNREACHABLE, ServingReason.STATS_INVALID})
# The order Ready names a cause in when pods fail for several: what a user must act
# on first (a server refusing work) before what only hides the truth (a blind operator).
REASON_PRECEDENCE = (
    ServingReason.MEMORY_GUARD,
    ServingReason.SERVER_WEDGED,
    ServingReason.MODEL_UNAVAILABLE,
    ServingReason.POD_BREAKER_OPEN,
    ServingReason.NO_READY_ENDPOINTS,
    ServingReason.METRICS_UNREACHABLE,
    ServingReason.STATS_INVALID,
    ServingReason.NOT_READY,
)


@dataclass(frozen=True)
class Misses:
    """Failures in a row of one link to a pod: its sidecar's scrapes, or its admin calls."""

    count: int = 0
    last_error: str = ""  # why the latest one failed
    since: float | None = None  # when the first of them failed

    def missed(self, error: str, now: float) -> Misses:
        return Misses(self.count + 1, error, self.since if self.since is not None else now)

    @property
    def too_many(self) -> bool:
        """More than MISSES_FORGIVEN in a row: the link is down, not blinking."""
        return self.count > MISSES_FORGIVEN

    def describe(self, what: str, unit: str, now: float, cause: str = "") -> str:
        """`what for 12 s (2 tries): cause [raw error]`; `cause`: one known for a fact
        (a node NotReady), told instead of the guess from the error's words."""
        lasted = now - (self.since if self.since is not None else now)
        evidence = _evidence(self.last_error, cause)
        return f"{what} for {lasted:.0f} s ({self.count} {unit}): {evidence}"


@dataclass(frozen=True)
class Sighting:
    """What the operator last saw of one pod's sidecar, carried from tick to tick."""

    last_ok: PodSample | None = None  # the last good scrape
    misses: Misses = Misses()  # scrapes failed (or not tried) since

    def after(self, sample: PodSample | None, now: float, why_unscraped: str) -> Sighting:
        """This sighting updated by one tick's scrape (None: the pod was not scraped)."""
        if sample is not None and sample.ok:
            return Sighting(last_ok=sample)
        error = sample.error if sample is not None else why_unscraped
        return Sighting(self.last_ok, self.misses.missed(error, now))

    @property
    def observed(self) -> bool:
        return self.last_ok is not None and not self.misses.too_many


@dataclass(frozen=True)
class PodServing:
    """One pod's verdict: whether it serves, why not, and the evidence."""

    pod: str
    reason: ServingReason
    detail: str = ""

    @property
    def serving(self) -> bool:
        return self.reason is ServingReason.SERVING

    @property
    def unobserved(self) -> bool:
        return self.reason.unobserved

    def describe(self) -> str:
        return f"{self.pod} {self.detail}" if self.detail else self.pod


def unreachable_cause(error: str) -> str:
    """A failed scrape's error in the words an operator on call needs.

    A NetworkPolicy that does not (yet) admit the operator looks, from the
    operator, like a refused or unreachable port (a rejecting agent) or a
    timeout (a dropping one): both are named so the reader knows where to look.
    """
    lowered = error.lower()
    if "refused" in lowered or "connect call failed" in lowered:
        return "connection refused (nothing listens, or a NetworkPolicy rejects the operator)"
    if "no route" in lowered or "unreachable" in lowered:
        return (
            "host unreachable (a NetworkPolicy rejects the operator, or the pod's network is gone)"
        )
    if "timeout" in lowered or "timed out" in lowered:
        return "timed out (a NetworkPolicy drops the operator's packets, or the sidecar hangs)"
    if error.startswith("HTTP "):
        return f"the sidecar answered {error}"
    return error[:MAX_ERROR_CHARS] or "not scraped"


def _evidence(error: str, known_cause: str = "") -> str:
    raw = error[:MAX_ERROR_CHARS]
    cause = known_cause or unreachable_cause(error)
    return f"{cause} [{raw}]" if raw and raw != cause else cause


def node_words(node: NodeNotReady) -> str:
    """`node n2 NotReady since 2026-12-06T03:20:11Z`."""
    if node.since is None:
        return f"node {node.node} NotReady"
    moment = dt.datetime.fromtimestamp(node.since, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"node {node.node} NotReady since {moment}"


def _unobserved(pod: PodView, sighting: Sighting | None, now: float) -> PodServing:
    node = node_words(pod.node_not_ready) if pod.node_not_ready is not None else ""
    if sighting is None or sighting.misses.since is None:
        detail = f"not scraped yet: {node}" if node else "not scraped yet"
        return PodServing(pod.name, ServingReason.METRICS_UNREACHABLE, detail)
    detail = sighting.misses.describe("not scraped", "tries", now, node)
    return PodServing(pod.name, ServingReason.METRICS_UNREACHABLE, detail)


def _admin_unreachable(pod: str, calls: Misses, now: float) -> PodServing:
    detail = calls.describe("admin API not reached", "calls", now)
    return PodServing(pod, ServingReason.ADMIN_UNREACHABLE, detail)


def _stats_unseen(sample: PodSample) -> str:
    """Why a good scrape carries no report of the server, in the sidecar's terms."""
    if sample.stats_valid is False and sample.stats_age_seconds is not None:
        return (
            f"stats file invalid (fusebox_stats_valid 0), last valid "
            f"{sample.stats_age_seconds:.0f} s ago: server state unknown"
        )
    if sample.stats_valid is False:
        return "stats file never valid (fusebox_stats_valid 0, no age): server state unknown"
    return "sidecar reports no stats age (fusebox_server_stats_age_seconds): server state unknown"


def _wedged(pod: str, sample: PodSample, wedge_after_seconds: float) -> PodServing | None:
    """SERVER_WEDGED when the server's stats or heartbeat are older than the threshold."""
    ages = [a for a in (sample.stats_age_seconds, sample.heartbeat_age_seconds) if a is not None]
    if ages and max(ages) > wedge_after_seconds:
        return PodServing(
            pod, ServingReason.SERVER_WEDGED, f"server stats {max(ages):.0f} s old: wedged"
        )
    return None


def judge_sample(pod: str, sample: PodSample, wedge_after_seconds: float) -> PodServing:
    """A Ready pod's verdict from a good scrape of its sidecar."""
    wedged = _wedged(pod, sample, wedge_after_seconds)
    if wedged is not None:
        return wedged
    if not sample.stats_observed:
        # The state, the heartbeats and the age all come from the stats file: without
        # it, a scrape that answers says nothing of the server. Not Serving: unknown.
        return PodServing(pod, ServingReason.STATS_INVALID, _stats_unseen(sample))
    if sample.memory_guard_active:
        return PodServing(
            pod, ServingReason.MEMORY_GUARD, "memory guard refusing new requests (503)"
        )
    if sample.model_loaded is False:
        moving = " (loading or swapping)" if sample.converging else ""
        return PodServing(
            pod, ServingReason.MODEL_UNAVAILABLE, f"no model loaded{moving}: requests get 503"
        )
    if sample.breaker_state is BreakerState.OPEN:
        return PodServing(pod, ServingReason.POD_BREAKER_OPEN, "its breaker is open (503)")
    return PodServing(pod, ServingReason.SERVING)


def judge_pod(
    pod: PodView, sighting: Sighting | None, wedge_after_seconds: float, now: float
) -> PodServing:
    """One pod's verdict: the kubelet first, then what its sidecar last said.

    A pod the kubelet does not call Ready is named for why where that is known: its
    node NotReady (the Node says so; the pod's own status does not), or its server
    wedged (its server's /readyz fails within seconds, long before the stats are
    `wedge_after_seconds` old, so a pod whose sidecar still shows stale stats is
    wedged, not merely not ready).
    """
    if not pod.serving:
        if pod.node_not_ready is not None:
            return PodServing(pod.name, ServingReason.NOT_READY, node_words(pod.node_not_ready))
        last = sighting.last_ok if sighting is not None and sighting.observed else None
        # Only a server whose last stats say it ran loaded: a starting one's load can
        # starve its stats writer for a while (policy._wedge_check reasons the same).
        if last is not None and last.model_loaded is True and pod.server_started:
            wedged = _wedged(pod.name, last, wedge_after_seconds)
            if wedged is not None:
                return wedged
        return PodServing(pod.name, ServingReason.NOT_READY)
    if sighting is None or not sighting.observed or sighting.last_ok is None:
        return _unobserved(pod, sighting, now)
    return judge_sample(pod.name, sighting.last_ok, wedge_after_seconds)


def judge_pods(
    pods: Sequence[PodView],
    sightings: Mapping[str, Sighting],
    wedge_after_seconds: float,
    now: float,
) -> list[PodServing]:
    """Every pod that is not leaving, judged, in name order."""
    return [
        judge_pod(pod, sightings.get(pod.name), wedge_after_seconds, now)
        for pod in sorted(pods, key=lambda p: p.name)
        if not pod.terminating
    ]


def update_sightings(
    sightings: Mapping[str, Sighting],
    pods: Sequence[PodView],
    samples: Mapping[str, PodSample],
    now: float,
) -> dict[str, Sighting]:
    """The sightings after this tick: every existing pod's, forgotten once it is gone.

    A pod that exists but was not scraped (its sidecar not Ready, no IP yet) is a
    miss too: the operator did not see it, whatever the reason.
    """
    updated: dict[str, Sighting] = {}
    for pod in pods:
        if pod.terminating:
            continue
        previous = sightings.get(pod.name, Sighting())
        updated[pod.name] = previous.after(samples.get(pod.name), now, pod.unscraped_because)
    return updated


@dataclass(frozen=True)
class ServiceView:
    """This tick's verdicts on a service's pods, and the figures status may show."""

    verdicts: tuple[PodServing, ...] = ()
    # Pods whose sidecar should answer (Ready, or scrapable) and that the
    # operator cannot see, or Ready ones whose server's stats it cannot read:
    # what TelemetryFresh and its event name.
    blind: tuple[PodServing, ...] = ()
    figures: tuple[PodSample, ...] = ()  # the last good sample of every observed pod
    # Ready pods whose admin API the operator's calls do not reach: it cannot act on them.
    unreachable: tuple[PodServing, ...] = ()
    last_seen: Mapping[str, float] = field(default_factory=dict)  # pod -> last good scrape
    # Serving pods the Service's endpoints leave out, or why they were not read.
    endpoints: EndpointGaps = EndpointGaps()

    @property
    def serving(self) -> int:
        return sum(1 for v in self.verdicts if v.serving)

    @property
    def unobserved(self) -> int:
        return sum(1 for v in self.verdicts if v.unobserved)

    def verdict(self, pod: str) -> PodServing | None:
        return next((v for v in self.verdicts if v.pod == pod), None)


def observe(
    pods: Sequence[PodView],
    sightings: Mapping[str, Sighting],
    wedge_after_seconds: float,
    now: float,
    reach: Mapping[str, Misses] | None = None,
) -> ServiceView:
    """The service as this tick saw it, from the sightings after its scrape and the
    admin calls' reach."""
    verdicts = judge_pods(pods, sightings, wedge_after_seconds, now)
    # A pod the operator should see: one that serves, or one it scrapes. Not a pod whose
    # sidecar is Ready before its server container started (still Pending): the scrape
    # skips it, and counting it blind named every such start in a TelemetryStale warning.
    watched = [p for p in pods if not p.terminating and (p.serving or p.scrapable)]
    blind = [
        _unobserved(p, sightings.get(p.name), now)
        for p in watched
        if not (s := sightings.get(p.name)) or not s.observed
    ]
    # A Ready pod whose sidecar answers without the server's stats is as blind: only a
    # Ready one, for a starting server has written none yet and its kubelet says so.
    blind += [v for v in verdicts if v.reason is ServingReason.STATS_INVALID]
    blind.sort(key=lambda v: v.pod)
    observed = [sightings[v.pod] for v in verdicts if not v.unobserved and v.pod in sightings]
    figures = [s.last_ok for s in observed if s.observed and s.last_ok is not None]
    last_seen = {
        name: s.last_ok.sampled_at for name, s in sightings.items() if s.last_ok is not None
    }
    unreachable = [
        _admin_unreachable(p.name, r, now)
        for p in sorted(pods, key=lambda p: p.name)
        if p.serving and (r := (reach or {}).get(p.name)) is not None and r.too_many
    ]
    return ServiceView(
        verdicts=tuple(verdicts),
        blind=tuple(blind),
        figures=tuple(figures),
        unreachable=tuple(unreachable),
        last_seen=last_seen,
    )


def outside_service(view: ServiceView, gaps: EndpointGaps) -> ServiceView:
    """The view with each serving pod the Service's ready endpoints leave out
    (`gaps.missing`, endpoints.judge_endpoints) judged NO_READY_ENDPOINTS: it serves
    nobody. Its figures stay: the pod itself was seen."""
    verdicts = tuple(
        PodServing(v.pod, ServingReason.NO_READY_ENDPOINTS, gaps.detail(v.pod))
        if v.serving and v.pod in gaps.missing
        else v
        for v in view.verdicts
    )
    return replace(view, verdicts=verdicts, endpoints=gaps)


def update_reach(
    reach: Mapping[str, Misses],
    pods: Sequence[PodView],
    calls: Mapping[str, tuple[bool | None, str]],
    now: float,
) -> dict[str, Misses]:
    """The admin calls' misses after this tick (pod -> (reached, error); reached None: no
    call was needed, which says nothing new). A pod the kubelet does not call Ready is
    still starting: its failures are expected, not kept."""
    updated: dict[str, Misses] = {}
    for pod in (p for p in pods if p.serving):
        before = reach.get(pod.name, Misses())
        reached, error = calls.get(pod.name, (None, ""))
        if reached is None:
            updated[pod.name] = before
        else:
            updated[pod.name] = Misses() if reached else before.missed(error, now)
    return updated


def service_reason(verdicts: Sequence[PodServing]) -> ServingReason | None:
    """The cause Ready names when pods do not serve: the first of REASON_PRECEDENCE."""
    present = {v.reason for v in verdicts if not v.serving}
    return next((reason for reason in REASON_PRECEDENCE if reason in present), None)
