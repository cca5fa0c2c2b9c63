"""Hostile bodies against the real server: never a 5xx, always an OpenAI error, still healthy.

A hand matrix (huge and non-finite numbers in every numeric field, lone
surrogate escapes, deep nesting, wrong types in every field, bodies that are
not objects, duplicate keys, unknown roles and content parts, megabytes of
whitespace, garbage on the raw socket) and a seeded hypothesis fuzz of
bodies around the chat and completions schema. After each, `GET /healthz`
answers 200 and an ordinary chat still succeeds.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fusebox_server_harness import MODEL_NAME, ServerProcess
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusebox_server.http.openai_parameters import body_parameters
from fusebox_server.http.rendering import Kind

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
PATHS = {Kind.CHAT: CHAT, Kind.COMPLETION: COMPLETIONS}
CLIENT_ERRORS = {400, 404, 413, 422}
NUMERIC_FIELDS = {
    Kind.CHAT: [
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "seed",
        "n",
        "presence_penalty",
        "frequency_penalty",
        "top_logprobs",
    ],
    Kind.COMPLETION: [
        "max_tokens",
        "temperature",
        "top_p",
        "seed",
        "n",
        "presence_penalty",
        "frequency_penalty",
        "logprobs",
        "best_of",
    ],
}
HUGE_OR_NON_FINITE = ["1" + "0" * 400, "-1" + "0" * 400, "1e309", "-1e309", "NaN", "Infinity"]
SMALL_NUMBERS = ["0", "-1", "-0.5", "0.0", "-9223372036854775809"]


def base_text(kind: Kind) -> str:
    """A valid body, as JSON text without its closing brace, so raw literals can follow."""
    if kind == Kind.CHAT:
        head = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}]}
    else:
        head = {"model": MODEL_NAME, "prompt": "hi"}
    return json.dumps({**head, "max_tokens": 2, "temperature": 0})[:-1]


def with_field(kind: Kind, name: str, literal: str) -> bytes:
    """The valid body with `name` set to a raw JSON literal (replacing any earlier value)."""
    body = json.loads(base_text(kind) + "}")
    body.pop(name, None)
    return (json.dumps(body)[:-1] + f', "{name}": {literal}}}').encode()


def assert_openai_error(response: httpx.Response, statuses: set[int]) -> dict[str, Any]:
    assert response.status_code in statuses, (response.status_code, response.text[:500])
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    return dict(error)


def assert_not_a_server_error(response: httpx.Response) -> None:
    """A success, or a client error in the OpenAI shape: never a 5xx."""
    if response.status_code != 200:
        assert_openai_error(response, CLIENT_ERRORS)


def assert_healthy(server: ServerProcess) -> None:
    assert server.client.get("/healthz").status_code == 200
    assert server.chat("hello", max_tokens=2).status_code == 200


def post(server: ServerProcess, kind: Kind, body: bytes) -> httpx.Response:
    return server.client.post(
        PATHS[kind], content=body, headers={"content-type": "application/json"}
    )


@pytest.fixture(scope="module")
def hostile_server(server: ServerProcess) -> Iterator[ServerProcess]:
    server.reset_runtime()
    yield server
    assert_healthy(server)


# ----- the hand matrix -----
def numeric_cases(literals: list[str]) -> list[Any]:
    return [
        pytest.param(kind, name, literal, id=f"{kind.value}-{name}-{literal[:12]}")
        for kind, names in NUMERIC_FIELDS.items()
        for name in names
        for literal in literals
    ]


@pytest.mark.parametrize(("kind", "name", "literal"), numeric_cases(HUGE_OR_NON_FINITE))
def test_huge_and_non_finite_numbers_are_a_client_error(
    hostile_server: ServerProcess, kind: Kind, name: str, literal: str
) -> None:
    response = post(hostile_server, kind, with_field(kind, name, literal))
    # 400 for a number out of range; 422 for a float where an integer belongs.
    assert assert_openai_error(response, {400, 422})["param"] == name
    assert_healthy(hostile_server)


@pytest.mark.parametrize(("kind", "name", "literal"), numeric_cases(SMALL_NUMBERS))
def test_zero_and_negative_numbers_are_served_or_refused_by_name(
    hostile_server: ServerProcess, kind: Kind, name: str, literal: str
) -> None:
    response = post(hostile_server, kind, with_field(kind, name, literal))
    if response.status_code != 200:
        assert assert_openai_error(response, {400, 422})["param"] == name
    assert_healthy(hostile_server)


WRONG_TYPES = ['"text"', "17", "2.5", "true", "[]", "[1, {}]", "{}", '{"a": [null]}']


def wrong_type_cases() -> list[Any]:
    return [
        pytest.param(kind, name, literal, id=f"{kind.value}-{name}-{literal}")
        for kind in (Kind.CHAT, Kind.COMPLETION)
        for name in sorted(body_parameters(kind))
        for literal in WRONG_TYPES
    ]


@pytest.mark.parametrize(("kind", "name", "literal"), wrong_type_cases())
def test_any_type_in_any_field_is_served_or_refused_by_name(
    hostile_server: ServerProcess, kind: Kind, name: str, literal: str
) -> None:
    response = post(hostile_server, kind, with_field(kind, name, literal))
    if response.status_code != 200:
        error = assert_openai_error(response, CLIENT_ERRORS)
        assert error["param"] is not None and error["param"].split("[")[0].split(".")[0] == name
    assert hostile_server.client.get("/healthz").status_code == 200


def chat_with(content: object) -> bytes:
    return json.dumps(
        {"model": MODEL_NAME, "messages": [{"role": "user", "content": content}], "max_tokens": 2}
    ).encode()


DEEP = 10_000
HOSTILE_BODIES = [
    pytest.param(b"", 400, id="empty"),
    pytest.param(b"hello there", 400, id="not-json"),
    pytest.param(b"\x00\x01\x02\xff\xfe", 400, id="binary"),
    pytest.param(b"[]", 422, id="array"),
    pytest.param(b'"a string"', 422, id="string"),
    pytest.param(b"42", 422, id="number"),
    pytest.param(b"null", 422, id="null"),
    pytest.param(b'{"model": "tiny", "model": "tiny", "prompt": "x"}', 400, id="duplicate-keys"),
    pytest.param(b'{"model": "tiny", "prompt": "\\ud800"}', 400, id="lone-high-surrogate"),
    pytest.param(b'{"model": "tiny\\udc00", "prompt": "x"}', 400, id="lone-low-surrogate"),
    pytest.param(
        b'{"model": "tiny", "prompt": "x", "stop": ["\\ud800"]}', 400, id="surrogate-stop"
    ),
    pytest.param(b'{"model": "tiny", "prompt": "x", "user": "\\udbff"}', 400, id="surrogate-user"),
    pytest.param(b"[" * DEEP + b"]" * DEEP, 400, id="deep-arrays"),
    pytest.param(b'{"a":' * DEEP + b"1" + b"}" * DEEP, 400, id="deep-objects"),
    pytest.param(
        b'{"model": "tiny", "prompt": ' + b"[" * DEEP + b"]" * DEEP + b"}", 400, id="deep-prompt"
    ),
    pytest.param(b"{" + b" " * (4 << 20) + b"}", 413, id="4MB-whitespace"),
    pytest.param(b'{"model": "tiny", "prompt": "x"', 400, id="truncated"),
    pytest.param(b'{"model": "tiny", "prompt": "x"} trailing', 400, id="trailing-garbage"),
    pytest.param(b"\xef\xbb\xbf{}", 400, id="utf8-bom"),
    pytest.param(
        b'{"model": "tiny", "prompt": "x", "max_tokens": 1' + b"0" * 5000 + b"}",
        400,
        id="5000-digit-int",
    ),
]


@pytest.mark.parametrize(("body", "status"), HOSTILE_BODIES)
@pytest.mark.parametrize("kind", [Kind.CHAT, Kind.COMPLETION])
def test_a_hostile_body_gets_an_openai_error(
    hostile_server: ServerProcess, kind: Kind, body: bytes, status: int
) -> None:
    assert_openai_error(post(hostile_server, kind, body), {status})
    assert_healthy(hostile_server)


HOSTILE_MESSAGES = [
    pytest.param([{"role": "wizard", "content": "x"}], 400, id="unknown-role"),
    pytest.param([{"role": "function", "content": "x"}], 400, id="function-role"),
    pytest.param([{"role": "", "content": "x"}], 400, id="empty-role"),
    pytest.param([{"content": "x"}], 422, id="no-role"),
    pytest.param(
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        400,
        id="image-part",
    ),
    pytest.param(
        [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}],
        400,
        id="audio-part",
    ),
    pytest.param([{"role": "user", "content": [{"type": "bogus"}]}], 400, id="unknown-part"),
    pytest.param([{"role": "user", "content": ["bare string"]}], 400, id="part-not-object"),
    pytest.param([{"role": "user", "content": [{"type": "text", "text": 5}]}], 422, id="text-5"),
    pytest.param([{"role": "user", "content": {"text": "x"}}], 422, id="content-object"),
    pytest.param([None], 422, id="message-null"),
    pytest.param([[]], 422, id="message-list"),
]


@pytest.mark.parametrize(("messages", "status"), HOSTILE_MESSAGES)
def test_hostile_messages_get_an_openai_error_naming_them(
    hostile_server: ServerProcess, messages: list[Any], status: int
) -> None:
    body = json.dumps({"model": MODEL_NAME, "messages": messages, "max_tokens": 2}).encode()
    error = assert_openai_error(post(hostile_server, Kind.CHAT, body), {status})
    assert error["param"].startswith("messages[0]")
    assert_healthy(hostile_server)


def test_control_characters_and_odd_unicode_are_served(hostile_server: ServerProcess) -> None:
    for content in ["\x00\x01\x1b[31m", "\u202e\ufeff\U0001f600", "é" * 100, "\\ud800 as text"]:
        assert post(hostile_server, Kind.CHAT, chat_with(content)).status_code == 200
    assert_healthy(hostile_server)


# ----- garbage on the raw socket -----
RAW_REQUESTS = [
    pytest.param(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(256)), id="tls"),
    pytest.param(b"\xff" * 4096, id="binary-noise"),
    pytest.param(b"POST " + b"A" * 70_000 + b" HTTP/1.1\r\n\r\n", id="huge-target"),
    pytest.param(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 999999\r\n\r\n"
        + bytes(range(256)) * 4,
        id="content-length-too-big-then-close",
    ),
    pytest.param(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n"
        + b"{}\x00\xff garbage after the body",
        id="content-length-too-small",
    ),
    pytest.param(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: banana\r\n\r\n{}",
        id="content-length-not-a-number",
    ),
    pytest.param(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n{}",
        id="content-length-negative",
    ),
    pytest.param(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
        b"Content-Length: 9\r\n\r\n{}",
        id="content-length-twice",
    ),
    pytest.param(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"zz\r\n\xff\xff\r\n0\r\n\r\n",
        id="bad-chunk-size",
    ),
    pytest.param(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n"
        b"\r\n{}",
        id="content-length-huge",
    ),
]


def send_raw(server: ServerProcess, raw: bytes) -> bytes:
    """Write raw bytes, half-close, and read whatever comes back until the server closes."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        try:
            sock.sendall(raw)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            return b""  # the server closed on us first: also an answer
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except OSError:
            pass
    return answer


@pytest.mark.parametrize("raw", RAW_REQUESTS)
def test_garbage_on_the_socket_never_gets_a_5xx(hostile_server: ServerProcess, raw: bytes) -> None:
    answer = send_raw(hostile_server, raw)
    statuses = [line[9:12] for line in answer.split(b"\r\n") if line.startswith(b"HTTP/1.1 ")]
    assert all(status.startswith(b"4") for status in statuses), answer[:500]
    assert statuses or not answer, answer[:500]  # an answer, or a closed connection
    assert_healthy(hostile_server)


# ----- fuzz -----
EDGE_NUMBERS = st.sampled_from(
    [0, 1, 2, -1, 3, 1 << 63, 1 << 64, -(1 << 63), 10**30, 0.5, -0.0, 1e-300, 1e300, 2.0000001]
)
json_scalars = (
    st.none()
    | st.booleans()
    | EDGE_NUMBERS
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(["tiny", "user", "system", "text", "json_object", "none", "auto", ""])
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=10,
)
message = (
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "system", "assistant", "tool", "x"]),
            "content": json_values,
        }
    )
    | json_values
)
all_names = sorted(body_parameters(Kind.CHAT) | body_parameters(Kind.COMPLETION))
overrides = st.dictionaries(
    st.sampled_from([*all_names, "extra", "Model", ""]),
    json_values | st.lists(message, max_size=3),
    max_size=5,
)


@st.composite
def fuzzed_bodies(draw: st.DrawFn) -> tuple[Kind, set[str], bytes]:
    kind = draw(st.sampled_from([Kind.CHAT, Kind.COMPLETION]))
    body: dict[str, Any] = json.loads(base_text(kind) + "}")
    body.update(draw(overrides))
    for name in ("max_tokens", "max_completion_tokens"):
        if isinstance(body.get(name), int) and body[name] > 8:
            body[name] = 8  # a valid body still generates: keep each one short
    text = json.dumps(body, allow_nan=True)
    return kind, set(body), text.encode("utf-8", "surrogatepass")


@settings(
    derandomize=True,
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=fuzzed_bodies())
def test_fuzzed_bodies_never_get_a_server_error(
    hostile_server: ServerProcess, case: tuple[Kind, set[str], bytes]
) -> None:
    kind, keys, body = case
    response = post(hostile_server, kind, body)
    assert_not_a_server_error(response)
    if keys - body_parameters(kind):  # a key with no row for this route is never ignored
        assert response.status_code == 400
    assert hostile_server.client.get("/healthz").status_code == 200
