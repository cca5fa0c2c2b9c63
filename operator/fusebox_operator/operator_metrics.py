"""The operator's own Prometheus metrics: what it did, how long it took, what failed.

Why: the sidecars say how each server is; nothing said whether the operator
itself keeps up (a tick slower than the scrape interval), what it does (how
many restarts, why, and whether they worked) or what it cannot reach. One
registry of its own (no default process collectors: a standby replica's
figures would read as the acting one's), served on its own port
(`FUSEBOX_METRICS_PORT`, the chart's `metricsPort`) next to kopf's health
endpoint. The handlers, the actuator and the scraper record at their seams;
the names and the bounded label values are all here (docs/metrics.md,
"The operator's metrics").

Every label value is bounded: an action's free-text reason becomes one of
`ActionCause`, an error one of a few kinds, a service's state its breaker
column and tier. No namespace or service label: those would collide with the
target's own `namespace` label and grow with every service.
"""

from __future__ import annotations

import enum
import functools
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from threading import Lock
from typing import ParamSpec, TypeVar
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from fusebox_operator.policy_state import ActionKind

Clock = Callable[[], float]
P = ParamSpec("P")
R = TypeVar("R")

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Seconds: a tick is milliseconds when idle, seconds while it waits on an admin call,
up to the actuator's model-load timeout (300 s, the +Inf bucket)."""
SERVICE_STALE_SECONDS = 600.0
"""A service not ticked for this long leaves the services gauge (deleted, or another
replica acts for it): the gauge counts what this process currently watches."""


class OperatorMetric(enum.StrEnum):
    """Exposed names; counters without `_total`, as prometheus_client takes them."""

    RECONCILE_DURATION_SECONDS = "fusebox_operator_reconcile_duration_seconds"
    TICK_DURATION_SECONDS = "fusebox_operator_tick_duration_seconds"
    ACTIONS = "fusebox_operator_actions"  # {action, reason, result}
    BREAKER_TRANSITIONS = "fusebox_operator_breaker_transitions"  # {from_state, to_state}
    SCRAPE_ERRORS = "fusebox_operator_scrape_errors"  # {kind}
    ADMIN_ERRORS = "fusebox_operator_admin_errors"  # {call, kind}
    SERVICES = "fusebox_operator_services"  # {breaker, tier}

    @property
    def samples(self) -> tuple[str, ...]:
        """The sample names Prometheus stores for this metric."""
        if self in COUNTERS:
            return (f"{self.value}_total",)
        if self in HISTOGRAMS:
            return tuple(f"{self.value}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
        return (self.value,)


COUNTERS = frozenset(
    {
        OperatorMetric.ACTIONS,
        OperatorMetric.BREAKER_TRANSITIONS,
        OperatorMetric.SCRAPE_ERRORS,
        OperatorMetric.ADMIN_ERRORS,
    }
)
HISTOGRAMS = frozenset(
    {OperatorMetric.RECONCILE_DURATION_SECONDS, OperatorMetric.TICK_DURATION_SECONDS}
)


class ActionCause(enum.StrEnum):
    """Why an action was taken, as the `reason` label (the status keeps the full text)."""

    MEMORY = "memory"  # the memory ladder: RSS or GPU memory near its limit
    RECOVERED = "recovered"  # memory calm after a swap: back to the primary
    WEDGED = "wedged"  # the server's stats or heartbeats stopped
    GPU_UNHEALTHY = "gpu_unhealthy"  # the kubelet marks the pod's GPU Unhealthy
    NODE_MEMORY = "node_memory"  # the node's available memory below its floor
    OTHER = "other"


class ActionOutcome(enum.StrEnum):
    """The `result` label: how the call ended."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    IN_FLIGHT = "in_flight"  # outcome unknown: retried with the same id
    REPLAYED = "replayed"  # the server had already run this id


class ScrapeErrorKind(enum.StrEnum):
    HTTP = "http"  # the sidecar answered, not 200
    TIMEOUT = "timeout"
    UNREACHABLE = "unreachable"  # connection refused or broken
    BAD_METRICS = "bad_metrics"  # the text did not parse


class AdminErrorKind(enum.StrEnum):
    HTTP = "http"  # the server refused the call (4xx, 5xx)
    BAD_ANSWER = "bad_answer"  # not JSON or not the contract's body
    UNREACHABLE = "unreachable"  # no answer: timed out or the connection broke


CAUSE_PREFIXES: tuple[tuple[str, ActionCause], ...] = (
    ("memory calm", ActionCause.RECOVERED),
    ("server stats", ActionCause.WEDGED),
    ("GPU ", ActionCause.GPU_UNHEALTHY),
    ("node memory pressure", ActionCause.NODE_MEMORY),
    ("RSS", ActionCause.MEMORY),
    ("GPU memory", ActionCause.MEMORY),
)


def action_cause(kind: ActionKind, reason: str) -> ActionCause:
    """The bounded cause of an action from its kind and the policy's reason text."""
    if kind is ActionKind.DRAIN:
        return ActionCause.GPU_UNHEALTHY
    if kind is ActionKind.RESTORE_PRIMARY:
        return ActionCause.RECOVERED
    if kind is ActionKind.GROW_LIMIT:
        return ActionCause.MEMORY
    # The longest prefix first: "GPU memory ..." is the ladder's, "GPU 0 ..." a drain's.
    for prefix, cause in sorted(CAUSE_PREFIXES, key=lambda p: -len(p[0])):
        if reason.startswith(prefix):
            return cause
    return ActionCause.OTHER


def action_outcome(text: str, settled: bool, replayed: bool) -> ActionOutcome:
    """The `result` of an actuator's answer (`actuator.ActionResult`'s fields)."""
    if not settled:
        return ActionOutcome.IN_FLIGHT
    if text.startswith("failed"):
        return ActionOutcome.FAILED
    return ActionOutcome.REPLAYED if replayed else ActionOutcome.SUCCEEDED


@dataclass(frozen=True)
class ServiceState:
    breaker: str  # status.summary.breaker: Closed, Open, HalfOpen, Refusing, Unknown
    tier: str  # status.degradation.tier
    seen_at: float


class ServicesCollector(Collector):
    """`fusebox_operator_services{breaker, tier}`: how many services are in each state,
    from the last tick of each (services not ticked for SERVICE_STALE_SECONDS left out)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.states: dict[str, ServiceState] = {}
        self.lock = Lock()  # ticks write on the event loop, scrapes read on a thread

    def set(self, service: str, breaker: str, tier: str) -> None:
        with self.lock:
            self.states[service] = ServiceState(breaker, tier, self.clock())

    def forget(self, service: str) -> None:
        with self.lock:
            self.states.pop(service, None)

    def collect(self) -> list[GaugeMetricFamily]:
        now = self.clock()
        counts: dict[tuple[str, str], int] = {}
        with self.lock:
            for key in [
                k for k, s in self.states.items() if now - s.seen_at > SERVICE_STALE_SECONDS
            ]:
                del self.states[key]
            for state in self.states.values():
                counts[(state.breaker, state.tier)] = counts.get((state.breaker, state.tier), 0) + 1
        family = GaugeMetricFamily(
            OperatorMetric.SERVICES.value,
            "InferenceServices this operator ticks, by breaker column and degradation tier.",
            labels=["breaker", "tier"],
        )
        for (breaker, tier), count in sorted(counts.items()):
            family.add_metric([breaker, tier], count)
        return [family]


@dataclass
class OperatorMetrics:
    """One registry and its metrics. The process has one (`METRICS`); tests make their own."""

    clock: Clock = time.time
    registry: CollectorRegistry = field(
        default_factory=lambda: CollectorRegistry(auto_describe=True)
    )

    def __post_init__(self) -> None:
        histogram = {"buckets": DURATION_BUCKETS, "registry": self.registry}
        self.reconcile_seconds = Histogram(
            OperatorMetric.RECONCILE_DURATION_SECONDS.value,
            "Duration of one create/update/resume handler run of an InferenceService.",
            **histogram,  # type: ignore[arg-type]
        )
        self.tick_seconds = Histogram(
            OperatorMetric.TICK_DURATION_SECONDS.value,
            "Duration of one telemetry tick of a service: scrape, decide, act, report.",
            **histogram,  # type: ignore[arg-type]
        )
        self.actions = Counter(
            OperatorMetric.ACTIONS.value,
            "Actions the operator sent to pods, by kind, cause and how the call ended.",
            ["action", "reason", "result"],
            registry=self.registry,
        )
        self.breaker_transitions = Counter(
            OperatorMetric.BREAKER_TRANSITIONS.value,
            "Changes of a service's latency breaker (status.breaker.state).",
            ["from_state", "to_state"],
            registry=self.registry,
        )
        self.scrape_errors = Counter(
            OperatorMetric.SCRAPE_ERRORS.value,
            "Sidecar scrapes that gave no metrics, by kind.",
            ["kind"],
            registry=self.registry,
        )
        self.admin_errors = Counter(
            OperatorMetric.ADMIN_ERRORS.value,
            "Admin API calls to a server that failed, by call and kind.",
            ["call", "kind"],
            registry=self.registry,
        )
        self.services = ServicesCollector(self.clock)
        self.registry.register(self.services)

    def action(
        self, kind: ActionKind, reason: str, text: str, settled: bool, replayed: bool
    ) -> None:
        self.actions.labels(
            kind.value,
            action_cause(kind, reason).value,
            action_outcome(text, settled, replayed).value,
        ).inc()

    def scrape_error(self, kind: ScrapeErrorKind) -> None:
        self.scrape_errors.labels(kind.value).inc()

    def admin_error(self, call: str, kind: AdminErrorKind) -> None:
        self.admin_errors.labels(call, kind.value).inc()

    def tick(
        self,
        service: str,
        seconds: float,
        before: Mapping[str, object],
        after: Mapping[str, object],
    ) -> None:
        """One tick of `service` (namespace/name) took `seconds`; `before` is the status
        it read, `after` its status patch: a breaker change counts as a transition, and
        the service's state is what the patch (else the status) says."""
        self.tick_seconds.observe(seconds)
        was, now = _breaker_state(before), _breaker_state(after)
        if was and now and was != now:
            self.breaker_transitions.labels(was, now).inc()
        column = _field(after, "summary", "breaker") or _field(before, "summary", "breaker")
        tier = _field(after, "degradation", "tier") or _field(before, "degradation", "tier")
        if column:
            self.services.set(service, column, tier or "none")

    def forget(self, service: str) -> None:
        self.services.forget(service)


def _field(status: Mapping[str, object], section: str, key: str) -> str:
    part = status.get(section)
    value = part.get(key) if isinstance(part, Mapping) else None
    return value if isinstance(value, str) else ""


def _breaker_state(status: Mapping[str, object]) -> str:
    return _field(status, "breaker", "state")


def serve(metrics: OperatorMetrics, port: int, host: str = "0.0.0.0") -> WSGIServer:
    """Serve /metrics on `port` (0: a free one, `server_port` says which) in a daemon
    thread: prometheus_client's own server, apart from kopf's event loop, so a busy
    loop still answers a scrape."""
    server, _ = start_http_server(port, addr=host, registry=metrics.registry)
    return server


METRICS = OperatorMetrics()
"""The process's metrics: the handlers, actuator and scraper record here."""


def timed(
    histogram: Histogram,
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """Observe how long each run of an async handler takes, raised or not."""

    def wrap(handler: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        @functools.wraps(handler)
        async def run(*args: P.args, **kwargs: P.kwargs) -> R:
            started = time.perf_counter()
            try:
                return await handler(*args, **kwargs)
            finally:
                histogram.observe(time.perf_counter() - started)

        return run

    return wrap
