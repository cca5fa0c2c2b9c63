"""ModelReady from the pods' model-fetch init containers: the download, the copy, the failure."""

from __future__ import annotations

from typing import Any

from fusebox_contract.model_fetch import FETCH_CONTAINER, FetchReason, FetchReport
from fusebox_contract.names import ConditionType, EventReason
from fusebox_operator.model_readiness import (
    model_ready,
    model_ready_conditions,
    resolved_revision,
)
from fusebox_operator.observations import FetchState, fetch_state
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
    updated, events = model_ready_conditions(conditions, LOCAL, [], 1, 0.0)
    assert updated == [] and events == []


def test_events_follow_the_reason_once_per_spell() -> None:
    downloading = [FetchState("p-1", True, False, False, None)]
    conditions, events = model_ready_conditions([], S3, downloading, 1, 0.0)
    assert [e.reason for e in events] == [EventReason.MODEL_DOWNLOADING]
    again, events = model_ready_conditions(conditions, S3, downloading, 1, 5.0)
    assert events == []
    failed = [FetchState("p-1", False, False, True, FetchReport(FetchReason.DISK_FULL, "full"))]
    conditions, events = model_ready_conditions(again, S3, failed, 1, 10.0)
    assert [(e.type, e.reason) for e in events] == [("Warning", EventReason.MODEL_FETCH_FAILED)]
    assert events[0].message.startswith("DiskFull: ")
    done = [FetchState("p-1", False, True, False, verified())]
    conditions, events = model_ready_conditions(conditions, S3, done, 1, 20.0)
    assert [e.reason for e in events] == [EventReason.MODEL_VERIFIED]
    (condition,) = conditions
    assert (condition["status"], condition["reason"]) == ("True", "Verified")


def test_the_resolved_revision_is_the_one_every_verified_copy_agrees_on() -> None:
    one = FetchState("p-1", False, True, False, verified())
    other = FetchState("p-2", False, True, False, verified(revision="f" * 40))
    assert resolved_revision([one]) == COMMIT
    assert resolved_revision([one, other]) == ""
