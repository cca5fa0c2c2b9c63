"""kopf handlers: thin, idempotent glue between events and the pure modules.

Why: kopf decides when something happens (create, update, resume, a timer
tick); the pure modules decide what; kube/telemetry/actuator do the I/O.
Handlers never write their own object's status through the API: they fill
kopf's `patch`, and kopf sends one patch per handler run.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import secrets
import time
from collections.abc import Mapping, Sequence
from typing import Any, cast

import kopf

from fusebox_contract.names import EventReason
from fusebox_operator import manifests
from fusebox_operator.actuator import Actuator, admin_session
from fusebox_operator.admin_secret import CONFLICT_RETRY_SECONDS, AdminSecretRefused
from fusebox_operator.cadence import (
    COARSE_TICK_SECONDS,
    FINE_TICK_SECONDS,
    coarse_ticks,
    tick_slack_seconds,
)
from fusebox_operator.drift import Applied, restored_message, secret_restored_message
from fusebox_operator.edits import edit_base, edit_message
from fusebox_operator.kube import (
    SERVICE_GROUP,
    SERVICE_PLURAL,
    SERVICE_VERSION,
    ChildRefused,
    Kube,
    KubeError,
    load_config,
)
from fusebox_operator.kubelet_pressure import KubeletPressureReader
from fusebox_operator.memo import (
    CONTEXT_KEY,
    OperatorContext,
    ServiceMemo,
    operator_context,
    service_memo,
)
from fusebox_operator.observations import PodSample, PodView
from fusebox_operator.operator_metrics import METRICS, timed
from fusebox_operator.pod_view import with_node_readiness
from fusebox_operator.reconcile_status import (
    CHILD_REFUSED_RETRY_SECONDS,
    GPU_NODES_RETRY_SECONDS,
    admin_secret_refused_status,
    applied_status,
    child_refused_status,
    invalid_status,
    memory_sized_message,
    resync_keeps,
    undone_edit,
    undone_message,
    waiting_for_gpu_nodes,
)
from fusebox_operator.settings import OperatorSettings
from fusebox_operator.sizing import GpuMemoryUnknown, recorded_sizing, size_memory
from fusebox_operator.spec import (
    InferenceServiceSpec,
    SpecError,
    applied_record_problem,
    check_service_name,
    parse_spec,
    watched_spec,
)
from fusebox_operator.spec_size import SPEC_RECORD_BUDGET_BYTES, recorded_bytes
from fusebox_operator.status import (
    iso,
    observed_yet,
    rebase_conditions,
    unlisted_pods_conditions,
    unreadable_record_conditions,
)
from fusebox_operator.telemetry import scrape_all, scrape_session
from fusebox_operator.tick import TickInputs, current_replicas, first_observation, run_tick

GROUP, VERSION, PLURAL = SERVICE_GROUP, SERVICE_VERSION, SERVICE_PLURAL
# The Nodes' MemoryPressure, one reader for the whole operator (kopf shares the
# startup memo's values with every object's memo, as it does the OperatorContext).
KUBELET_PRESSURE_KEY = "kubelet-pressure"
log = logging.getLogger(__name__)


def configure(settings: kopf.OperatorSettings, ours: OperatorSettings) -> None:
    """Explicit timeouts and storage: nothing left to kopf's defaults that matters."""
    settings.watching.server_timeout = ours.watch_server_timeout_seconds
    settings.watching.client_timeout = ours.watch_client_timeout_seconds
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = ours.request_timeout_seconds
    settings.networking.connect_timeout = 10
    settings.peering.standalone = ours.standalone
    settings.peering.name = ours.peering_name
    settings.peering.mandatory = not ours.standalone
    settings.peering.clusterwide = not ours.watch_namespaces
    settings.peering.lifetime = ours.peering_lifetime_seconds
    # Our own events carry the story; kopf's per-handler success lines would flood it.
    settings.posting.level = logging.WARNING
    settings.posting.reporting_component = "fusebox-operator"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="fusebox.dev")
    settings.persistence.diffbase_storage = BoundedDiffBaseStorage(
        prefix="fusebox.dev", key="last-handled-configuration"
    )


OVERSIZED_SPEC_KEY = "fusebox.dev/oversized-spec"
"""What kopf's annotation records in place of a spec over the budget: its digest."""


class BoundedDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's last-handled annotation, where a spec over SPEC_RECORD_BUDGET_BYTES (which
    the reconcile refuses, spec_size.py) is recorded by its digest and size.

    Why: kopf writes the annotation in the same cycle as the refusal's status patch,
    first; an annotation past Kubernetes' 256 KiB would be refused, and the refusal
    never reach status. The digest still moves with every edit, so kopf's diff (and
    the reconcile it calls) does too; the handler reads the spec from the body.
    """

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        essence = super().build(body=body, extra_fields=extra_fields)
        spec = essence.get("spec")
        if spec is not None and recorded_bytes(spec) > SPEC_RECORD_BUDGET_BYTES:
            text = json.dumps(spec, sort_keys=True, separators=(",", ":"))
            digest = hashlib.sha256(text.encode()).hexdigest()
            recorded = {OVERSIZED_SPEC_KEY: digest, "bytes": recorded_bytes(spec)}
            essence = cast(kopf.BodyEssence, {**essence, "spec": recorded})
        return essence


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    ours = OperatorSettings.from_env(os.environ)
    configure(settings, ours)
    load_config()
    kube = Kube()
    kube.watch_pods(ours)
    kube.watch_children(ours)
    kube.watch_endpoints(ours)
    memo[CONTEXT_KEY] = OperatorContext(
        ours, kube, scrape_session(), Actuator(admin_session(), kube)
    )
    memo[KUBELET_PRESSURE_KEY] = KubeletPressureReader(kube.core)


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    context = operator_context(memo)
    context.kube.stop_watching()
    await context.kube.close()
    await context.scrape_session.close()
    await context.actuator.session.close()


def _invalid(
    body: kopf.Body, status: kopf.Status, patch: kopf.Patch, generation: int, message: str
) -> kopf.PermanentError:
    for key, value in invalid_status(status, message, generation, time.time()).items():
        patch.status[key] = value
    kopf.event(body, type="Warning", reason=EventReason.INVALID_SPEC, message=message)
    return kopf.PermanentError(message)


def _waiting_for_gpu_nodes(
    body: kopf.Body, status: kopf.Status, patch: kopf.Patch, generation: int, message: str
) -> kopf.TemporaryError:
    """The spec may be right and the cluster not there yet: say so, look again later."""
    keys, text, new = waiting_for_gpu_nodes(status, message, generation, time.time())
    for key, value in keys.items():
        patch.status[key] = value
    if new:  # once per spell, not once per retry
        kopf.event(body, type="Warning", reason=EventReason.WAITING_FOR_GPU_NODES, message=text)
    return kopf.TemporaryError(text, delay=GPU_NODES_RETRY_SECONDS)


def _admin_secret_conflict(
    body: kopf.Body,
    status: kopf.Status,
    patch: kopf.Patch,
    generation: int,
    service: ServiceMemo,
    error: AdminSecretRefused,
) -> kopf.TemporaryError:
    """A Secret of the token's name Fusebox did not write: no child is applied (the pods
    would mount it); say so, look again until it is deleted or renamed."""
    text = f"{error}; looking again every {CONFLICT_RETRY_SECONDS} s"
    for key, value in admin_secret_refused_status(status, text, generation, time.time()).items():
        patch.status[key] = value
    _admin_secret_refused(body, service, error)
    return kopf.TemporaryError(text, delay=CONFLICT_RETRY_SECONDS)


def _admin_secret_refused(body: kopf.Body, service: ServiceMemo, error: AdminSecretRefused) -> None:
    """A read refused the admin Secret: one Warning per spell (the reason names it, never
    the token)."""
    if service.secret_refused(str(error), time.time()):
        kopf.event(
            body, type="Warning", reason=EventReason.ADMIN_SECRET_REFUSED, message=str(error)
        )


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
@timed(METRICS.reconcile_seconds)
async def reconcile(
    spec: kopf.Spec,
    name: str,
    namespace: str | None,
    body: kopf.Body,
    status: kopf.Status,
    meta: kopf.Meta,
    patch: kopf.Patch,
    memo: kopf.Memo,
    old: Any = None,
    reason: Any = None,
    **_: Any,
) -> None:
    """Children from the spec: built purely, adopted (owner refs), applied level-triggered.

    On an edit (`old` is the previous spec), one SpecApplied event says what the
    edit does to the pods (compared with the applied spec, so the first edit accepted
    after a refused one says it too): roll them, reach them live, scale, or nothing.
    """
    assert namespace is not None  # the CRD is namespaced
    service = service_memo(memo)
    service.reconciled_at = time.time()  # its conditions may land while a tick runs
    try:
        await _reconcile(spec, name, namespace, body, status, meta, patch, memo, old, reason)
    finally:
        service.reconciled_at = time.time()


async def _reconcile(
    spec: kopf.Spec,
    name: str,
    namespace: str,
    body: kopf.Body,
    status: kopf.Status,
    meta: kopf.Meta,
    patch: kopf.Patch,
    memo: kopf.Memo,
    old: Any,
    reason: Any,
) -> None:
    generation = int(meta.get("generation") or 0)
    context = operator_context(memo)
    kube, ours = context.kube, context.settings
    service = service_memo(memo)
    try:
        check_service_name(name)
        parsed = parse_spec(spec)
        node_vram: list[int] = []
        if parsed.gpu.count > 0 and parsed.gpu.memory_gib is None:
            node_vram = await kube.node_vram_mib(parsed.gpu.product)
        sizing = size_memory(parsed, node_vram)
    except GpuMemoryUnknown as error:
        raise _waiting_for_gpu_nodes(body, status, patch, generation, str(error)) from error
    except SpecError as error:
        raise _invalid(body, status, patch, generation, str(error)) from error

    token = secrets.token_urlsafe(32)

    def render(of: InferenceServiceSpec) -> list[manifests.Manifest]:
        return manifests.build_children(
            of,
            name,
            namespace,
            size_memory(of, node_vram),
            ours,
            token,
            # The autoscaler owns the count: a spec edit must not reset it.
            replicas=current_replicas(of, status),
        )

    rendered = render(parsed)
    base = edit_base(old, status)  # the applied spec: a refused edit in between ran nothing
    edited = edit_message(base, parsed, rendered, render, generation) if base is not None else None
    try:
        async with service.children_lock:
            # A new service has no Secret yet: create it without reading first.
            created, _ = await _apply_children(
                kube, body, rendered, new=reason == kopf.Reason.CREATE
            )
            service.applied_generation = generation
            if created:  # the token this reconcile wrote: the first tick need not read it
                service.token_known(token, time.time())
    except AdminSecretRefused as error:
        raise _admin_secret_conflict(body, status, patch, generation, service, error) from error
    except ChildRefused as error:  # before KubeError: a refusal a retry will not fix
        for key, value in child_refused_status(status, str(error), generation, time.time()).items():
            patch.status[key] = value
        raise kopf.TemporaryError(str(error), delay=CHILD_REFUSED_RETRY_SECONDS) from error
    except KubeError as error:
        raise kopf.TemporaryError(str(error), delay=10) from error
    if edited is not None:
        kopf.event(body, type="Normal", reason=EventReason.SPEC_APPLIED, message=edited)

    applied = applied_status(status, spec, sizing, name, generation, time.time())
    if status.get("memory") != applied["memory"]:
        # kopf.event, not kopf.info: posting.level (WARNING) filters kopf.info.
        kopf.event(
            body,
            type="Normal",
            reason=EventReason.MEMORY_SIZED,
            message=memory_sized_message(sizing, parsed),
        )
    if not observed_yet(status):  # a new service: its first observation in this write
        applied.update(await _first_observation(parsed, {**status, **applied}, meta, context))
    for key, value in applied.items():
        patch.status[key] = value


async def _first_observation(
    parsed: InferenceServiceSpec,
    status: Mapping[str, Any],
    meta: kopf.Meta,
    context: OperatorContext,
) -> Mapping[str, Any]:
    """The first tick's status keys, when the service has no pods yet (tick.first_observation);
    else none, and the first tick observes as before. `status`: what this reconcile writes."""
    name, namespace = str(meta["name"]), str(meta["namespace"])
    try:  # the pod watch's store, as the tick reads it (a LIST only while it is not synced)
        pods = await context.kube.list_pods(namespace, manifests.selector_labels(name), name)
    except KubeError as error:
        log.info("%s/%s: first observation left to the tick: %s", namespace, name, error)
        return {}
    inputs = TickInputs(
        namespace=namespace,
        service_id=_service_id(str(meta["uid"])),
        spec=parsed,
        status=status,
        pods=pods,
        token="",  # no pod, so no call carries it
        generation=int(status["appliedGeneration"]),
        annotations=dict(meta.get("annotations") or {}),
        operator_pod=context.settings.pod_name,
    )
    return await first_observation(inputs, time.time) or {}


async def _apply_children(
    kube: Kube,
    body: kopf.Body,
    rendered: Sequence[manifests.Manifest],
    scale: bool = True,
    new: bool = False,
) -> tuple[bool, list[Applied]]:
    """Adopt and apply the children, the admin Secret first: (Secret created, each apply)."""
    secret, *children = rendered
    kopf.adopt([secret, *children], owner=body)
    # The token is never logged nor regenerated.
    created = await kube.create_secret_once(secret, likely_absent=new)
    return created, await _apply_rest(kube, children, scale)


async def _apply_rest(
    kube: Kube, children: Sequence[manifests.Manifest], scale: bool
) -> list[Applied]:
    return [await kube.apply(child, scale=scale) for child in children]


async def _resync(
    body: kopf.Body,
    spec: InferenceServiceSpec,
    spec_generation: int,
    status: Mapping[str, Any],
    meta: kopf.Meta,
    context: OperatorContext,
    service: ServiceMemo,
    undone: str | None = None,
) -> None:
    """Put back a child deleted or edited outside Fusebox, with a Warning naming it.

    `undone`: the hold (its InvalidSpec reason) of an edit just undone; then what is
    written puts back children of that edit, not of a hand's, and one SpecApplied
    says so (the first accepted edit after a held one always posts it).

    It renders what the last reconcile applied (`spec`, of `spec_generation`, and the
    sizing it recorded in status.memory) and writes only what drifted, so an untouched
    service costs reads and posts nothing. An autoscaled Deployment keeps its count:
    the autoscaler owns it.
    """
    name, namespace = str(meta["name"]), str(meta["namespace"])
    sizing = recorded_sizing(status.get("memory") or {})
    known_token = service.admin_token
    now = time.time()
    # The Secret is read every few resyncs only (memo.SECRET_CHECK_EVERY_RESYNCS).
    check_secret = service.secret_check_due(now, context.settings.resync_seconds)
    async with service.children_lock:
        # A newer spec a reconcile still applies or retries is the reconcile's; one
        # it refused or waits on leaves the applied generation's children to keep.
        generation = int(meta.get("generation") or 0)
        ours = service.applied_generation
        if sizing is None or not resync_keeps(status, generation, spec_generation, ours):
            return
        rendered = manifests.build_children(
            spec,
            name,
            namespace,
            sizing,
            context.settings,
            known_token or secrets.token_urlsafe(32),
            replicas=current_replicas(spec, status),
        )
        secret, *children = rendered
        kopf.adopt([secret, *children], owner=body)
        try:
            secret_created = False
            if check_secret:
                secret_created, held = await context.kube.check_secret(secret)
                service.token_known(held, now)  # a rotated token is picked up here
            applied = await _apply_rest(context.kube, children, scale=spec.autoscaling is None)
        except AdminSecretRefused as error:
            _admin_secret_refused(body, service, error)
            return
        except KubeError as error:
            log.warning("%s/%s: resync: %s", namespace, name, error)
            return
    if undone is not None:
        put_back = ", ".join(a.child for a in applied if a.wrote)
        before = int(status.get("appliedGeneration") or 0)
        told = undone_message(spec_generation, before, undone, put_back)
        kopf.event(body, type="Normal", reason=EventReason.SPEC_APPLIED, message=told)
        applied = []  # told above: ours, not a hand's
    messages = [restored_message(a, name) for a in applied if a.wrote]
    if secret_created:
        messages.insert(0, secret_restored_message(rendered[0], name, known_token is not None))
    for message in messages:
        kopf.event(body, type="Warning", reason=EventReason.CHILD_RESTORED, message=message)


def _service_id(uid: str) -> str:
    return uid.replace("-", "")[:8]


async def _token(
    service: ServiceMemo, kube: Kube, namespace: str, name: str, uid: str, resync_seconds: float
) -> str:
    """The admin token as last read (a resync reads it again now and then); read now
    when unknown: after a restart, or after a pod refused it. No token ("") while a
    read refused the Secret lately: it is read again a resync period after."""
    if not service.admin_token:
        if service.refused_lately(time.time(), resync_seconds):
            return ""
        secret = manifests.admin_secret_name(name)
        held = await kube.read_admin_token(namespace, secret, uid)
        service.token_known(held, time.time())
    assert service.admin_token is not None
    return service.admin_token


def _fine_ticks(spec: kopf.Spec, status: kopf.Status, **_: Any) -> bool:
    return not coarse_ticks(spec, status)


def _coarse_ticks(spec: kopf.Spec, status: kopf.Status, **_: Any) -> bool:
    return coarse_ticks(spec, status)


# Two timers, one tick: kopf's `when` gives each service exactly one (cadence.py).
FINE_TIMER_ID, COARSE_TIMER_ID = "telemetry", "telemetry-coarse"
TELEMETRY_TIMER_IDS = (FINE_TIMER_ID, COARSE_TIMER_ID)  # their "succeeded" lines are dropped


@kopf.timer(
    GROUP, VERSION, PLURAL, id=FINE_TIMER_ID, interval=FINE_TICK_SECONDS, initial_delay=2.0,
    when=_fine_ticks,
)  # fmt: skip
async def telemetry(**kwargs: Any) -> None:
    """Every second, for a scrape interval that is not a whole number of coarse ticks."""
    await _telemetry(FINE_TICK_SECONDS, **kwargs)


@kopf.timer(
    GROUP, VERSION, PLURAL, id=COARSE_TIMER_ID, interval=COARSE_TICK_SECONDS, sharp=True,
    initial_delay=2.0, when=_coarse_ticks,
)  # fmt: skip
async def telemetry_coarse(**kwargs: Any) -> None:
    """Every COARSE_TICK_SECONDS on kopf's grid, for the default interval and its multiples."""
    await _telemetry(COARSE_TICK_SECONDS, **kwargs)


async def _telemetry(
    tick_seconds: float,
    *,
    spec: kopf.Spec,
    name: str,
    namespace: str | None,
    uid: str,
    body: kopf.Body,
    status: kopf.Status,
    meta: kopf.Meta,
    patch: kopf.Patch,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    """Gather the tick's inputs, run it (tick.run_tick), apply its status patch and events."""
    assert namespace is not None
    now = time.time()
    context, service = operator_context(memo), service_memo(memo)
    if not service.scrape_due(now, tick_slack_seconds(tick_seconds)):
        return
    # The last applied spec, not .spec: an edit the reconcile refused (InvalidSpec) or
    # still waits on leaves the pods of the previous one running, and they stay watched.
    generation = int(meta.get("generation") or 0)
    watched = watched_spec(spec, status, generation, service.parse_applied)
    if watched is None:
        # Nothing applied yet (no pods of ours to watch), or a record this parser refuses.
        problem = applied_record_problem(status)
        told = None if problem is None else unreadable_record_conditions(status, problem, now)
        if told is not None:
            log.warning("%s/%s: status.appliedSpec unreadable: %s", namespace, name, problem)
            patch.status["conditions"] = told
        return
    parsed, applied_generation = watched
    service.scraped(now, parsed.telemetry.scrape_interval_seconds)
    tick_status: Mapping[str, Any] = status
    undone = undone_edit(spec, status, generation, now)
    if undone is not None:
        accepted_again = undone[0]
        for key, value in accepted_again.items():
            patch.status[key] = value
        tick_status = {**status, **accepted_again}  # the tick builds its conditions on these
        applied_generation = generation
        service.applied_generation = generation  # the children are this spec's: resync again
    service.catch_up(tick_status, context.settings.pod_name, applied_generation)
    # A child the watches saw deleted or edited is put back at this tick; the
    # periodic resync (from the watches' view, no reads) is the safety net. An undone
    # edit whose child was refused wrote the children before that one: put back now.
    touched = context.kube.children_touched(namespace, name)
    if service.resync_due(now, context.settings.resync_seconds) or touched or undone:
        await _resync(
            body, parsed, applied_generation, status, meta, context, service,
            undone=None if undone is None else undone[1],
        )  # fmt: skip
    kube = context.kube
    try:
        pods = await kube.list_pods(namespace, manifests.selector_labels(name), name)
    except KubeError as error:
        # No pods, no tick: status says so rather than standing as last observed.
        log.warning("%s/%s: no tick: %s", namespace, name, error)
        told = unlisted_pods_conditions(tick_status, str(error), now)
        if told is not None:
            patch.status["conditions"] = told
        return
    try:
        token = await _token(service, kube, namespace, name, uid, context.settings.resync_seconds)
    except AdminSecretRefused as error:
        # Observed all the same; an action carries no token the operator did not write,
        # so it fails (401) and says so.
        _admin_secret_refused(body, service, error)
        token = ""
    except KubeError as error:
        log.warning("%s/%s: %s", namespace, name, error)
        return

    async def scrape(targets: Sequence[PodView]) -> list[PodSample]:
        return await scrape_all(
            context.scrape_session,
            targets,
            parsed.telemetry.scrape_timeout_seconds,
            parsed.breaker.latency.metric,
        )

    reader = memo.get(KUBELET_PRESSURE_KEY)
    kubelet = None
    if isinstance(reader, KubeletPressureReader) and any(pod.node for pod in pods):
        kubelet = await reader.pressured()  # one list per interval for every service
        pods = with_node_readiness(pods, reader.not_ready() or {})  # the same list's
    inputs = TickInputs(
        namespace=namespace,
        service_id=_service_id(uid),
        spec=parsed,
        status=tick_status,
        pods=pods,
        token=token,
        # The tick's conditions are about the applied generation's pods.
        generation=applied_generation,
        annotations=dict(meta.get("annotations") or {}),  # the incident controls
        operator_pod=context.settings.pod_name,
        kubelet_pressure=kubelet,
        endpoints=kube.service_endpoints(namespace, name),  # the Service is named as the object
    )
    told_before = functools.partial(kube.actions_told, namespace, name)
    started = time.perf_counter()
    outcome = await run_tick(inputs, service.tick, scrape, context.actuator, time.time, told_before)
    METRICS.tick(f"{namespace}/{name}", time.perf_counter() - started, status, outcome.status_patch)
    if context.actuator.token_refused(token):
        service.forget_token()  # rotated or recreated: the next tick reads the Secret
    for event in outcome.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)
    for key, value in outcome.status_patch.items():
        patch.status[key] = value
    if "conditions" in patch.status and service.reconciled_lately(time.time()):
        patch.status["conditions"] = await _onto_stored_conditions(
            kube, namespace, name, status, patch.status["conditions"]
        )
    if outcome.deletion_costs:
        # Before the count goes down, so the ReplicaSet deletes the pods serving least.
        try:
            await kube.set_deletion_costs(namespace, outcome.deletion_costs)
        except KubeError as error:
            log.warning("%s/%s: %s; scaling down without it", namespace, name, error)
    if outcome.replicas is not None:
        try:
            await kube.scale_deployment(namespace, name, outcome.replicas)
        except KubeError as error:
            log.warning("%s/%s: %s", namespace, name, error)


@kopf.on.delete(GROUP, VERSION, PLURAL, optional=True)
def forget_service(name: str, namespace: str | None, **_: Any) -> None:
    """A deleted service leaves the operator's services gauge (no finalizer for this)."""
    METRICS.forget(f"{namespace}/{name}")


async def _onto_stored_conditions(
    kube: Kube,
    namespace: str,
    name: str,
    read: Mapping[str, Any],
    conditions: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """The conditions this timer built on `read` (the body kopf gave it), laid over those
    stored now: a reconcile that wrote its own (SpecApplied, ...) while the tick scraped
    and acted keeps them. Unreadable: this timer's list as built (the next reconcile
    writes its conditions again)."""
    try:
        stored = await kube.read_service_status(namespace, name)
    except KubeError as error:
        log.info("%s/%s: conditions written as read: %s", namespace, name, error)
        return conditions
    return rebase_conditions(
        read.get("conditions") or [], conditions, stored.get("conditions") or []
    )


@kopf.on.probe(id="scrapedAt")
def scraped_at(**_: Any) -> str:
    """Liveness payload: the operator's own clock, proving the event loop runs."""
    return iso(time.time())
