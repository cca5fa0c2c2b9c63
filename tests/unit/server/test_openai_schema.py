"""Request validation: every hostile body is a 4xx domain error, never anything else."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fusebox_server.errors import InvalidRequest, SchemaError, ServerError
from fusebox_server.http.openai_parameters import PARAMETERS, Parameter, Treatment
from fusebox_server.http.openai_schema import (
    parse_chat_request,
    parse_completion_request,
    parse_json_body,
)
from fusebox_server.http.rendering import Kind

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
        "logprobs",
        "top_logprobs",
        "logit_bias",
        "presence_penalty",
        "frequency_penalty",
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


# ----- every parameter the official client sends has a row -----
CLIENT_ONLY_ARGUMENTS = {"self"}


def _client_parameters(create: Any) -> set[str]:
    return set(inspect.signature(create).parameters) - CLIENT_ONLY_ARGUMENTS


@pytest.mark.parametrize(
    ("create", "kind"),
    [
        pytest.param(openai.resources.chat.completions.Completions.create, Kind.CHAT, id="chat"),
        pytest.param(openai.resources.completions.Completions.create, Kind.COMPLETION, id="comp"),
    ],
)
def test_the_table_has_a_row_for_every_client_parameter_and_no_other(
    create: Any, kind: Kind
) -> None:
    rows = {row.name for row in PARAMETERS if kind in row.routes}
    assert rows == _client_parameters(create)


def _base(kind: Kind) -> dict[str, Any]:
    if kind == Kind.CHAT:
        return {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    return {"model": "m", "prompt": "hi"}


def _parse(kind: Kind, body: dict[str, Any]) -> Any:
    return (parse_chat_request if kind == Kind.CHAT else parse_completion_request)(body)


REFUSING_VALUES: dict[str, object] = {
    "functions": [{"name": "f"}],
    "function_call": "auto",
    "audio": {"voice": "alloy", "format": "wav"},
    "modalities": ["text", "audio"],
    "prediction": {"type": "content", "content": "x"},
    "reasoning_effort": "low",
    "verbosity": "low",
    "web_search_options": {},
    "store": True,
    "metadata": {"k": "v"},
    "service_tier": "flex",
    "prompt_cache_retention": "24h",
    "prompt_cache_options": {},
    "moderation": {},
    "echo": True,
    "best_of": 2,
    "suffix": "tail",
}


def _refused(kind: Kind) -> list[Any]:
    return [
        pytest.param(kind, row, id=f"{kind.value}-{row.name}")
        for row in PARAMETERS
        if row.treatment == Treatment.REFUSED and kind in row.routes
    ]


@pytest.mark.parametrize(("kind", "row"), _refused(Kind.CHAT) + _refused(Kind.COMPLETION))
def test_a_refused_parameter_is_a_400_naming_it_and_its_off_value_passes(
    kind: Kind, row: Parameter
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        _parse(kind, {**_base(kind), row.name: REFUSING_VALUES[row.name]})
    assert caught.value.status == 400 and caught.value.param == row.name
    _parse(kind, {**_base(kind), row.name: None})


@pytest.mark.parametrize(
    ("name", "off"),
    [
        ("tool_choice", "none"),
        ("modalities", ["text"]),
        ("store", False),
        ("service_tier", "auto"),
        ("service_tier", "default"),
    ],
)
def test_the_off_value_of_a_refused_parameter_is_accepted(name: str, off: object) -> None:
    _parse(Kind.CHAT, {**_base(Kind.CHAT), name: off})


@pytest.mark.parametrize("kind", [Kind.CHAT, Kind.COMPLETION])
@pytest.mark.parametrize("name", ["frobnicate", "extra_body", "timeout", "role"])
def test_an_unknown_key_is_a_400_naming_it(kind: Kind, name: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        _parse(kind, {**_base(kind), name: 1})
    assert caught.value.param == name


def test_a_key_of_the_other_route_is_refused() -> None:
    with pytest.raises(InvalidRequest) as caught:
        _parse(Kind.COMPLETION, {**_base(Kind.COMPLETION), "messages": []})
    assert caught.value.param == "messages"


def test_logged_identifiers_are_kept_and_must_be_strings() -> None:
    request = parse_chat_request({**_base(Kind.CHAT), "user": "u-1", "safety_identifier": "s"})
    assert dict(request.identifiers) == {"user": "u-1", "safety_identifier": "s"}
    with pytest.raises(ServerError) as caught:
        parse_chat_request({**_base(Kind.CHAT), "user": 7})
    assert caught.value.param == "user"


def test_response_format_becomes_the_output_format_and_a_bad_schema_is_named() -> None:
    def parse(response_format: Any) -> Any:
        return parse_chat_request({**_base(Kind.CHAT), "response_format": response_format})

    text = parse({"type": "text"})
    assert not text.wants_json and text.sampling.output_format is None
    assert parse({"type": "json_object"}).sampling.output_format.schema is None
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    chosen = parse({"type": "json_schema", "json_schema": {"name": "n", "schema": schema}})
    assert chosen.wants_json and chosen.sampling.output_format.schema == schema
    for response_format, error, param in [
        ({"type": "json_schema"}, SchemaError, "response_format.json_schema"),
        (
            {"type": "json_schema", "json_schema": {}},
            InvalidRequest,
            "response_format.json_schema.name",
        ),
        ({"type": "xml"}, InvalidRequest, "response_format.type"),
        ({"type": "text", "json_schema": {}}, InvalidRequest, "response_format.json_schema"),
        (
            {"type": "json_schema", "json_schema": {"name": "n", "extra": 1}},
            InvalidRequest,
            "response_format.json_schema.extra",
        ),
        (
            {
                "type": "json_schema",
                "json_schema": {"name": "n", "schema": {"type": "array", "uniqueItems": True}},
            },
            InvalidRequest,
            "response_format.json_schema.schema",
        ),
    ]:
        with pytest.raises(error) as caught:
            parse(response_format)
        assert caught.value.param == param, response_format
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(600):  # within what the body parser takes, past what compiling could
        deep = {"type": "array", "items": deep}
    with pytest.raises(InvalidRequest) as caught:
        parse({"type": "json_schema", "json_schema": {"name": "n", "schema": deep}})
    assert caught.value.param == "response_format.json_schema.schema"
    assert "nested deeper than the limit of 100 levels" in caught.value.message  # not a 500


def test_stream_options_need_a_stream_and_known_boolean_options() -> None:
    wanted = parse_chat_request(
        {**_base(Kind.CHAT), "stream": True, "stream_options": {"include_usage": True}}
    )
    assert wanted.include_usage
    for options, stream, param in [
        ({"include_usage": True}, False, "stream_options"),
        ({"include_usage": "yes"}, True, "stream_options.include_usage"),
        ({"include_obfuscation": True}, True, "stream_options.include_obfuscation"),
        ({"bogus": True}, True, "stream_options.bogus"),
    ]:
        with pytest.raises(ServerError) as caught:
            parse_chat_request({**_base(Kind.CHAT), "stream": stream, "stream_options": options})
        assert caught.value.param == param


# ----- hostile JSON -----
@pytest.mark.parametrize("name", ["temperature", "top_p", "presence_penalty"])
def test_an_integer_too_large_for_a_float_is_a_400(name: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_chat_request({**_base(Kind.CHAT), name: 10**400})
    assert caught.value.param == name


@pytest.mark.parametrize("seed", [1 << 64, -(1 << 63) - 1, 10**400])
def test_a_seed_beyond_64_bits_is_a_400(seed: int) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_chat_request({**_base(Kind.CHAT), "seed": seed})
    assert caught.value.param == "seed"


@pytest.mark.parametrize("key", ["1" * 5000, "9" * 19])
def test_a_logit_bias_id_too_long_for_any_vocabulary_is_a_400(key: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_chat_request({**_base(Kind.CHAT), "logit_bias": {key: 1}})
    assert caught.value.param == "logit_bias"
    zeros = parse_chat_request({**_base(Kind.CHAT), "logit_bias": {"0" * 5000 + "7": 1}})
    assert zeros.sampling.logit_bias == ((7, 1.0),)


def test_two_spellings_of_one_logit_bias_id_are_a_400_not_a_summed_bias() -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_chat_request({**_base(Kind.CHAT), "logit_bias": {"1": 100, "01": 100}})
    assert caught.value.param == "logit_bias" and "'1' and '01'" in caught.value.message


def test_duplicate_keys_are_refused_naming_the_key() -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_json_body(b'{"model": "a", "prompt": "x", "model": "b"}')
    assert caught.value.param == "model"


@pytest.mark.parametrize("escape", [b"\\ud800", b"\\udfff", b"x\\ud800\\u0041"])
def test_a_lone_surrogate_escape_is_a_400(escape: bytes) -> None:
    with pytest.raises(InvalidRequest):
        parse_json_body(b'{"prompt": "' + escape + b'"}')


def test_a_surrogate_pair_is_one_character() -> None:
    assert parse_json_body(b'{"prompt": "\\ud83d\\ude00"}')["prompt"] == "\U0001f600"


def test_docs_server_md_has_the_table_row_for_row() -> None:
    docs = (Path(__file__).resolve().parents[3] / "docs" / "server.md").read_text()
    documented = {
        line.split("|")[1].strip().strip("`"): (
            line.split("|")[3].strip(),
            line.split("|")[4].strip(),
        )
        for line in docs.splitlines()
        if line.startswith("| `") and line.count("|") >= 5
    }
    words = {
        Treatment.HONOURED: "honoured",
        Treatment.REFUSED: "refused (400)",
        Treatment.CLIENT_SIDE: "client-side",
    }
    for row in PARAMETERS:  # the treatment and the how, so neither copy drifts
        assert documented.get(row.name) == (words[row.treatment], row.how), row.name


def test_the_table_states_the_limits_the_parser_applies() -> None:
    from fusebox_server.http.openai_schema import SEED_RANGE, STOP_MAX_CHARS
    from fusebox_server.model.json_grammar import MAX_SCHEMA_BYTES, MAX_SCHEMA_PROPERTIES

    how = {row.name: row.how for row in PARAMETERS}
    assert f"at most {STOP_MAX_CHARS} characters" in how["stop"]
    assert f"{MAX_SCHEMA_BYTES // 1024} KiB of JSON" in how["response_format"]
    assert f"{MAX_SCHEMA_PROPERTIES:,} properties" in how["response_format"]
    assert SEED_RANGE == (-(2**63), 2**64 - 1) and "-2^63 to 2^64 - 1" in how["seed"]


def test_a_stop_sequence_over_the_cap_is_refused_naming_stop() -> None:
    from fusebox_server.http.openai_schema import STOP_MAX_CHARS

    body: dict[str, Any] = {"model": "m", "prompt": "p", "stop": ["x" * STOP_MAX_CHARS]}
    assert parse_completion_request(body).sampling.stop == ("x" * STOP_MAX_CHARS,)
    body["stop"] = ["ok", "x" * 300_000]
    with pytest.raises(InvalidRequest) as refused:
        parse_completion_request(body)
    assert refused.value.param == "stop" and str(STOP_MAX_CHARS) in refused.value.message


def test_a_developer_message_reaches_the_template_as_a_system_turn() -> None:
    body = {**_base(Kind.CHAT), "messages": [{"role": "developer", "content": "Be brief."}]}
    (message,) = parse_chat_request(body).messages
    assert message.template_message() == {"role": "system", "content": "Be brief."}


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ({"role": "user", "content": "hi", "nickname": "x"}, "messages[0].nickname"),
        ({"role": "user", "content": "hi", "tool_call_id": "c"}, "messages[0].tool_call_id"),
        ({"role": "system", "content": "hi", "refusal": "no"}, "messages[0].refusal"),
        (
            {"role": "assistant", "content": "hi", "function_call": {"name": "f"}},
            "messages[0].function_call",
        ),
        ({"role": "assistant", "content": "hi", "audio": {"id": "a"}}, "messages[0].audio"),
        ({"role": "assistant", "content": "a", "refusal": "b"}, "messages[0].refusal"),
        ({"role": "user", "content": "hi", "name": 5}, "messages[0].name"),
    ],
)
def test_a_message_key_that_would_be_dropped_is_a_400_naming_it(
    message: dict[str, Any], param: str
) -> None:
    with pytest.raises(ServerError) as caught:
        parse_chat_request({**_base(Kind.CHAT), "messages": [message]})
    assert 400 <= caught.value.status < 500 and caught.value.param == param


def test_a_message_name_reaches_the_template_and_a_refusal_is_the_assistants_words() -> None:
    messages: list[Any] = [
        {"role": "user", "content": "hi", "name": "ada"},
        {"role": "assistant", "content": None, "refusal": "I can't."},
    ]
    parsed = parse_chat_request({**_base(Kind.CHAT), "messages": messages}).messages
    assert [message.template_message() for message in parsed] == [
        {"role": "user", "content": "hi", "name": "ada"},
        {"role": "assistant", "content": "I can't."},
    ]


def test_the_message_shapes_the_openai_client_sends_back_are_accepted() -> None:
    """A reply's message sent back as history (`messages.append(reply.message)`), with
    the keys OpenAI's own replies carry as none, a tool result with its tool's name."""
    from openai.types.chat import ChatCompletionMessage

    reply = ChatCompletionMessage.model_validate(
        {
            "role": "assistant",
            "content": None,
            "refusal": None,
            "annotations": [],
            "audio": None,
            "function_call": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        }
    )
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        reply.model_dump(mode="json"),
        {"role": "tool", "tool_call_id": "c1", "name": "f", "content": "{}"},
    ]
    parsed = parse_chat_request({**_base(Kind.CHAT), "messages": messages}).messages
    assert [message.role for message in parsed] == ["user", "assistant", "tool"]
    assert parsed[1].tool_calls[0].name == "f" and parsed[2].tool_call_id == "c1"


@pytest.mark.parametrize(
    ("max_tokens", "error", "param"),
    [
        (-5, InvalidRequest, "max_tokens"),
        ("abc", SchemaError, "max_tokens"),
        (16, InvalidRequest, "max_completion_tokens"),  # they differ: the message names both
    ],
)
def test_max_tokens_is_checked_beside_max_completion_tokens(
    max_tokens: object, error: type[ServerError], param: str
) -> None:
    body = {**_base(Kind.CHAT), "max_tokens": max_tokens, "max_completion_tokens": 2}
    with pytest.raises(error) as caught:
        parse_chat_request(body)
    assert caught.value.param == param and "max_tokens" in caught.value.message
    agreeing = {**_base(Kind.CHAT), "max_tokens": 2, "max_completion_tokens": 2}
    assert parse_chat_request(agreeing).sampling.max_tokens == 2


@pytest.mark.parametrize("key", ["cache_control", "annotations"])
def test_an_unknown_key_on_a_text_part_is_a_400_naming_it(key: str) -> None:
    part = {"type": "text", "text": "a", key: {"type": "ephemeral"}}
    body = {**_base(Kind.CHAT), "messages": [{"role": "user", "content": [part]}]}
    with pytest.raises(InvalidRequest) as caught:
        parse_chat_request(body)
    assert caught.value.param == f"messages[0].content[0].{key}"


def test_a_json_schema_description_is_accepted_and_documented_as_not_steering() -> None:
    """OpenAI accepts `description`; here it is checked, and the output is the schema's
    alone, as docs/server.md says (never a silent pass-through to nothing)."""

    def output_format(json_schema: dict[str, Any]) -> Any:
        response_format = {"type": "json_schema", "json_schema": json_schema}
        body = {**_base(Kind.CHAT), "response_format": response_format}
        return parse_chat_request(body).sampling.output_format

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    described = output_format({"name": "x", "description": "answer as a haiku", "schema": schema})
    assert described == output_format({"name": "x", "schema": schema})
    with pytest.raises(SchemaError):
        output_format({"name": "x", "description": 3, "schema": schema})
    server_md = (Path(__file__).resolve().parents[3] / "docs" / "server.md").read_text()
    assert "`json_schema.description` is accepted and does not steer" in server_md
