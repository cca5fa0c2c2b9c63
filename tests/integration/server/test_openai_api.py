"""The official openai client against the server, and hostile input that must never get a 500."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from fusebox_server_harness import MODEL_NAME, ServerProcess


@pytest.fixture
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [model.id for model in models.data] == [MODEL_NAME]


def test_chat_completion_returns_decoded_text(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "Hello, world."}],
        max_tokens=6,
        temperature=0,
    )
    choice = completion.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert completion.usage is not None
    assert 0 < completion.usage.completion_tokens <= 6
    assert completion.usage.prompt_tokens > 0


def test_chat_stream_yields_chunks_that_join_to_the_unstreamed_text(
    client: openai.OpenAI,
) -> None:
    messages: Any = [{"role": "user", "content": "Write a short poem about the sea at night."}]
    whole = client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_tokens=8, temperature=0
    )
    stream = client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_tokens=8, temperature=0, stream=True
    )
    pieces = []
    finish = None
    for chunk in stream:
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    assert len([p for p in pieces if p]) >= 2
    assert "".join(pieces) == whole.choices[0].message.content
    assert finish == "length"


def test_completion_and_its_stream_agree(client: openai.OpenAI) -> None:
    whole = client.completions.create(
        model=MODEL_NAME, prompt="The quick brown fox", max_tokens=6, temperature=0
    )
    assert whole.choices[0].text
    stream = client.completions.create(
        model=MODEL_NAME,
        prompt="The quick brown fox",
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    text = ""
    usage = None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].text
        if chunk.usage is not None:
            usage = chunk.usage
    assert text == whole.choices[0].text
    assert usage is not None and usage.completion_tokens == 6


def test_sampling_with_a_seed_is_reproducible(client: openai.OpenAI) -> None:
    def sample() -> str | None:
        completion = client.chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": "Tell me a joke about computers."}],
            max_tokens=6,
            temperature=0.9,
            top_p=0.9,
            seed=7,
        )
        return completion.choices[0].message.content

    assert sample() == sample()


def _chat_body(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
    }
    body.update(fields)
    return body


BAD_CHAT_BODIES = [
    pytest.param({"messages": "hello"}, 422, id="messages-not-a-list"),
    pytest.param({"messages": [{"role": "user", "content": 5}]}, 422, id="content-a-number"),
    pytest.param({"messages": [{"role": 1, "content": "x"}]}, 422, id="role-a-number"),
    pytest.param({"messages": ["hello"]}, 422, id="message-not-an-object"),
    pytest.param({"max_tokens": "ten"}, 422, id="max-tokens-a-string"),
    pytest.param({"stream": "yes"}, 422, id="stream-a-string"),
    pytest.param({"temperature": "hot"}, 422, id="temperature-a-string"),
    pytest.param({"model": None}, 422, id="model-missing"),
    pytest.param({"messages": []}, 400, id="empty-messages"),
    pytest.param({"messages": [{"role": "wizard", "content": "x"}]}, 400, id="unknown-role"),
    pytest.param({"n": 0}, 400, id="n-below-one"),
    pytest.param({"n": 129}, 400, id="n-above-128"),
    pytest.param({"logit_bias": {"99999999": 5}}, 400, id="bias-outside-the-vocabulary"),
    pytest.param({"top_logprobs": 3}, 400, id="top-logprobs-without-logprobs"),
    pytest.param({"temperature": -1}, 400, id="negative-temperature"),
    pytest.param({"top_p": 1.5}, 400, id="top-p-above-one"),
    pytest.param({"max_tokens": 0}, 400, id="zero-max-tokens"),
    pytest.param({"max_tokens": 100000}, 400, id="max-tokens-over-limit"),
    pytest.param({"stop": [1, 2]}, 422, id="stop-not-strings"),
    pytest.param({"response_format": {"type": "xml"}}, 400, id="unknown-response-format"),
    pytest.param({"model": "gpt-9"}, 404, id="unknown-model"),
]


def assert_openai_error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    return dict(error)


@pytest.mark.parametrize(("fields", "status"), BAD_CHAT_BODIES)
def test_bad_chat_input_gets_an_openai_error(
    server: ServerProcess, fields: dict[str, Any], status: int
) -> None:
    body = _chat_body(**fields)
    if fields.get("model", "") is None:
        del body["model"]
    response = server.client.post("/v1/chat/completions", json=body)
    assert_openai_error(response, status)


def test_max_tokens_over_the_limit_names_both_numbers(server: ServerProcess) -> None:
    error = assert_openai_error(server.chat("hi", max_tokens=100000), 400)
    assert "100000" in error["message"] and "512" in error["message"]


@pytest.mark.parametrize(
    ("body", "status"),
    [
        pytest.param(b"{not json", 400, id="invalid-json"),
        pytest.param(b"\xff\xfe{}", 400, id="invalid-utf8"),
        pytest.param(b"[1, 2]", 422, id="json-not-an-object"),
        pytest.param(b"", 400, id="empty-body"),
        pytest.param(b'{"model": "tiny", "prompt": "x", "temperature": NaN}', 400, id="nan"),
        pytest.param(b"[" * 200_000 + b"]" * 200_000, 400, id="deeply-nested"),
    ],
)
def test_malformed_bodies_get_an_openai_error(
    server: ServerProcess, body: bytes, status: int
) -> None:
    for path in ("/v1/chat/completions", "/v1/completions"):
        response = server.client.post(
            path, content=body, headers={"content-type": "application/json"}
        )
        assert_openai_error(response, status)


def test_prompt_over_max_input_tokens_names_both_counts(server: ServerProcess) -> None:
    response = server.client.post(
        "/v1/completions",
        json={"model": MODEL_NAME, "prompt": "hello " * 2000, "max_tokens": 2},
    )
    error = assert_openai_error(response, 400)
    counted = [int(word) for word in error["message"].split() if word.isdigit()]
    assert 256 in counted, error["message"]
    assert any(count > 256 for count in counted), error["message"]
    assert error["code"] == "context_length_exceeded"


def test_body_over_the_limit_gets_413_by_header_and_by_stream(server: ServerProcess) -> None:
    big = b'{"model": "tiny", "prompt": "' + b"a" * (2 << 20) + b'"}'
    assert_openai_error(server.client.post("/v1/completions", content=big), 413)

    def chunks() -> Any:  # no Content-Length: chunked transfer
        for start in range(0, len(big), 65536):
            yield big[start : start + 65536]

    assert_openai_error(server.client.post("/v1/completions", content=chunks()), 413)


def test_unknown_route_and_method_get_openai_errors(server: ServerProcess) -> None:
    assert_openai_error(server.client.get("/v1/nothing"), 404)
    assert_openai_error(server.client.get("/v1/chat/completions"), 405)


def test_server_is_healthy_and_serves_after_hostile_input(server: ServerProcess) -> None:
    for body in (b"{", b"\x00" * 100, b'{"messages": {"a": 1}}', b"null"):
        response = server.client.post("/v1/chat/completions", content=body)
        assert response.status_code < 500
    assert server.client.get("/healthz").status_code == 200
    response = server.chat("hi")
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"]


def test_request_id_is_echoed_and_logged(server: ServerProcess) -> None:
    response = server.chat("hi", max_tokens=1)
    assert response.status_code == 200
    generated = response.headers["x-request-id"]
    assert generated
    response = server.client.post(
        "/v1/chat/completions",
        json=_chat_body(max_tokens=1),
        headers={"X-Request-Id": "trace-abc-123"},
    )
    assert response.headers["x-request-id"] == "trace-abc-123"
    line = server.wait_for(
        lambda: [ln for ln in server.log_text().splitlines() if "trace-abc-123" in ln],
        what="the request's log line",
    )[0]
    import json

    record = json.loads(line)
    for key in (
        "request_id",
        "model_name",
        "input_length",
        "output_length",
        "gpu_device_id",
        "latency_seconds",
        "status",
    ):
        assert key in record
    assert record["status"] == 200 and record["model_name"] == MODEL_NAME
