"""What the operator observes of each pod: the API's view of it and one sidecar scrape.

Why: the telemetry loop, the policy, the status builder and the actuator all
speak about pods in these terms, and none of them should need another's
module (or the Kubernetes client) to do so. Plain frozen dataclasses; a
value not measured is None, never zero.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fusebox_contract.model_fetch import FETCH_CONTAINER, FetchReport, parse
from fusebox_contract.names import BreakerState, Variant
from fusebox_operator.latency import Buckets

# The kubelet's waiting reasons of a container it cannot create or start: a missing
# Secret or key, an image it cannot pull. Waiting does not clear them.
CANNOT_START_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)


@dataclass(frozen=True)
class FetchProgress:
    """A download under way as the pod's sidecar exports the fetcher's report file.

    The termination message says how a run ended; this says how the running one
    goes. `age_seconds`: since the fetcher last wrote (it writes as bytes arrive,
    so a stalled download's grows); `read_at`: when the operator scraped it.
    """

    bytes_done: int
    bytes_total: int | None
    rate_bytes_per_second: float | None
    age_seconds: float | None
    read_at: float
    waiting: bool = False  # for another pod's download of the same model (a shared cache)


@dataclass(frozen=True)
class FetchState:
    """One pod's model-fetch init container, as the kubelet reports it.

    `report`: the fetcher's last report (the current run's termination message,
    else the previous run's); None when it left none (not run yet, or killed).
    """

    pod: str
    running: bool
    succeeded: bool
    failed: bool  # the last run exited non-zero, and none has succeeded since
    report: FetchReport | None
    restarts: int = 0
    exit_message: str = ""  # the termination message when it holds no report (a log tail)
    # Why the kubelet cannot start it ("" when it can): its waiting reason and words, as
    # "CreateContainerConfigError: couldn't find key token in Secret team-a/hub".
    cannot_start: str = ""
    # The running download's figures, read through the sidecar this tick (None: not
    # running, or not read: the sidecar not Ready yet, its scrape failed).
    live: FetchProgress | None = None


def _terminated(state: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    value = (state or {}).get("terminated")
    return value if isinstance(value, Mapping) else None


def fetch_state(pod: str, init_statuses: Sequence[Mapping[str, Any]]) -> FetchState | None:
    """The fetch container's state in a pod's `status.initContainerStatuses` (camelCase,
    as the API serves it); None when the pod has no fetch container or no status yet."""
    status = next((s for s in init_statuses if s.get("name") == FETCH_CONTAINER), None)
    if status is None:
        return None
    state = status.get("state") or {}
    now = _terminated(state)
    last = _terminated(status.get("lastState"))
    ended = now or last
    text = str((ended or {}).get("message") or "")
    report = parse(text) if text else None
    succeeded = now is not None and now.get("exitCode") == 0
    waiting = state.get("waiting") or {}
    cannot_start = ""
    if waiting.get("reason") in CANNOT_START_REASONS:
        said = str(waiting.get("message") or "").strip()[-300:]
        cannot_start = f"{waiting['reason']}" + (f": {said}" if said else "")
    # A retry of a failed run is still that failure until one succeeds: otherwise a
    # refused token would flap between its name and Downloading on every back-off.
    failed = bool(cannot_start) or (
        not succeeded and ended is not None and ended.get("exitCode") != 0
    )
    return FetchState(
        pod=pod,
        running="running" in state,
        succeeded=succeeded,
        failed=failed,
        report=report,
        restarts=int(status.get("restartCount") or 0),
        exit_message="" if report is not None else text.strip()[-300:],
        cannot_start=cannot_start,
    )


@dataclass(frozen=True)
class NodeNotReady:
    """A node whose Ready condition is not True (False, or Unknown: its kubelet stopped
    posting), as the Node's status says it; `since`: that condition's lastTransitionTime
    (None when the API gave none readable)."""

    node: str
    since: float | None = None


@dataclass(frozen=True)
class PodView:
    """What the telemetry loop needs of a pod."""

    name: str
    uid: str
    ip: str
    phase: str
    ready: bool
    sidecar_ready: bool
    server_started: bool
    server_restarts: int
    terminating: bool
    oom_killed: bool
    unschedulable: str = ""  # the scheduler's message while the pod cannot be placed
    # The server's GPUs the kubelet reports Unhealthy (the device plugin's health).
    unhealthy_gpus: tuple[str, ...] = ()
    node: str = ""  # the node it runs on ("" while unscheduled)
    # Why a container of the pod cannot run ("" when none is stuck): the kubelet's
    # waiting reason and message (CrashLoopBackOff, ImagePullBackOff, ...).
    failing: str = ""
    # A terminating pod's deletionTimestamp: the kubelet kills it by then. A pod still
    # there well after it is stuck (its node is gone), not leaving.
    grace_ends_at: float | None = None
    # The model-fetch init container (s3:// and hf:// sources); None for a local source.
    fetch: FetchState | None = None
    # Its node when that node is not Ready (pod_view.with_node_readiness): the node
    # controller then calls the pod not Ready while its containers still say ready.
    # None: the node is Ready, or the Nodes were not read.
    node_not_ready: NodeNotReady | None = None
    # When the kubelet last set the pod's Ready condition (its lastTransitionTime), for a
    # Ready pod: how long the Service's endpoints have had to list it (endpoints.py).
    ready_since: float | None = None

    @property
    def instance(self) -> str:
        """This run of the server container: a restarted container starts from defaults."""
        return f"{self.uid}/{self.server_restarts}"

    @property
    def ended(self) -> bool:
        """Evicted or finished (phase Failed or Succeeded): the API keeps the pod until
        someone deletes it, but nothing of it runs again."""
        return self.phase in ("Succeeded", "Failed")

    @property
    def serving(self) -> bool:
        """Ready and not being deleted: an endpoint the Service sends traffic to."""
        return self.ready and not self.terminating

    @property
    def scrapable(self) -> bool:
        """Running with an IP and its sidecar Ready, and not being deleted: a pod whose
        sidecar should answer a scrape. (A native sidecar is Ready while the pod is
        still Pending, its server container not started yet: not scrapable.)"""
        return (
            self.phase == "Running"
            and bool(self.ip)
            and self.sidecar_ready
            and not self.terminating
        )

    @property
    def downloading(self) -> bool:
        """Its model fetcher runs and its sidecar (started first) is Ready: a pod whose
        sidecar can say how the download goes."""
        return (
            self.fetch is not None
            and self.fetch.running
            and bool(self.ip)
            and self.sidecar_ready
            and not self.terminating
        )

    @property
    def unscraped_because(self) -> str:
        """Why a pod that exists was not scraped this tick."""
        if not self.ip:
            return "no pod IP yet"
        if not self.sidecar_ready:
            return "sidecar not ready"
        if self.phase != "Running":
            return f"pod {self.phase or 'not running'}, its server not started"
        return "not scraped"


@dataclass(frozen=True)
class RequestCounts:
    """Monotonic request counters of one pod (fusebox_requests_total by outcome).

    The server counts each request once, under one outcome, so the sum of
    the calls below is the number of requests that ran.
    """

    succeeded: float = 0
    failed: float = 0
    rejected: float = 0
    timed_out: float = 0
    cancelled: float = 0
    invalid: float = 0

    @property
    def calls(self) -> float:
        """Requests that ran to a verdict, as resilience4j counts calls.

        Rejections (429/503: not permitted), invalid requests (the caller's
        4xx, never queued) and cancellations (the client left: neither a
        success nor a failure of the service) are not calls.
        """
        return self.succeeded + self.failed + self.timed_out

    def since(self, earlier: RequestCounts | None) -> RequestCounts:
        if earlier is None:
            return RequestCounts()
        values = []
        for now_value, then_value in zip(self.as_tuple(), earlier.as_tuple(), strict=True):
            # A counter that went down means the process restarted: count from zero.
            values.append(now_value - then_value if now_value >= then_value else now_value)
        return RequestCounts(*values)

    def plus(self, other: RequestCounts) -> RequestCounts:
        return RequestCounts(
            *(a + b for a, b in zip(self.as_tuple(), other.as_tuple(), strict=True))
        )

    def as_tuple(self) -> tuple[float, float, float, float, float, float]:
        return (
            self.succeeded,
            self.failed,
            self.rejected,
            self.timed_out,
            self.cancelled,
            self.invalid,
        )


@dataclass(frozen=True)
class PodSample:
    """One scrape of one pod's sidecar; None means "not measured", never zero."""

    pod: str
    sampled_at: float
    ok: bool = True
    rss_bytes: float | None = None
    memory_limit_bytes: float | None = None
    gpu_memory_used_bytes: float | None = None
    gpu_memory_total_bytes: float | None = None
    latency_p99_seconds: float | None = None  # the server's own window; shown per pod
    # The breaker's latency histogram, cumulative since the server started: what
    # the breaker's p99 comes from (latency.py). None from a sidecar without one.
    latency_buckets: Buckets | None = None
    quality_failure_ratio: float | None = None
    # fusebox_stats_valid: whether the sidecar read the server's stats file, and
    # every field had its contracted type, at this scrape (None: not reported).
    stats_valid: bool | None = None
    # Seconds since the server last wrote a valid stats file: how old every figure
    # the sidecar relays from it is (None: no valid file seen in the sidecar's life).
    stats_age_seconds: float | None = None
    heartbeat_age_seconds: float | None = None
    requests: RequestCounts | None = None
    breaker_state: BreakerState | None = None
    degradation_level: int | None = None
    model_loaded: bool | None = None
    memory_guard_active: bool | None = None  # the server's last-resort guard refuses work
    variant: Variant | None = None  # the variant the server reports serving
    # fusebox_model_info: the primary's revision as the server reports it, and the dtype
    # its weights loaded in, only while the pod serves the primary (None: not reported,
    # reported empty, or the fallback loaded: its dtype is not the primary's).
    model_revision: str | None = None
    model_dtype: str | None = None
    converging: bool | None = None  # the server is still moving to its target variant
    queue_length: float | None = None
    requests_running: float | None = None  # generating now (queue_length waits for a slot)
    tokenizer_cache_entries: float | None = None
    cuda_contexts: float | None = None
    fallback_configured: bool | None = None  # a fallback is configured on the server
    # False: this server cannot swap to a fallback (none configured, or the
    # device cannot serve its quantization); None: not reported.
    fallback_available: bool | None = None
    fallback_unavailable_reason: str | None = None  # the server's words, when it gave them
    # The node's memory as the pod sees it (node_pressure): MemAvailable, MemTotal and
    # the share of the last 10 s with some / all tasks stalled on memory (PSI).
    node_available_bytes: float | None = None
    node_total_bytes: float | None = None
    node_pressure_some: float | None = None
    node_pressure_full: float | None = None
    # fusebox_sidecar_measured{quantity}: the sidecar read RSS from /proc and GPU
    # memory from NVML itself (True), or relays the server's figure (False, None).
    rss_measured: bool | None = None
    gpu_memory_measured: bool | None = None
    # The model fetcher's report, while the pod's sidecar exports one.
    fetch: FetchProgress | None = None
    error: str = ""

    @property
    def stats_observed(self) -> bool:
        """The server's own report was seen: a valid stats file whose age is known.

        Without it nothing says whether the server runs, refuses or is wedged (the
        state, the heartbeats and the age all come from that file), so the pod is
        judged unobserved (serving.StatsInvalid), never Serving.
        """
        return self.ok and self.stats_valid is not False and self.stats_age_seconds is not None

    @property
    def relayed_at(self) -> float:
        """When the figures relayed from the stats file were measured: when the server
        wrote it, not when the sidecar was scraped."""
        return self.sampled_at - (self.stats_age_seconds or 0.0)

    @property
    def rss_measured_at(self) -> float:
        return self.sampled_at if self.rss_measured else self.relayed_at

    @property
    def gpu_memory_measured_at(self) -> float:
        return self.sampled_at if self.gpu_memory_measured else self.relayed_at

    @property
    def cannot_swap(self) -> bool:
        """The server said it cannot swap to a fallback: the fallback tier leaves it alone."""
        return self.ok and self.fallback_available is False
