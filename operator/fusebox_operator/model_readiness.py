"""ModelReady: where the download of an s3:// or hf:// model stands, from the pods.

Why a condition of its own: a fetched model is the slowest and most fragile
step of a pod's start (gigabytes over a network, a token, a bucket policy), and
while it runs Ready only says "not ready". The fetcher (fusebox_server.fetch)
ends with its report as the init container's termination message; the kubelet
keeps it in the pod's status, where this module reads it with the container's
state. While it runs, its report file is exported by the pod's sidecar (started
before it) and scraped by the tick: a first download's bytes, rate and stall,
told with the time they were read and rewritten at most every
PROGRESS_REFRESH_SECONDS (a status write per tick per downloading service
would be the API cost operator-api-cost.md took out). Pure: the pods'
fetch states in, a condition and events out.

The verdict across pods: a named failure wins (it does not clear by waiting,
and it is what a user must fix); then a download under way; Verified only when
every pod that runs the service has its verified copy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from fusebox_contract.model_fetch import FetchReason, FetchReport
from fusebox_contract.names import ConditionType, EventReason
from fusebox_operator.observations import FetchProgress, FetchState
from fusebox_operator.spec import InferenceServiceSpec
from fusebox_operator.status import (
    EventRecord,
    drop_condition,
    human_bytes,
    human_seconds,
    iso,
    set_condition,
)

MAX_PODS_NAMED = 3
NO_PODS = "NoPods"
PROGRESS_REFRESH_SECONDS = 10.0
"""A download's figures in ModelReady are rewritten at most this often."""
STALLED_SECONDS = 30.0
"""A fetcher that has written no report for this long is told as stalled: it writes
at least every second while bytes arrive, and every 2 s while it waits for another
pod's download."""


def _rate(report: FetchReport) -> str:
    if report.rate_bytes_per_second is None:
        return ""
    return f" at {human_bytes(report.rate_bytes_per_second)}/s"


def _figures(done: int, total: int | None) -> str:
    if total is None:
        return f"{human_bytes(done)} so far"
    share = f" ({100 * done / total:.0f}%)" if total > 0 else ""
    return f"{human_bytes(done)} of {human_bytes(total)}{share}"


def _live(progress: FetchProgress) -> str:
    age = progress.age_seconds
    stalled = age is not None and age >= STALLED_SECONDS
    if progress.waiting:
        text = "waiting for another pod's download (shared cache)"
        return f"{text}, no word for {human_seconds(age)}" if stalled else text
    text = _figures(progress.bytes_done, progress.bytes_total)
    if stalled:
        return f"{text}, no bytes for {human_seconds(age)}"
    if progress.rate_bytes_per_second is not None:
        text += f" at {human_bytes(progress.rate_bytes_per_second)}/s"
    return text


def _progress(state: FetchState) -> str:
    if state.running and state.live is not None:
        return _live(state.live)
    report = state.report
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
        text = _named(waiting, lambda s: f"{s.pod} {_progress(s)}")
        read = [s.live.read_at for s in waiting if s.running and s.live is not None]
        when = f" (read {iso(max(read))})" if read else ""
        return False, FetchReason.DOWNLOADING.value, f"{source}: {text}{when}"
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


class ModelReadiness(NamedTuple):
    conditions: list[dict[str, Any]]
    events: list[EventRecord]
    # When ModelReady last got a download's figures; None when none is under way.
    progress_told_at: float | None = None


def model_ready_conditions(
    conditions: Sequence[Mapping[str, Any]],
    spec: InferenceServiceSpec,
    states: Sequence[FetchState],
    generation: int,
    now: float,
    progress_told_at: float | None = None,
) -> ModelReadiness:
    """The conditions with ModelReady set (or dropped for a local source), and an event
    when its reason changes: ModelDownloading, ModelVerified, or ModelFetchFailed
    (a Warning) naming the failure, once per spell.

    `progress_told_at`: when the figures of a download under way were last told (the
    previous call's answer). Sooner than PROGRESS_REFRESH_SECONDS after it, a
    Downloading message with new figures is kept as it was: it says when its
    figures were read.
    """
    verdict = model_ready(spec, states)
    if verdict is None:
        return ModelReadiness(drop_condition(conditions, ConditionType.MODEL_READY), [])
    status, reason, message = verdict
    before = next((c for c in conditions if c.get("type") == ConditionType.MODEL_READY), None)
    downloading = reason == FetchReason.DOWNLOADING
    # Only figures read this tick are held back: a download's first figures, and any
    # change of what is known without them, are told at once.
    figures = downloading and any(s.running and s.live is not None for s in states)
    told_at = now if figures else None
    if (
        figures
        and before is not None
        and before.get("reason") == reason
        and progress_told_at is not None
        and 0 <= now - progress_told_at < PROGRESS_REFRESH_SECONDS
    ):
        message, told_at = str(before.get("message") or message), progress_told_at
    updated = set_condition(
        conditions, ConditionType.MODEL_READY, status, reason, message, generation, now
    )
    if (before is not None and before.get("reason") == reason) or reason == NO_PODS:
        return ModelReadiness(updated, [], told_at)
    if downloading:
        event = EventRecord("Normal", EventReason.MODEL_DOWNLOADING, message)
    elif reason == FetchReason.VERIFIED:
        event = EventRecord("Normal", EventReason.MODEL_VERIFIED, message)
    else:
        event = EventRecord("Warning", EventReason.MODEL_FETCH_FAILED, f"{reason}: {message}")
    return ModelReadiness(updated, [event], told_at)
