"""ModelReady from the pods' model-fetch init containers: the download, the copy, the failure."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fusebox_contract.model_fetch import FETCH_CONTAINER, FetchReason, FetchReport
from fusebox_contract.names import ConditionType, EventReason
from fusebox_operator.model_readiness import (
    fetch_figures,
    model_ready,
    model_ready_conditions,
    resolved_revision,
)
from fusebox_operator.observations import (
    FetchProgress,
    FetchState,
    PodSample,
    PodView,
    fetch_state,
)
from fusebox_operator.spec import parse_spec

S3 = parse_spec({"model": {"name": "chat", "source": "s3://models/tiny"}})
LOCAL = parse_spec({"model": {"name": "chat", "source": "pvc://models/tiny"}})
COMMIT = "0123456789abcdef0123456789abcdef01234567"
GIB = 1024**3


def verified(cached: bool = False, revision: str = COMMIT) -> FetchReport:
    return FetchReport(
        FetchReason.VERIFIED, "ok", 2 * GIB, 2 * GIB, 1e8, revision=revision, cached=cached
    )


def status(state: dict[str, Any], last: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "name": FETCH_CONTAINER,
        "state": state,
        "lastState": last or {},
        "restartCount": 1 if last else 0,
    }


def ended(code: int, report: FetchReport | str | None) -> dict[str, Any]:
    message = report.dumps() if isinstance(report, FetchReport) else (report or "")
    return {"terminated": {"exitCode": code, "message": message}}


def test_a_finished_fetch_is_read_from_its_termination_message() -> None:
    state = fetch_state("p-1", [status(ended(0, verified()))])
    assert state is not None and state.succeeded and not state.failed
    assert state.report == verified()


def test_a_retry_after_a_failure_still_reports_the_failure() -> None:
    refused = FetchReport(FetchReason.BAD_CREDENTIALS, "SignatureDoesNotMatch")
    state = fetch_state("p-1", [status({"running": {}}, last=ended(1, refused))])
    assert state is not None and state.running and state.failed
    assert model_ready(S3, [state]) == (
        False,
        "BadCredentials",
        "s3://models/tiny: p-1: SignatureDoesNotMatch",
    )


def test_a_fetcher_that_died_without_a_report_is_named_with_its_last_words() -> None:
    state = fetch_state("p-1", [status(ended(137, "Killed\n"))])
    assert state is not None and state.failed and state.report is None
    verdict = model_ready(S3, [state])
    assert verdict == (False, "FetchFailed", "s3://models/tiny: p-1: Killed")


def test_a_fetcher_the_kubelet_cannot_start_is_named_not_told_as_downloading() -> None:
    missing = {
        "waiting": {
            "reason": "CreateContainerConfigError",
            "message": "couldn't find key token in Secret team-a/hub-token",
        }
    }
    state = fetch_state("p-1", [status(missing)])
    assert state is not None and state.failed and not state.running
    assert model_ready(S3, [state]) == (
        False,
        "BadCredentials",
        "s3://models/tiny: p-1: its fetcher cannot start: CreateContainerConfigError: "
        "couldn't find key token in Secret team-a/hub-token",
    )
    pull = {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}
    state = fetch_state("p-1", [status(pull)])
    assert state is not None
    assert model_ready(S3, [state])[:2] == (False, "FetchFailed")  # type: ignore[index]
    # Waiting for its turn (the sidecar first) is not a failure.
    starting = fetch_state("p-1", [status({"waiting": {"reason": "PodInitializing"}})])
    assert starting is not None and not starting.failed


def test_a_pod_without_a_fetch_container_has_no_state() -> None:
    assert fetch_state("p-1", [{"name": "sidecar", "state": {"running": {}}}]) is None


def test_a_download_under_way_shows_bytes_total_and_rate() -> None:
    progress = FetchReport(FetchReason.DOWNLOADING, "", GIB, 4 * GIB, 50 * 1024**2)
    states = [FetchState("p-1", running=True, succeeded=False, failed=False, report=progress)]
    assert model_ready(S3, states) == (
        False,
        "Downloading",
        "s3://models/tiny: p-1 1.0Gi of 4.0Gi at 50.0Mi/s",
    )


def test_verified_only_when_every_pod_has_its_copy() -> None:
    done = FetchState("p-1", False, True, False, verified())
    shared = FetchState("p-2", False, True, False, verified(cached=True))
    pending = FetchState("p-3", True, False, False, None)
    assert model_ready(S3, [done, pending])[1] == "Downloading"  # type: ignore[index]
    ready, reason, message = model_ready(S3, [done, shared])  # type: ignore[misc]
    assert (ready, reason) == (True, "Verified")
    assert COMMIT in message and "2 pod(s) verified" in message
    assert "1 from the shared cache" in message


def test_a_failure_on_any_pod_outweighs_the_others() -> None:
    done = FetchState("p-1", False, True, False, verified())
    mismatch = FetchReport(FetchReason.HASH_MISMATCH, "config.json: md5 differs")
    bad = FetchState("p-2", False, False, True, mismatch)
    assert model_ready(S3, [done, bad])[:2] == (False, "HashMismatch")  # type: ignore[index]


def test_a_local_source_has_no_model_ready_condition() -> None:
    conditions = [{"type": ConditionType.MODEL_READY, "status": "True"}]
    assert model_ready(LOCAL, []) is None
    updated, events, _ = model_ready_conditions(conditions, LOCAL, [], 1, 0.0)
    assert updated == [] and events == []


def test_events_follow_the_reason_once_per_spell() -> None:
    downloading = [FetchState("p-1", True, False, False, None)]
    conditions, events, _ = model_ready_conditions([], S3, downloading, 1, 0.0)
    assert [e.reason for e in events] == [EventReason.MODEL_DOWNLOADING]
    again, events, _ = model_ready_conditions(conditions, S3, downloading, 1, 5.0)
    assert events == []
    failed = [FetchState("p-1", False, False, True, FetchReport(FetchReason.DISK_FULL, "full"))]
    conditions, events, _ = model_ready_conditions(again, S3, failed, 1, 10.0)
    assert [(e.type, e.reason) for e in events] == [("Warning", EventReason.MODEL_FETCH_FAILED)]
    assert events[0].message.startswith("DiskFull: ")
    done = [FetchState("p-1", False, True, False, verified())]
    conditions, events, _ = model_ready_conditions(conditions, S3, done, 1, 20.0)
    assert [e.reason for e in events] == [EventReason.MODEL_VERIFIED]
    (condition,) = conditions
    assert (condition["status"], condition["reason"]) == ("True", "Verified")


def pod_view(name: str) -> PodView:
    return PodView(name, f"uid-{name}", "10.0.0.9", "Pending", False, True, False, 0, False, False)


def live(done: int, total: int | None, age: float = 0.5, read_at: float = 100.0) -> FetchProgress:
    return FetchProgress(done, total, 1e8 if done else None, age, read_at)


def test_a_running_download_is_told_with_its_live_figures_and_when_they_were_read() -> None:
    running = FetchState("p-1", True, False, False, None, live=live(GIB, 4 * GIB))
    unsized = FetchState("p-2", True, False, False, None, live=live(0, None, read_at=90.0))
    assert model_ready(S3, [running, unsized]) == (
        False,
        "Downloading",
        "s3://models/tiny: p-1 1.0Gi of 4.0Gi (25%) at 95.4Mi/s; p-2 0B so far "
        "(read 1970-01-01T00:01:30Z)",  # the older read: every figure is that fresh
    )


def test_a_download_whose_report_has_not_moved_for_thirty_seconds_is_told_as_stalled() -> None:
    stalled = FetchState("p-1", True, False, False, None, live=live(GIB, 4 * GIB, age=95.0))
    _, _, message = model_ready(S3, [stalled]) or (None, "", "")
    assert "p-1 1.0Gi of 4.0Gi (25%), no bytes for 95s" in message, message
    assert "/s" not in message  # no rate next to a download that does not move


def test_figures_are_told_only_of_a_fetcher_the_kubelet_says_runs() -> None:
    # The run ended (its termination message is being written) or has not started: what
    # the sidecar last exported of it is not a download under way.
    ended = FetchState("p-1", False, False, False, None, live=live(GIB, 4 * GIB))
    assert model_ready(S3, [ended]) == (False, "Downloading", "s3://models/tiny: p-1 downloading")


def test_a_download_s_figures_are_rewritten_at_most_every_ten_seconds() -> None:
    def at(done: int, now: float, *pods: str) -> list[FetchState]:
        return [
            FetchState(pod, True, False, False, None, live=live(done, 4 * GIB, read_at=now))
            for pod in pods or ("p-1",)
        ]

    first = model_ready_conditions([], S3, at(GIB, 100.0), 1, 100.0)
    assert first.progress_told is not None and first.progress_told.at == 100.0
    told = first.progress_told
    held = model_ready_conditions(first.conditions, S3, at(2 * GIB, 105.0), 1, 105.0, told)
    assert held.conditions == first.conditions and held.progress_told == told
    fresh = model_ready_conditions(held.conditions, S3, at(3 * GIB, 110.0), 1, 110.0, told)
    assert "3.0Gi of 4.0Gi" in fresh.conditions[0]["message"]
    assert fresh.progress_told is not None and fresh.progress_told.at == 110.0
    # A change other than the figures is told at once: a pod came, one stalled, the
    # spec was edited.
    came = model_ready_conditions(
        fresh.conditions, S3, at(3 * GIB, 111.0, "p-1", "p-2"), 1, 111.0, fresh.progress_told
    )
    assert "p-2" in came.conditions[0]["message"]
    slow = [FetchState("p-1", True, False, False, None, live=live(GIB, 4 * GIB, age=31.0))]
    stalled = model_ready_conditions(fresh.conditions, S3, slow, 1, 111.0, fresh.progress_told)
    assert "no bytes for 31s" in stalled.conditions[0]["message"]
    edited = model_ready_conditions(
        fresh.conditions, S3, at(3 * GIB + 1, 111.0), 2, 111.0, fresh.progress_told
    )
    assert "(read 1970-01-01T00:01:51Z)" in edited.conditions[0]["message"]
    # An outcome is told at once, and a later download starts a new clock.
    done = [FetchState("p-1", False, True, False, verified())]
    verified_now = model_ready_conditions(fresh.conditions, S3, done, 1, 111.0, told)
    assert verified_now.conditions[0]["reason"] == "Verified"
    assert verified_now.progress_told is None


def test_a_pod_s_last_figures_stand_in_for_a_failed_scrape_for_twenty_seconds() -> None:
    running = FetchState("p-1", True, False, False, None)
    pods = [replace(pod_view("p-1"), fetch=running), replace(pod_view("p-2"), fetch=running)]
    kept = {"p-1": live(GIB, 4 * GIB, read_at=100.0), "p-2": live(GIB, 4 * GIB, read_at=85.0)}
    failed = [PodSample("p-1", 110.0, ok=False), PodSample("p-2", 110.0, ok=False)]
    assert fetch_figures(pods, failed, kept, 110.0) == {"p-1": kept["p-1"]}  # p-2's too old
    fresh = live(2 * GIB, 4 * GIB, read_at=110.0)
    answered = [PodSample("p-1", 110.0, fetch=fresh)]
    assert fetch_figures(pods, answered, kept, 110.0) == {"p-1": fresh}
    # A fetcher that ended keeps no figures; a pod the kubelet runs (Running, its init
    # containers run again) is read like any other.
    done = [replace(pods[0], fetch=replace(running, running=False, succeeded=True))]
    assert fetch_figures(done, answered, kept, 110.0) == {}
    # The message tells the oldest figure's read time.
    states = [replace(running, live=kept["p-1"]), replace(running, pod="p-2", live=fresh)]
    _, _, message = model_ready(S3, states) or (None, "", "")
    assert message.endswith("(read 1970-01-01T00:01:40Z)"), message


def test_the_resolved_revision_is_the_one_every_verified_copy_agrees_on() -> None:
    one = FetchState("p-1", False, True, False, verified())
    other = FetchState("p-2", False, True, False, verified(revision="f" * 40))
    assert resolved_revision([one]) == COMMIT
    assert resolved_revision([one, other]) == ""


def test_a_download_s_first_figures_are_told_at_once() -> None:
    waiting = [FetchState("p-1", False, False, False, None)]  # the fetcher not started
    first = model_ready_conditions([], S3, waiting, 1, 100.0)
    assert first.conditions[0]["message"] == "s3://models/tiny: p-1 downloading"
    assert first.progress_told is None
    running = [FetchState("p-1", True, False, False, None, live=live(GIB, 4 * GIB, read_at=101))]
    second = model_ready_conditions(first.conditions, S3, running, 1, 101.0)
    assert "p-1 1.0Gi of 4.0Gi (25%)" in second.conditions[0]["message"]
    assert second.progress_told is not None and second.progress_told.at == 101.0


def test_a_pod_waiting_for_another_pod_s_download_is_told_as_waiting_not_as_stalled() -> None:
    waiter = replace(live(0, None, age=1.0), waiting=True)
    downloading = FetchState("p-1", True, False, False, None, live=live(GIB, 4 * GIB))
    waiting = FetchState("p-2", True, False, False, None, live=waiter)
    _, _, message = model_ready(S3, [downloading, waiting]) or (None, "", "")
    assert "p-2 waiting for another pod's download (shared cache) (read" in message, message
    # A waiter whose report stopped moving (it rewrites it every 2 s while it waits).
    silent = FetchState("p-2", True, False, False, None, live=replace(waiter, age_seconds=40.0))
    _, _, message = model_ready(S3, [silent]) or (None, "", "")
    assert "p-2 waiting for another pod's download (shared cache), no word for 40s" in message
