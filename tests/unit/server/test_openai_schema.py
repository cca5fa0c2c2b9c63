"""Request validation: every hostile body is a 4xx domain error, never anything else."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fusebox_server.errors import ServerError
from fusebox_server.openai_schema import (
    parse_chat_request,
    parse_completion_request,
    parse_json_body,
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=12,
)
known_keys = st.sampled_from(
    [
        "model",
        "messages",
        "prompt",
        "max_tokens",
        "temperature",
        "top_p",
        "n",
        "stream",
        "stop",
        "seed",
        "response_format",
        "stream_options",
        "role",
        "content",
        "echo",
    ]
)
bodies = st.dictionaries(known_keys, json_values, max_size=8)


@settings(max_examples=300, deadline=None)
@given(body=bodies)
def test_any_json_object_parses_or_fails_with_a_client_error(body: dict[str, Any]) -> None:
    for parse in (parse_chat_request, parse_completion_request):
        try:
            parse(body)
        except ServerError as error:
            assert 400 <= error.status < 500


@settings(max_examples=200, deadline=None)
@given(raw=st.binary(max_size=64))
def test_any_bytes_parse_or_fail_with_a_client_error(raw: bytes) -> None:
    try:
        parse_json_body(raw)
    except ServerError as error:
        assert error.status in (400, 422)


def test_a_valid_chat_request_keeps_its_fields() -> None:
    request = parse_chat_request(
        {
            "model": "m",
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                }
            ],
            "max_tokens": 3,
            "temperature": 0,
            "stop": "x",
            "response_format": {"type": "json_object"},
        }
    )
    assert request.messages[0].content == "ab"
    assert request.sampling.max_tokens == 3 and request.sampling.stop == ("x",)
    assert request.wants_json


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_numbers_are_refused(value: str) -> None:
    with pytest.raises(ServerError) as caught:
        parse_completion_request(
            parse_json_body(f'{{"model":"m","prompt":"p","temperature":{value}}}'.encode())
        )
    assert caught.value.status == 400
    assert caught.value.param == "temperature"


def test_deeply_nested_json_is_a_client_error() -> None:
    with pytest.raises(ServerError) as caught:
        parse_json_body(b"[" * 200_000 + b"]" * 200_000)
    assert caught.value.status == 400
