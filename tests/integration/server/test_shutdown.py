"""SIGTERM: the server stops accepting and lets every request under way finish.

The kubelet sends SIGTERM after the pod's preStop sleep (a scale-down, a
rollout, a drain); a generation that started just before may run up to the
request timeout. It must end as it would have: the whole answer, then the
process exits 0. A second signal stops waiting.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from typing import Any

import httpx
from fusebox_server_harness import MODEL_NAME, ServerProcess

from fusebox_contract.wiring import CLOSE_NOTICE_SECONDS, FAULTS_ENV

TOKENS = 24
SLOW_MS = 400  # per token: about 10 s, well past any fixed few-second drain
# The tiny model's greedy answer to this runs to max_tokens (deterministic weights).
PROMPT = [{"role": "user", "content": "Write a short poem about the sea at night."}]
BODY = {"model": MODEL_NAME, "messages": PROMPT, "max_tokens": TOKENS, "temperature": 0}


def slow_server(start_server: Any) -> ServerProcess:
    server: ServerProcess = start_server(
        flags={"request-timeout": 60, "max-new-tokens": TOKENS},
        env={FAULTS_ENV: f"slow:{SLOW_MS}"},
    )
    return server


def running(server: ServerProcess) -> bool:
    return int(server.stats().get("running") or 0) >= 2


def test_requests_under_way_at_sigterm_finish_whole_then_the_server_exits_0(
    start_server: Any,
) -> None:
    server = slow_server(start_server)
    answers: dict[str, Any] = {}

    def plain() -> None:
        with httpx.Client(base_url=server.url, timeout=90) as client:
            answers["plain"] = client.post("/v1/chat/completions", json=BODY)

    def streamed() -> None:
        chunks = []
        with httpx.Client(base_url=server.url, timeout=90) as client:
            with client.stream("POST", "/v1/chat/completions", json={**BODY, "stream": True}) as r:
                answers["stream_status"] = r.status_code
                chunks = [line for line in r.iter_lines() if line.startswith("data: ")]
        answers["stream"] = chunks

    threads = [threading.Thread(target=plain), threading.Thread(target=streamed)]
    for thread in threads:
        thread.start()
    server.wait_for(lambda: running(server), timeout=30, what="both requests generating")
    server.process.send_signal(signal.SIGTERM)
    for thread in threads:
        thread.join(timeout=90)

    plain_answer = answers["plain"]
    assert plain_answer.status_code == 200, plain_answer.text
    choice = plain_answer.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert plain_answer.json()["usage"]["completion_tokens"] == TOKENS
    assert answers["stream_status"] == 200
    assert answers["stream"][-1] == "data: [DONE]"
    last = json.loads(answers["stream"][-2].removeprefix("data: "))
    assert last["choices"][0]["finish_reason"] == "length"
    # All TOKENS x SLOW_MS of generation ran, most of it after SIGTERM: the drain
    # waited for the requests, not a fixed few seconds.
    assert server.process.wait(timeout=60) == 0
    assert "shutting_down" in server.log_text()


def test_a_second_signal_stops_waiting_for_the_requests_under_way(start_server: Any) -> None:
    server = slow_server(start_server)
    outcomes: list[str] = []

    def ask() -> None:
        try:
            with httpx.Client(base_url=server.url, timeout=90) as client:
                outcomes.append(str(client.post("/v1/chat/completions", json=BODY).status_code))
        except httpx.HTTPError as error:
            outcomes.append(type(error).__name__)

    threads = [threading.Thread(target=ask) for _ in range(2)]
    for thread in threads:
        thread.start()
    server.wait_for(lambda: running(server), timeout=30, what="both requests generating")
    server.process.send_signal(signal.SIGTERM)
    server.wait_for(lambda: "shutting_down" in server.log_text(), what="the drain started")
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=30) == 0
    for thread in threads:
        thread.join(timeout=30)
    # Cut short: neither answer completed.
    assert len(outcomes) == 2 and "200" not in outcomes, outcomes


def test_after_sigterm_a_kept_alive_connection_is_answered_and_told_to_close(
    start_server: Any,
) -> None:
    # A client between two requests on a keep-alive connection when SIGTERM comes:
    # its next request is answered, with Connection: close, rather than the
    # connection closed under it (the connection error a scale-down used to cost).
    server = start_server(flags={"request-timeout": 60})
    with httpx.Client(base_url=server.url, timeout=30) as client:
        before = client.get("/v1/models")
        assert before.status_code == 200 and before.headers.get("connection") != "close"
        server.process.send_signal(signal.SIGTERM)
        server.wait_for(lambda: "shutting_down" in server.log_text(), what="the signal handled")
        # A quarter of the notice: a server that stopped accepting at once (uvicorn checks
        # its exit flag every 0.1 s) has closed this idle connection and its listener.
        time.sleep(CLOSE_NOTICE_SECONDS / 4)
        after = client.get("/v1/models")
        assert after.status_code == 200
        assert after.headers["connection"] == "close"
        with httpx.Client(base_url=server.url, timeout=30) as newcomer:
            assert newcomer.get("/v1/models").headers["connection"] == "close"
        # Ready no more: a load balancer that probes stops sending new connections.
        assert client.get("/readyz").status_code == 503
    assert server.process.wait(timeout=30) == 0
