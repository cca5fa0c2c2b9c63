"""`response_format` enforced: the random tiny model's answers parse as JSON and validate
against the schema, through the official `openai` client (create, stream, and its
pydantic `parse` helpers), and a schema keyword the server cannot enforce is a 400.

Without constrained decoding these fail: the random model answers prose.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pydantic
import pytest
from fusebox_server_harness import MODEL_NAME, ServerProcess

MESSAGES: list[Any] = [{"role": "user", "content": "Describe a pet as JSON"}]
MAX_TOKENS = 48

PET_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "legs": {"type": "integer"},
        "weight": {"anyOf": [{"type": "number"}, {"type": "null"}]},
        "kind": {"enum": ["cat", "dog", "fish"]},
        "tags": {"type": "array", "items": {"$ref": "#/$defs/Tag"}},
    },
    "required": ["name", "legs", "weight", "kind", "tags"],
    "additionalProperties": False,
    "$defs": {
        "Tag": {
            "type": "object",
            "properties": {"label": {"type": "string"}, "on": {"type": "boolean"}},
            "required": ["label", "on"],
            "additionalProperties": False,
        }
    },
}


class Owner(pydantic.BaseModel):
    name: str
    age: int | None
    pets: list[str]


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as client:
        yield client


def chat(client: openai.OpenAI, **fields: Any) -> Any:
    arguments: dict[str, Any] = {
        "model": MODEL_NAME,
        "messages": MESSAGES,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
    }
    arguments.update(fields)
    return client.chat.completions.create(**arguments)


def json_schema_format(schema: dict[str, Any], name: str = "pet") -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def validate(value: Any, schema: dict[str, Any], root: dict[str, Any]) -> None:
    """The subset of JSON Schema the server enforces, checked independently of it."""
    if "$ref" in schema:
        validate(value, root["$defs"][schema["$ref"].rsplit("/", 1)[-1]], root)
    elif "anyOf" in schema:
        failures = []
        for option in schema["anyOf"]:
            try:
                validate(value, option, root)
                return
            except AssertionError as error:
                failures.append(error)
        raise AssertionError(f"{value!r} matches no option: {failures}")
    elif "enum" in schema:
        assert value in schema["enum"], value
    elif schema.get("type") == "object":
        assert isinstance(value, dict), value
        assert set(schema["required"]) <= set(value), value
        assert set(value) <= set(schema["properties"]), value
        for key, item in value.items():
            validate(item, schema["properties"][key], root)
    elif schema.get("type") == "array":
        assert isinstance(value, list), value
        for item in value:
            validate(item, schema["items"], root)
    else:
        python = {"string": str, "boolean": bool, "null": type(None)}
        kind = schema["type"]
        if kind == "integer":
            assert isinstance(value, int) and not isinstance(value, bool), value
        elif kind == "number":
            assert isinstance(value, int | float) and not isinstance(value, bool), value
        else:
            assert isinstance(value, python[kind]), value


@pytest.mark.parametrize(
    "sampling",
    [{"temperature": 0}, {"temperature": 1.0, "seed": 11}, {"temperature": 0.8, "top_p": 0.9}],
    ids=["greedy", "sampled", "nucleus"],
)
def test_json_object_answers_parse_as_objects(client: openai.OpenAI, sampling: Any) -> None:
    response = chat(client, response_format={"type": "json_object"}, n=2, **sampling)
    for choice in response.choices:
        assert isinstance(json.loads(choice.message.content), dict), choice.message.content
        assert choice.finish_reason == "stop"


def test_a_streamed_json_object_parses_once_joined(client: openai.OpenAI) -> None:
    chunks = list(
        chat(client, response_format={"type": "json_object"}, stream=True, temperature=1, seed=3)
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert isinstance(json.loads(text), dict), text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_json_schema_answers_validate_against_the_schema(client: openai.OpenAI, seed: int) -> None:
    response = chat(
        client,
        response_format=json_schema_format(PET_SCHEMA),
        temperature=1.0,
        seed=seed,
        max_tokens=96,
        logprobs=True,
        top_logprobs=2,
    )
    choice = response.choices[0]
    validate(json.loads(choice.message.content), PET_SCHEMA, PET_SCHEMA)
    assert choice.finish_reason == "stop"
    # Scores stay the raw model's: one entry per generated token, each a log-probability.
    assert choice.logprobs is not None
    assert len(choice.logprobs.content) == response.usage.completion_tokens
    assert all(entry.logprob <= 0.0 for entry in choice.logprobs.content)


def test_the_clients_parse_helper_returns_the_pydantic_object(client: openai.OpenAI) -> None:
    completion = client.beta.chat.completions.parse(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=MAX_TOKENS, response_format=Owner
    )
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, Owner)


def test_the_clients_streaming_parse_helper_returns_the_pydantic_object(
    client: openai.OpenAI,
) -> None:
    with client.beta.chat.completions.stream(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=MAX_TOKENS, response_format=Owner, seed=5
    ) as stream:
        final = stream.get_final_completion()
    assert isinstance(final.choices[0].message.parsed, Owner)


def test_a_budget_too_small_for_the_document_ends_with_length(client: openai.OpenAI) -> None:
    response = chat(client, response_format=json_schema_format(PET_SCHEMA), max_tokens=4)
    choice = response.choices[0]
    assert choice.finish_reason == "length"
    with pytest.raises(ValueError):
        json.loads(choice.message.content)


CODE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "code": {"type": "string", "pattern": "^[A-Z]{2,4}$"},
        "note": {"type": "string", "minLength": 3, "maxLength": 8},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 2},
        "level": {"type": "integer", "minimum": 1, "maximum": 5},
    },
    "required": ["code", "note", "tags", "level"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("seed", [1, 2])
def test_keywords_llguidance_enforces_hold_in_the_random_models_answers(
    client: openai.OpenAI, seed: int
) -> None:
    """pattern, minLength/maxLength, minItems/maxItems, minimum/maximum: refused before
    llguidance, enforced now."""
    response = chat(
        client,
        response_format=json_schema_format(CODE_SCHEMA, "code"),
        temperature=1.0,
        seed=seed,
        max_tokens=96,
    )
    value = json.loads(response.choices[0].message.content)
    assert set(value) == {"code", "note", "tags", "level"}
    assert re.fullmatch("[A-Z]{2,4}", value["code"]), value
    assert 3 <= len(value["note"]) <= 8, value
    assert 1 <= len(value["tags"]) <= 2 and set(value["tags"]) <= {"a", "b"}, value
    assert isinstance(value["level"], int) and 1 <= value["level"] <= 5, value
    assert response.choices[0].finish_reason == "stop"


def test_a_schema_only_llguidance_knows_is_cut_with_length_on_a_tight_budget(
    client: openai.OpenAI,
) -> None:
    """No shortest-completion bookkeeping for such a schema: as OpenAI, `length` and a
    cut document (docs/api.md)."""
    response = chat(client, response_format=json_schema_format(CODE_SCHEMA, "code"), max_tokens=3)
    assert response.choices[0].finish_reason == "length"
    with pytest.raises(ValueError):
        json.loads(response.choices[0].message.content)


@pytest.mark.parametrize(
    ("schema", "keyword"),
    [
        (
            {"type": "object", "properties": {"ids": {"type": "array", "uniqueItems": True}}},
            "uniqueItems",
        ),
        ({"not": {"type": "string"}}, "not"),
        ({"type": "string", "if": {"minLength": 1}, "then": {"maxLength": 3}}, "if"),
        ({"type": "string", "pattern": "(unclosed"}, "unclosed group"),
    ],
    ids=["uniqueItems", "not", "if", "bad-pattern"],
)
def test_a_schema_keyword_that_cannot_be_enforced_is_a_400_naming_it(
    client: openai.OpenAI, schema: dict[str, Any], keyword: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, response_format=json_schema_format(schema))
    assert caught.value.param == "response_format.json_schema.schema"
    assert keyword in caught.value.message


def test_a_malformed_json_schema_format_is_refused_naming_the_field(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, response_format={"type": "json_schema", "json_schema": {"name": "a b"}})
    assert caught.value.param == "response_format.json_schema.name"
    with pytest.raises(openai.UnprocessableEntityError) as unprocessable:
        chat(client, response_format={"type": "json_schema"})
    assert unprocessable.value.param == "response_format.json_schema"


def test_a_schema_past_the_limits_is_a_prompt_400_and_liveness_answers_meanwhile(
    server: ServerProcess,
) -> None:
    """11,000 properties (330 KiB, within the body limit) once compiled for seconds on the
    event loop, then panicked in llguidance's matcher on the inference thread: /healthz
    went unanswered, and the client got a 500 quoting the Rust backtrace."""
    schema = {"type": "object", "properties": {f"z_{i}": {"type": "string"} for i in range(11_000)}}
    body = {
        "model": MODEL_NAME,
        "messages": MESSAGES,
        "max_tokens": 1,
        "response_format": json_schema_format(schema, name="huge"),
    }
    with httpx.Client(base_url=server.url, timeout=120) as http, ThreadPoolExecutor(1) as pool:
        posted = pool.submit(http.post, "/v1/chat/completions", json=body)
        time.sleep(0.5)  # the body is in, its schema being read
        health = http.get("/healthz", timeout=2)
        answer = posted.result()
    assert health.status_code == 200
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == "response_format.json_schema.schema"
    assert "1,024" in error["message"] and "backtrace" not in answer.text


@pytest.mark.parametrize(
    "schema",
    [
        {"$ref": "#"},
        {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    ],
)
def test_a_schema_that_only_refers_to_itself_is_a_400_not_an_empty_answer(
    client: openai.OpenAI, schema: dict[str, Any]
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, response_format=json_schema_format(schema, name="selfref"), max_tokens=8)
    assert caught.value.param == "response_format.json_schema.schema"
    assert "no JSON document satisfies the schema" in caught.value.message
