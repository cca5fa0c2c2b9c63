"""Tool calling's pure parts: request validation, the family parsers, forcing, stream splitting."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fusebox_server.errors import InvalidRequest, ServerError
from fusebox_server.http.openai_schema import parse_chat_request
from fusebox_server.http.tool_calls import (
    MARKERS,
    CallFormat,
    ChoiceMode,
    FunctionCall,
    ParsedReply,
    StreamSplitter,
    ToolUse,
    check_json_answer,
    forced_format,
    forced_schema,
    format_of_template,
    parse_forced,
    parse_tool_use,
    read_reply,
)
from fusebox_server.model.structured_output import ConstrainedRow, vocabulary_from_bytes
from fusebox_server.zoo import templates

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME: dict[str, Any] = {"type": "function", "function": {"name": "get_time"}}


def _use(**body: Any) -> ToolUse:
    use = parse_tool_use({"tools": [WEATHER, TIME], **body})
    assert use is not None
    return use


def _chat(**body: Any) -> Any:
    return parse_chat_request(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}
    )


# ----- the request -----
def test_tools_default_to_auto_and_parallel_calls() -> None:
    use = _chat(tools=[WEATHER]).tool_use
    assert use.mode == ChoiceMode.AUTO and use.parallel and use.tools[0].name == "get_weather"
    assert use.tools[0].template_entry() == WEATHER
    assert _chat().tool_use is None
    assert _chat(tools=[], tool_choice="none").tool_use is None


def test_a_tool_without_parameters_takes_an_empty_object() -> None:
    assert _use().tools[1].parameters == {"type": "object", "properties": {}}


@pytest.mark.parametrize(
    ("tools", "param"),
    [
        ({"type": "function"}, "tools"),
        (["get_weather"], "tools[0]"),
        ([{"type": "code", "function": {"name": "f"}}], "tools[0].type"),
        ([{"type": "function"}], "tools[0].function"),
        ([{"type": "function", "function": {"name": "no spaces"}}], "tools[0].function.name"),
        ([{"type": "function", "function": {"name": "x" * 65}}], "tools[0].function.name"),
        ([{"type": "function", "function": {}}], "tools[0].function.name"),
        (
            [{"type": "function", "function": {"name": "f", "description": 3}}],
            "tools[0].function.description",
        ),
        (
            [{"type": "function", "function": {"name": "f", "parameters": "{}"}}],
            "tools[0].function.parameters",
        ),
        (
            [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}],
            "tools[0].function.parameters.type",
        ),
        ([{"type": "function", "function": {"name": "f", "bogus": 1}}], "tools[0].function.bogus"),
        ([WEATHER, WEATHER], "tools[1]"),
    ],
)
def test_a_malformed_tool_is_a_400_naming_its_path(tools: object, param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        _chat(tools=tools)
    assert caught.value.status == 400 and caught.value.param == param


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": {"type": "function", "function": {}}}, "tool_choice.function.name"),
        ({"tool_choice": {"type": "function"}}, "tool_choice.function.name"),
        ({"tool_choice": {"name": "get_weather"}}, "tool_choice"),
        ({"parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ],
)
def test_a_bad_choice_is_a_400_naming_it(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        _chat(tools=[WEATHER], **body)
    assert caught.value.param == param


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"parallel_tool_calls": False}, "parallel_tool_calls"),
    ],
)
def test_a_choice_without_tools_is_a_400(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        _chat(**body)
    assert caught.value.param == param


def test_the_choices_parse() -> None:
    named = _use(tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert named.mode == ChoiceMode.NAMED and named.named == "get_time" and named.forced
    assert _use(tool_choice="required", parallel_tool_calls=False).parallel is False
    assert not _use(tool_choice="none").parses_calls


@pytest.mark.parametrize("name", ["functions", "function_call"])
def test_the_deprecated_functions_stay_refused_naming_them(name: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        _chat(**{name: [{"name": "f"}] if name == "functions" else "auto"})
    assert caught.value.param == name


# ----- history -----
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}


def test_tool_turns_and_assistant_calls_are_kept_for_the_template() -> None:
    request = _chat(
        messages=[
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ]
    )
    assistant, tool = request.messages[1].template_message(), request.messages[2].template_message()
    assert assistant["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {}}}
    ]
    assert tool == {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ({"role": "tool", "content": "sunny"}, "messages[0].tool_call_id"),
        ({"role": "assistant", "tool_calls": {}}, "messages[0].tool_calls"),
        (
            {"role": "assistant", "tool_calls": [{"type": "function"}]},
            "messages[0].tool_calls[0].id",
        ),
        (
            {"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f"}}]},
            "messages[0].tool_calls[0].function.arguments",
        ),
        (
            {
                "role": "assistant",
                "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "{no"}}],
            },
            "messages[0].tool_calls[0].function.arguments",
        ),
        ({"role": "user", "content": "x", "tool_calls": [CALL]}, "messages[0].tool_calls"),
    ],
)
def test_a_malformed_tool_message_is_a_400_naming_its_path(
    message: dict[str, Any], param: str
) -> None:
    with pytest.raises(ServerError) as caught:
        _chat(messages=[message])
    assert caught.value.status == 400 and caught.value.param == param


# ----- formats and parsers -----
def test_each_zoo_template_names_its_format() -> None:
    assert format_of_template(templates.QWEN2_5) == CallFormat.HERMES
    assert format_of_template(templates.QWEN3) == CallFormat.HERMES
    assert format_of_template(templates.LLAMA3) == CallFormat.LLAMA3_JSON
    assert format_of_template("{{ '[TOOL_CALLS]' }}") == CallFormat.MISTRAL
    for plain in (templates.MISTRAL, templates.GEMMA2, templates.PHI3):
        assert format_of_template(plain) is None


def _calls(text: str, call_format: CallFormat, **body: Any) -> tuple[Any, list[tuple[str, Any]]]:
    reply = read_reply(text, call_format, _use(**body))
    return reply.content, [(call.name, json.loads(call.arguments)) for call in reply.calls]


def test_hermes_calls_parse_with_the_text_around_them() -> None:
    text = (
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
        '</tool_call>\n<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    )
    assert _calls(text, CallFormat.HERMES) == (
        "Let me look.",
        [("get_weather", {"city": "Oslo"}), ("get_time", {})],
    )
    only_first = _calls(text, CallFormat.HERMES, parallel_tool_calls=False)
    assert only_first[1] == [("get_weather", {"city": "Oslo"})]
    bare = '<tool_call>{"name": "get_time", "arguments": "{}"}</tool_call>'
    assert _calls(bare, CallFormat.HERMES) == (None, [("get_time", {})])


def test_llama3_json_calls_parse() -> None:
    one = '{"name": "get_weather", "parameters": {"city": "Oslo"}}'
    assert _calls(one, CallFormat.LLAMA3_JSON) == (None, [("get_weather", {"city": "Oslo"})])
    two = one + '; {"name": "get_time", "parameters": {}}'
    assert [name for name, _ in _calls(two, CallFormat.LLAMA3_JSON)[1]] == [
        "get_weather",
        "get_time",
    ]
    tagged = "<|python_tag|>" + one
    assert _calls(tagged, CallFormat.LLAMA3_JSON)[1] == [("get_weather", {"city": "Oslo"})]


def test_mistral_calls_parse_with_or_without_the_marker() -> None:
    listed = '[{"name": "get_weather", "arguments": {"city": "Oslo"}}]'
    assert _calls("[TOOL_CALLS]" + listed, CallFormat.MISTRAL) == (
        None,
        [("get_weather", {"city": "Oslo"})],
    )
    assert _calls(listed, CallFormat.MISTRAL)[1] == [("get_weather", {"city": "Oslo"})]


@pytest.mark.parametrize(
    ("text", "call_format"),
    [
        ("The weather is fine.", CallFormat.HERMES),
        ('<tool_call>{"name": "get_weather", "arguments": {"ci', CallFormat.HERMES),
        ('<tool_call>{"name": "get_weather"</tool_call>', CallFormat.HERMES),
        ('<tool_call>{"name": "launch", "arguments": {}}</tool_call>', CallFormat.HERMES),
        ('<tool_call>{"arguments": {}}</tool_call>', CallFormat.HERMES),
        ('<tool_call>{"name": "get_time", "arguments": [1]}</tool_call>', CallFormat.HERMES),
        (
            '{"name": "get_weather", "parameters": {"city": "Oslo"}} and more',
            CallFormat.LLAMA3_JSON,
        ),
        ("{not json", CallFormat.LLAMA3_JSON),
        ('The answer: {"name": "get_time", "parameters": {}}', CallFormat.LLAMA3_JSON),
        ("[TOOL_CALLS] oops", CallFormat.MISTRAL),
        ("[TOOL_CALLS][]", CallFormat.MISTRAL),
    ],
)
def test_text_that_is_not_a_clean_call_stays_content(text: str, call_format: CallFormat) -> None:
    assert _calls(text, call_format) == (text, [])


def test_tool_choice_none_reads_no_calls() -> None:
    text = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    assert _calls(text, CallFormat.HERMES, tool_choice="none") == (text, [])


# ----- forcing -----
def test_a_named_function_is_forced_to_its_parameters() -> None:
    use = _use(tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert forced_schema(use) == WEATHER["function"]["parameters"]
    reply = parse_forced('{"city": "Oslo"}', use)
    assert reply.content is None and reply.calls[0].name == "get_weather"
    assert json.loads(reply.calls[0].arguments) == {"city": "Oslo"}
    assert reply.finish_reason("stop") == "tool_calls"


def test_required_is_forced_to_a_list_of_one_or_more_calls_of_declared_tools() -> None:
    use = _use(tool_choice="required")
    schema = forced_schema(use)
    assert schema["type"] == "array" and schema["minItems"] == 1
    options = schema["items"]["anyOf"]
    assert [item["properties"]["name"]["const"] for item in options] == ["get_weather", "get_time"]
    assert options[0]["properties"]["parameters"] == WEATHER["function"]["parameters"]
    text = (
        '[{"name": "get_time", "parameters": {}}, '
        '{"name": "get_weather", "parameters": {"city": "Oslo"}}]'
    )
    calls = parse_forced(text, use).calls
    assert [call.name for call in calls] == ["get_time", "get_weather"]
    assert json.loads(calls[1].arguments) == {"city": "Oslo"}
    assert parse_forced('[{"name": "nope", "parameters": {}}]', use).calls == ()
    assert parse_forced("[]", use) == ParsedReply("[]", ())
    cut = '[{"name": "get_time", "parameters": {}}, {"na'  # no name yet: no second call
    assert parse_forced(cut, use) == ParsedReply(None, (FunctionCall("get_time", "{}"),), cut=True)


NAMED_WEATHER: Any = {"type": "function", "function": {"name": "get_weather"}}


def test_a_named_call_cut_short_is_still_its_call_with_the_arguments_written() -> None:
    """As OpenAI answers a forced function cut by `max_tokens`: the call, its arguments
    as far as they go (not JSON), and the generation's own finish reason."""
    reply = parse_forced('{"city": "Os', _use(tool_choice=NAMED_WEATHER))
    assert reply == ParsedReply(None, (FunctionCall("get_weather", '{"city": "Os'),), cut=True)
    assert reply.finish_reason("length") == "length"
    assert parse_forced("", _use(tool_choice=NAMED_WEATHER)).calls[0].arguments == ""


@pytest.mark.parametrize("parallel", [True, False])
def test_a_required_call_cut_short_keeps_its_whole_calls_and_the_one_being_written(
    parallel: bool,
) -> None:
    use = _use(tool_choice="required", parallel_tool_calls=parallel)
    whole = '{"name": "get_time", "parameters": {}}'
    cut = '{ "name":"get_weather" , "parameters" : {"city": "Os'
    text = f"[{whole}, {cut}" if parallel else cut
    reply = parse_forced(text, use)
    expected = [("get_time", "{}")] if parallel else []
    expected.append(("get_weather", '{"city": "Os'))
    assert [(call.name, call.arguments) for call in reply.calls] == expected
    assert reply.content is None and reply.finish_reason("length") == "length"
    closed_but_cut = f"[{whole}" if parallel else whole[:-1]  # `]` / `}` not written yet
    assert parse_forced(closed_but_cut, use).finish_reason("length") == "length"
    assert parse_forced(closed_but_cut, use).calls == (FunctionCall("get_time", "{}"),)
    for before_a_name in ('[{"name": "get_ti', '{"na', "["):
        assert parse_forced(before_a_name, use) == ParsedReply(before_a_name, ())
    for before_arguments in ('{"name": "get_time"', '{"name": "get_time", "para'):
        text = f"[{before_arguments}" if parallel else before_arguments
        assert parse_forced(text, use).calls == (FunctionCall("get_time", ""),)
    undeclared = '[{"name": "launch", "parameters": {"x' if parallel else '{"name": "launch", "'
    assert parse_forced(undeclared, use).calls == ()


FORCED_OUTPUTS: Any = [
    (NAMED_WEATHER, True, '{"city": "Oslo, Norway"}'),
    (NAMED_WEATHER, True, '{"city"    :"Oslo",\n\n"n":  8888888888888}'),  # as qwen spaced it
    (
        "required",
        True,
        '[{"name": "get_time", "parameters": {}}, '
        '{"name":"get_weather","parameters":{"city":"Oslo"}}]',
    ),
    ("required", False, '{"name": "get_weather", "parameters": {"city": "Oslo"}}'),
]


@pytest.mark.parametrize(("choice", "parallel", "whole"), FORCED_OUTPUTS)
def test_a_forced_call_cut_anywhere_streams_as_it_answers_unstreamed(
    choice: Any, parallel: bool, whole: str
) -> None:
    """Every prefix of a forced output, as `max_tokens` may cut it: the stream's call
    deltas, content and finish reason are the unstreamed answer's."""
    body = {"tool_choice": choice, "parallel_tool_calls": parallel}
    use = _use(**body)
    for end in range(len(whole) + 1):
        text = whole[:end]
        reply = read_reply(text, None, use)
        unstreamed = (
            reply.content or "",
            [(call.name, call.arguments) for call in reply.calls],
            reply.finish_reason("length"),
        )
        splitter = StreamSplitter(use, None)
        content = ""
        joined: dict[int, list[str]] = {}
        for piece in [text[at : at + 3] for at in range(0, len(text), 3)]:
            sent, deltas = splitter.push(piece)
            content += sent or ""
            for delta in deltas or []:
                call = joined.setdefault(delta["index"], ["", ""])
                call[0] += delta["function"].get("name") or ""
                call[1] += delta["function"]["arguments"]
        sent, deltas = splitter.finish()
        content += sent or ""
        for delta in deltas or []:
            call = joined.setdefault(delta["index"], ["", ""])
            call[0] += delta["function"].get("name") or ""
            call[1] += delta["function"]["arguments"]
        streamed = (
            content,
            [(name, arguments) for name, arguments in joined.values()],
            splitter.finish_reason("length"),
        )
        assert streamed == unstreamed, text
        if choice == NAMED_WEATHER:  # a named call is always the call
            assert unstreamed[1] and unstreamed[1][0][0] == "get_weather"
    assert read_reply(whole, None, use).finish_reason("length") == "tool_calls"


def test_required_without_parallel_calls_is_forced_to_exactly_one_call() -> None:
    use = _use(tool_choice="required", parallel_tool_calls=False)
    schema = forced_schema(use)
    assert [item["properties"]["name"]["const"] for item in schema["anyOf"]] == [
        "get_weather",
        "get_time",
    ]
    text = '{"name": "get_time", "parameters": {}}'
    assert [call.name for call in parse_forced(text, use).calls] == ["get_time"]
    assert parse_forced('{"name": "nope", "parameters": {}}', use).calls == ()
    assert parse_forced("[" + text + "]", use).calls == ()  # not the shape it was forced to
    assert parse_forced('{"name": "get_ti', use).content == '{"name": "get_ti'


def test_a_forced_list_of_calls_may_not_be_empty_and_closes_as_soon_as_one_call_is_written() -> (
    None
):
    """Ours' closing bookkeeping understands `minItems`, so a tight budget still closes."""
    output_format = forced_format(_use(tool_choice="required"))
    start = output_format.start()
    assert start is not None
    assert not start.feed(b"[]").valid
    shortest = '[{"name":"get_time","parameters":{}}]'
    assert start.min_close == len(shortest)
    assert start.feed(shortest.encode()).finished
    assert start.feed(b"[").min_close == len(shortest) - 1
    after_one = start.feed(shortest[:-1].encode())
    assert after_one.min_close == 1  # `]`: one call is enough
    assert start.feed(shortest[:-1].encode() + b",").min_close == len(shortest) - 1
    typing_a_required_key = b'[{"name":"get_weather","parameters":{"ci'
    assert start.feed(typing_a_required_key).min_close == len('ty":""}}]')


BYTES_VOCABULARY = vocabulary_from_bytes([bytes([value]) for value in range(256)] + [None])
BYTES_END = 256


@pytest.mark.parametrize("parallel", [True, False])
def test_random_logits_always_give_parseable_calls_within_a_tight_budget(parallel: bool) -> None:
    """A random model on a budget just over the shortest call: every output parses as calls."""
    use = _use(tool_choice="required", parallel_tool_calls=parallel)
    output_format = forced_format(use)
    generator = torch.Generator().manual_seed(7)
    for budget in range(37, 120, 3):
        constrained = ConstrainedRow(output_format, BYTES_VOCABULARY, [BYTES_END], budget)
        text = b""
        for _ in range(budget):
            token = constrained.choose(torch.randn(257, generator=generator), None)
            constrained.took(token)
            if token == BYTES_END:
                break
            text += bytes([token])
            if constrained.finished:
                break
        reply = parse_forced(text.decode("utf-8"), use)
        assert reply.calls and reply.content is None, text
        assert parallel or len(reply.calls) == 1


ORDER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "place_order",
        "parameters": {  # as pydantic writes nested models: `$ref`s into the tool's `$defs`
            "$defs": {
                "Address": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "zip": {"type": "integer"}},
                    "required": ["city", "zip"],
                    "additionalProperties": False,
                },
            },
            "type": "object",
            "properties": {"ship_to": {"$ref": "#/$defs/Address"}},
            "required": ["ship_to"],
            "additionalProperties": False,
        },
    },
}


@pytest.mark.parametrize("parallel", [True, False])
def test_required_enforces_a_tools_references_to_its_own_definitions(parallel: bool) -> None:
    use = parse_tool_use(
        {"tools": [WEATHER, ORDER], "tool_choice": "required", "parallel_tool_calls": parallel}
    )
    assert use is not None
    start = forced_format(use).start()
    assert start is not None
    call = '{"name":"place_order","parameters":{"ship_to":{"city":"Oslo","zip":150}}}'
    wrong = '{"name":"place_order","parameters":{"ship_to":{"city":"Oslo","zip":"x"}}}'
    if parallel:
        call, wrong = f"[{call}]", f"[{wrong}]"
    assert start.feed(call.encode()).finished
    assert not start.feed(wrong.encode()).valid
    (parsed,) = parse_forced(call, use).calls
    assert json.loads(parsed.arguments) == {"ship_to": {"city": "Oslo", "zip": 150}}


def test_required_enforces_a_tools_references_to_itself() -> None:
    """`#` and `#/properties/..` point into the tool's own schema, not the forced list."""
    tree = {
        "type": "object",
        "properties": {
            "label": {"type": "string"},
            "children": {"type": "array", "items": {"$ref": "#"}},
            "first": {"$ref": "#/properties/label"},
        },
        "required": ["label"],
        "additionalProperties": False,
    }
    tool = {"type": "function", "function": {"name": "tree", "parameters": tree}}
    use = parse_tool_use({"tools": [tool], "tool_choice": "required"})
    assert use is not None
    output_format = forced_format(use)
    constrained = ConstrainedRow(output_format, BYTES_VOCABULARY, [BYTES_END], 400)
    good = b'[{"name":"tree","parameters":{"label":"a","children":[{"label":"b"}],"first":"c"}}]'
    bad = b'[{"name":"tree","parameters":{"label":"a","children":[{"name":'
    assert _grammar_accepts(constrained, good)
    assert not _grammar_accepts(
        ConstrainedRow(output_format, BYTES_VOCABULARY, [BYTES_END], 400), bad
    )


def _grammar_accepts(constrained: ConstrainedRow, text: bytes) -> bool:
    """Whether llguidance's grammar lets a byte-per-token model write `text`."""
    for byte in text:
        logits = torch.full((257,), -1e9)
        logits[byte] = 0.0
        if constrained.choose(logits, None) != byte:
            return False
        constrained.took(byte)
    return True


def test_tools_that_compile_alone_but_not_together_are_a_400_naming_tools() -> None:
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(49):  # 99 levels: within the nesting limit alone, not wrapped in the list
        deep = {"type": "object", "properties": {"a": deep}}
    tool = {"type": "function", "function": {"name": "deep", "parameters": deep}}
    named = parse_tool_use(
        {"tools": [tool], "tool_choice": {"type": "function", "function": {"name": "deep"}}}
    )
    assert named is not None
    forced_format(named)
    required = parse_tool_use({"tools": [tool], "tool_choice": "required"})
    assert required is not None
    with pytest.raises(InvalidRequest) as caught:
        forced_format(required)
    assert caught.value.param == "tools"
    assert "nested deeper than the limit of 100 levels" in str(caught.value)


def test_a_forced_schema_compiles_and_an_unenforceable_keyword_is_a_400_naming_it() -> None:
    assert forced_format(_use(tool_choice="required")).schema == forced_schema(
        _use(tool_choice="required")
    )
    unique: dict[str, Any] = {
        "type": "function",
        "function": {
            "name": "code",
            "parameters": {
                "type": "object",
                "properties": {"x": {"type": "array", "uniqueItems": True}},
            },
        },
    }
    use = parse_tool_use({"tools": [WEATHER, unique], "tool_choice": "required"})
    assert use is not None
    with pytest.raises(InvalidRequest) as caught:
        forced_format(use)
    assert caught.value.param == "tools[1].function.parameters"
    assert "uniqueItems" in str(caught.value)
    named = {"type": "function", "function": {"name": "get_weather"}}
    other = parse_tool_use({"tools": [WEATHER, unique], "tool_choice": named})
    assert other is not None and forced_format(other).schema == WEATHER["function"]["parameters"]


def test_a_tools_pattern_keyword_is_now_enforced_not_refused() -> None:
    pattern: dict[str, Any] = {
        "type": "function",
        "function": {
            "name": "code",
            "parameters": {
                "type": "object",
                "properties": {"x": {"type": "string", "pattern": "^[a-z]+$"}},
                "required": ["x"],
            },
        },
    }
    use = parse_tool_use({"tools": [pattern], "tool_choice": "required"})
    assert use is not None
    assert forced_format(use).schema == forced_schema(use)


# ----- streaming -----
def _stream(pieces: list[str], call_format: CallFormat | None, **body: Any) -> tuple[str, Any]:
    splitter = StreamSplitter(_use(**body), call_format)
    content = ""
    deltas: list[dict[str, Any]] = []
    for piece in [*pieces, None]:
        text, calls = splitter.finish() if piece is None else splitter.push(piece)
        content += text or ""
        deltas += calls or []
    return content, deltas


def test_a_hermes_stream_sends_text_at_once_and_holds_the_call() -> None:
    splitter = StreamSplitter(_use(), CallFormat.HERMES)
    assert splitter.push("Let me ") == ("Let me", None)  # a space: held until text follows
    assert splitter.push("look.<tool") == (" look.", None)  # may be the marker: held
    assert splitter.push('_call>{"name": "get_time", ') == (None, None)
    assert splitter.push('"arguments": {}}</tool_call>') == (None, None)
    text, calls = splitter.finish()
    assert text is None and calls is not None
    assert splitter.finish_reason("stop") == "tool_calls"
    assert calls[0]["index"] == 0 and calls[0]["id"].startswith("call_")
    assert calls[0]["function"] == {"name": "get_time", "arguments": "{}"}


def test_a_held_marker_that_is_no_call_goes_out_as_content() -> None:
    pieces = ["a <tool", " b", ' <tool_call>{"name": "x"']
    assert _stream(pieces, CallFormat.HERMES) == ("".join(pieces), [])


def test_a_llama3_stream_holds_an_answer_that_opens_with_a_brace() -> None:
    content, deltas = _stream(
        ['{"name": "get_time", ', '"parameters": {}}'], CallFormat.LLAMA3_JSON
    )
    assert content == "" and deltas[0]["function"]["name"] == "get_time"
    assert _stream(["Hello", " {x}"], CallFormat.LLAMA3_JSON) == ("Hello {x}", [])


def test_a_named_stream_sends_arguments_as_they_come() -> None:
    use = {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    content, deltas = _stream(['{"city"', ': "Oslo"}'], None, **use)
    assert content == ""
    assert deltas[0]["id"].startswith("call_") and deltas[0]["function"]["name"] == "get_weather"
    assert "id" not in deltas[1]
    assert "".join(d["function"]["arguments"] for d in deltas) == '{"city": "Oslo"}'


@pytest.mark.parametrize("call_format", [None, *CallFormat])
def test_a_required_stream_holds_everything_until_the_end(call_format: CallFormat | None) -> None:
    pieces = ['{"name": "get_time", ', '"parameters": {}}']
    content, deltas = _stream(
        pieces, call_format, tool_choice="required", parallel_tool_calls=False
    )
    assert content == "" and [d["function"]["name"] for d in deltas] == ["get_time"]


def test_a_required_stream_sends_each_call_as_its_own_delta_in_order() -> None:
    pieces = [
        '[{"name": "get_time", "parameters": {}}, ',
        '{"name": "get_weather", ',
        '"parameters": {"city": "Oslo"}}]',
    ]
    content, deltas = _stream(pieces, None, tool_choice="required")
    assert content == ""
    assert [(d["index"], d["function"]["name"]) for d in deltas] == [
        (0, "get_time"),
        (1, "get_weather"),
    ]
    assert deltas[0]["id"] != deltas[1]["id"] and all(d["id"].startswith("call_") for d in deltas)
    assert json.loads(deltas[1]["function"]["arguments"]) == {"city": "Oslo"}


# ----- hostile input -----
DEEP = "[" * 100_000 + "]" * 100_000


def test_deeply_nested_history_arguments_are_a_400_not_a_crash() -> None:
    call = {**CALL, "function": {"name": "get_weather", "arguments": DEEP}}
    with pytest.raises(InvalidRequest) as caught:
        _chat(messages=[{"role": "assistant", "content": None, "tool_calls": [call]}])
    assert caught.value.param == "messages[0].tool_calls[0].function.arguments"


@pytest.mark.parametrize("call_format", list(CallFormat))
def test_a_deeply_nested_reply_stays_content(call_format: CallFormat) -> None:
    for text in (DEEP, f"<tool_call>{DEEP}</tool_call>", f"[TOOL_CALLS]{DEEP}"):
        assert read_reply(text, call_format, _use()).content == text
    assert read_reply(DEEP, None, _use(tool_choice="required")).calls == ()


def test_a_deeply_nested_forced_schema_is_a_400_naming_it() -> None:
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(2_000):
        schema = {"type": "object", "properties": {"x": schema}}
    deep = {"type": "function", "function": {"name": "deep", "parameters": schema}}
    use = parse_tool_use({"tools": [deep], "tool_choice": "required"})
    assert use is not None
    with pytest.raises(InvalidRequest) as caught:
        forced_format(use)
    assert caught.value.param == "tools[0].function.parameters"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(
    body=st.dictionaries(
        st.sampled_from(["tools", "tool_choice", "parallel_tool_calls"]), json_values
    )
)
def test_any_tools_body_parses_or_is_a_400(body: dict[str, Any]) -> None:
    try:
        parse_tool_use(body)
    except InvalidRequest as error:
        assert error.param is not None


@settings(max_examples=300, deadline=None)
@given(
    pieces=st.lists(
        st.sampled_from(["<tool", "_call>", "</tool_call>", "{", "}", '"name"', ": ", "x", " "])
        | st.text(max_size=6),
        max_size=12,
    ),
    call_format=st.sampled_from([None, *CallFormat]),
)
def test_a_stream_without_calls_sends_the_whole_text_as_content(
    pieces: list[str], call_format: CallFormat | None
) -> None:
    use = _use()
    text = "".join(pieces)
    content, deltas = _stream(pieces, call_format)
    if read_reply(text, call_format, use).calls:
        assert deltas and all(d["function"]["name"] in ("get_weather", "get_time") for d in deltas)
    else:
        assert content == text and deltas == []


def _strict(tool: dict[str, Any]) -> dict[str, Any]:
    return {**tool, "function": {**tool["function"], "strict": True}}


def test_strict_under_auto_is_a_400_naming_it_and_forced_calls_keep_it() -> None:
    """Under auto the model writes a call freely: strict would be a promise not kept."""
    for choice in (None, "auto"):
        with pytest.raises(InvalidRequest) as caught:
            parse_tool_use({"tools": [WEATHER, _strict(TIME)], "tool_choice": choice})
        assert caught.value.param == "tools[1].function.strict"
        assert "'required'" in caught.value.message
    strict_off = {**TIME, "function": {**TIME["function"], "strict": False}}
    assert parse_tool_use({"tools": [WEATHER, strict_off]}) is not None
    named = {"type": "function", "function": {"name": "get_time"}}
    for choice in ("required", named, "none"):
        use = parse_tool_use({"tools": [WEATHER, _strict(TIME)], "tool_choice": choice})
        assert use is not None and use.tools[1].strict


@pytest.mark.parametrize("call_format", [CallFormat.HERMES, CallFormat.MISTRAL])
def test_a_json_answer_that_forbids_the_call_format_is_a_400_naming_response_format(
    call_format: CallFormat,
) -> None:
    """Hermes' `<tool_call>` and Mistral's `[TOOL_CALLS]` are not JSON: under `auto` a
    JSON `response_format` would leave the tools uncallable, silently."""
    for choice in (None, "auto"):
        with pytest.raises(InvalidRequest) as caught:
            check_json_answer(_use(tool_choice=choice), call_format)
        assert caught.value.param == "response_format"
        assert MARKERS[call_format] in caught.value.message
    check_json_answer(_use(tool_choice="none"), call_format)


def test_a_json_answer_keeps_llama3s_json_calls_callable() -> None:
    check_json_answer(_use(), CallFormat.LLAMA3_JSON)
    check_json_answer(None, CallFormat.HERMES)


def _no_constants(name: str) -> Any:
    raise AssertionError(f"{name} in arguments: not JSON")


@pytest.mark.parametrize(
    ("choice", "call_format", "text"),
    [
        (NAMED_WEATHER, None, '{"city": "a", "n": 9e99999999}'),
        ("required", None, '[{"name": "get_weather", "parameters": {"n": -1E999}}]'),
        (
            "auto",
            CallFormat.HERMES,
            '<tool_call>{"name": "get_weather", "arguments": {"n": 1e400}}</tool_call>',
        ),
        ("auto", CallFormat.LLAMA3_JSON, '{"name": "get_weather", "parameters": {"n": 1e400}}'),
    ],
)
def test_a_number_past_a_float_stays_json_in_the_arguments(
    choice: Any, call_format: CallFormat | None, text: str
) -> None:
    """A number too big for a double is a JSON number: the arguments a client parses
    (JSON.parse, pydantic) must not say `Infinity`."""
    reply = read_reply(text, call_format, _use(tool_choice=choice))
    assert reply.calls
    arguments = json.loads(reply.calls[0].arguments, parse_constant=_no_constants)
    assert "Infinity" not in reply.calls[0].arguments and arguments


def test_nan_or_infinity_written_by_a_model_is_not_a_call() -> None:
    text = '<tool_call>{"name": "get_weather", "arguments": {"n": NaN}}</tool_call>'
    reply = read_reply(text, CallFormat.HERMES, _use(tool_choice="auto"))
    assert reply.calls == () and reply.content == text


HERMES_CALL_TEXT = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
MISTRAL_CALL_TEXT = '[TOOL_CALLS][{"name": "get_time", "arguments": {}}]'


@settings(max_examples=400, deadline=None)
@example(pieces=["Let me check.", "\n", HERMES_CALL_TEXT, "\n"], call_format=CallFormat.HERMES)
@example(pieces=["\n\n", HERMES_CALL_TEXT, "\n", HERMES_CALL_TEXT], call_format=CallFormat.HERMES)
@example(pieces=["Hi\n", HERMES_CALL_TEXT, "\nmore\n"], call_format=CallFormat.HERMES)
@example(pieces=[" Sure.\n", MISTRAL_CALL_TEXT], call_format=CallFormat.MISTRAL)
@given(
    pieces=st.lists(
        st.sampled_from(
            [HERMES_CALL_TEXT, MISTRAL_CALL_TEXT, "<tool", "_call>", "\n", " ", "\n\n", "Hi", "x."]
        ),
        max_size=10,
    ),
    call_format=st.sampled_from([None, *CallFormat]),
)
def test_streamed_content_joins_to_the_unstreamed_content(
    pieces: list[str], call_format: CallFormat | None
) -> None:
    """Whitespace around calls included: the deltas join to `message.content` exactly."""
    use = _use()
    text = "".join(pieces)
    reply = read_reply(text, call_format, use)
    unstreamed = (reply.content or "") if reply.calls else text
    content, deltas = _stream(pieces, call_format)
    assert content == unstreamed
    assert len(deltas) == len(reply.calls)


def test_a_hermes_reply_keeps_no_newline_around_its_calls_streamed_or_not() -> None:
    text = "Let me check.\n" + HERMES_CALL_TEXT + "\n"
    assert read_reply(text, CallFormat.HERMES, _use()).content == "Let me check."
    assert _stream(["Let me check.", "\n", HERMES_CALL_TEXT, "\n"], CallFormat.HERMES)[0] == (
        "Let me check."
    )
