"""kopf handlers: thin, idempotent glue between events and the pure modules.

Why: kopf decides when something happens (create, update, resume, a timer
tick); the pure modules decide what; kube/telemetry/actuator do the I/O.
Handlers never write their own object's status through the API: they fill
kopf's `patch`, and kopf sends one patch per handler run.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
import kopf

from fusebox_contract.names import ConditionType, EventReason
from fusebox_operator import manifests
from fusebox_operator.actuator import Actuator
from fusebox_operator.drift import Applied, restored_message, secret_restored_message
from fusebox_operator.edits import edit_message
from fusebox_operator.kube import (
    SERVICE_GROUP,
    SERVICE_PLURAL,
    SERVICE_VERSION,
    Kube,
    KubeError,
    load_config,
)
from fusebox_operator.observations import PodSample, PodView
from fusebox_operator.settings import OperatorSettings
from fusebox_operator.sizing import GpuMemoryUnknown, recorded_sizing, size_memory
from fusebox_operator.spec import (
    InferenceServiceSpec,
    SpecError,
    applied_spec_text,
    check_service_name,
    parse_spec,
    watched_spec,
)
from fusebox_operator.status import (
    SPEC_VALID,
    iso,
    rebase_conditions,
    set_condition,
    undone_wait,
)
from fusebox_operator.telemetry import scrape_all
from fusebox_operator.tick import TickInputs, TickMemory, current_replicas, run_tick

GROUP, VERSION, PLURAL = SERVICE_GROUP, SERVICE_VERSION, SERVICE_PLURAL
TICK_SECONDS = 1.0  # the timer ticks often; each object scrapes at its own interval
GPU_NODES_RETRY_SECONDS = 60
"""How often a reconcile waiting for labelled GPU nodes looks again."""
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
    # Our own events carry the story; kopf's per-handler success lines would flood it.
    settings.posting.level = logging.WARNING
    settings.posting.reporting_component = "fusebox-operator"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="fusebox.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="fusebox.dev", key="last-handled-configuration"
    )


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    ours = OperatorSettings.from_env(os.environ)
    configure(settings, ours)
    load_config()
    memo.settings = ours
    memo.kube = Kube()
    memo.kube.watch_pods(ours)
    memo.session = aiohttp.ClientSession()
    memo.actuator = Actuator(memo.session, memo.kube)


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    memo.kube.stop_watching()
    await memo.session.close()


def _invalid(
    body: kopf.Body, status: kopf.Status, patch: kopf.Patch, generation: int, message: str
) -> kopf.PermanentError:
    now = time.time()
    conditions = list(status.get("conditions") or [])
    invalid = EventReason.INVALID_SPEC
    conditions = set_condition(
        conditions, ConditionType.INVALID_SPEC, True, invalid, message, generation, now
    )
    conditions = set_condition(
        conditions, ConditionType.READY, False, invalid, message, generation, now
    )
    patch.status["conditions"] = conditions
    patch.status["observedGeneration"] = generation
    kopf.event(body, type="Warning", reason=invalid, message=message)
    return kopf.PermanentError(message)


def _waiting_for_gpu_nodes(
    body: kopf.Body, status: kopf.Status, patch: kopf.Patch, generation: int, message: str
) -> kopf.TemporaryError:
    """The spec may be right and the cluster not there yet: say so, look again later.

    InvalidSpec False carries the reason (the telemetry loop never writes it);
    Ready too while no spec was ever applied. Once pods of an applied spec run,
    Ready is theirs: the tick reports them, and two writers would flap it.
    """
    now = time.time()
    conditions = list(status.get("conditions") or [])
    waiting = EventReason.WAITING_FOR_GPU_NODES
    already = any(
        c.get("type") == ConditionType.INVALID_SPEC and c.get("reason") == waiting
        for c in conditions
    )
    text = f"{message}; looking again every {GPU_NODES_RETRY_SECONDS} s"
    conditions = set_condition(
        conditions, ConditionType.INVALID_SPEC, False, waiting, text, generation, now
    )
    if "memory" not in status:  # nothing applied yet, so no pods of ours
        conditions = set_condition(
            conditions, ConditionType.READY, False, waiting, text, generation, now
        )
    patch.status["conditions"] = conditions
    patch.status["observedGeneration"] = generation
    if not already:  # once per spell, not once per retry
        kopf.event(body, type="Warning", reason=waiting, message=text)
    return kopf.TemporaryError(text, delay=GPU_NODES_RETRY_SECONDS)


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
async def reconcile(
    spec: kopf.Spec,
    name: str,
    namespace: str | None,
    body: kopf.Body,
    status: kopf.Status,
    meta: kopf.Meta,
    patch: kopf.Patch,
    memo: Any,
    old: Any = None,
    **_: Any,
) -> None:
    """Children from the spec: built purely, adopted (owner refs), applied level-triggered.

    On an edit (`old` is the previous spec), one SpecApplied event says what the
    edit does to the pods: roll them, reach them live, scale, or nothing.
    """
    assert namespace is not None  # the CRD is namespaced
    generation = int(meta.get("generation") or 0)
    kube: Kube = memo.kube
    ours: OperatorSettings = memo.settings
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
    edited = (
        edit_message(old, parsed, rendered, render, generation)
        if isinstance(old, Mapping)
        else None
    )
    try:
        async with _children_lock(memo):
            await _apply_children(kube, body, rendered)
            memo.applied_generation = generation
    except KubeError as error:
        raise kopf.TemporaryError(str(error), delay=10) from error
    if edited is not None:
        kopf.event(body, type="Normal", reason=EventReason.SPEC_APPLIED, message=edited)

    memory = {
        "limitBytes": sizing.limit_bytes,
        "requestBytes": sizing.request_bytes,
        "vramBytes": sizing.vram_bytes,
        "source": sizing.vram_source,
        "qosClass": sizing.qos_class,
    }
    if status.get("memory") != memory:
        # kopf.event, not kopf.info: posting.level (WARNING) filters kopf.info.
        kopf.event(
            body,
            type="Normal",
            reason=EventReason.MEMORY_SIZED,
            message=(
                f"memory limit {manifests.memory_quantity(sizing.limit_bytes)}, request "
                f"{manifests.memory_quantity(sizing.request_bytes)} ({sizing.qos_class}); VRAM "
                f"{sizing.vram_bytes / 1024**3:.2f} GiB x {parsed.gpu.count} from "
                f"{sizing.vram_source}, headroom {parsed.memory.headroom_ratio:g}"
            ),
        )
    now = time.time()
    conditions = list(status.get("conditions") or [])
    conditions = set_condition(
        conditions, ConditionType.INVALID_SPEC, False, SPEC_VALID, "spec accepted", generation, now
    )
    held_back = (EventReason.INVALID_SPEC, EventReason.WAITING_FOR_GPU_NODES)
    if not any(c.get("type") == ConditionType.READY for c in conditions) or any(
        c.get("type") == ConditionType.READY and c.get("reason") in held_back for c in conditions
    ):
        conditions = set_condition(
            conditions,
            ConditionType.READY,
            False,
            "Reconciling",
            "children applied",
            generation,
            now,
        )
    patch.status["conditions"] = conditions
    patch.status["memory"] = memory
    patch.status["selector"] = manifests.selector_text(name)
    patch.status["observedGeneration"] = generation
    # What the telemetry loop protects the pods with until the next spec is applied;
    # in status, so a restarted operator knows it while a later edit is refused.
    patch.status["appliedSpec"] = applied_spec_text(spec)
    patch.status["appliedGeneration"] = generation


def _children_lock(memo: Any) -> asyncio.Lock:
    """One writer of a service's children at a time: the reconcile or the resync."""
    lock: asyncio.Lock = memo.setdefault("children_lock", asyncio.Lock())
    return lock


async def _apply_children(
    kube: Kube, body: kopf.Body, rendered: Sequence[manifests.Manifest], scale: bool = True
) -> tuple[bool, list[Applied]]:
    """Adopt and apply the children, the admin Secret first: (Secret created, each apply)."""
    secret, *children = rendered
    kopf.adopt([secret, *children], owner=body)
    created = await kube.create_secret_once(secret)  # the token is never logged nor regenerated
    return created, [await kube.apply(child, scale=scale) for child in children]


async def _resync(
    body: kopf.Body,
    spec: InferenceServiceSpec,
    status: Mapping[str, Any],
    meta: kopf.Meta,
    memo: Any,
) -> None:
    """Put back a child deleted or edited outside Fusebox, with a Warning naming it.

    It renders what the last reconcile applied (the sizing it recorded in
    status.memory) and writes only what drifted, so an untouched service costs
    reads and posts nothing. An autoscaled Deployment keeps its count: the
    autoscaler owns it.
    """
    name, namespace = str(meta["name"]), str(meta["namespace"])
    sizing = recorded_sizing(status.get("memory") or {})
    known_token = memo.get("admin_token")
    async with _children_lock(memo):
        # Only children this process applied for this very generation: a newer
        # spec (or one a reconcile still retries) is the reconcile's to apply.
        if sizing is None or memo.get("applied_generation") != meta.get("generation"):
            return
        rendered = manifests.build_children(
            spec,
            name,
            namespace,
            sizing,
            memo.settings,
            known_token or secrets.token_urlsafe(32),
            replicas=current_replicas(spec, status),
        )
        try:
            secret_created, applied = await _apply_children(
                memo.kube, body, rendered, scale=spec.autoscaling is None
            )
        except KubeError as error:
            log.warning("%s/%s: resync: %s", namespace, name, error)
            return
    messages = [restored_message(a, name) for a in applied if a.wrote]
    if secret_created:
        messages.insert(0, secret_restored_message(rendered[0], name, known_token is not None))
    for message in messages:
        kopf.event(body, type="Warning", reason=EventReason.CHILD_RESTORED, message=message)


def _service_id(uid: str) -> str:
    return uid.replace("-", "")[:8]


async def _token(memo: kopf.Memo, kube: Kube, namespace: str, name: str) -> str:
    token = memo.get("admin_token")
    if not token:
        token = await kube.read_secret_value(namespace, manifests.admin_secret_name(name))
        memo.admin_token = token
    return str(token)


@kopf.timer(GROUP, VERSION, PLURAL, interval=TICK_SECONDS, initial_delay=2.0)
async def telemetry(
    spec: kopf.Spec,
    name: str,
    namespace: str | None,
    uid: str,
    body: kopf.Body,
    status: kopf.Status,
    meta: kopf.Meta,
    patch: kopf.Patch,
    memo: Any,
    **_: Any,
) -> None:
    """Gather the tick's inputs, run it (tick.run_tick), apply its status patch and events."""
    assert namespace is not None
    now = time.time()
    if now < memo.get("next_scrape_at", 0.0):
        return
    # The last applied spec, not .spec: an edit the reconcile refused (InvalidSpec) or
    # still waits on leaves the pods of the previous one running, and they stay watched.
    generation = int(meta.get("generation") or 0)
    watched = watched_spec(spec, status, generation)
    if watched is None:
        return  # nothing applied yet: no pods of ours to watch
    parsed, applied_generation = watched
    memo.next_scrape_at = now + parsed.telemetry.scrape_interval_seconds
    tick_status: Mapping[str, Any] = status
    accepted_again = undone_wait(spec, status, generation, now)
    if accepted_again is not None:
        for key, value in accepted_again.items():
            patch.status[key] = value
        tick_status = {**status, **accepted_again}  # the tick builds its conditions on these
        applied_generation = generation
        memo.applied_generation = generation  # the children are this spec's: resync again
    if now >= memo.setdefault("next_resync_at", now + memo.settings.resync_seconds):
        memo.next_resync_at = now + memo.settings.resync_seconds
        await _resync(body, parsed, status, meta, memo)
    kube: Kube = memo.kube
    try:
        pods = await kube.list_pods(namespace, manifests.selector_labels(name))
        token = await _token(memo, kube, namespace, name)
    except KubeError as error:
        log.warning("%s/%s: %s", namespace, name, error)
        return

    async def scrape(targets: Sequence[PodView]) -> list[PodSample]:
        return await scrape_all(
            memo.session,
            targets,
            parsed.telemetry.scrape_timeout_seconds,
            parsed.breaker.latency.metric,
        )

    memory: TickMemory = memo.setdefault("tick", TickMemory())
    inputs = TickInputs(
        namespace=namespace,
        service_id=_service_id(uid),
        spec=parsed,
        status=tick_status,
        pods=pods,
        token=token,
        # The tick's conditions are about the applied generation's pods.
        generation=applied_generation,
    )
    outcome = await run_tick(inputs, memory, scrape, memo.actuator, time.time)
    for event in outcome.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)
    for key, value in outcome.status_patch.items():
        patch.status[key] = value
    if "conditions" in patch.status:
        patch.status["conditions"] = await _onto_stored_conditions(
            kube, namespace, name, status, patch.status["conditions"]
        )
    if outcome.replicas is not None:
        try:
            await kube.scale_deployment(namespace, name, outcome.replicas)
        except KubeError as error:
            log.warning("%s/%s: %s", namespace, name, error)


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
