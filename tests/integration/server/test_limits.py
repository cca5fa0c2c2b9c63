"""Overload, deadlines, quality sampling, the leak fault and a stuck worker, on one small server.

The server runs one generation at a time with a queue of two, a 6-second
deadline, every response quality-checked, and the leak and slow faults armed
(off until a test switches them on).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fusebox_server_harness import MODEL_NAME, ServerProcess

from fusebox_contract.admin import (
    ActionRequest,
    BreakerRequest,
    DegradationRequest,
    DegradationResult,
    ErrorAnswer,
)
from fusebox_contract.names import (
    ActionType,
    BreakerState,
    DegradationLevel,
    RequestOutcome,
    Variant,
)

MIB = 1 << 20
PLAIN_PROMPT = "Hello, world."
FLAGGED_PROMPT = "Translate the following text into French."
QUALITY_FILE = "quality.json"  # in server_workdir; the limited server re-reads it live


def _greedy_text(server: ServerProcess, prompt: str) -> str:
    response = server.chat(prompt, max_tokens=8)
    assert response.status_code == 200
    return str(response.json()["choices"][0]["message"]["content"])


def _blocked_term(flagged: str, plain: str) -> str:
    """A piece of the flagged prompt's greedy output that the plain prompt's lacks."""
    runs = [run for run in flagged.replace("\ufffd", "\x00").split("\x00") if run.strip()]
    for run in sorted(runs, key=len, reverse=True):
        for size in range(min(len(run), 4), 0, -1):
            term = run[:size]
            if term.strip() and term.lower() not in plain.lower():
                return term
    pytest.skip("the tiny model's outputs share every piece; no distinguishing term")


@pytest.fixture(scope="module")
def limited(
    start_server: Any, server: ServerProcess, server_workdir: Path
) -> Iterator[ServerProcess]:
    term = _blocked_term(_greedy_text(server, FLAGGED_PROMPT), _greedy_text(server, PLAIN_PROMPT))
    quality = server_workdir / QUALITY_FILE
    quality.write_text(json.dumps({"sampleRate": 1.0, "blockedTerms": [term]}))
    limited = start_server(
        flags={
            "max-concurrency": 1,
            "max-queue": 2,
            "request-timeout": 6,
            "quality-file": str(quality),
            "heartbeat-timeout": 3,
        },
        env={"FUSEBOX_FAULTS": "leak:0,slow:0"},
    )
    yield limited
    limited.stop()


@pytest.fixture
def faults_off(limited: ServerProcess) -> Iterator[ServerProcess]:
    yield limited
    limited.set_faults(leak=0, slow=0)
    limited.wait_for(
        lambda: limited.state().running == 0 and limited.state().queue_length == 0,
        what="an idle server",
    )


def test_overload_gets_429_beyond_running_plus_queue(faults_off: ServerProcess) -> None:
    server = faults_off
    # Each request holds its slot for about a second: all ten arrive while the first three
    # are still in the server, and the third still finishes well inside the deadline.
    server.set_faults(slow=250)
    before = server.state().requests

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            body = {
                "model": MODEL_NAME,
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 5,
                "temperature": 0,
            }
            return await asyncio.gather(
                *(client.post("/v1/chat/completions", json=body) for _ in range(10))
            )

    responses = asyncio.run(burst())
    statuses = sorted(response.status_code for response in responses)
    assert statuses == [200] * 3 + [429] * 7
    for response in responses:
        if response.status_code == 429:
            assert int(response.headers["retry-after"]) >= 1
            assert response.json()["error"]["type"] == "rate_limit_error"
    state = server.wait_for(
        lambda: (lambda s: s if s.running == 0 and s.queue_length == 0 else None)(server.state()),
        what="running and queue back to 0",
    )
    assert state.worker_active == 0
    # Each request counted once: 7 rejected, 3 succeeded, nothing else.
    after = state.requests
    assert after[RequestOutcome.REJECTED] - before[RequestOutcome.REJECTED] == 7
    assert after[RequestOutcome.SUCCEEDED] - before[RequestOutcome.SUCCEEDED] == 3
    for outcome in ("failed", "timed_out", "cancelled", "invalid"):
        assert after[outcome] == before[outcome]


def test_generation_past_the_deadline_gets_504_and_frees_the_slot(
    faults_off: ServerProcess,
) -> None:
    server = faults_off
    server.set_faults(slow=300)
    before = server.state().requests
    response = server.chat("hi", max_tokens=40)
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "timeout"
    server.wait_for(lambda: server.state().running == 0, what="the slot to be freed")
    assert server.state().requests[RequestOutcome.TIMED_OUT] - before[RequestOutcome.TIMED_OUT] == 1
    server.set_faults(slow=0)
    assert server.chat("hi").status_code == 200


def test_stream_past_the_deadline_ends_with_an_error_event(faults_off: ServerProcess) -> None:
    server = faults_off
    server.set_faults(slow=300)
    events: list[str] = []
    with server.client.stream(
        "POST",
        "/v1/chat/completions",
        json={
            "model": MODEL_NAME,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 40,
            "temperature": 0,
            "stream": True,
        },
    ) as response:
        assert response.status_code == 200
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert len(events) >= 2
    last = json.loads(events[-1][len("data: ") :])
    assert last["error"]["code"] == "timeout"
    assert "data: [DONE]" not in events
    server.wait_for(lambda: server.state().running == 0, what="the slot to be freed")


def test_quality_failures_raise_the_failure_ratio(faults_off: ServerProcess) -> None:
    server = faults_off

    def quality() -> dict[str, Any]:
        return dict(server.stats()["quality"])

    start = server.wait_for(quality, what="stats")
    assert server.chat(PLAIN_PROMPT, max_tokens=8).status_code == 200
    after_plain = server.wait_for(
        lambda: (lambda q: q if q["sampled_total"] > start["sampled_total"] else None)(quality()),
        what="a sampled response",
    )
    assert after_plain["failed_total"] == start["failed_total"]

    assert server.chat(FLAGGED_PROMPT, max_tokens=8).status_code == 200
    after_blocked = server.wait_for(
        lambda: (lambda q: q if q["failed_total"] > start["failed_total"] else None)(quality()),
        what="a blocked-term failure",
    )
    # json_object is enforced; one token cannot hold a whole document, and a cut one fails.
    json_response = server.chat(PLAIN_PROMPT, max_tokens=1, response_format={"type": "json_object"})
    assert json_response.status_code == 200
    after_json = server.wait_for(
        lambda: (lambda q: q if q["failed_total"] > after_blocked["failed_total"] else None)(
            quality()
        ),
        what="an invalid-JSON failure",
    )
    assert after_json["failure_ratio"] > 0
    assert after_json["failure_ratio"] >= after_blocked["failure_ratio"]


def _replace_quality_file(server: ServerProcess, path: Path, settings: dict[str, Any]) -> None:
    """Swap in new content (a rename, as the kubelet's volume swap is) and see it applied."""
    reloads = server.log_text().count("config_file_reloaded")
    staged = path.with_suffix(".staged")
    staged.write_text(json.dumps(settings))
    staged.replace(path)
    server.wait_for(
        lambda: server.log_text().count("config_file_reloaded") > reloads, what="the reload"
    )


def test_an_edited_quality_file_applies_to_the_next_responses_without_a_restart(
    faults_off: ServerProcess, server_workdir: Path
) -> None:
    server, path = faults_off, server_workdir / QUALITY_FILE
    original, pid = json.loads(path.read_text()), server.pid

    def quality() -> dict[str, Any]:
        return dict(server.stats()["quality"])

    def after(
        previous: dict[str, Any], key: str, what: str, unchanged: str | None = None
    ) -> dict[str, Any]:
        found: dict[str, Any] = server.wait_for(
            lambda: (lambda q: q if q[key] > previous[key] else None)(quality()), what=what
        )
        if unchanged is not None:
            assert found[unchanged] == previous[unchanged]
        return found

    try:
        start = server.wait_for(quality, what="stats")
        assert server.chat(PLAIN_PROMPT, max_tokens=8).status_code == 200
        plain = after(start, "sampled_total", "a sampled plain response", "failed_total")

        # Any output longer than a hundredth of its prompt now fails the check.
        _replace_quality_file(server, path, {"sampleRate": 1.0, "maxOutputInputRatio": 0.01})
        assert server.chat(PLAIN_PROMPT, max_tokens=8).status_code == 200
        ratio = after(plain, "failed_total", "an output/input ratio failure")

        # Nothing sampled: of three responses at rate 0 and one at rate 1, one is checked.
        _replace_quality_file(server, path, {"sampleRate": 0.0})
        for _ in range(3):
            assert server.chat(PLAIN_PROMPT, max_tokens=8).status_code == 200
        answered = time.time()
        written_later = server.wait_for(
            lambda: (lambda s: s if s["written_at"] > answered + 0.5 else None)(server.stats()),
            what="stats written after the three responses",
        )
        assert written_later["quality"]["sampled_total"] == ratio["sampled_total"]
        _replace_quality_file(server, path, {"sampleRate": 1.0})
        assert server.chat(PLAIN_PROMPT, max_tokens=8).status_code == 200
        checked = after(ratio, "sampled_total", "the one sampled response")
        assert checked["sampled_total"] == ratio["sampled_total"] + 1
        assert checked["failed_total"] == ratio["failed_total"]  # the default ratio again
        assert server.pid == pid and server.process.poll() is None
    finally:
        _replace_quality_file(server, path, original)


def test_leak_fault_grows_rss_until_unload_drops_it(faults_off: ServerProcess) -> None:
    server = faults_off
    before = server.state().leaked_bytes
    rss_before = server.stats()["rss_bytes"]
    server.set_faults(leak=64)
    for _ in range(3):
        assert server.chat("hi", max_tokens=1).status_code == 200
    server.set_faults(leak=0)
    assert server.state().leaked_bytes == before + 3 * 64 * MIB
    grown = server.wait_for(
        lambda: (lambda s: s if s["rss_bytes"] >= rss_before + 150 * MIB else None)(server.stats()),
        what="RSS to grow by the leaked blocks",
    )

    gc = server.act(ActionType.GC)
    assert (gc.memory_after.rss_bytes or 0) >= grown["rss_bytes"] - 64 * MIB

    unload = server.act(ActionType.UNLOAD)
    freed = (unload.memory_before.rss_bytes or 0) - (unload.memory_after.rss_bytes or 0)
    assert freed >= 150 * MIB
    server.act(ActionType.LOAD, Variant.PRIMARY)
    assert server.chat("hi").status_code == 200


def test_a_stuck_worker_fails_healthz_while_the_loop_answers(faults_off: ServerProcess) -> None:
    server = faults_off
    server.set_faults(slow=8000)
    thread = threading.Thread(target=lambda: server.chat("hi", max_tokens=2), daemon=True)
    thread.start()
    stale = server.wait_for(
        lambda: (lambda r: r if r.status_code == 503 else None)(server.client.get("/healthz")),
        timeout=30,
        what="/healthz to fail",
    )
    ages = stale.json()["heartbeat_age_seconds"]
    assert ages["worker"] >= 3 and ages["loop"] < 3
    server.set_faults(slow=0)
    server.wait_for(
        lambda: server.client.get("/healthz").status_code == 200,
        timeout=30,
        what="/healthz to recover",
    )
    thread.join(timeout=30)


def test_each_outcome_is_counted_exactly_once(faults_off: ServerProcess) -> None:
    server = faults_off
    n = 3
    before = server.state().requests

    for _ in range(n):  # succeeded
        assert server.chat("hi", max_tokens=1).status_code == 200
    for _ in range(n):  # invalid: a model this server does not serve
        assert server.chat("hi", model="no-such-model").status_code == 404
    server.send(BreakerRequest(BreakerState.OPEN)).raise_for_status()
    for _ in range(n):  # rejected
        assert server.chat("hi").status_code == 503
    server.send(BreakerRequest(BreakerState.CLOSED)).raise_for_status()

    server.set_faults(slow=250)
    for _ in range(n):  # cancelled: the client leaves after the first piece
        with server.client.stream(
            "POST",
            "/v1/chat/completions",
            json={
                "model": MODEL_NAME,
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 40,
                "stream": True,
            },
        ) as response:
            assert response.status_code == 200
            next(line for line in response.iter_lines() if line.startswith("data: "))
        server.wait_for(lambda: server.state().running == 0, what="the cancel to land")

    server.set_faults(slow=3000)

    async def run_past_the_deadline() -> list[int]:
        # One runs, two wait in the queue: all three outlive the 6-second deadline.
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            body = {
                "model": MODEL_NAME,
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 40,
            }
            responses = await asyncio.gather(
                *(client.post("/v1/chat/completions", json=body) for _ in range(n))
            )
        return [r.status_code for r in responses]

    assert asyncio.run(run_past_the_deadline()) == [504] * n
    server.set_faults(slow=0)
    after = server.wait_for(
        lambda: (lambda s: s.requests if s.running == 0 else None)(server.state()),
        what="an idle server",
    )
    counted = {outcome: after[outcome] - before[outcome] for outcome in after}
    assert counted == {
        "succeeded": n,
        "invalid": n,
        "rejected": n,
        "cancelled": n,
        "timed_out": n,
        "failed": 0,
    }


def test_without_a_configured_fallback_nothing_swaps(faults_off: ServerProcess) -> None:
    server = faults_off
    state = server.state()
    assert state.fallback_configured is False
    assert "no fallback is configured" in (state.fallback_unavailable_reason or "")
    for request in (
        ActionRequest(uuid.uuid4().hex, ActionType.SWAP),
        ActionRequest(uuid.uuid4().hex, ActionType.LOAD, Variant.FALLBACK),
    ):
        response = server.send(request)
        assert response.status_code == 409
        assert "no fallback is configured" in ErrorAnswer.parse(response.json()).message
    try:
        for level in (2, 3):
            response = server.send(DegradationRequest(DegradationLevel(level)))
            assert response.status_code == 200
            assert DegradationResult.parse(response.json()).converging is False
            assert server.state().degradation_level == level
        # Level 3's canned answers still work, on the primary.
        canned = server.chat("你好")
        assert canned.headers["x-fusebox-served-by"] == "canned"
        assert canned.headers["x-fusebox-variant"] == "primary"
        assert server.chat("hi").headers["x-fusebox-variant"] == "primary"
    finally:
        server.send(DegradationRequest(DegradationLevel.NONE)).raise_for_status()
    assert server.state().variant == "primary"
