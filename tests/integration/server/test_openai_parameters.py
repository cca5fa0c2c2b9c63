"""Each row of the parameter table, through the official openai client against a real server.

Honoured rows show their effect; refused rows get a 400 whose `error.param`
names them; client-side rows show what reaches the server. A test keeps
every row of `openai_parameters.PARAMETERS` covered here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from fusebox_server_harness import MODEL_NAME, ServerProcess

from fusebox_server.http.openai_parameters import PARAMETERS, Treatment
from fusebox_server.http.rendering import Kind
from fusebox_server.model.tiny_model import ensure_model
from fusebox_server.model.tokenization import load_tokenizer

PROMPT = "Tell me about the river"
MESSAGES: list[Any] = [{"role": "user", "content": PROMPT}]


@pytest.fixture(scope="module")
def checked_server(start_server: Any, server_workdir: Path) -> ServerProcess:
    """Every response quality-checked, so response_format's effect shows in the log."""
    quality = server_workdir / "quality-every-response.json"
    quality.write_text(json.dumps({"sampleRate": 1.0}))
    server: ServerProcess = start_server(
        flags={"max-new-tokens": 64, "max-input-tokens": 256, "quality-file": str(quality)}
    )
    return server


@pytest.fixture(scope="module")
def client(checked_server: ServerProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{checked_server.url}/v1", api_key="unused", max_retries=0
    ) as client:
        yield client


def chat(client: openai.OpenAI, **fields: Any) -> Any:
    arguments: dict[str, Any] = {
        "model": MODEL_NAME,
        "messages": MESSAGES,
        "max_tokens": 8,
        "temperature": 0,
    }
    arguments.update(fields)
    return client.chat.completions.create(**arguments)


def complete(client: openai.OpenAI, **fields: Any) -> Any:
    arguments: dict[str, Any] = {
        "model": MODEL_NAME,
        "prompt": PROMPT,
        "max_tokens": 8,
        "temperature": 0,
    }
    arguments.update(fields)
    return client.completions.create(**arguments)


def log_lines(server: ServerProcess, request_id: str) -> list[dict[str, Any]]:
    lines = []
    for line in server.log_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("request_id") == request_id:
            lines.append(entry)
    return lines


def request_line(server: ServerProcess, request_id: str) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        return next((e for e in log_lines(server, request_id) if e["event"] == "request"), None)

    line: dict[str, Any] = server.wait_for(found, what=f"the request line of {request_id}")
    return line


# ----- honoured rows: each shows its effect -----
def check_model(client: openai.OpenAI, server: ServerProcess) -> None:
    assert chat(client).model == MODEL_NAME
    with pytest.raises(openai.NotFoundError) as caught:
        chat(client, model="not-served")
    assert caught.value.param == "model"


def check_messages(client: openai.OpenAI, server: ServerProcess) -> None:
    short = chat(client, messages=[{"role": "user", "content": "hi"}])
    longer = chat(client, messages=[*MESSAGES, {"role": "user", "content": PROMPT}])
    assert longer.usage.prompt_tokens > short.usage.prompt_tokens


def check_prompt(client: openai.OpenAI, server: ServerProcess) -> None:
    short = complete(client, prompt="hi")
    longer = complete(client, prompt=PROMPT * 3)
    assert longer.usage.prompt_tokens > short.usage.prompt_tokens
    assert complete(client, prompt=[PROMPT]).choices[0].text == complete(client).choices[0].text


def check_max_tokens(client: openai.OpenAI, server: ServerProcess) -> None:
    assert chat(client, max_tokens=2).usage.completion_tokens <= 2
    assert complete(client, max_tokens=2).usage.completion_tokens <= 2
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, max_tokens=65)
    assert caught.value.param == "max_tokens"


def check_max_completion_tokens(client: openai.OpenAI, server: ServerProcess) -> None:
    capped = chat(client, max_tokens=None, max_completion_tokens=2)
    assert capped.usage.completion_tokens <= 2
    assert chat(client, max_tokens=2, max_completion_tokens=2).usage.completion_tokens <= 2
    with pytest.raises(openai.BadRequestError) as differ:
        chat(client, max_tokens=16, max_completion_tokens=2)
    assert differ.value.param == "max_completion_tokens" and "max_tokens" in differ.value.message
    with pytest.raises(openai.BadRequestError) as negative:
        chat(client, max_tokens=-5, max_completion_tokens=2)
    assert negative.value.param == "max_tokens"
    with pytest.raises(openai.UnprocessableEntityError) as wrong_type:  # as any non-integer
        chat(client, max_tokens="abc", max_completion_tokens=2)
    assert wrong_type.value.param == "max_tokens"


def check_temperature(client: openai.OpenAI, server: ServerProcess) -> None:
    greedy = [chat(client, temperature=0, max_tokens=16).choices[0].message.content for _ in "ab"]
    assert greedy[0] == greedy[1]
    hot = {
        chat(client, temperature=2, seed=seed, max_tokens=16).choices[0].message.content
        for seed in range(4)
    }
    assert hot - {greedy[0]}, "temperature 2 never left the greedy path"


def check_top_p(client: openai.OpenAI, server: ServerProcess) -> None:
    greedy = chat(client, temperature=0, max_tokens=16).choices[0].message.content
    nucleus = chat(client, temperature=2, top_p=1e-9, seed=3, max_tokens=16)
    assert nucleus.choices[0].message.content == greedy


def check_seed(client: openai.OpenAI, server: ServerProcess) -> None:
    def sample(seed: int) -> str:
        content: str = (
            chat(client, temperature=2, seed=seed, max_tokens=16).choices[0].message.content
        )
        return content

    assert sample(11) == sample(11)
    assert len({sample(seed) for seed in range(4)}) > 1


def check_stop(client: openai.OpenAI, server: ServerProcess) -> None:
    text: str = chat(client, max_tokens=16).choices[0].message.content
    assert len(text) >= 4, text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    stopped = chat(client, max_tokens=16, stop=[stop]).choices[0]
    assert stopped.message.content == text[: text.find(stop)]
    assert stopped.finish_reason == "stop"
    # One token's text holding two stops: the text ends at the earlier one in the text,
    # whatever the order of the list.
    scored = chat(client, max_tokens=16, logprobs=True).choices[0].logprobs.content
    offset = 0
    for score in scored:
        first, last = score.token[:1], score.token[-1:]
        if first != last and first not in text[:offset] and last not in text[:offset]:
            break
        offset += len(score.token)
    else:
        pytest.fail(f"no token with two new characters in {text!r}")
    stopped = chat(client, max_tokens=16, stop=[last, first]).choices[0]
    assert stopped.message.content == text[:offset] and stopped.finish_reason == "stop"


def check_n(client: openai.OpenAI, server: ServerProcess) -> None:
    hot = {"temperature": 1.5, "max_tokens": 12}
    three = chat(client, n=3, seed=5, **hot)
    assert [choice.index for choice in three.choices] == [0, 1, 2]
    texts = [choice.message.content for choice in three.choices]
    assert len(set(texts)) > 1, "three seeded choices came out the same"
    assert [c.message.content for c in chat(client, n=3, seed=5, **hot).choices] == texts
    # Choice i samples with seed + i: each is the n=1 answer of that seed.
    alone = [chat(client, seed=5 + index, **hot) for index in range(3)]
    assert [single.choices[0].message.content for single in alone] == texts
    assert three.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
    completions = complete(client, n=2, seed=9, logprobs=1, **hot)
    assert [c.text for c in completions.choices] == [
        complete(client, seed=9 + index, **hot).choices[0].text for index in range(2)
    ]
    assert all(len(c.logprobs.tokens or []) > 0 for c in completions.choices)  # type: ignore[union-attr]
    pieces: dict[int, str] = {}
    for chunk in complete(client, n=2, seed=9, stream=True, **hot):
        for part in chunk.choices:
            pieces[part.index] = pieces.get(part.index, "") + part.text
    assert [pieces[index] for index in range(2)] == [c.text for c in completions.choices]
    streamed: dict[int, str] = {}
    finishes: dict[int, str | None] = {}
    for chunk in chat(client, n=3, seed=5, stream=True, **hot):
        for choice in chunk.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + (choice.delta.content or "")
            finishes[choice.index] = choice.finish_reason or finishes.get(choice.index)
    assert [streamed[index] for index in range(3)] == texts
    assert all(finishes[index] in ("stop", "length") for index in range(3))
    for too_many in (0, 9):  # the server runs 8 generations at once
        with pytest.raises(openai.BadRequestError) as caught:
            chat(client, n=too_many)
        assert caught.value.param == "n"


def check_presence_penalty(client: openai.OpenAI, server: ServerProcess) -> None:
    plain = complete(client, max_tokens=32).choices[0].text
    assert complete(client, max_tokens=32, presence_penalty=2).choices[0].text != plain
    assert complete(client, max_tokens=32, presence_penalty=0).choices[0].text == plain
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, presence_penalty=2.5)
    assert caught.value.param == "presence_penalty"


def check_frequency_penalty(client: openai.OpenAI, server: ServerProcess) -> None:
    plain = chat(client, max_tokens=32)
    penalised = chat(client, max_tokens=32, frequency_penalty=2)
    assert penalised.choices[0].message.content != plain.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as caught:
        complete(client, frequency_penalty=-3)
    assert caught.value.param == "frequency_penalty"


def check_logit_bias(client: openai.OpenAI, server: ServerProcess) -> None:
    forced = complete(client, max_tokens=4, logit_bias={"42": 100}, logprobs=0).choices[0]
    assert forced.logprobs is not None and forced.logprobs.tokens is not None
    token = forced.logprobs.tokens[0]
    assert forced.logprobs.tokens == [token] * 4 and forced.text == token * 4
    first = chat(client, max_tokens=1, logprobs=True).choices[0].logprobs.content[0].token
    first_ids = load_tokenizer(ensure_model("tiny")).encode(first, add_special_tokens=False)
    assert len(first_ids) == 1, first
    banned = chat(client, max_tokens=1, logprobs=True, logit_bias={str(first_ids[0]): -100})
    assert banned.choices[0].logprobs.content[0].token != first
    for bias in ({"100000000": 1}, {"1" * 5000: 1}, {"1": 100, "01": 100}):
        with pytest.raises(openai.BadRequestError) as caught:
            chat(client, logit_bias=bias)
        assert caught.value.param == "logit_bias", bias


def legacy_token_bytes(token: str) -> bytes:
    """A legacy `tokens` entry's bytes: a token that is part of a character is its escaped
    bytes (`\\xe5\\x8f`)."""
    if token.startswith("\\x") and len(token) % 4 == 0:
        return bytes.fromhex(token.replace("\\x", ""))
    return token.encode()


def check_logprobs(client: openai.OpenAI, server: ServerProcess) -> None:
    answer = chat(client, max_tokens=12, logprobs=True)
    choice = answer.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    content = choice.logprobs.content
    assert len(content) == answer.usage.completion_tokens
    # Tokens that are part of a character show as escapes; their bytes join into the text.
    text = b"".join(bytes(entry.bytes or []) for entry in content).decode(errors="replace")
    assert text == choice.message.content
    assert all(entry.logprob <= 0 and entry.top_logprobs == [] for entry in content)
    streamed = [
        entry
        for chunk in chat(client, max_tokens=12, logprobs=True, stream=True)
        for c in chunk.choices
        if c.logprobs is not None
        for entry in c.logprobs.content or []
    ]
    assert [(e.token, round(e.logprob, 3)) for e in streamed] == [
        (e.token, round(e.logprob, 3)) for e in content
    ]
    legacy = complete(client, max_tokens=12, logprobs=2)
    lp = legacy.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.top_logprobs is not None
    assert len(lp.tokens) == legacy.usage.completion_tokens == len(lp.token_logprobs or [])
    text = b"".join(map(legacy_token_bytes, lp.tokens)).decode(errors="replace")
    assert text == legacy.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    rows = zip(lp.tokens, lp.token_logprobs or [], lp.top_logprobs, strict=True)
    for token, logprob, top in rows:
        assert top[token] == logprob == max(top.values())  # greedy: the chosen is the likeliest
        assert 1 <= len(top) <= 3
    chunks = list(complete(client, max_tokens=12, logprobs=2, stream=True))
    streamed_tokens = [
        token
        for chunk in chunks
        if chunk.choices[0].logprobs is not None
        for token in chunk.choices[0].logprobs.tokens or []
    ]
    assert streamed_tokens == lp.tokens
    with pytest.raises(openai.BadRequestError) as caught:
        complete(client, logprobs=6)
    assert caught.value.param == "logprobs"


def check_top_logprobs(client: openai.OpenAI, server: ServerProcess) -> None:
    hot = chat(client, max_tokens=12, logprobs=True, top_logprobs=5, temperature=1.5, seed=2)
    for entry in hot.choices[0].logprobs.content:
        alternatives = [alt.logprob for alt in entry.top_logprobs]
        assert len(alternatives) == 5 and alternatives == sorted(alternatives, reverse=True)
        assert entry.logprob <= alternatives[0]
        assert sum(math.exp(lp) for lp in alternatives) <= 1.0 + 1e-4
        if entry.token in [alt.token for alt in entry.top_logprobs]:
            listed = {alt.token: alt.logprob for alt in entry.top_logprobs}
            assert math.isclose(listed[entry.token], entry.logprob, abs_tol=1e-4)
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, top_logprobs=2)
    assert caught.value.param == "top_logprobs"


def check_stream(client: openai.OpenAI, server: ServerProcess) -> None:
    whole = chat(client, max_tokens=8).choices[0].message.content
    chunks = list(chat(client, max_tokens=8, stream=True))
    assert len(chunks) > 1
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole


def check_stream_options(client: openai.OpenAI, server: ServerProcess) -> None:
    plain = list(chat(client, stream=True))
    assert all(chunk.usage is None for chunk in plain)
    counted = list(chat(client, stream=True, stream_options={"include_usage": True}))
    assert counted[-1].usage is not None and counted[-1].usage.completion_tokens > 0
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, stream_options={"include_usage": True})
    assert caught.value.param == "stream_options"


def check_response_format(client: openai.OpenAI, server: ServerProcess) -> None:
    """Enforced (test_structured_output.py has the rest); the quality check still reads
    JSON: a document cut by `max_tokens` fails it."""
    whole = chat(client, response_format={"type": "json_object"}, max_tokens=32)
    assert isinstance(json.loads(whole.choices[0].message.content), dict)
    cut = chat(client, response_format={"type": "json_object"}, max_tokens=1)
    assert cut.choices[0].finish_reason == "length"
    chat(
        client,
        response_format={"type": "json_object"},
        max_tokens=1,
        extra_headers={"X-Request-Id": "rf-j"},
    )
    chat(client, response_format={"type": "text"}, extra_headers={"X-Request-Id": "rf-t"})
    request_line(server, "rf-t")
    failures = server.wait_for(
        lambda: [e for e in log_lines(server, "rf-j") if e["event"] == "quality_failure"],
        what="the cut json_object response checked as JSON",
    )
    assert "invalid_json" in failures[0]["reasons"]
    assert not [e for e in log_lines(server, "rf-t") if e["event"] == "quality_failure"]
    schema = {"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}
    with pytest.raises(openai.BadRequestError) as caught:
        chat(
            client,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
        )
    assert caught.value.param == "response_format.json_schema.schema"
    assert "uniqueItems" in caught.value.message


TOOL: Any = {"type": "function", "function": {"name": "f"}}


def check_tools(client: openai.OpenAI, server: ServerProcess) -> None:
    """The tiny model's template has no tool format: tools are refused, not turned into prose.
    Their effect on a model whose template has one: test_tool_calling.py."""
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, tools=[TOOL])
    assert caught.value.param == "tools" and "chat template" in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, tools=[{"type": "function", "function": {"name": "two words"}}])
    assert caught.value.param == "tools[0].function.name"
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    history: Any = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, messages=history)
    assert caught.value.param == "messages[1].tool_calls"


def check_tool_choice(client: openai.OpenAI, server: ServerProcess) -> None:
    assert chat(client, tool_choice="none").choices
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, tool_choice="auto")
    assert caught.value.param == "tool_choice"
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, tools=[TOOL], tool_choice={"type": "function", "function": {"name": "g"}})
    assert caught.value.param == "tool_choice"


def check_parallel_tool_calls(client: openai.OpenAI, server: ServerProcess) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, parallel_tool_calls=False)
    assert caught.value.param == "parallel_tool_calls"


def logged_identifier(name: str) -> Callable[[openai.OpenAI, ServerProcess], None]:
    def check(client: openai.OpenAI, server: ServerProcess) -> None:
        request_id = f"id-{name}"
        with_id = chat(client, extra_headers={"X-Request-Id": request_id}, **{name: "who-7"})
        without = chat(client)
        assert with_id.choices[0].message.content == without.choices[0].message.content
        assert request_line(server, request_id)[name] == "who-7"
        if name == "user":
            completion_id = "id-user-completion"
            complete(client, user="who-8", extra_headers={"X-Request-Id": completion_id})
            assert request_line(server, completion_id)["user"] == "who-8"

    return check


HONOURED: dict[str, Callable[[openai.OpenAI, ServerProcess], None]] = {
    "model": check_model,
    "messages": check_messages,
    "prompt": check_prompt,
    "max_tokens": check_max_tokens,
    "max_completion_tokens": check_max_completion_tokens,
    "temperature": check_temperature,
    "top_p": check_top_p,
    "seed": check_seed,
    "stop": check_stop,
    "n": check_n,
    "presence_penalty": check_presence_penalty,
    "frequency_penalty": check_frequency_penalty,
    "logit_bias": check_logit_bias,
    "logprobs": check_logprobs,
    "top_logprobs": check_top_logprobs,
    "stream": check_stream,
    "stream_options": check_stream_options,
    "response_format": check_response_format,
    "tools": check_tools,
    "tool_choice": check_tool_choice,
    "parallel_tool_calls": check_parallel_tool_calls,
    "user": logged_identifier("user"),
    "safety_identifier": logged_identifier("safety_identifier"),
    "prompt_cache_key": logged_identifier("prompt_cache_key"),
}


@pytest.mark.parametrize("name", sorted(HONOURED))
def test_an_honoured_parameter_has_its_effect(
    name: str, client: openai.OpenAI, checked_server: ServerProcess
) -> None:
    HONOURED[name](client, checked_server)


# ----- refused rows: a 400 naming them, and their off value passes -----
REFUSING: dict[str, tuple[object, object]] = {
    # name: (a value that asks for the feature, the value that means "off")
    "functions": ([{"name": "f"}], None),
    "function_call": ("auto", "none"),
    "audio": ({"voice": "alloy", "format": "wav"}, None),
    "modalities": (["text", "audio"], ["text"]),
    "prediction": ({"type": "content", "content": "x"}, None),
    "reasoning_effort": ("low", None),
    "verbosity": ("low", None),
    "web_search_options": ({}, None),
    "store": (True, False),
    "metadata": ({"k": "v"}, None),
    "service_tier": ("flex", "auto"),
    "prompt_cache_retention": ("24h", None),
    "prompt_cache_options": ({}, None),
    "moderation": ({}, None),
    "echo": (True, False),
    "best_of": (2, 1),
    "suffix": ("tail", ""),
}
COMPLETION_REFUSING: dict[str, object] = {}


def refused_rows() -> list[Any]:
    return [
        pytest.param(kind, row.name, id=f"{kind.value}-{row.name}")
        for row in PARAMETERS
        for kind in (Kind.CHAT, Kind.COMPLETION)
        if row.treatment == Treatment.REFUSED and kind in row.routes
    ]


@pytest.mark.parametrize(("kind", "name"), refused_rows())
def test_a_refused_parameter_gets_a_400_naming_it(
    kind: Kind, name: str, client: openai.OpenAI
) -> None:
    call = chat if kind == Kind.CHAT else complete
    asking, off = REFUSING[name]
    if kind == Kind.COMPLETION:
        asking = COMPLETION_REFUSING.get(name, asking)
    with pytest.raises(openai.BadRequestError) as caught:
        call(client, **{name: asking})
    assert caught.value.status_code == 400
    assert caught.value.param == name
    assert caught.value.type == "invalid_request_error"
    if off is not None:
        call(client, **{name: off})


# ----- client-side rows: what reaches the server -----
def test_extra_body_keys_meet_their_rows_and_unknown_ones_are_refused(
    client: openai.OpenAI,
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, extra_body={"top_k": 5})
    assert caught.value.param == "top_k"
    with pytest.raises(openai.BadRequestError) as caught:
        complete(client, extra_body={"guided_json": {}})
    assert caught.value.param == "guided_json"
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, extra_body={"store": True})
    assert caught.value.param == "store"
    assert chat(client, extra_body={"seed": 3}).choices


def test_extra_headers_carry_the_request_id(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=2, extra_headers={"X-Request-Id": "eh-1"}
    )
    assert raw.headers["x-request-id"] == "eh-1"


@pytest.mark.parametrize("call", [chat, complete], ids=["chat", "completion"])
def test_extra_query_parameters_are_refused_naming_them(
    client: openai.OpenAI, call: Callable[..., Any]
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        call(client, extra_query={"api-version": "2024-01-01"})
    assert caught.value.param == "api-version"


def test_timeout_stays_in_the_client(client: openai.OpenAI) -> None:
    assert chat(client, timeout=60).choices
    assert complete(client, timeout=60).choices


CLIENT_SIDE_TESTS = {"extra_body", "extra_headers", "extra_query", "timeout"}


def test_every_row_of_the_table_is_tested_here() -> None:
    expected = {
        Treatment.HONOURED: set(HONOURED),
        Treatment.REFUSED: set(REFUSING),
        Treatment.CLIENT_SIDE: CLIENT_SIDE_TESTS,
    }
    for treatment, tested in expected.items():
        assert {row.name for row in PARAMETERS if row.treatment == treatment} == tested


def test_a_message_key_that_would_be_dropped_is_a_400_naming_it(client: openai.OpenAI) -> None:
    messages: Any = [{"role": "user", "content": "hi", "nickname": "ada"}]
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, messages=messages)
    assert caught.value.param == "messages[0].nickname"


def test_a_reply_sent_back_as_history_is_accepted(client: openai.OpenAI) -> None:
    """`messages.append(reply.message)`, as the openai docs do, with a user `name`."""
    first: Any = [{"role": "user", "content": "hi", "name": "ada"}]
    reply = chat(client, messages=first).choices[0].message
    follow_up = [*first, reply, {"role": "user", "content": [{"type": "text", "text": "more"}]}]
    assert chat(client, messages=follow_up).choices[0].finish_reason in ("stop", "length")
