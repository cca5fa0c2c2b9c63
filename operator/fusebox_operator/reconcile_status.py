"""The status a reconcile writes: the spec refused, waiting for GPU nodes or for a
foreign admin Secret to go, or applied.

Why: the reconcile handler decides which of these happened; what each
one says in status (the conditions, the recorded sizing, the applied spec the
control loop watches with) is a pure function of the stored status and the
outcome, tested without kopf. The tick owns Ready once pods of an applied spec
run; these only write it while nothing was applied, so the two never flap it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fusebox_contract.names import ConditionType, EventReason
from fusebox_operator.manifests import memory_quantity, selector_text
from fusebox_operator.sizing import MemorySizing, prefix_cache_limit_bytes
from fusebox_operator.spec import InferenceServiceSpec, applied_spec_text
from fusebox_operator.status import SPEC_VALID, set_condition

GPU_NODES_RETRY_SECONDS = 60
"""How often a reconcile waiting for labelled GPU nodes looks again."""
CHILD_REFUSED = "ChildRefused"
"""InvalidSpec's reason when the API server refused a child as rendered (422 Invalid)."""
CHILD_REFUSED_RETRY_SECONDS = 60
"""How often a reconcile whose child the API server refused tries again: the same
spec is refused the same way, but a webhook or an API server upgrade may change
its mind, and an edit reconciles at once anyway."""
# Ready's reasons a reconcile wrote itself; an applied spec clears them.
HELD_BACK = (
    EventReason.INVALID_SPEC,
    EventReason.WAITING_FOR_GPU_NODES,
    EventReason.ADMIN_SECRET_REFUSED,
    CHILD_REFUSED,
)


def held_back(status: Mapping[str, Any], generation: int) -> bool:
    """Whether the reconcile of `generation` stopped before writing any child: the
    parser refused it (InvalidSpec True) or it waits for GPU nodes. The children of
    the applied generation are then still the service's, and a resync keeps them.

    A child the API server refused (CHILD_REFUSED) is not one of these: that
    reconcile wrote the children before it, and retries them; a resync putting the
    applied generation's back in between would flap them.
    """
    for condition in status.get("conditions") or []:
        if (
            condition.get("type") == ConditionType.INVALID_SPEC
            and condition.get("observedGeneration") == generation
        ):
            reason, refused = condition.get("reason"), condition.get("status") == "True"
            waiting = reason == EventReason.WAITING_FOR_GPU_NODES
            return bool(waiting or (refused and reason == EventReason.INVALID_SPEC))
    return False


def resync_keeps(
    status: Mapping[str, Any], generation: int, record_generation: int, applied_here: int | None
) -> bool:
    """Whether a resync may put back the children of `record_generation` (the applied
    spec it renders) while the object is at `generation`.

    Either that generation is the current one and this process applied it (or caught
    up with the replica that did), or a later edit was held back before any child of
    it was written (`held_back`), so the record's children are still the ones kept;
    then this process must not have applied another since (`applied_here`, None
    after a restart whose resume refused the edit again). A body read before a
    reconcile's status patch landed holds an older record: never restored over the
    children just applied.
    """
    if applied_here == record_generation == generation:
        return True
    return (
        applied_here in (None, record_generation)
        and status.get("appliedGeneration") == record_generation
        and held_back(status, generation)
    )


# Holds an undone edit leaves standing: kopf sees no diff (the spec is the one it last
# handled), so no reconcile runs to clear them. A parser refusal (PermanentError) is
# recorded by kopf as handled, so undoing it is an edit that reconciles.
UNDONE_BY_THE_TICK = (EventReason.WAITING_FOR_GPU_NODES, CHILD_REFUSED)


def undone_edit(
    raw_spec: Mapping[str, Any], status: Mapping[str, Any], generation: int, now: float
) -> tuple[dict[str, Any], str] | None:
    """(the status keys to write, the hold's reason) when an edit that waited for GPU
    nodes or whose child the API server refused was undone, else None.

    Undoing it gives kopf no diff (the spec is the last one it handled), so no
    reconcile runs to say the spec is accepted again, and WaitingForGPUNodes or
    ChildRefused would stay until some other edit. The spec is then the applied one
    (`status.appliedSpec`) again.
    """
    conditions = status.get("conditions") or []
    held = next(
        (
            str(c.get("reason"))
            for c in conditions
            if c.get("type") == ConditionType.INVALID_SPEC and c.get("reason") in UNDONE_BY_THE_TICK
        ),
        None,
    )
    if held is None or status.get("appliedSpec") != applied_spec_text(raw_spec):
        return None
    accepted = set_condition(
        conditions, ConditionType.INVALID_SPEC, False, SPEC_VALID, "spec accepted", generation, now
    )
    keys = {
        "conditions": accepted,
        "appliedGeneration": generation,
        "observedGeneration": generation,
    }
    return keys, held


def undone_message(generation: int, applied_generation: int, held: str, put_back: str) -> str:
    """The SpecApplied event of an undone edit: what it gives back, in one line."""
    what = f"puts back {put_back}" if put_back else "no pod or child changes"
    return (
        f"generation {generation}: the spec of generation {applied_generation} again "
        f"(the edit held as {held} undone): {what}"
    )


def _conditions(status: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [dict(c) for c in status.get("conditions") or []]


def invalid_status(
    status: Mapping[str, Any], message: str, generation: int, now: float
) -> dict[str, Any]:
    """InvalidSpec True with the parser's message; Ready False with it while no spec was
    ever applied. Once one was, its pods keep serving and Ready is the tick's: a refused
    edit is told by InvalidSpec alone, never by a Ready that flaps False and back."""
    return _refused(status, EventReason.INVALID_SPEC, message, generation, now)


def child_refused_status(
    status: Mapping[str, Any], refusal: str, generation: int, now: float
) -> dict[str, Any]:
    """InvalidSpec True, reason ChildRefused, with the API server's refusal (the child,
    the fields, its words); Ready False with it while nothing was ever applied.

    The parser accepted the spec, Kubernetes did not: the children before the refused
    one are written, the refused one (and those after it) are not, and the applied
    generation's pods keep running. Without this the only trace was a retry every
    10 s and "Unprocessable Entity" in the operator's log.
    """
    text = (
        f"{refusal}; the spec's other children are applied as far as that one, trying "
        f"again every {CHILD_REFUSED_RETRY_SECONDS} s (fix the field in the spec)"
    )
    return _refused(status, CHILD_REFUSED, text, generation, now)


def _refused(
    status: Mapping[str, Any], reason: str, message: str, generation: int, now: float
) -> dict[str, Any]:
    """InvalidSpec True for `reason`; Ready False with it only while no spec was ever
    applied (status.memory absent: no pods of ours), else Ready stays the tick's."""
    conditions = set_condition(
        _conditions(status), ConditionType.INVALID_SPEC, True, reason, message, generation, now
    )
    if "memory" not in status:
        conditions = set_condition(
            conditions, ConditionType.READY, False, reason, message, generation, now
        )
    return {"conditions": conditions, "observedGeneration": generation}


def waiting_for_gpu_nodes(
    status: Mapping[str, Any], message: str, generation: int, now: float
) -> tuple[dict[str, Any], str, bool]:
    """The spec may be right and the cluster not there yet: (status keys, the text to
    tell, whether this wait is new and deserves its one Warning).

    InvalidSpec False carries the reason (the telemetry loop never writes it);
    Ready too while no spec was ever applied. Once pods of an applied spec run,
    Ready is theirs: the tick reports them, and two writers would flap it.
    """
    conditions = _conditions(status)
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
    return {"conditions": conditions, "observedGeneration": generation}, text, not already


def admin_secret_refused_status(
    status: Mapping[str, Any], message: str, generation: int, now: float
) -> dict[str, Any]:
    """Ready False with the refusal while no spec was ever applied; else nothing: the
    pods of an applied spec keep running and the tick reports them."""
    if "memory" in status:
        return {}
    conditions = set_condition(
        _conditions(status), ConditionType.READY, False, EventReason.ADMIN_SECRET_REFUSED,
        message, generation, now,
    )  # fmt: skip
    return {"conditions": conditions, "observedGeneration": generation}


def memory_entry(sizing: MemorySizing) -> dict[str, Any]:
    """status.memory: the sizing the children were rendered with (a resync renders it again)."""
    return {
        "limitBytes": sizing.limit_bytes,
        "requestBytes": sizing.request_bytes,
        "vramBytes": sizing.vram_bytes,
        "source": sizing.vram_source,
        "qosClass": sizing.qos_class,
    }


def memory_sized_message(sizing: MemorySizing, spec: InferenceServiceSpec) -> str:
    """The MemorySized event: the limit, where VRAM came from, the headroom, and what a
    prefix cache asked beyond the server's default added (else a grown limit is a riddle)."""
    message = (
        f"memory limit {memory_quantity(sizing.limit_bytes)}, request "
        f"{memory_quantity(sizing.request_bytes)} ({sizing.qos_class}); VRAM "
        f"{sizing.vram_bytes / 1024**3:.2f} GiB x {spec.gpu.count} from "
        f"{sizing.vram_source}, headroom {spec.memory.headroom_ratio:g}"
    )
    cache_bytes = prefix_cache_limit_bytes(spec)
    if cache_bytes:
        message += (
            f"; +{cache_bytes / 1024**3:.2f} GiB for server.prefixCache.maxBytes "
            f"{spec.server.prefix_cache_bytes / 1024**3:.2f} GiB (beyond 1 GiB, over "
            f"rss.ratioOfLimit {spec.breaker.resource.rss.ratio:g})"
        )
    return message


def applied_status(
    status: Mapping[str, Any],
    raw_spec: Mapping[str, Any],
    sizing: MemorySizing,
    name: str,
    generation: int,
    now: float,
) -> dict[str, Any]:
    """The children of this spec are applied: InvalidSpec False, the sizing, the selector,
    and the applied spec the control loop protects the pods with until the next one.

    Ready becomes "Reconciling" only where no pod has reported yet (no Ready at all,
    or one this reconcile's refusal or wait wrote): the tick owns it after that. A
    service no tick has written yet, with no pod listed, gets the tick's first
    observation laid over these in the same write (tick.first_observation), so its
    Ready says "0/N pods serving" from the start instead of "Reconciling".
    """
    conditions = set_condition(
        _conditions(status),
        ConditionType.INVALID_SPEC,
        False,
        SPEC_VALID,
        "spec accepted",
        generation,
        now,
    )
    ready = next((c for c in conditions if c.get("type") == ConditionType.READY), None)
    if ready is None or ready.get("reason") in HELD_BACK:
        conditions = set_condition(
            conditions, ConditionType.READY, False, "Reconciling", "children applied",
            generation, now,
        )  # fmt: skip
    return {
        "conditions": conditions,
        "memory": memory_entry(sizing),
        "selector": selector_text(name),
        "observedGeneration": generation,
        # In status, so a restarted operator knows it while a later edit is refused.
        "appliedSpec": applied_spec_text(raw_spec),
        "appliedGeneration": generation,
    }
