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
from dataclasses import dataclass
from typing import Any, NamedTuple

from fusebox_contract.model_fetch import FetchReason, FetchReport
from fusebox_contract.names import ConditionType, EventReason
from fusebox_operator.observations import FetchProgress, FetchState, PodSample, PodView
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
FIGURES_KEPT_SECONDS = 20.0
"""A pod's last figures stand in for this long when its sidecar's scrape fails."""
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
    share = f" ({100.0 * float(done) / float(total):.0f}%)" if total > 0 else ""
    return f"{human_bytes(done)} of {human_bytes(total)}{share}"


def _stalled(progress: FetchProgress) -> bool:
    return progress.age_seconds is not None and progress.age_seconds >= STALLED_SECONDS


def _live(progress: FetchProgress) -> str:
    age = progress.age_seconds
    stalled = _stalled(progress)
    if progress.waiting:
        text = "waiting for another pod's download (shared cache)"
        return f"{text}, no word for {human_seconds(age)}" if stalled else text
    text = _figures(progress.bytes_done, progress.bytes_total)
    if stalled:
        return f"{text}, no bytes for {human_seconds(age)}"
    if progress.rate_bytes_per_second is not None:
        text += f" at {human_bytes(progress.rate_bytes_per_second)}/s"
    return text


def _shown_live(state: FetchState) -> FetchProgress | None:
    """The figures told for a pod: those of a fetcher the kubelet says runs."""
    return state.live if state.running else None


def _kind(state: FetchState) -> str:
    """What a pod's part of a Downloading message says, without its figures."""
    live = _shown_live(state)
    if live is None:
        return "report" if state.report is not None and state.report.bytes_total else "none"
    return ("waiting " if live.waiting else "") + ("stalled" if _stalled(live) else "moving")


def download_shape(spec: InferenceServiceSpec, states: Sequence[FetchState]) -> tuple[str, ...]:
    """What a Downloading message says, figures aside: the source, and each pod named with
    the kind of its part. Figures alone moving may wait for the next refresh; a new
    shape (a pod gone or come, a download stalled or waiting) is told at once."""
    named = [s for s in states if not s.succeeded]
    return (
        spec.model.source_text,
        *(f"{s.pod} {_kind(s)}" for s in named[:MAX_PODS_NAMED]),
        str(len(named)),
    )


def _progress(state: FetchState) -> str:
    live = _shown_live(state)
    if live is not None:
        return _live(live)
    report = state.report
    if report is None or report.bytes_total is None:
        return "downloading"
    return f"{human_bytes(report.bytes_done)} of {human_bytes(report.bytes_total)}{_rate(report)}"


def _named(states: Sequence[FetchState], describe: Any) -> str:
    listed = "; ".join(describe(s) for s in states[:MAX_PODS_NAMED])
    more = len(states) - MAX_PODS_NAMED
    return listed + (f"; and {more} more" if more > 0 else "")


def _failure(state: FetchState) -> tuple[str, str]:
    if state.cannot_start:
        # The fetcher's only Secret references are the credentials' keys.
        credentials = (
            "CreateContainerConfigError" in state.cannot_start
            and "secret" in state.cannot_start.lower()
        )
        reason = FetchReason.BAD_CREDENTIALS if credentials else FetchReason.FAILED
        return reason.value, f"{state.pod}: its fetcher cannot start: {state.cannot_start}"
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
        # The oldest read: every figure shown is at least that fresh.
        read = [live.read_at for s in waiting if (live := _shown_live(s)) is not None]
        when = f" (read {iso(min(read))})" if read else ""
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


def fetch_figures(
    pods: Sequence[PodView],
    samples: Sequence[PodSample],
    kept: Mapping[str, FetchProgress],
    now: float,
) -> dict[str, FetchProgress]:
    """Each pod's figures of the download its fetcher runs: this tick's scrape of its
    sidecar, else the last ones read within FIGURES_KEPT_SECONDS (one failed scrape
    does not make the message lose them and come back, a status write each time; the
    message's read time is its oldest figure's)."""
    running = {p.name for p in pods if p.fetch is not None and p.fetch.running}
    fresh = {s.pod: s.fetch for s in samples if s.ok and s.fetch is not None and s.pod in running}
    older = {
        pod: figures
        for pod, figures in kept.items()
        if pod in running and pod not in fresh and now - figures.read_at <= FIGURES_KEPT_SECONDS
    }
    return older | fresh


@dataclass(frozen=True)
class ProgressTold:
    """What ModelReady last told of a download under way: when, and its shape."""

    at: float
    shape: tuple[str, ...]


class ModelReadiness(NamedTuple):
    conditions: list[dict[str, Any]]
    events: list[EventRecord]
    # What ModelReady last told of a download's figures; None when none is under way.
    progress_told: ProgressTold | None = None


def model_ready_conditions(
    conditions: Sequence[Mapping[str, Any]],
    spec: InferenceServiceSpec,
    states: Sequence[FetchState],
    generation: int,
    now: float,
    progress_told: ProgressTold | None = None,
) -> ModelReadiness:
    """The conditions with ModelReady set (or dropped for a local source), and an event
    when its reason changes: ModelDownloading, ModelVerified, or ModelFetchFailed
    (a Warning) naming the failure, once per spell.

    `progress_told`: the previous call's answer. Sooner than PROGRESS_REFRESH_SECONDS
    after it, a Downloading message of the same shape (download_shape) whose figures
    moved is kept as it was: it says when its figures were read.
    """
    verdict = model_ready(spec, states)
    if verdict is None:
        return ModelReadiness(drop_condition(conditions, ConditionType.MODEL_READY), [])
    status, reason, message = verdict
    before = next((c for c in conditions if c.get("type") == ConditionType.MODEL_READY), None)
    downloading = reason == FetchReason.DOWNLOADING
    figures = downloading and any(_shown_live(s) is not None for s in states)
    told = ProgressTold(now, download_shape(spec, states)) if figures else None
    if (
        told is not None
        and progress_told is not None
        and before is not None
        and before.get("reason") == reason
        and before.get("observedGeneration") == generation
        and progress_told.shape == told.shape
        and 0 <= now - progress_told.at < PROGRESS_REFRESH_SECONDS
    ):
        message, told = str(before.get("message") or message), progress_told
    updated = set_condition(
        conditions, ConditionType.MODEL_READY, status, reason, message, generation, now
    )
    if (before is not None and before.get("reason") == reason) or reason == NO_PODS:
        return ModelReadiness(updated, [], told)
    if downloading:
        event = EventRecord("Normal", EventReason.MODEL_DOWNLOADING, message)
    elif reason == FetchReason.VERIFIED:
        event = EventRecord("Normal", EventReason.MODEL_VERIFIED, message)
    else:
        event = EventRecord("Warning", EventReason.MODEL_FETCH_FAILED, f"{reason}: {message}")
    return ModelReadiness(updated, [event], told)
