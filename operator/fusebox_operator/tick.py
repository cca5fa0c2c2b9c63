"""One telemetry tick of one InferenceService: scrape, decide, act, converge, report.

Why: this is the operator's control loop, and kopf is only what calls it on
a timer. Kept out of the kopf handler, the loop is a plain async function of
its inputs (the parsed spec, the current status, the pods, the admin token),
its collaborators (a scrape function, an actuator, a clock) and the memory
it carries between ticks; it returns the status patch and the events. The
handler gathers the inputs and applies the outputs, and a test drives the
whole loop against real server processes without kopf or a cluster.

The decisions inside are pure functions of this module and of `policy` and
`rollout`: which pods are out of service, which level each pod gets this
tick, which actions run. Actions that take a pod out of service (reload,
swap, restart, a level that changes the model) roll through the pods one at
a time; an action whose outcome is unknown stays in flight and is retried
with the same id, never issued again under a new one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Protocol

from fusebox_contract.names import ConditionType, DegradationTier, EventReason, Variant
from fusebox_operator.actuator import ActionResult, RuntimeCall, RuntimeTarget
from fusebox_operator.autoscaling import (
    Recommendation,
    ScaleDecision,
    WindowHold,
    decide_scale,
    pending_for_gpu,
)
from fusebox_operator.deletion_cost import deletion_costs
from fusebox_operator.endpoints import EndpointMemory, EndpointsRead, judge_endpoints
from fusebox_operator.gpu_health import drain_actions, gpu_condition
from fusebox_operator.incident import hold_tier, incident_step, parse_controls, was_paused
from fusebox_operator.model_readiness import (
    ProgressTold,
    fetch_figures,
    model_ready_conditions,
    resolved_revision,
)
from fusebox_operator.node_pressure import (
    KubeletPressure,
    NodePressure,
    node_condition,
    relieve_nodes,
)
from fusebox_operator.observations import FetchProgress, FetchState, PodSample, PodView
from fusebox_operator.observe_mode import (
    NOT_ACTED,
    after_observing,
    observed,
    swaps_as_reported,
)
from fusebox_operator.pod_view import current_count
from fusebox_operator.policy import admit_percent, decide
from fusebox_operator.policy_state import DISRUPTIVE, Action, ActionKind, PolicyState
from fusebox_operator.rollout import (
    Degradation,
    PodReadiness,
    Rollout,
    held_words,
    pod_degradations,
)
from fusebox_operator.serving import (
    Misses,
    Sighting,
    observe,
    outside_service,
    update_reach,
    update_sightings,
)
from fusebox_operator.spec import InferenceServiceSpec, Mode
from fusebox_operator.status import (
    EventRecord,
    acting_operator,
    add_autoscaling_status,
    blind_events,
    build_status,
    drop_autoscaling_status,
    drop_condition,
    scale_down_held_events,
    scaling_events,
    should_write,
    stuck_pod_events,
    transition_events,
)
from fusebox_operator.telemetry import scrapable

Scrape = Callable[[Sequence[PodView]], Awaitable[list[PodSample]]]
# How long past its grace period a terminating pod still counts as leaving.
STUCK_TERMINATING_SECONDS = 30.0
POD_DELETING = frozenset({ActionKind.RESTART, ActionKind.DRAIN})  # the pod is gone after these
Clock = Callable[[], float]
# Of the given action ids, those an Event on the service already names: a predecessor
# that ran them and died before its status was written may or may not have told them.
ToldBefore = Callable[[Sequence[str]], Awaitable[set[str]]]


async def none_told(ids: Sequence[str]) -> set[str]:
    """Where no Events are read: every replayed action is told (never none)."""
    return set()


class ActuatorPort(Protocol):
    """What the tick needs of `actuator.Actuator`."""

    async def execute(
        self, namespace: str, pod: PodView | None, token: str, action: Action
    ) -> ActionResult: ...

    async def reconcile_runtime(
        self,
        pod: PodView,
        token: str,
        target: RuntimeTarget,
        sample: PodSample | None,
        applied: MutableMapping[str, RuntimeTarget],
    ) -> RuntimeCall: ...


@dataclass
class TickMemory:
    """What one service's ticks carry between them (kopf keeps it in the memo).

    Lost on an operator restart by design: the policy state is rebuilt from
    status, and `applied` empty only means each pod is told its state once more.
    """

    policy: PolicyState | None = None
    applied: dict[str, RuntimeTarget] = field(default_factory=dict)  # pod instance -> target
    # The autoscaler's recent recommendations (its stabilization windows); lost on a
    # restart or a handover, after which the first tick counts the count in place as
    # asked for then (autoscaling.decide_scale), so each window holds a full window again.
    scale_history: tuple[Recommendation, ...] = ()
    scale_down_told: WindowHold | None = None  # the scale-down hold ScaleDownHeld told
    drained: set[str] = field(default_factory=set)  # pod UIDs drained off an Unhealthy GPU
    node_pressure: NodePressure = field(default_factory=NodePressure)  # nodes below the floor
    # What the operator last saw of each pod's sidecar (serving.py): a restarted
    # operator starts blind and claims nothing until it has scraped.
    sightings: dict[str, Sighting] = field(default_factory=dict)
    # (reason, pod) last named unobserved or unreachable: each spell is told once.
    blind: set[tuple[str, str]] = field(default_factory=set)
    held_steps: set[str] = field(default_factory=set)  # pods whose held ladder step was told
    reach: dict[str, Misses] = field(default_factory=dict)  # failed admin calls, per pod
    # What ModelReady last told of a download's figures, and each downloading pod's
    # last figures (model_readiness): rewritten at most every PROGRESS_REFRESH_SECONDS.
    fetch_progress_told: ProgressTold | None = None
    fetch_figures: dict[str, FetchProgress] = field(default_factory=dict)
    # The last write of another operator replica this memory was built from
    # (status.operator.pod, status.updatedAt): `written_elsewhere` tells a newer one.
    foreign_write: tuple[str, str] | None = None
    held: bool = False  # the last tick ran holding (Observe, pause-actions): nothing was sent
    # Serving pods seen listed by the Service's endpoints, and since when others are not.
    endpoints: EndpointMemory = field(default_factory=EndpointMemory)

    def start_over(self) -> None:
        """Forget everything, as a restarted operator would: the next tick rebuilds
        the policy from status and tells each pod its state once more."""
        fresh = TickMemory()
        for name in (f.name for f in fields(self)):
            setattr(self, name, getattr(fresh, name))

    def end_hold(self) -> None:
        """The first tick since holding: forget the drains and cache sheds that were
        only told as WouldAct, so the pods still on a bad GPU or a pressured node get
        them now. Both are decided and remembered in one step (so a hold tells each
        once); a real drain or shed just before the hold at worst runs once more,
        and a pod already being deleted is never drained again."""
        self.drained.clear()
        self.node_pressure.relieved_at.clear()


@dataclass(frozen=True)
class TickInputs:
    namespace: str
    service_id: str
    spec: InferenceServiceSpec
    status: Mapping[str, Any]
    pods: Sequence[PodView]
    token: str
    generation: int
    # The object's annotations: the incident controls (incident.py) are read from them.
    annotations: Mapping[str, str] = field(default_factory=dict)
    # The operator replica running this tick (its pod), told in status.operator.
    operator_pod: str = ""
    # Nodes whose kubelet reports MemoryPressure (kubelet_pressure.py, read operator-wide);
    # None: not read (refused, failed), and the sidecars' MemAvailable alone decides.
    kubelet_pressure: Mapping[str, KubeletPressure] | None = None
    # The Service's EndpointSlices as the watch holds them (endpoints.py); None: not read
    # by this caller (a first observation has no pod), and Ready says nothing of them.
    endpoints: EndpointsRead | None = None


@dataclass(frozen=True)
class TickOutcome:
    status_patch: dict[str, Any]  # empty: nothing worth writing
    events: list[EventRecord]
    state: PolicyState
    samples: list[PodSample]
    replicas: int | None = None  # the Deployment's count, when the service autoscales
    # Before a scale-down: each pod's pod-deletion-cost, set before the count is lowered
    # so the ReplicaSet deletes the pods that serve least first (deletion_cost.py).
    deletion_costs: dict[str, int] = field(default_factory=dict)


# ----- pure decisions ---------------------------------------------------------------------


def pod_degradation(
    pod: PodView,
    sample: PodSample | None,
    applied: Mapping[str, RuntimeTarget],
    spec: InferenceServiceSpec,
) -> Degradation:
    """Where a pod is: what we told this run of it, else the level it reports (or 0) with
    the tiers its reported variant implies (`reported_tiers`)."""
    told = applied.get(pod.instance)
    if told is not None:
        return told[2]
    if sample is None or not sample.ok or sample.degradation_level is None:
        return Degradation(0, spec.degradation.tiers)
    return Degradation(sample.degradation_level, reported_tiers(spec, sample))


def reported_tiers(spec: InferenceServiceSpec, sample: PodSample) -> tuple[DegradationTier, ...]:
    """The spec's tiers, with fallback-model as the pod's variant shows it was told.

    A pod's report has a level and a variant but no tiers. A restarted operator
    that meets a pod serving otherwise than the spec's tiers say (they were
    edited while it was down) takes it where it is, so the change is a swap
    that waits for its turn, not one pushed to every pod at once.
    """
    tiers = spec.degradation.tiers
    fallback = DegradationTier.FALLBACK_MODEL
    if spec.fallback is None or sample.variant is None or sample.cannot_swap:
        return tiers
    if (sample.degradation_level or 0) < fallback.level:
        return tiers
    if sample.variant == Variant.FALLBACK and fallback not in tiers:
        return (*tiers, fallback)
    if sample.variant == Variant.PRIMARY and fallback in tiers:
        return tuple(tier for tier in tiers if tier is not fallback)
    return tiers


def converging(
    pod: PodView,
    sample: PodSample | None,
    state: PolicyState,
    applied: Mapping[str, RuntimeTarget],
    spec: InferenceServiceSpec,
) -> bool:
    """Whether the pod is still moving to the variant it was told to serve.

    The pod's own report decides: a level that swaps the model is converged
    only when the sidecar shows the target variant with the model loaded. A
    pod that reports it cannot swap to the fallback expects the primary, so
    it never holds up the rollout waiting for a swap that cannot come.
    """
    if sample is None or not sample.ok:
        return False
    if sample.model_loaded is False or sample.converging:
        return True
    if state.pod_variant(pod.name) == Variant.FALLBACK:
        expected = Variant.FALLBACK  # the ladder swapped this pod on its own
    else:
        # A pod whose server cannot load the fallback stays on the primary at any level.
        swaps = spec.fallback is not None and not sample.cannot_swap
        expected = pod_degradation(pod, sample, applied, spec).variant(swaps)
    return sample.variant is not None and sample.variant != expected


def readiness(
    pods: Sequence[PodView],
    samples: Mapping[str, PodSample],
    state: PolicyState,
    applied: Mapping[str, RuntimeTarget],
    spec: InferenceServiceSpec,
    now: float | None = None,
) -> Rollout:
    """This tick's rollout over the listed pods (terminating ones count as out).

    A pod terminating past its grace period (`_leaving` no more: its node is gone, and
    it stays until the node comes back or someone force-deletes it) is left out: it
    will never be in service again, and counted as out it held every reload, swap and
    restart of every other pod, the ladder stuck on its cheap rungs. `now` None: every
    terminating pod counts as leaving.
    """
    busy = {a.pod for a in state.in_flight.values() if a.kind in DISRUPTIVE}
    return Rollout(
        PodReadiness(
            pod.name,
            pod.serving,
            pod.name in busy or converging(pod, samples.get(pod.name), state, applied, spec),
        )
        for pod in pods
        if now is None or not pod.terminating or _leaving(pod, now)
    )


def held_step_events(told: set[str], rollout: Rollout) -> tuple[list[EventRecord], set[str]]:
    """A Warning for each pod whose ladder step the rollout newly holds (Rollout.held),
    once a spell; the pods told, for the next tick."""
    events = [
        EventRecord("Warning", EventReason.LADDER_STEP_HELD, held_words(pod, *held), True)
        for pod, held in sorted(rollout.held.items())
        if pod not in told
    ]
    return events, set(rollout.held)


def unable_to_swap(samples: Mapping[str, PodSample], state: PolicyState) -> set[str]:
    """Pods that cannot swap to the fallback: by this tick's report where a pod gave one,
    else by the last report the state remembers. A failed scrape says nothing, so it
    does not make a pod that could not swap able again."""
    reported = {n for n, s in samples.items() if s.ok and s.fallback_available is not None}
    said_unable = {name for name in reported if samples[name].cannot_swap}
    return said_unable | (set(state.fallback_unavailable) - reported)


def service_swaps(samples: Mapping[str, PodSample], state: PolicyState) -> bool:
    """Whether "the service swaps to the fallback" is true of this service.

    Its pods share one template and one kind of device, so a pod known unable
    speaks for a pod not heard from (a failed scrape, a stale report): the
    service swaps when some pod said it can, or when no pod is known unable
    (an older sidecar that never says counts as able).
    """
    said_able = any(s.ok and s.fallback_available is True for s in samples.values())
    return said_able or not unable_to_swap(samples, state)


def runtime_targets(
    state: PolicyState,
    spec: InferenceServiceSpec,
    pods: Sequence[PodView],
    samples: Mapping[str, PodSample],
    applied: Mapping[str, RuntimeTarget],
    rollout: Rollout,
) -> dict[str, RuntimeTarget]:
    """Breaker and admit share for every pod at once; the level as the rollout allows."""
    current = {pod.name: pod_degradation(pod, samples.get(pod.name), applied, spec) for pod in pods}
    desired = Degradation(state.level, spec.degradation.tiers)
    cannot_swap = unable_to_swap(samples, state)
    told = pod_degradations(desired, current, spec.fallback is not None, rollout, cannot_swap)
    admit = admit_percent(state, spec)
    return {pod.name: (state.breaker, admit, told[pod.name]) for pod in pods}


def settable(pods: Sequence[PodView], samples: Mapping[str, PodSample]) -> list[PodView]:
    """Pods whose admin API can take a call: a pod with neither readiness nor a good
    scrape is still starting, and calling it would only time out. A pod whose server
    waits in a crash loop has its sidecar scraped fine but no admin API to call."""
    return [
        pod
        for pod in pods
        if pod.ready or (pod.name in samples and samples[pod.name].ok and not crash_looping(pod))
    ]


def unplaced(pods: Sequence[PodView], now: float) -> dict[str, str]:
    """Pods the scheduler cannot place, with its message, unless a pod is leaving.

    A terminating pod keeps its CPU, memory and GPU until it is gone, so on a
    full node the pod replacing it (a rollout, maxSurge 0) is Unschedulable
    for a moment and then placed: that is a rollout at work, not a shortage
    to warn about. Once no pod of the service is leaving, a pod the scheduler
    still cannot place is one. A pod terminating for longer than its grace
    period plus STUCK_TERMINATING_SECONDS is not leaving but stuck (its node is
    gone), and holds nothing back.
    """
    if any(_leaving(pod, now) for pod in pods):
        return {}
    return {pod.name: pod.unschedulable for pod in pods if pod.unschedulable}


def _leaving(pod: PodView, now: float) -> bool:
    if not pod.terminating:
        return False
    return pod.grace_ends_at is None or now < pod.grace_ends_at + STUCK_TERMINATING_SECONDS


def fetching(pods: Sequence[PodView]) -> dict[str, str]:
    """Pods that cannot serve yet because their model is still being fetched: what Ready
    waits for, pointing at ModelReady for the figures or the failure."""
    return {
        pod.fetch.pod: _fetch_words(pod.fetch)
        for pod in pods
        if pod.fetch is not None and not pod.fetch.succeeded and _fetch_counts(pod)
    }


def _fetch_words(fetch: FetchState) -> str:
    if fetch.cannot_start:
        return "its model fetcher cannot start (ModelReady)"
    if fetch.failed:
        return "its model download failed, retried (ModelReady)"
    return "its model downloading (ModelReady)"


def _fetch_counts(pod: PodView) -> bool:
    """A pod whose fetch ModelReady tells: not on its way out, not evicted (an evicted
    pod stays in the API with its fetcher's last failure until someone deletes it)."""
    return not pod.terminating and not pod.ended


def crash_looping(pod: PodView) -> bool:
    """The server is failing and not running (waiting out a back-off)."""
    return bool(pod.failing) and not pod.server_started


def stored_sequence(status: Mapping[str, Any]) -> int:
    """The action id sequence status.policy holds (0: none, or unreadable)."""
    try:
        return int((status.get("policy") or {}).get("sequence") or 0)
    except (TypeError, ValueError):
        return 0


def foreign_write(status: Mapping[str, Any], operator_pod: str) -> tuple[str, str] | None:
    """The stored status's last write when another operator replica made it: its pod and
    `updatedAt`; None when this replica made it, or nobody says (no status.operator)."""
    writer = str((status.get("operator") or {}).get("pod") or "")
    if not writer or not operator_pod or writer == operator_pod:
        return None
    return writer, str(status.get("updatedAt") or "")


def written_elsewhere(memory: TickMemory, status: Mapping[str, Any], operator_pod: str) -> bool:
    """Whether status moved under this memory: another replica acted since it was built.

    Why: kopf peering pauses a replica when one of higher priority joins and keeps
    its memo; when that one leaves, the paused replica resumes with no resume
    handler and its memory from before. Ticking from it would close a breaker the
    other replica opened, wind the action ids back (the server then replays an
    old result for a new action) and undo the tier. A status sequence beyond the
    memory's, or a write by another replica this memory has not seen, means the
    memory is stale. A body that merely lags this replica's own last write shows
    neither: its sequence is not higher, and its writer is this replica or the
    foreign write the memory was built from.
    """
    if memory.policy is None:
        return False  # built from status this tick anyway
    if stored_sequence(status) > memory.policy.sequence:
        return True
    seen = foreign_write(status, operator_pod)
    return seen is not None and seen != memory.foreign_write


def sized_limit_bytes(status: Mapping[str, Any]) -> float | None:
    """The server's memory limit as reconcile last sized it (status.memory), if any."""
    limit = (status.get("memory") or {}).get("limitBytes")
    return float(limit or 0) or None


def current_replicas(spec: InferenceServiceSpec, status: Mapping[str, Any]) -> int:
    """The autoscaler's last count (status), inside today's range; else where it starts."""
    if spec.autoscaling is None:
        return spec.replicas
    recorded = (status.get("autoscaling") or {}).get("replicas")
    return spec.autoscaling.clamp(int(recorded)) if recorded else spec.initial_replicas()


def autoscale(
    spec: InferenceServiceSpec,
    status: Mapping[str, Any],
    pods: Sequence[PodView],
    samples: Mapping[str, PodSample],
    memory: TickMemory,
    now: float,
) -> ScaleDecision | None:
    """This tick's replica count from the serving pods' load (None: not autoscaled)."""
    if spec.autoscaling is None:
        return None
    serving = [samples[p.name] for p in pods if p.ready and not p.terminating and p.name in samples]
    pending = pending_for_gpu(unplaced(pods, now))
    current = current_replicas(spec, status)
    decision = decide_scale(
        spec.autoscaling,
        current,
        serving,
        pending,
        memory.scale_history,
        now,
        stale_after_seconds=spec.telemetry.wedge_after_seconds,
    )
    memory.scale_history = decision.history
    return decision


def deleted_as_terminating(pods: Sequence[PodView], deleted: set[str]) -> list[PodView]:
    """The pods as the next listing will show them: those deleted this tick terminating."""
    return [
        replace(pod, terminating=True) if pod.name in deleted and not pod.terminating else pod
        for pod in pods
    ]


def deletions_alone(actions: Sequence[Action]) -> list[Action]:
    """The actions in order, except that a pod deleted this tick gets its deletion only.

    Anything else queued on that pod dies with it, and it would go first: a reload
    retried because the load wedged the server waits on the wedged server (an unload
    with a 300 s timeout) before the restart that cures it, and the whole tick, every
    status write of the service included, waits with it. A dropped retry stays in
    flight until the deletion settles, which forgets it with the pod
    (`PolicyState.settle`).
    """
    deletion: dict[str, str] = {}
    for action in actions:
        if action.kind in POD_DELETING:
            deletion.setdefault(action.pod, action.id)
    return [a for a in actions if deletion.get(a.pod, a.id) == a.id]


async def execute_per_pod(
    actions: Sequence[Action],
    inputs: TickInputs,
    by_name: Mapping[str, PodView],
    actuator: ActuatorPort,
) -> list[tuple[Action, ActionResult]]:
    """Each action with its result, in the given order: one pod's actions one after
    another, different pods' side by side, so a slow model load on one pod (minutes,
    on a large model) never holds back another pod's restart."""
    queues: dict[str, list[int]] = {}
    for index, action in enumerate(actions):
        queues.setdefault(action.pod, []).append(index)
    results: dict[int, ActionResult] = {}

    async def run_queue(indexes: Sequence[int]) -> None:
        for index in indexes:
            action = actions[index]
            pod = by_name.get(action.pod)
            results[index] = await actuator.execute(inputs.namespace, pod, inputs.token, action)

    await asyncio.gather(*(run_queue(indexes) for indexes in queues.values()))
    return [(action, results[index]) for index, action in enumerate(actions)]


# ----- the tick -------------------------------------------------------------------------------


async def run_tick(
    inputs: TickInputs,
    memory: TickMemory,
    scrape: Scrape,
    actuator: ActuatorPort,
    clock: Clock,
    told_before: ToldBefore = none_told,
) -> TickOutcome:
    """Scrape -> decide -> act -> converge runtime state -> status patch and events."""
    spec = inputs.spec
    now = clock()
    issued = memory.policy.sequence if memory.policy is not None else 0
    if written_elsewhere(memory, inputs.status, inputs.operator_pod):
        memory.start_over()  # another replica acted meanwhile: its status is the truth
    state = memory.policy
    if state is None:
        # First tick after a start, an operator restart or a handover: resume from status.
        state = PolicyState.from_status(inputs.service_id, inputs.status)
        state.sequence = max(state.sequence, issued)  # an id this process used is never reused
        memory.foreign_write = foreign_write(inputs.status, inputs.operator_pod)
    controls = parse_controls(inputs.annotations, spec)
    observing = spec.mode is Mode.OBSERVE
    # Paused by fusebox.dev/pause-actions: the same gate as Observe, with its own reason.
    holding = observing or controls.paused is not None
    if memory.held and not holding:
        memory.end_hold()
    memory.held = holding
    was_holding = inputs.status.get("mode") == Mode.OBSERVE or was_paused(inputs.status)
    resumed = not holding and was_holding
    if resumed:
        state = after_observing(state)  # first tick since Observe or a pause: nothing was done
    incident = incident_step(controls, inputs.status, state, spec, now)
    state = incident.state  # a reset-breaker not yet honoured is applied before deciding
    # Reconcile re-sizes the limit on a spec edit (status.memory): the ladder's
    # grow-limit target is a multiple of today's sized limit, never of an old one.
    state.memory_limit_bytes = sized_limit_bytes(inputs.status)
    targets = scrapable(inputs.pods)
    by_name = {pod.name: pod for pod in targets}
    # Pods still downloading their model: only the fetcher's figures are read of them.
    downloading = [pod for pod in inputs.pods if pod.downloading and pod.name not in by_name]
    scraped = await scrape([*targets, *downloading])
    samples = {s.pod: s for s in scraped if s.pod in by_name}
    memory.fetch_figures = fetch_figures(inputs.pods, scraped, memory.fetch_figures, now)
    if resumed:
        state = swaps_as_reported(state, samples, now)  # the ladder's swaps the hold kept

    rollout = readiness(inputs.pods, samples, state, memory.applied, spec, now)
    # A pod whose sidecar is briefly unready is not scraped but still exists: its
    # in-flight action and its ladder's swap are kept until the pod itself goes.
    existing = [pod.name for pod in inputs.pods if not pod.terminating]
    new_state, actions = decide(state, samples.values(), now, spec, rollout, existing)
    hold_tier(new_state, controls, now)  # fusebox.dev/pin-tier outranks the policy
    if spec.gpu.count > 0:
        actions = [*actions, *drain_actions(inputs.pods, memory.drained, new_state, now)]
    # Another tenant eating the node: shed caches on pods that have nothing else to do.
    busy = new_state.busy_pods() | {action.pod for action in actions}
    relief, node_events = relieve_nodes(
        inputs.pods,
        samples,
        memory.node_pressure,
        new_state,
        spec,
        now,
        busy,
        inputs.kubelet_pressure,
    )
    actions = [*actions, *relief]

    # Actions whose outcome was unknown go again first, with their own ids.
    retries = [a for a in new_state.in_flight.values() if a.pod in by_name]
    retried = {a.id for a in retries}
    calls_due = deletions_alone([*retries, *actions])
    # The one place decisions become calls. In Observe (or paused) none is made: each
    # action is settled as not taken (the ladder moves on as if it had not helped) and
    # told as WouldAct; the runtime state below is not sent either.
    would_act = calls_due if holding else []
    for action in would_act:
        new_state.settle(action, settled=True)
    results = [] if holding else await execute_per_pod(calls_due, inputs, by_name, actuator)
    executed: list[tuple[Action, str]] = []
    # Fresh decisions the server had already run under the same id: an operator that
    # died after acting, before its status was written, decided them first. Its event
    # is posted now unless an Event already names the action: never twice, never lost.
    replays: list[str] = []
    for action, result in results:
        if new_state.settle(action, result.settled):
            executed.append((action, result.text))
            if result.replayed and action.id not in retried:
                replays.append(action.id)
    already_told = await told_before(replays) if replays else set()

    # Figures after an action are the ones a user wants to see at once.
    acted = sorted({a.pod for a, _ in executed if a.kind not in POD_DELETING and a.pod in by_name})
    if acted:
        for sample in await scrape([by_name[name] for name in acted]):
            samples[sample.pod] = sample
        for name in acted:
            # The estimate came from the figures before the action: shown next to the
            # figures after it, it would promise an OOM the action just put off. The
            # next tick measures the trend again.
            new_state.time_to_oom.pop(name, None)

    restarted = {a.pod for a, _ in executed if a.kind in POD_DELETING}
    # Deleted, a pod leaves the Service's endpoints at once: this tick's status already
    # judges and shows it as the next tick will list it, terminating.
    pods_after = deleted_as_terminating(inputs.pods, restarted)
    reachable = (
        [] if holding else settable([p for p in targets if p.name not in restarted], samples)
    )
    wanted = runtime_targets(new_state, spec, reachable, samples, memory.applied, rollout)
    told_runtime = await asyncio.gather(
        *(
            actuator.reconcile_runtime(
                pod, inputs.token, wanted[pod.name], samples.get(pod.name), memory.applied
            )
            for pod in reachable
        )
    )
    calls = {pod.name: (c.reached, c.error) for pod, c in zip(reachable, told_runtime, strict=True)}
    memory.policy = new_state
    alive = {pod.instance for pod in inputs.pods}
    for instance in [key for key in memory.applied if key not in alive]:
        del memory.applied[instance]  # pods and container runs that are gone

    # "The service swaps to the fallback" only when some pod can.
    some_pod_swaps = service_swaps(samples, new_state)
    told = [(action, text) for action, text in executed if action.id not in already_told]
    events = (
        incident.events
        + node_events
        + transition_events(state, new_state, told, spec.degrades_to_fallback and some_pod_swaps)
    )
    scale = autoscale(spec, inputs.status, inputs.pods, samples, memory, now)
    written_at = clock()
    memory.sightings = update_sightings(memory.sightings, pods_after, samples, now)
    memory.reach = update_reach(memory.reach, pods_after, calls, now)
    seen = observe(
        pods_after, memory.sightings, spec.telemetry.wedge_after_seconds, written_at, memory.reach
    )
    # A serving pod the Service's EndpointSlices leave out gets no traffic: not serving.
    serving_pods = [p for p in pods_after if (v := seen.verdict(p.name)) and v.serving]
    gaps, memory.endpoints = judge_endpoints(
        inputs.endpoints, serving_pods, memory.endpoints, written_at
    )
    seen = outside_service(seen, gaps)
    events += blind_events(memory.blind, seen)
    held_events, memory.held_steps = held_step_events(memory.held_steps, rollout)
    events += held_events
    memory.blind = {(v.reason.value, v.pod) for v in (*seen.blind, *seen.unreachable)}
    sample_list = sorted(samples.values(), key=lambda s: s.pod)
    # The count the Deployment is set to run: the autoscaler's when it acts; while
    # holding, the one reconcile applies (status.autoscaling), never the would-be
    # count, or Ready would count pods nobody asked for.
    replicas = scale.replicas if scale and not holding else current_replicas(spec, inputs.status)
    new_status = build_status(
        inputs.status,
        new_state,
        [sample for sample in sample_list if sample.pod not in restarted],
        executed,
        seen,
        spec,
        inputs.generation,
        written_at,
        desired_pods=replicas,
        unschedulable=unplaced(pods_after, now),
        failing={p.name: p.failing for p in pods_after if p.failing and not p.terminating},
        holding=holding,
        starting=fetching(pods_after),
        held={pod: held_words(pod, *held) for pod, held in rollout.held.items()},
    )
    events += stuck_pod_events(inputs.status, new_status)
    new_status["mode"] = spec.mode.value  # the mode this tick ran in
    if inputs.operator_pod:
        new_status["operator"] = acting_operator(inputs.status, inputs.operator_pod, written_at)
    if incident.status is not None:
        new_status["incident"] = incident.status
    new_status["replicas"] = current_count(inputs.pods)  # the scale subresource's
    if spec.gpu.count > 0:
        new_status["conditions"] = gpu_condition(
            new_status.get("conditions") or [], inputs.pods, inputs.generation, written_at
        )
    else:
        # A service moved to CPU has no GPU to be healthy or not.
        new_status["conditions"] = drop_condition(
            new_status["conditions"], ConditionType.GPU_HEALTHY
        )
    new_status["conditions"] = node_condition(
        new_status.get("conditions") or [], memory.node_pressure, inputs.generation, written_at
    )
    fetches = [
        replace(p.fetch, live=memory.fetch_figures.get(p.name))
        for p in inputs.pods
        if p.fetch is not None and _fetch_counts(p)
    ]
    model = model_ready_conditions(
        new_status["conditions"],
        spec,
        fetches,
        inputs.generation,
        written_at,
        memory.fetch_progress_told,
    )
    new_status["conditions"] = model.conditions
    events += model.events
    memory.fetch_progress_told = model.progress_told
    revision = resolved_revision(fetches)
    if revision:
        new_status["modelRevision"] = revision
    elif inputs.status.get("modelRevision") is not None:
        new_status["modelRevision"] = None  # a merge patch deletes a key only by a null
    if holding:
        # The Deployment keeps its count, and status.autoscaling the count it runs
        # (reconcile applies that count): the scale is told as WouldAct only.
        why = NOT_ACTED if observing else controls.not_acted
        events, would = observed(would_act, events, scale, inputs.status, written_at, why)
        if would is not None:
            new_status["lastWouldAct"] = would
        # Observe or a pause interrupts a hold: one still there on return is told again.
        memory.scale_down_told = None
    elif scale is not None:
        events += scaling_events(inputs.status, scale)
        held_down, memory.scale_down_told = scale_down_held_events(memory.scale_down_told, scale)
        events += held_down
        add_autoscaling_status(
            new_status, inputs.status, scale, spec, inputs.generation, written_at
        )
    if scale is None:
        drop_autoscaling_status(new_status, inputs.status)
    write = bool(executed or would_act) or should_write(inputs.status, new_status, written_at)
    enforced = scale if scale is not None and not holding else None
    scaled = enforced.replicas if enforced is not None else None
    # The ReplicaSet reads the costs only when the count goes down: set just then.
    down = enforced is not None and enforced.reason is EventReason.SCALED_DOWN
    costs = deletion_costs(seen.verdicts) if down else {}
    return TickOutcome(new_status if write else {}, events, new_state, sample_list, scaled, costs)


# ----- the first observation, made by a new service's reconcile ---------------------------


class _CallNeeded(Exception):
    """The observation would have to scrape a pod or call one: the tick's work."""


class _NoCalls:
    """The actuator of an observation that may not reach any pod."""

    async def execute(
        self, namespace: str, pod: PodView | None, token: str, action: Action
    ) -> ActionResult:
        raise _CallNeeded(f"{action.kind.value} on {action.pod}")

    async def reconcile_runtime(
        self,
        pod: PodView,
        token: str,
        target: RuntimeTarget,
        sample: PodSample | None,
        applied: MutableMapping[str, RuntimeTarget],
    ) -> RuntimeCall:
        raise _CallNeeded(f"runtime state of {pod.name}")


async def _no_scrape(targets: Sequence[PodView]) -> list[PodSample]:
    if targets:
        raise _CallNeeded(f"a scrape of {len(targets)} pod(s)")
    return []


async def first_observation(inputs: TickInputs, clock: Clock) -> dict[str, Any] | None:
    """The status keys the first tick would write, for the reconcile of a service with no
    pods yet to write with its own; None when the tick must make it.

    Why: a new service was written three times (kopf's finalizer, the reconcile's
    status, the first tick's status two seconds later), and each write came back
    as one more watch event through kopf's change detection; that last write and
    its event were a fifth of a new service's operator CPU
    (decisions/operator-api-cost.md, fifth pass). A service whose Deployment has
    just been created has no pod to scrape nor to call, so the tick's first
    observation needs nothing the reconcile lacks: it is the same `run_tick`, on
    the pods the tick would list (none) and the status the reconcile is about to
    write, so the first timer tick finds nothing moved and writes nothing.

    Only while nothing is called: with pods listed, or with anything the tick
    would post (an event), scale or act on, the first tick does it as before.
    Nothing is kept for the tick either (a throwaway TickMemory): it starts from
    the status written here, as after an operator restart.
    """
    if inputs.pods:
        return None
    try:
        outcome = await run_tick(inputs, TickMemory(), _no_scrape, _NoCalls(), clock)
    except _CallNeeded:
        return None
    scales = outcome.replicas is not None and outcome.replicas != current_replicas(
        inputs.spec, inputs.status
    )
    if outcome.events or scales or not outcome.status_patch:
        return None
    return outcome.status_patch
