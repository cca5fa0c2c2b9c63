"""Breaker enforcement, degradation levels, client disconnects and the tokenizer cache."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from typing import Any

import httpx
import openai
from fusebox_server_harness import MODEL_NAME, ServerProcess

from fusebox_contract.admin import (
    ActionRequest,
    BreakerRequest,
    DegradationRequest,
    DegradationResult,
    ServerState,
)
from fusebox_contract.names import (
    ActionType,
    BreakerState,
    DegradationLevel,
    DegradationTier,
    Variant,
)


def test_open_breaker_refuses_new_requests_while_running_ones_finish(
    clean_server: ServerProcess,
) -> None:
    results: list[httpx.Response] = []

    def long_request() -> None:
        with httpx.Client(base_url=clean_server.url, timeout=120) as client:
            results.append(
                client.post(
                    "/v1/completions",
                    json={
                        "model": MODEL_NAME,
                        "prompt": "Once",
                        "max_tokens": 120,
                        "temperature": 0,
                    },
                )
            )

    threads = [threading.Thread(target=long_request) for _ in range(3)]
    for thread in threads:
        thread.start()
    clean_server.wait_for(lambda: clean_server.state().running == 3, what="three running requests")
    clean_server.send(BreakerRequest(BreakerState.OPEN)).raise_for_status()
    refused = clean_server.chat("hi")
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "breaker_open"
    assert int(refused.headers["retry-after"]) > 0
    for thread in threads:
        thread.join(timeout=120)
    assert [r.status_code for r in results] == [200, 200, 200]

    clean_server.send(BreakerRequest(BreakerState.CLOSED)).raise_for_status()
    assert clean_server.chat("hi").status_code == 200


def test_half_open_admits_the_configured_share(clean_server: ServerProcess) -> None:
    clean_server.send(BreakerRequest(BreakerState.HALF_OPEN, 20)).raise_for_status()
    statuses = [clean_server.chat("hi", max_tokens=1).status_code for _ in range(200)]
    admitted = statuses.count(200)
    assert set(statuses) <= {200, 503}
    assert 24 <= admitted <= 56  # 20% +- 8% of 200
    # The stats file is rewritten once a second: wait for the write after the PUT.
    clean_server.wait_for(
        lambda: clean_server.stats()["state"]["breaker"] == "half_open",
        what="the stats file to say half_open",
    )
    clean_server.send(BreakerRequest(BreakerState.CLOSED)).raise_for_status()
    assert all(clean_server.chat("hi", max_tokens=1).status_code == 200 for _ in range(10))


def _openai(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def test_level_1_streams_the_whole_answer_in_one_chunk(clean_server: ServerProcess) -> None:
    client = _openai(clean_server)
    messages: Any = [{"role": "user", "content": "hi"}]
    unstreamed = client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_tokens=8, temperature=0
    )
    clean_server.send(DegradationRequest(DegradationLevel.NO_STREAMING)).raise_for_status()
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL_NAME,
        messages=messages,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )  # the official client, as a caller with stream=True uses it
    assert raw.headers["content-type"].startswith("text/event-stream")
    chunks = list(raw.parse())
    text_chunks = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(text_chunks) == 1  # not incremental: the whole text at once
    assert text_chunks[0].choices[0].delta.content == unstreamed.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8
    clean_server.send(DegradationRequest(DegradationLevel.NONE)).raise_for_status()
    streamed = clean_server.chat("hi", stream=True, max_tokens=8)
    assert streamed.text.count("data: {") > 3  # back to one event per piece


def converged(server: ServerProcess, variant: Variant) -> ServerState:
    def done() -> ServerState | None:
        state = server.state()
        settled = not state.converging and state.ready
        return state if settled and state.variant is variant else None

    state: ServerState = server.wait_for(done, timeout=60, what=f"convergence on {variant}")
    return state


def test_level_2_converges_on_the_fallback_and_level_0_restores_the_primary(
    clean_server: ServerProcess,
) -> None:
    response = clean_server.send(DegradationRequest(DegradationLevel.FALLBACK_MODEL))
    assert response.status_code == 202
    assert DegradationResult.parse(response.json()) == DegradationResult(
        DegradationLevel.FALLBACK_MODEL,
        # no tiers given: every one up to 2
        (DegradationTier.NO_STREAMING, DegradationTier.FALLBACK_MODEL),
        variant=Variant.PRIMARY,
        target_variant=Variant.FALLBACK,
        converging=True,
    )
    state = clean_server.state()
    assert state.degradation_level == 2 and state.target_variant is Variant.FALLBACK
    converged(clean_server, Variant.FALLBACK)
    response = clean_server.chat("hi")
    assert response.status_code == 200
    assert response.headers["x-fusebox-variant"] == "fallback"
    assert response.headers["x-fusebox-served-by"] == "fallback"
    # Level 3 keeps the fallback: nothing to converge.
    again = clean_server.send(DegradationRequest(DegradationLevel.CANNED_ANSWERS))
    assert again.status_code == 200 and not DegradationResult.parse(again.json()).converging
    back = clean_server.send(DegradationRequest(DegradationLevel.NONE))
    assert back.status_code == 202
    assert DegradationResult.parse(back.json()).target_variant is Variant.PRIMARY
    converged(clean_server, Variant.PRIMARY)
    assert clean_server.chat("hi").headers["x-fusebox-variant"] == "primary"


def test_a_second_put_during_the_load_retargets_without_a_second_load(
    clean_server: ServerProcess,
) -> None:
    loads_before = clean_server.log_text().count('"event": "model_loaded"')
    first = clean_server.send(DegradationRequest(DegradationLevel.FALLBACK_MODEL))
    second = clean_server.send(DegradationRequest(DegradationLevel.CANNED_ANSWERS))
    assert first.status_code == 202
    assert DegradationResult.parse(second.json()).target_variant is Variant.FALLBACK
    converged(clean_server, Variant.FALLBACK)
    assert clean_server.log_text().count('"event": "model_loaded"') == loads_before + 1


def test_level_3_answers_template_prompts_from_canned_answers(
    clean_server: ServerProcess,
) -> None:
    clean_server.send(DegradationRequest(DegradationLevel.CANNED_ANSWERS)).raise_for_status()
    client = _openai(clean_server)
    messages: Any = [{"role": "user", "content": "你好"}]
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL_NAME, messages=messages, stream=True, stream_options={"include_usage": True}
    )
    assert raw.headers["x-fusebox-served-by"] == "canned"
    assert raw.headers["content-type"].startswith("text/event-stream")
    chunks = list(raw.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "你好！"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens > 0 and usage.completion_tokens > 0
    canned = client.chat.completions.create(model=MODEL_NAME, messages=messages)
    assert canned.choices[0].message.content == "你好！"
    assert canned.usage is not None and canned.usage.total_tokens == usage.total_tokens
    completion = clean_server.client.post(
        "/v1/completions",
        json={"model": MODEL_NAME, "prompt": "What is the capital of France?", "max_tokens": 32},
    )
    assert completion.json()["choices"][0]["text"] == "The capital of France is Paris."
    # Canned answers bypass the model: they work even with the model unloaded.
    clean_server.send(ActionRequest(uuid.uuid4().hex, ActionType.UNLOAD)).raise_for_status()
    assert clean_server.chat("再见").json()["choices"][0]["message"]["content"] == "再见！"
    assert clean_server.chat("not a template").status_code == 503


async def _drop_after_first_chunk(port: int, index: int) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request_id = f"drop-{index}-{uuid.uuid4().hex[:8]}"
    body = json.dumps(
        {
            "model": MODEL_NAME,
            "messages": [{"role": "user", "content": f"Tell me a long story number {index}"}],
            "max_tokens": 500,
            "temperature": 0,
            "stream": True,
        }
    ).encode()
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"X-Request-Id: {request_id}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    received = b""
    while b"data: {" not in received:
        chunk = await asyncio.wait_for(reader.read(4096), timeout=120)
        assert chunk, "server closed before the first chunk"
        received += chunk
    assert b" 200 " in received.split(b"\r\n", 1)[0]
    writer.close()
    await writer.wait_closed()
    return request_id


def test_disconnected_streams_are_cancelled_and_free_their_slots(
    clean_server: ServerProcess,
) -> None:
    baseline = clean_server.state()

    async def drop_all() -> list[str]:
        return await asyncio.gather(
            *(_drop_after_first_chunk(clean_server.port, i) for i in range(50))
        )

    request_ids = asyncio.run(drop_all())
    settled = clean_server.wait_for(
        lambda: (lambda s: s if s.running == 0 and s.queue_length == 0 else None)(
            clean_server.state()
        ),
        timeout=30,
        what="running and queue back to 0",
    )
    assert settled.worker_active == 0
    clean_server.wait_for(
        lambda: clean_server.state().asyncio_tasks <= baseline.asyncio_tasks,
        what="asyncio tasks back to the baseline",
    )
    assert clean_server.state().threads <= baseline.threads

    lines = [json.loads(line) for line in clean_server.log_text().splitlines() if '"drop-' in line]
    by_id = {line["request_id"]: line for line in lines if line.get("event") == "request"}
    assert set(request_ids) <= set(by_id)
    for request_id in request_ids:
        assert by_id[request_id]["finish_reason"] == "cancelled"
        assert by_id[request_id]["output_length"] < 500

    response = clean_server.chat("Hello, world.", max_tokens=4)
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"]


def test_tokenizer_cache_stays_bounded_and_templates_hit_the_pre_encoded_path(
    server: ServerProcess,
) -> None:
    before = server.stats()["tokenizer_template_hits_total"]
    for index in range(150):
        response = server.client.post(
            "/v1/completions",
            json={
                "model": MODEL_NAME,
                "prompt": f"unique prompt {index} {uuid.uuid4()}",
                "max_tokens": 1,
            },
        )
        assert response.status_code == 200
    for template in ("Hello, world.", "你好"):
        assert server.chat(template, max_tokens=1).status_code == 200

    def settled() -> Any:
        stats = server.stats()
        return stats if stats["tokenizer_template_hits_total"] >= before + 2 else None

    stats = server.wait_for(settled, what="template hits in the stats file")
    assert stats["tokenizer_cache_entries"] == 100
