"""Audit N2: a fallback whose weights are corrupt must not take the model down.

A real server with `--fallback-dir` pointing at the tiny model's config and
tokenizer but weights cut short (`--check-config` passes: it reads no
weights). Asked for the fallback, by the degradation tier or by the swap
action, the server keeps answering 200 from the primary, says in its stats
file (and so in the sidecar's metrics) that the fallback is unavailable and
why, and a second attempt is refused without touching the primary.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fusebox_server_harness import ServerProcess
from test_seams import check_config

from fusebox_contract.admin import ActionRequest, DegradationRequest, ErrorAnswer
from fusebox_contract.metrics import Metric
from fusebox_contract.names import ActionType, DegradationLevel, Variant
from fusebox_contract.stats import StatsDocument, parse
from fusebox_sidecar.collectors import relayed_families


@pytest.fixture(scope="module")
def corrupt_fallback_dir(tiny_model_dir: Path, server_workdir: Path) -> Path:
    directory = server_workdir / f"corrupt-fallback-{uuid.uuid4().hex[:6]}"
    directory.mkdir()
    for path in tiny_model_dir.iterdir():
        if path.name != "model.safetensors":
            (directory / path.name).symlink_to(path)
    (directory / "model.safetensors").write_bytes(
        (tiny_model_dir / "model.safetensors").read_bytes()[:4096]
    )
    return directory


@pytest.fixture
def corrupt(start_server: Any, corrupt_fallback_dir: Path) -> Iterator[ServerProcess]:
    server = start_server(flags={"device": "cpu", "fallback-dir": str(corrupt_fallback_dir)})
    yield server
    server.stop()


def fresh_document(server: ServerProcess, since: float) -> StatsDocument:
    """The first stats file written after `since` with no variant change under way."""

    def fresh_and_settled() -> StatsDocument | None:
        document = parse(server.stats_file.read_text()).document
        if document is None or document.written_at <= since or document.state.converging:
            return None
        return document

    found: StatsDocument = server.wait_for(fresh_and_settled, timeout=60, what="a settled state")
    return found


def assert_primary_answers(server: ServerProcess) -> None:
    assert server.client.get("/readyz").status_code == 200
    response = server.chat("hi")
    assert response.status_code == 200, response.text
    assert response.headers["x-fusebox-variant"] == Variant.PRIMARY.value


def assert_fallback_reported_unavailable(server: ServerProcess, since: float) -> str:
    # A settled document may be written after `since` and before the failed load is
    # recorded (seen under load): wait for the one that records it.
    def recorded() -> StatsDocument | None:
        document = fresh_document(server, since)
        return document if document.state.fallback_available is False else None

    document: StatsDocument = server.wait_for(recorded, timeout=60, what="the refusal recorded")
    state = document.state
    assert state.fallback_configured is True and state.fallback_available is False
    reason = state.fallback_unavailable_reason
    assert reason is not None and "loading it failed" in reason and "SafetensorError" in reason
    metrics = {family.name: family.samples for family in relayed_families(document, time.time())}
    assert metrics[Metric.FALLBACK_AVAILABLE.value][0].value == 0.0
    info = metrics[Metric.FALLBACK_UNAVAILABLE_INFO.value][0]
    assert info.labels["reason"] == reason and info.value == 1.0
    return reason


def test_check_config_passes_a_fallback_with_corrupt_weights(
    tiny_model_dir: Path, corrupt_fallback_dir: Path
) -> None:
    result = check_config(
        "--model-dir", str(tiny_model_dir), "--fallback-dir", str(corrupt_fallback_dir)
    )
    assert result.returncode == 0, result.stderr


def test_level_2_with_a_corrupt_fallback_keeps_the_primary_answering(
    corrupt: ServerProcess,
) -> None:
    assert_primary_answers(corrupt)
    asked_at = time.time()
    assert corrupt.send(DegradationRequest(DegradationLevel.FALLBACK_MODEL)).is_success
    state = fresh_document(corrupt, asked_at).state
    assert state.variant is Variant.PRIMARY and state.model_loaded is True
    assert state.degradation_level == 2
    assert_primary_answers(corrupt)
    assert_fallback_reported_unavailable(corrupt, asked_at)

    # A second attempt: nothing is loaded or unloaded again, the primary answers on.
    assert corrupt.send(DegradationRequest(DegradationLevel.NONE)).is_success
    log_before_retry = len(corrupt.log_text())
    asked_again_at = time.time()
    assert corrupt.send(DegradationRequest(DegradationLevel.FALLBACK_MODEL)).is_success
    again = fresh_document(corrupt, asked_again_at).state
    assert again.variant is Variant.PRIMARY and again.model_loaded is True
    assert again.target_variant is Variant.PRIMARY
    assert_primary_answers(corrupt)
    retry_log = corrupt.log_text()[log_before_retry:]
    assert "model_loaded" not in retry_log and "model_unloaded" not in retry_log


def test_the_swap_action_to_a_corrupt_fallback_is_refused_and_the_primary_answers(
    corrupt: ServerProcess,
) -> None:
    def swap() -> ActionRequest:
        return ActionRequest(uuid.uuid4().hex, ActionType.SWAP, Variant.FALLBACK)

    asked_at = time.time()
    first = corrupt.send(swap())
    assert first.status_code == 409, first.text
    error = ErrorAnswer.parse(first.json())
    assert error.code == "fallback_unavailable"
    assert_primary_answers(corrupt)
    reason = assert_fallback_reported_unavailable(corrupt, asked_at)
    assert error.message == reason

    log_before_retry = len(corrupt.log_text())
    second = corrupt.send(swap())
    assert second.status_code == 409 and ErrorAnswer.parse(second.json()).message == reason
    assert_primary_answers(corrupt)
    retry_log = corrupt.log_text()[log_before_retry:]
    assert "model_loaded" not in retry_log and "model_unloaded" not in retry_log
