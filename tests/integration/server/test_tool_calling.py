"""Tool calling through the official openai client against a real server on a zoo family.

Qwen 2.5's template (written here in the family's format) lists the tools in
`<tools>`, writes earlier calls in `<tool_call>` and results in
`<tool_response>`; Llama 3's lists them in a system turn, writes calls as
JSON and results in an `ipython` turn. The model is random: what it says is noise, so these tests
hold the server to what it controls: the conversation with tools and tool
turns reaches the model exactly as the template renders it, a forced call
comes back as a call whose arguments parse and match the schema (streamed
and not), and what cannot be served is a 400 naming the parameter.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pydantic
import pytest
from fusebox_server_harness import MODEL_NAME, ServerProcess, streamed_calls, zoo_server

from fusebox_contract.admin import DegradationRequest
from fusebox_contract.names import DegradationLevel
from fusebox_server.zoo.release import ensure_zoo_model

RESULT_TURNS = {"qwen2.5": "<tool_response>", "llama3": "<|start_header_id|>ipython"}
"""Each family with a tool format, and how its template marks a tool's result."""
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer"},
            },
            "required": ["city", "unit", "days"],
            "additionalProperties": False,
        },
    },
}
TIME: Any = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string"}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, TIME]
CALL: Any = {
    "id": "call_7",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "celsius"}'},
}
CONVERSATION: Any = [
    {"role": "system", "content": "You answer with tools."},
    {"role": "user", "content": "What is the weather in Oslo?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_7", "content": '{"temperature": 21}'},
]


@pytest.fixture(scope="module", params=sorted(RESULT_TURNS))
def family(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture(scope="module")
def family_server(family: str, server_workdir: Path) -> Iterator[ServerProcess]:
    with zoo_server(family, server_workdir, max_new_tokens=128) as server:
        yield server


@pytest.fixture(scope="module")
def client(family_server: ServerProcess) -> Iterator[openai.OpenAI]:
    url = f"{family_server.url}/v1"
    with openai.OpenAI(base_url=url, api_key="unused", max_retries=0) as client:
        yield client


def chat(client: openai.OpenAI, **fields: Any) -> Any:
    arguments: dict[str, Any] = {
        "model": MODEL_NAME,
        "messages": CONVERSATION,
        "tools": TOOLS,
        "max_tokens": 16,
        "temperature": 0,
    }
    arguments.update(fields)
    return client.chat.completions.create(**arguments)


def _template_tokens(family: str, messages: Any, tools: Any) -> int:
    """The conversation's prompt as transformers renders it with the release's template
    (history arguments decoded, as templates read them)."""
    from transformers import AutoTokenizer

    tokenizer: Any = AutoTokenizer.from_pretrained(
        str(ensure_zoo_model(family)), local_files_only=True
    )
    decoded = json.loads(json.dumps(messages))
    for message in decoded:
        for call in message.get("tool_calls") or []:
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
        if message["content"] is None:
            message["content"] = ""
    text = tokenizer.apply_chat_template(
        decoded, tools=tools, tokenize=False, add_generation_prompt=True
    )
    assert RESULT_TURNS[family] in text and '"city": "Oslo"' in text
    assert ("get_time" in text) == bool(tools)
    return len(tokenizer.encode(text, add_special_tokens=False))


def test_a_conversation_with_tool_turns_reaches_the_model_as_the_template_renders_it(
    client: openai.OpenAI, family: str
) -> None:
    answer = chat(client)
    assert answer.usage.prompt_tokens == _template_tokens(family, CONVERSATION, TOOLS)
    choice = answer.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    without_tools = chat(client, tools=None)
    assert without_tools.usage.prompt_tokens == _template_tokens(family, CONVERSATION, None)
    assert without_tools.usage.prompt_tokens < answer.usage.prompt_tokens


def _check_weather_arguments(arguments: str) -> None:
    value = json.loads(arguments)
    assert set(value) == {"city", "unit", "days"}
    assert isinstance(value["city"], str) and value["unit"] in ("celsius", "fahrenheit")
    assert isinstance(value["days"], int) and not isinstance(value["days"], bool)


NAMED: Any = {"type": "function", "function": {"name": "get_weather"}}


def test_a_named_function_comes_back_as_its_call(client: openai.OpenAI) -> None:
    answer = chat(client, tool_choice=NAMED, max_tokens=96)
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "get_weather"
    _check_weather_arguments(call.function.arguments)


def test_a_named_function_streams_as_call_deltas(client: openai.OpenAI) -> None:
    chunks = list(chat(client, tool_choice=NAMED, max_tokens=96, stream=True))
    calls, finishes, content = streamed_calls(chunks)
    assert content == "" and finishes[-1] == "tool_calls"
    assert list(calls) == [0] and calls[0]["name"] == "get_weather"
    assert calls[0]["id"].startswith("call_")
    _check_weather_arguments(calls[0]["arguments"])
    argument_chunks = [c for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert len(argument_chunks) > 1, "the arguments did not stream piece by piece"


def test_a_named_call_cut_by_max_tokens_is_its_call_with_finish_reason_length(
    client: openai.OpenAI,
) -> None:
    """As OpenAI answers a forced function cut by `max_tokens`: the call, its arguments
    as far as they were written, and `length`; the stream and the whole answer agree."""
    answer = chat(client, tool_choice=NAMED, max_tokens=3)
    choice = answer.choices[0]
    assert choice.finish_reason == "length" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.function.name == "get_weather"
    arguments = call.function.arguments
    assert arguments.startswith("{") and answer.usage.completion_tokens == 3
    with pytest.raises(json.JSONDecodeError):
        json.loads(arguments)
    streamed, finishes, content = streamed_calls(
        chat(client, tool_choice=NAMED, max_tokens=3, stream=True)
    )
    assert content == "" and finishes[-1] == "length"
    assert [(c["name"], c["arguments"]) for c in streamed.values()] == [("get_weather", arguments)]


def _answer_and_stream(client: openai.OpenAI, **fields: Any) -> tuple[Any, Any]:
    """(finish_reason, calls, content) of the same greedy request, whole and streamed."""
    choice = chat(client, **fields).choices[0]
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    answered = (choice.finish_reason, calls, choice.message.content or "")
    streamed, finishes, content = streamed_calls(chat(client, stream=True, **fields))
    joined = [(call["name"], call["arguments"]) for call in streamed.values()]
    return answered, (finishes[-1], joined, content)


def test_a_required_call_cut_short_answers_alike_streamed_or_not(client: openai.OpenAI) -> None:
    """A forced list cut before it closed: the call being written, named, with its
    arguments as far as they go, and the generation's finish reason, streamed or not.
    A stop sequence on the tools' first argument names cuts it inside the arguments
    (a random model under the grammar pads every gap, so `max_tokens` cuts it before
    the arguments, then closes it in time)."""
    answered, streamed = _answer_and_stream(
        client, tool_choice="required", max_tokens=128, stop=['"city"', '"zone"']
    )
    assert answered == streamed
    finish_reason, calls, content = answered
    assert finish_reason == "stop" and content == ""
    (name, arguments), *_ = calls
    assert name in ("get_weather", "get_time") and arguments.startswith("{")
    with pytest.raises(json.JSONDecodeError):
        json.loads(arguments)
    cut_calls = []
    for max_tokens in (3, 30, 44, 46):  # before a name, after it, then closed in time
        answered, streamed = _answer_and_stream(
            client, tool_choice="required", max_tokens=max_tokens
        )
        assert answered == streamed, max_tokens
        finish_reason, calls, content = answered
        assert bool(calls) != bool(content), answered  # cut before any name: content
        if finish_reason == "length" and calls:
            cut_calls.append(calls[-1])
        else:
            assert finish_reason == ("tool_calls" if calls else "length"), answered
    assert cut_calls, "no budget cut the list after a call's name"
    assert all(name in ("get_weather", "get_time") for name, _ in cut_calls)


def _check_declared_call(name: str, arguments: str) -> None:
    if name == "get_weather":
        _check_weather_arguments(arguments)
    else:
        assert name == "get_time" and set(json.loads(arguments)) == {"zone"}


def test_required_comes_back_as_one_or_more_calls_of_declared_tools(
    client: openai.OpenAI,
) -> None:
    answer = chat(client, tool_choice="required", max_tokens=128)
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = choice.message.tool_calls
    assert calls, "required gave no call"
    assert len({call.id for call in calls}) == len(calls)
    for call in calls:
        assert call.id.startswith("call_") and call.type == "function"
        _check_declared_call(call.function.name, call.function.arguments)
    streamed, finishes, content = streamed_calls(
        chat(client, tool_choice="required", max_tokens=128, stream=True)
    )
    assert content == "" and finishes[-1] == "tool_calls"
    assert list(streamed) == list(range(len(streamed))) and streamed
    assert len({call["id"] for call in streamed.values()}) == len(streamed)
    for call in streamed.values():
        _check_declared_call(call["name"], call["arguments"])
    # Greedy decoding of the same request: the stream's calls are the answer's calls.
    assert [(c["name"], c["arguments"]) for c in streamed.values()] == [
        (call.function.name, call.function.arguments) for call in calls
    ]


PING: Any = {
    "type": "function",
    "function": {
        "name": "ping",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
    },
}
"""A call with nothing random in it but its spacing: after each one the model only picks
`,` (another call) or `]`, so a random model writes several within the budget."""


def test_required_gives_several_calls_when_the_model_writes_several(
    client: openai.OpenAI,
) -> None:
    counts = []
    for seed in range(6):
        answer = chat(
            client,
            tools=[PING, TIME],
            tool_choice="required",
            max_tokens=128,
            temperature=1.0,
            seed=seed,
        )
        choice = answer.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
        for call in choice.message.tool_calls:
            assert call.function.name in ("ping", "get_time")
            expected = set() if call.function.name == "ping" else {"zone"}
            assert set(json.loads(call.function.arguments)) == expected
        counts.append(len(choice.message.tool_calls))
    assert max(counts) > 1, counts
    streamed, finishes, _ = streamed_calls(
        chat(client, tools=[PING], tool_choice="required", max_tokens=128, stream=True)
    )
    assert finishes[-1] == "tool_calls" and list(streamed) == list(range(len(streamed)))
    assert all(call["name"] == "ping" and call["arguments"] == "{}" for call in streamed.values())


def test_required_without_parallel_calls_gives_exactly_one_call(client: openai.OpenAI) -> None:
    for temperature, seed in ((0.0, None), (1.0, 3), (1.0, 5)):
        answer = chat(
            client,
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=128,
            temperature=temperature,
            seed=seed,
        )
        choice = answer.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        (call,) = choice.message.tool_calls
        assert call.id.startswith("call_")
        _check_declared_call(call.function.name, call.function.arguments)
    streamed, finishes, content = streamed_calls(
        chat(client, tool_choice="required", parallel_tool_calls=False, max_tokens=128, stream=True)
    )
    assert content == "" and finishes[-1] == "tool_calls" and list(streamed) == [0]
    assert streamed[0]["id"].startswith("call_")
    _check_declared_call(streamed[0]["name"], streamed[0]["arguments"])


class Address(pydantic.BaseModel):
    city: str
    zip: int


class Order(pydantic.BaseModel):
    ship_to: Address
    items: list[Address]


def test_required_enforces_a_pydantic_tool_with_nested_models(client: openai.OpenAI) -> None:
    """pydantic writes nested models as `$ref`s into the tool's `$defs`: the forced list
    of calls still enforces them (they are rebased, not left pointing at its root)."""
    tool = openai.pydantic_function_tool(Order)
    for stream in (False, True):
        answer = chat(client, tools=[tool], tool_choice="required", max_tokens=128, stream=stream)
        if stream:
            streamed, finishes, _ = streamed_calls(answer)
            assert finishes[-1] == "tool_calls"
            calls = [(call["name"], call["arguments"]) for call in streamed.values()]
        else:
            assert answer.choices[0].finish_reason == "tool_calls"
            calls = [
                (c.function.name, c.function.arguments)
                for c in answer.choices[0].message.tool_calls
            ]
        assert calls
        for name, arguments in calls:
            assert name == "Order"
            Order.model_validate_json(arguments)


def test_a_strict_tool_under_auto_is_a_400_naming_strict(client: openai.OpenAI) -> None:
    """`pydantic_function_tool` sends strict: true; under auto nothing would enforce it."""
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, tools=[WEATHER, openai.pydantic_function_tool(Order)])
    assert caught.value.param == "tools[1].function.strict"


def test_an_unknown_named_function_is_a_400_naming_tool_choice(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, tool_choice={"type": "function", "function": {"name": "launch"}})
    assert caught.value.param == "tool_choice" and "launch" in caught.value.message


def test_a_malformed_history_call_is_a_400_naming_its_path(client: openai.OpenAI) -> None:
    broken = [*CONVERSATION]
    broken[2] = {**CALL, "function": {"name": "get_weather", "arguments": "{oops"}}
    broken[2] = {"role": "assistant", "content": None, "tool_calls": [broken[2]]}
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, messages=broken)
    assert caught.value.param == "messages[2].tool_calls[0].function.arguments"


# Only Llama 3's call format is plain JSON, which a response_format can shape.
@pytest.mark.parametrize("family", ["llama3"], indirect=True)
def test_a_llama3_answer_in_its_call_format_comes_back_as_a_call(client: openai.OpenAI) -> None:
    """`auto` reads the model's own call format. Llama 3 writes a call as a bare JSON
    object, so a `response_format` schema of that object makes even the random model
    write one; the server must read it back as a call, not as content."""
    call_schema = {
        "type": "object",
        "properties": {
            "name": {"const": "get_time"},
            "parameters": TIME["function"]["parameters"],
        },
        "required": ["name", "parameters"],
        "additionalProperties": False,
    }
    shaped = {"type": "json_schema", "json_schema": {"name": "call", "schema": call_schema}}
    answer = chat(client, response_format=shaped, max_tokens=64)
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_time"
    assert set(json.loads(call.function.arguments)) == {"zone"}
    streamed, finishes, content = streamed_calls(
        chat(client, response_format=shaped, max_tokens=64, stream=True)
    )
    assert content == "" and finishes[-1] == "tool_calls"
    assert streamed[0]["name"] == "get_time" and streamed[0]["arguments"] == call.function.arguments
    undeclared = chat(client, tools=[WEATHER], response_format=shaped, max_tokens=64).choices[0]
    assert not undeclared.message.tool_calls and undeclared.finish_reason == "stop"
    assert json.loads(undeclared.message.content)["name"] == "get_time"  # stays content


# Qwen 2.5 (Hermes) writes a call as `<tool_call>` text, which no JSON document holds.
@pytest.mark.parametrize("family", ["qwen2.5"], indirect=True)
def test_a_json_response_format_that_forbids_the_call_format_is_a_400_under_auto(
    client: openai.OpenAI,
) -> None:
    """Under `auto` the JSON grammar would forbid `<tool_call>`: the tools could never
    be called, so the request is refused naming `response_format`, not silently served."""
    shaped = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    for response_format in ({"type": "json_object"}, shaped):
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as caught:
                chat(client, response_format=response_format, stream=stream)
            assert caught.value.param == "response_format"
            assert "<tool_call>" in caught.value.message
    answer = chat(client, response_format={"type": "json_object"}, tool_choice="none")
    assert isinstance(json.loads(answer.choices[0].message.content), dict)  # only JSON wanted
    assert chat(client, response_format={"type": "text"}).choices[0].finish_reason


def test_the_no_streaming_tier_sends_a_forced_call_whole_in_one_chunk(
    client: openai.OpenAI, family_server: ServerProcess
) -> None:
    family_server.send(DegradationRequest(DegradationLevel.NO_STREAMING)).raise_for_status()
    try:
        chunks = list(chat(client, tool_choice=NAMED, max_tokens=96, stream=True))
    finally:
        family_server.reset_runtime()
    with_calls = [c for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert len(with_calls) == 1, "under no-streaming the call comes whole, in one chunk"
    (delta,) = with_calls[0].choices[0].delta.tool_calls
    assert delta.index == 0 and delta.id and delta.function.name == "get_weather"
    _check_weather_arguments(delta.function.arguments or "")
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_tool_choice_none_shows_the_tools_and_reads_no_calls(
    client: openai.OpenAI, family: str
) -> None:
    """`none` still renders the tools (the history refers to them); a call-shaped answer
    (Llama 3's JSON, made by a response_format) stays content."""
    answer = chat(client, tool_choice="none")
    assert answer.usage.prompt_tokens == _template_tokens(family, CONVERSATION, TOOLS)
    assert not answer.choices[0].message.tool_calls
    if family == "llama3":
        shape = {
            "type": "object",
            "properties": {
                "name": {"const": "get_time"},
                "parameters": TIME["function"]["parameters"],
            },
            "required": ["name", "parameters"],
            "additionalProperties": False,
        }
        shaped = {"type": "json_schema", "json_schema": {"name": "call", "schema": shape}}
        text = chat(client, tool_choice="none", response_format=shaped, max_tokens=64)
        assert not text.choices[0].message.tool_calls
        assert json.loads(text.choices[0].message.content)["name"] == "get_time"
