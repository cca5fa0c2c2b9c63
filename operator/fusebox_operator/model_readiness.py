"""ModelReady: where the download of an s3:// or hf:// model stands, from the pods.

Why a condition of its own: a fetched model is the slowest and most fragile
step of a pod's start (gigabytes over a network, a token, a bucket policy), and
while it runs Ready only says "not ready". The fetcher (fusebox_server.fetch)
ends with its report as the init container's termination message; the kubelet
keeps it in the pod's status, where this module reads it with the container's
state. Pure: the pods' init-container statuses in, a condition and events out.

The verdict across pods: a named failure wins (it does not clear by waiting,
and it is what a user must fix); then a download under way; Verified only when
every pod that runs the service has its verified copy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fusebox_contract.model_fetch import FetchReason, FetchReport
from fusebox_contract.names import ConditionType, EventReason
from fusebox_operator.observations import FetchState
from fusebox_operator.spec import InferenceServiceSpec
from fusebox_operator.status import (
    EventRecord,
    drop_condition,
    human_bytes,
    set_condition,
)

MAX_PODS_NAMED = 3
NO_PODS = "NoPods"


def _rate(report: FetchReport) -> str:
    if report.rate_bytes_per_second is None:
        return ""
    return f" at {human_bytes(report.rate_bytes_per_second)}/s"


def _progress(report: FetchReport | None) -> str:
    if report is None or report.bytes_total is None:
        return "downloading"
    return f"{human_bytes(report.bytes_done)} of {human_bytes(report.bytes_total)}{_rate(report)}"


def _named(states: Sequence[FetchState], describe: Any) -> str:
    listed = "; ".join(describe(s) for s in states[:MAX_PODS_NAMED])
    more = len(states) - MAX_PODS_NAMED
    return listed + (f"; and {more} more" if more > 0 else "")


def _failure(state: FetchState) -> tuple[str, str]:
    if state.report is not None and state.report.reason.failed:
        return state.report.reason.value, f"{state.pod}: {state.report.message}"
    why = state.exit_message or "exited without a report"
    return FetchReason.FAILED.value, f"{state.pod}: {why}"


def model_ready(
    spec: InferenceServiceSpec, states: Sequence[FetchState]
) -> tuple[bool | None, str, str] | None:
    """ModelReady's (status, reason, message); None for a source nothing fetches."""
    if spec.model.fetch is None:
        return None
    source = spec.model.source_text
    failed = [s for s in states if s.failed]
    if failed:
        reason, _ = _failure(failed[0])
        text = _named(failed, lambda s: _failure(s)[1])
        return False, reason, f"{source}: {text}"
    waiting = [s for s in states if not s.succeeded]
    if waiting:
        text = _named(waiting, lambda s: f"{s.pod} {_progress(s.report)}")
        return False, FetchReason.DOWNLOADING.value, f"{source}: {text}"
    if not states:
        return False, NO_PODS, f"{source}: no pod has started its download yet"
    reports = [s.report for s in states if s.report is not None]
    revisions = sorted({r.revision for r in reports if r.revision})
    size = max((r.bytes_total or 0 for r in reports), default=0)
    cached = sum(1 for r in reports if r.cached)
    at = f" at {', '.join(revisions)}" if revisions else ""
    return (
        True,
        FetchReason.VERIFIED.value,
        f"{source}{at}: {len(states)} pod(s) verified, {human_bytes(size)}"
        + (f", {cached} from the shared cache" if cached else ""),
    )


def resolved_revision(states: Sequence[FetchState]) -> str:
    """The revision the verified copies are at (the hub's commit hash); "" if unknown or
    if pods disagree (a branch that moved between two pods' downloads)."""
    revisions = {
        s.report.revision
        for s in states
        if s.succeeded and s.report is not None and s.report.revision
    }
    return revisions.pop() if len(revisions) == 1 else ""


def model_ready_conditions(
    conditions: Sequence[Mapping[str, Any]],
    spec: InferenceServiceSpec,
    states: Sequence[FetchState],
    generation: int,
    now: float,
) -> tuple[list[dict[str, Any]], list[EventRecord]]:
    """The conditions with ModelReady set (or dropped for a local source), and an event
    when its reason changes: ModelDownloading, ModelVerified, or ModelFetchFailed
    (a Warning) naming the failure, once per spell."""
    verdict = model_ready(spec, states)
    if verdict is None:
        return drop_condition(conditions, ConditionType.MODEL_READY), []
    status, reason, message = verdict
    before = next((c for c in conditions if c.get("type") == ConditionType.MODEL_READY), None)
    updated = set_condition(
        conditions, ConditionType.MODEL_READY, status, reason, message, generation, now
    )
    if (before is not None and before.get("reason") == reason) or reason == NO_PODS:
        return updated, []
    if reason == FetchReason.DOWNLOADING:
        return updated, [EventRecord("Normal", EventReason.MODEL_DOWNLOADING, message)]
    if reason == FetchReason.VERIFIED:
        return updated, [EventRecord("Normal", EventReason.MODEL_VERIFIED, message)]
    return updated, [EventRecord("Warning", EventReason.MODEL_FETCH_FAILED, f"{reason}: {message}")]
