"""The structured-output grammar (what text is a prefix of an accepted document) and the
per-row token choice under it, on hand-made logits and vocabularies."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

import pytest
import torch

from fusebox_server.errors import InvalidRequest
from fusebox_server.http.response_format import parse_response_format
from fusebox_server.http.tool_calls import forced_format, parse_tool_use
from fusebox_server.model.json_grammar import (
    MAX_SCHEMA_BYTES,
    MAX_SCHEMA_NESTING,
    MAX_SCHEMA_PROPERTIES,
    PANIC_REASON,
    WHITESPACE_RUN_BYTES,
    OutputFormat,
    UnsupportedSchema,
    refusal_reason,
)
from fusebox_server.model.structured_output import (
    ConstrainedRow,
    TokenVocabulary,
    vocabulary_from_bytes,
    vocabulary_of,
)

ANY_OBJECT = OutputFormat.json(None)
PERSON: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        "kind": {"enum": ["cat", "dog"], "type": "string"},
        "home": {"$ref": "#/$defs/Place"},
    },
    "required": ["name", "age", "kind", "home"],
    "additionalProperties": False,
    "$defs": {
        "Place": {
            "type": "object",
            "properties": {
                "grid": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}}
            },
            "required": ["grid"],
            "additionalProperties": False,
        }
    },
}


def state_of(output_format: OutputFormat, text: str | bytes) -> Any:
    data = text.encode("utf-8") if isinstance(text, str) else text
    return output_format.start().feed(data)


@pytest.mark.parametrize(
    "text",
    [
        "{}",
        '{"a": 1}',
        '{"a": [1, 2.5, -0.5e10, 1E+5, -0, true, false, null]}',
        '{"nested": {"deeper": [[], [[]], {"x": "y"}]}}',
        '{"中文": "你好, 世界 😀"}',
        '{"escapes": "\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u00e9 \\ud83d\\ude00"}',
        ' {\n  "a" : 1 ,\n  "b" : 2\n}',
    ],
)
def test_a_whole_json_object_is_complete_and_finished(text: str) -> None:
    state = state_of(ANY_OBJECT, text)
    assert state.valid and state.complete and state.finished
    assert state.min_close == 0
    assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize(
    "text", ["{", '{"a', '{"a":', '{"a": -', '{"a": 1.', '{"a": 1e', '{"a": [1,', '{"a": "x\\u00']
)
def test_a_prefix_is_valid_and_not_complete(text: str) -> None:
    state = state_of(ANY_OBJECT, text)
    assert state.valid and not state.complete


@pytest.mark.parametrize(
    "text",
    [
        "[]",  # json_object means an object
        '"a"',
        "1",
        '{"a": 1}x',  # no trailing garbage
        "{} ",  # nothing at all after the document
        "{}{}",
        '{"a": 01}',
        '{"a": .5}',
        '{"a": 1.e5}',
        '{"a": +1}',
        '{"a": tru}',
        '{"a": 1,}',
        '{"a" 1}',
        '{"a": "\x01"}',  # a raw control character
        '{"a": "\\x41"}',  # not a JSON escape
        '{"a": "\\u00g0"}',
        '{"a": 1, "a": 2}',  # a key twice
        "{'a': 1}",
    ],
)
def test_text_that_is_no_prefix_of_a_json_object_is_invalid(text: str) -> None:
    assert not state_of(ANY_OBJECT, text).valid


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a": "\xff"}',
        b'{"a": "\x80"}',
        b'{"a": "\xc0\xaf"}',
        b'{"a": "\xed\xa0\x80"}',
        b'{"a": "\xe4\xb8"}',
    ],
    ids=["ff", "lone-continuation", "overlong", "surrogate", "cut-character"],
)
def test_bytes_that_are_not_utf8_are_invalid_inside_strings(raw: bytes) -> None:
    state = state_of(ANY_OBJECT, raw)
    assert not state.complete


def test_a_character_split_over_tokens_stays_valid_between_its_bytes() -> None:
    state = state_of(ANY_OBJECT, b'{"a": "' + "中".encode()[:2])
    assert state.valid and state.min_close == 1 + 1 + 1  # the last byte, the quote, the brace
    assert state.feed("中".encode()[2:] + b'"}').finished


def test_whitespace_runs_are_bounded() -> None:
    assert state_of(ANY_OBJECT, "{" + " " * WHITESPACE_RUN_BYTES + "}").finished
    assert not state_of(ANY_OBJECT, "{" + " " * (WHITESPACE_RUN_BYTES + 1)).valid
    assert not state_of(ANY_OBJECT, " " * (WHITESPACE_RUN_BYTES + 1) + "{").valid


def test_free_documents_nest_only_so_deep() -> None:
    assert state_of(ANY_OBJECT, '{"a":' + "[" * 20).valid
    assert not state_of(ANY_OBJECT, '{"a":' + "[" * 40).valid


def test_the_fewest_closing_bytes_are_known_at_every_point() -> None:
    assert state_of(ANY_OBJECT, "").min_close == 2  # {}
    assert state_of(ANY_OBJECT, '{"a":tru').min_close == 2  # e}
    assert state_of(ANY_OBJECT, '{"a":[[1').min_close == 3  # ]]}
    assert state_of(ANY_OBJECT, '{"a":1,').min_close == len('"":0}')
    shortest = '{"name":"","age":0,"kind":"cat","home":{"grid":[]}}'
    person = OutputFormat.json(PERSON)
    assert person.start().min_close == len(shortest)
    assert state_of(person, shortest).finished
    assert state_of(person, '{"name":"x","ag').min_close == len(
        'e":0,"kind":"cat","home":{"grid":[]}}'
    )


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "Rex", "age": 3, "kind": "dog", "home": {"grid": [[1, -2], [], [0]]}}',
        '{"home": {"grid": []}, "kind": "cat", "age": null, "name": "\\u00e9"}',  # any order
    ],
)
def test_a_document_of_the_schema_is_finished(text: str) -> None:
    assert state_of(OutputFormat.json(PERSON), text).finished


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "Rex"}',  # required keys missing: `}` refused
        '{"name": 1',  # a string expected
        '{"name": "a", "age": 1.5',  # integer: no fraction
        '{"name": "a", "age": "3"',  # integer or null
        '{"name": "a", "age": 3, "kind": "cow"',  # not in the enum
        '{"name": "a", "other"',  # additionalProperties: false
        '{"name": "a", "name"',  # twice
        '{"name": "a", "age": 3, "kind": "cat", "home": {"grid": [[1.5',  # nested integer
        '{"name": "a", "age": 3, "kind": "cat", "home": {"grid": [1',  # array of arrays
    ],
)
def test_text_the_schema_rejects_is_invalid(text: str) -> None:
    assert not state_of(OutputFormat.json(PERSON), text).valid


def test_any_of_and_type_lists_are_followed_side_by_side() -> None:
    either = OutputFormat.json(
        {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "null"}}]}
    )
    assert state_of(either, '"x"').finished and state_of(either, "[null,null]").finished
    assert not state_of(either, "[1").valid
    nullable = OutputFormat.json({"type": ["number", "null"]})
    assert state_of(nullable, "null").finished
    number = state_of(nullable, "12")
    assert number.complete and not number.finished  # 12 may go on: 123
    assert not state_of(nullable, "nul1").valid


def test_enum_and_const_accept_exactly_their_values() -> None:
    mixed = OutputFormat.json({"enum": ["a", 1, None, {"k": [True]}]})
    for text in ['"a"', "1", "null", '{"k":[true]}']:
        assert state_of(mixed, text).complete, text
    assert not state_of(mixed, '"b"').valid
    const = OutputFormat.json({"const": "only"})
    assert state_of(const, '"only"').finished and not state_of(const, '"onl"').complete


def test_what_pydantic_sends_in_strict_mode_compiles() -> None:
    pydantic = pytest.importorskip("pydantic")
    from openai.lib._pydantic import to_strict_json_schema

    class Pet(pydantic.BaseModel):
        name: str
        legs: int
        weight: float | None
        tags: list[str]
        kind: str = pydantic.Field(json_schema_extra={"enum": ["cat", "dog"]})

    class Owner(pydantic.BaseModel):
        pets: list[Pet]
        main: Pet | None

    owner = OutputFormat.json(to_strict_json_schema(Owner))
    text = json.dumps(
        {
            "pets": [{"name": "a", "legs": 4, "weight": None, "tags": ["x"], "kind": "dog"}],
            "main": None,
        }
    )
    assert state_of(owner, text).finished
    Owner.model_validate_json(text)


def _nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def accepted(output_format: OutputFormat, text: str) -> bool:
    """llguidance's verdict on a whole document: every byte consumed and the end reached."""
    import llguidance

    from fusebox_server.model.structured_output import vocabulary_from_bytes

    data = text.encode("utf-8")
    table = vocabulary_from_bytes([bytes([b]) for b in range(256)])
    matcher = llguidance.LLMatcher(table.matcher_tokenizer, output_format.grammar, log_level=0)
    return all(matcher.consume_token(b) for b in data) and bool(matcher.is_accepting())


NODE = {"type": "object", "properties": {"next": {"$ref": "#/$defs/Node"}}}


@pytest.mark.parametrize(
    ("schema", "good", "bad"),
    [
        ({"type": "string", "pattern": "^a+$"}, '"aaa"', '"ab"'),
        ({"type": "string", "format": "date-time"}, '"2026-12-05T15:00:00Z"', '"soon"'),
        ({"type": "string", "minLength": 2}, '"ab"', '"a"'),
        ({"type": "string", "maxLength": 2}, '"ab"', '"abc"'),
        ({"type": "number", "minimum": 0}, "3", "-1"),
        ({"type": "integer", "maximum": 9}, "9", "10"),
        ({"type": "integer", "multipleOf": 2}, "4", "3"),
        ({"type": "array", "minItems": 1}, "[1]", "[]"),
        ({"type": "array", "maxItems": 1}, "[1]", "[1,2]"),
        ({"type": "array", "prefixItems": [{"type": "string"}]}, '["a",1]', "[1]"),
        (
            {"type": "object", "patternProperties": {"^x": {"type": "integer"}}},
            '{"x1":1}',
            '{"x1":"a"}',
        ),
        ({"type": "object", "minProperties": 1}, '{"a":1}', "{}"),
        ({"oneOf": [{"type": "string"}, {"type": "integer"}]}, "1", "true"),
        ({"allOf": [{"type": "integer"}, {"minimum": 5}]}, "5", "4"),
        ({"type": "string", "format": "email"}, '"a@b.co"', '"ab.co"'),
        ({"$defs": {"Node": NODE}, "$ref": "#/$defs/Node"}, '{"next":{"next":{}}}', '{"next":1}'),
        ({"type": "array", "items": {"type": "string", "pattern": "^x$"}}, '["x"]', '["y"]'),
        (_nested(70), "[" * 70 + '"a"' + "]" * 70, "[" * 70 + "1" + "]" * 70),
        ({"type": "string", "items": {}}, '"a"', "[]"),  # items applies to arrays only
    ],
)
def test_keywords_llguidance_enforces_are_enforced(
    schema: dict[str, Any], good: str, bad: str
) -> None:
    output_format = OutputFormat.json(schema)
    assert accepted(output_format, good)
    assert not accepted(output_format, bad)


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
        ({"not": {"type": "string"}}, "not"),
        ({"if": {}, "then": {}}, "if"),
        ({"type": "date"}, "date"),
        ({"$ref": "#/$defs/Missing"}, "Missing"),
        ({"$ref": "https://example.com/schema"}, "example.com"),
        ({"type": "object", "required": ["x"], "additionalProperties": False}, "'x'"),
        (_nested(400), "nested deeper than the limit of 100 levels"),
        ({"type": "string", "pattern": "("}, "unclosed group"),
        ({"type": "string", "maxLength": -1}, "maxLength"),
        ({"type": "array", "minItems": 5, "maxItems": 2}, "minItems"),
        ({"enum": []}, "Unsatisfiable"),
        ({"type": "string", "format": "regex"}, "regex"),
    ],
)
def test_keywords_llguidance_refuses_are_refused_by_name(
    schema: dict[str, Any], named: str
) -> None:
    with pytest.raises(UnsupportedSchema) as caught:
        OutputFormat.json(schema)
    assert named in str(caught.value)


def test_properties_come_in_the_schemas_order_not_sorted() -> None:
    """What `parse()` clients send: the declared order, which llguidance writes."""
    schema = {
        "type": "object",
        "properties": {"zeta": {"type": "integer"}, "alpha": {"type": "integer"}},
        "required": ["zeta", "alpha"],
        "additionalProperties": False,
    }
    assert accepted(OutputFormat.json(schema), '{"zeta":1,"alpha":2}')
    assert not accepted(OutputFormat.json(schema), '{"alpha":2,"zeta":1}')


def test_whitespace_and_escapes_follow_what_json_dumps_writes() -> None:
    string = OutputFormat.json({"type": "string"})
    assert accepted(string, json.dumps("é \n 🚀"))  # \u escapes, surrogate pairs included
    assert accepted(ANY_OBJECT, '{\n   "a": 1}')
    assert not accepted(ANY_OBJECT, '{\n    "a": 1}')  # five whitespace bytes in one gap
    assert not accepted(ANY_OBJECT, ' {"a": 1}')  # none before the document


def test_a_compiled_schema_is_kept_and_ours_closes_only_what_it_knows() -> None:
    assert OutputFormat.json(dict(PERSON)) is OutputFormat.json(dict(PERSON))
    assert OutputFormat.json(PERSON).start() is not None
    assert OutputFormat.json({"type": "string", "pattern": "^a$"}).start() is None


# ----- the choice, on a hand-made vocabulary -----

SPELLINGS: list[bytes | None] = [
    b"{",
    b"}",
    b'"',
    b"a",
    b":",
    b"1",
    b"x",
    None,
    b'"a"',
    b" ",
    b"}x",
    b'"}',
    b"\n\n\n\n\n",
]
END = 7  # end of sequence: a special token, no bytes
SPECIAL = 13


def vocabulary() -> TokenVocabulary:
    return vocabulary_from_bytes([*SPELLINGS, None])  # 13: another special token


def logits_favouring(*order: int) -> torch.Tensor:
    """Logits over the vocabulary where `order[0]` is the most likely, then `order[1]`..."""
    values = torch.full((len(SPELLINGS) + 1,), -5.0)
    for rank, token in enumerate(order):
        values[token] = 10.0 - rank
    return values


def row(output_format: OutputFormat = ANY_OBJECT, budget: int = 50) -> ConstrainedRow:
    return ConstrainedRow(output_format, vocabulary(), [END], budget)


def decode(constrained: ConstrainedRow, logits: torch.Tensor, steps: int) -> bytes:
    text = b""
    for _ in range(steps):
        token = constrained.choose(logits, None)
        constrained.took(token)
        if token == END:
            break
        data = constrained.vocabulary.token_bytes[token]
        assert data is not None
        text += data
        if constrained.finished:
            break
    return text


def test_greedy_takes_the_most_likely_token_that_keeps_the_document_valid() -> None:
    constrained = row()
    assert (
        constrained.choose(logits_favouring(6, SPECIAL, END, 3, 0), None) == 0
    )  # x, special, end: no
    constrained.took(0)
    assert constrained.choose(logits_favouring(10, 1), None) == 1  # `}x` would trail garbage


def test_the_end_token_is_valid_only_once_the_document_is_complete() -> None:
    number = ConstrainedRow(OutputFormat.json({"type": "integer"}), vocabulary(), [END], 10)
    assert number.choose(logits_favouring(END, 5), None) == 5
    number.took(5)
    assert number.complete and not number.finished
    assert number.choose(logits_favouring(END, 5), None) == END


def test_a_finished_document_ends_the_row() -> None:
    constrained = row()
    assert decode(constrained, logits_favouring(0, 1), 10) == b"{}"
    assert constrained.finished


def test_a_model_that_never_closes_its_string_is_closed_within_its_budget() -> None:
    for budget in (6, 9, 20):
        constrained = row(budget=budget)
        text = decode(constrained, logits_favouring(3, 0, 2, 4, 5, 11, 1), budget)
        assert isinstance(json.loads(text), dict)
        assert constrained.finished and len(text) <= budget  # one byte per token here


def test_padding_whitespace_cannot_run_on() -> None:
    constrained = row(budget=30)
    text = decode(constrained, logits_favouring(9, 12, 0, 1), 30)
    # No whitespace before the document (llguidance's JSON starts at its first byte).
    assert text == b"{" + b" " * WHITESPACE_RUN_BYTES + b"}"


def test_a_budget_too_small_for_any_document_still_gives_valid_prefix_tokens() -> None:
    constrained = row(budget=1)
    token = constrained.choose(logits_favouring(6, 3, 0), None)
    assert token == 0  # `{`: the grammar alone decides when nothing can close in time


def test_ids_past_the_tokenizer_are_never_chosen() -> None:
    wide = torch.cat([logits_favouring(6, 0), torch.full((4,), 50.0)])  # logits 18 wide
    constrained = row()
    assert constrained.choose(wide, None) == 0
    assert constrained.mask(wide)[len(SPELLINGS) + 1 :].eq(-math.inf).all()


def test_a_key_twice_in_a_free_object_stays_refused() -> None:
    constrained = row()
    for token in (0, 8, 4, 5):  # {"a":1
        assert constrained.allows(token)
        constrained.took(token)
    comma = vocabulary_from_bytes([*SPELLINGS, None, b","])
    twice = ConstrainedRow(ANY_OBJECT, comma, [END], 50)
    for token in (0, 8, 4, 5, 14):  # {"a":1,
        twice.took(token)
    assert not twice.allows(8)  # "a" again: json.loads would keep only the last


def test_a_schema_only_llguidance_knows_is_cut_on_a_tight_budget() -> None:
    """No shortest-completion bookkeeping there: the row runs out, as OpenAI's does."""
    pattern = OutputFormat.json({"type": "string", "pattern": "^a+$"})
    constrained = ConstrainedRow(pattern, vocabulary(), [END], 3)
    text = decode(constrained, logits_favouring(3, 2), 3)
    assert text == b'"aa' and not constrained.complete
    closing = ConstrainedRow(OutputFormat.json({"type": "string"}), vocabulary(), [END], 3)
    assert decode(closing, logits_favouring(3, 2), 3) == b'"a"'  # ours closes what it knows


def test_sampling_resamples_without_the_invalid_draws_and_keeps_valid_draws() -> None:
    seen: list[torch.Tensor] = []
    rounds = iter([[6, 3], [0]])

    def sample(logits: torch.Tensor, count: int) -> list[int]:
        seen.append(logits.clone())
        return next(rounds)

    constrained = row()
    assert constrained.choose(logits_favouring(6, 3, 0), sample) == 0
    assert seen[0][6] > -math.inf  # the model's own distribution first
    assert seen[1][6] == -math.inf and seen[1][3] == -math.inf  # the invalid draws masked
    assert seen[1][2] == -math.inf  # and every token that cannot start here
    assert seen[1][0] > -math.inf


def test_sampling_that_keeps_missing_falls_back_to_logit_order() -> None:
    constrained = row()
    assert constrained.choose(logits_favouring(6, 2, 0), lambda logits, count: [6]) == 0


def test_draws_are_distinct_and_only_of_tokens_with_probability() -> None:
    from fusebox_server.model.decode_settings import DecodeSettings
    from fusebox_server.model.engine import draw_tokens

    settings = DecodeSettings(8, 1.0, 0.9, None, ())
    logits = torch.tensor([3.0, 2.0, -math.inf, 1.0, -math.inf])
    generator = torch.Generator().manual_seed(1)
    drawn = draw_tokens(logits, 8, settings, generator)
    assert len(drawn) == len(set(drawn)) and set(drawn) <= {0, 1, 3}
    assert draw_tokens(torch.full((4,), -math.inf), 8, settings, generator) == []


def test_the_tiny_tokenizers_token_bytes_are_its_decoded_text(tiny_tokenizer: Any) -> None:
    table = vocabulary_of(tiny_tokenizer)
    assert vocabulary_of(tiny_tokenizer) is table  # built once per tokenizer
    assert table.token_bytes[tiny_tokenizer.eos_token_id] is None
    checked = 0
    for token_id, data in enumerate(table.token_bytes):
        text = tiny_tokenizer.decode([token_id])
        if data is not None and "\ufffd" not in text:
            assert data == text.encode("utf-8"), token_id
            checked += 1
    assert checked > 1000
    assert table.byte_tokens[ord("{")] == table.token_bytes.index(b"{")


# ----- in both batches, on the tiny model -----

STEPS = 32
PET: dict[str, Any] = {
    "type": "object",
    "properties": {"kind": {"enum": ["cat", "dog"]}, "n": {"type": ["integer", "null"]}},
    "required": ["kind", "n"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Any, tiny_tokenizer: Any) -> Any:
    from fusebox_server.model.engine import load_model

    return load_model("primary", tiny_model_dir, "none", torch.device("cpu"), tiny_tokenizer)


def test_loading_a_model_builds_its_tokenizers_tables_once(tiny_model_dir: Any) -> None:
    """The first constrained request must not pay for them inside the worker."""
    from fusebox_server.model.engine import load_model
    from fusebox_server.model.tokenization import load_tokenizer

    tokenizer = load_tokenizer(tiny_model_dir)
    assert "_fusebox_token_vocabulary" not in vars(tokenizer)
    load_model("primary", tiny_model_dir, "none", torch.device("cpu"), tokenizer)
    built = vars(tokenizer)["_fusebox_token_vocabulary"]
    assert vocabulary_of(tokenizer) is built


def _settings() -> list[Any]:
    from fusebox_server.model.decode_settings import DecodeSettings

    plain = DecodeSettings(max_new_tokens=STEPS, temperature=0.0, top_p=1.0, seed=None, stop=())
    pet = OutputFormat.json(PET)
    return [
        plain,  # the batch's shared argmax
        replace(plain, output_format=ANY_OBJECT),
        replace(plain, output_format=pet, top_alternatives=2),
        replace(plain, output_format=pet, temperature=0.9, seed=7),
    ]


def _decode(rows: list[Any], first: list[Any], batch: Any, tokenizer: Any) -> list[list[int]]:
    tokens: list[list[int]] = [[t] for t in first]
    done = [row.document_finished for row in rows]
    for _ in range(STEPS - 1):
        for index, token in enumerate(batch.step()):
            if not done[index]:
                tokens[index].append(token)
                done[index] = rows[index].document_finished
    return tokens


@pytest.mark.parametrize("kind", ["alone", "decode_batch", "slot_batch"])
def test_constrained_rows_decode_documents_beside_plain_rows(
    kind: str, loaded: Any, tiny_tokenizer: Any
) -> None:
    from fusebox_server.model.engine import DecodeBatch, Decoding, prefill
    from fusebox_server.model.slot_batch import SlotBatch

    prompt = tuple(tiny_tokenizer.backend_tokenizer.encode("Once upon a time").ids)
    table = vocabulary_of(tiny_tokenizer)
    settings = _settings()
    rows = [Decoding(loaded, prompt, s, table) for s in settings]
    if kind == "alone":
        tokens = []
        for decoding in rows:
            steps = [decoding.step()]
            while len(steps) < STEPS and not decoding.document_finished:
                steps.append(decoding.step())
            tokens.append(steps)
    else:
        batch = DecodeBatch(loaded) if kind == "decode_batch" else SlotBatch(loaded, graphs=False)
        first = prefill(loaded, rows)
        batch.add(*rows)
        tokens = _decode(rows, first, batch, tiny_tokenizer)
    texts = [tiny_tokenizer.decode(t, skip_special_tokens=True) for t in tokens]
    assert isinstance(json.loads(texts[1]), dict)
    for text in texts[2:]:
        document = json.loads(text)
        assert set(document) == {"kind", "n"} and document["kind"] in ("cat", "dog")
        assert document["n"] is None or isinstance(document["n"], int)
    assert all(row.document_finished for row in rows[1:])
    with pytest.raises(ValueError):
        json.loads(texts[0])  # the random model's free text is no JSON
    assert rows[2].last_score is not None  # scored, of the raw logits
    if kind != "alone":
        alone = [Decoding(loaded, prompt, s, table) for s in settings]
        for index, decoding in enumerate(alone[1:], start=1):
            by_itself = [decoding.step() for _ in range(len(tokens[index]))]
            assert by_itself == tokens[index], index


DOCUMENT = '{"名字": "小猫 🚀", "legs": 4, "tags": ["a\\nb", "\\u00e9"], "ok": true, "w": -0.5e10}'


@pytest.mark.parametrize("name", ["tiny", "llama3", "mistral", "gemma2"])
def test_each_tokenizers_encoding_of_a_document_is_accepted_token_by_token(name: str) -> None:
    """Byte-level BPE and SentencePiece with byte fallback: the table's bytes of a real
    encoding join into the document (a SentencePiece leading space aside), and the
    grammar accepts them token by token."""
    from fusebox_server.model.tiny_model import ensure_model
    from fusebox_server.model.tokenization import load_tokenizer
    from fusebox_server.zoo.release import ensure_zoo_model

    tokenizer = load_tokenizer(ensure_model("tiny") if name == "tiny" else ensure_zoo_model(name))
    table = vocabulary_of(tokenizer)
    ids = tokenizer.encode(DOCUMENT, add_special_tokens=False)
    pieces = [table.token_bytes[token] for token in ids]
    assert all(piece is not None for piece in pieces)
    assert b"".join(p for p in pieces if p is not None).lstrip(b" ") == DOCUMENT.encode()
    state = ANY_OBJECT.start()
    for piece in pieces:
        assert piece is not None
        state = state.feed(piece)
        assert state.valid, piece
    assert state.finished


def test_literals_that_are_prefixes_of_each_other_are_told_apart_by_what_follows() -> None:
    numbers = OutputFormat.json({"type": "array", "items": {"enum": [1, 12, 123]}})
    assert state_of(numbers, "[1,12,123]").finished
    assert not state_of(numbers, "[1234").valid and not state_of(numbers, "[13").valid
    one = state_of(OutputFormat.json({"enum": [1, 12]}), "1")
    assert one.complete and not one.finished and one.feed(b"2").finished
    many = OutputFormat.json({"enum": [f"value_{i:05d}" for i in range(4000)]})  # in 64 KiB
    assert state_of(many, '"value_03999"').finished and not state_of(many, '"value_05').valid
    assert state_of(many, '"value_0').min_close == len('0000"')


# ----- bounds: size, forks, and schemas no document satisfies -----


def _properties(count: int) -> dict[str, Any]:
    return {"type": "object", "properties": {f"z_{i}": {"type": "string"} for i in range(count)}}


def _response_format(schema: Any) -> dict[str, Any]:
    return {
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    }


def test_a_schema_past_the_grammar_compilers_reach_is_a_400_without_its_backtrace() -> None:
    """11,000 properties once panicked inside llguidance's matcher on the inference thread,
    and the client got a 500 quoting the Rust backtrace."""
    with pytest.raises(InvalidRequest) as caught:
        parse_response_format(_response_format(_properties(11_000)))
    assert caught.value.param == "response_format.json_schema.schema"
    assert "backtrace" not in caught.value.message and "panic" not in caught.value.message
    assert "more than the limit of 1,024" in caught.value.message


def test_a_panic_of_the_grammar_compiler_is_named_not_quoted() -> None:
    panic = "panic: assertion failed: x < y\n<backtrace>\n 0: <unknown> at /tmp/python-build/x.c"
    assert refusal_reason(panic) == PANIC_REASON
    assert refusal_reason("regex parse error:\n    (\n    ^\nerror: unclosed group") == (
        "regex parse error: ( ^ error: unclosed group"
    )


def test_an_object_too_wide_for_the_grammar_parser_is_a_400_when_compiled() -> None:
    """600 optional properties in one object compiled, then llguidance's parser gave up at
    the `{`: the answer was empty with `length`. Now it is refused at once, briefly."""
    with pytest.raises(InvalidRequest) as caught:
        parse_response_format(_response_format(_properties(600)))
    assert caught.value.param == "response_format.json_schema.schema"
    assert "max is 2000" in caught.value.message and "<state>" not in caught.value.message


@pytest.mark.parametrize(
    ("schema", "limit"),
    [
        (_properties(MAX_SCHEMA_PROPERTIES + 1), "1,025 properties, more than the limit of 1,024"),
        (
            {"enum": ["v" * 60] * 1100},
            f"bytes of JSON, more than the limit of {MAX_SCHEMA_BYTES:,} bytes (64 KiB)",
        ),
        (_nested(MAX_SCHEMA_NESTING), "nested deeper than the limit of 100 levels"),
    ],
)
def test_a_schema_past_a_size_limit_is_a_400_naming_the_limit(schema: Any, limit: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_response_format(_response_format(schema))
    assert caught.value.param == "response_format.json_schema.schema"
    assert limit in caught.value.message


def test_a_schema_at_the_size_limits_is_enforced() -> None:
    wide = {"type": "object", "properties": {f"o{j}": _properties(255) for j in range(4)}}
    assert accepted(OutputFormat.json(wide), '{"o2": {"z_7": "a"}}')
    deep = _nested(MAX_SCHEMA_NESTING - 1)
    assert accepted(OutputFormat.json(deep), "[" * 99 + '"a"' + "]" * 99)


def _forking(depth: int, titled: bool) -> dict[str, Any]:
    """The audit's schema: each level two `anyOf` arrays of the level below (`titled`: the
    two spelt apart, so they cannot be merged as identical)."""
    defs: dict[str, Any] = {"L0": {"type": "string"}}
    for level in range(1, depth + 1):
        option = {"type": "array", "items": {"$ref": f"#/$defs/L{level - 1}"}, "minItems": 1}
        defs[f"L{level}"] = {"anyOf": [option, {**option, "title": "b"} if titled else option]}
    return {"$defs": defs, "$ref": f"#/$defs/L{depth}"}


@pytest.mark.parametrize("titled", [False, True])
def test_forking_anyof_options_cost_a_bounded_number_of_steps(
    titled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """17 levels of two options once forked the bookkeeping into 131,072 readings (seconds
    per token on the one inference thread). Steps are counted: a byte's work is bounded."""
    from fusebox_server.model import json_grammar

    steps = 0
    feed = json_grammar._feed

    def counted(*args: Any) -> None:
        nonlocal steps
        steps += 1
        feed(*args)

    monkeypatch.setattr(json_grammar, "_feed", counted)
    state = OutputFormat.json(_forking(17, titled)).start()
    for _ in range(17):
        state = state.feed(b"[")
        assert len(state.stacks) <= 1024
    assert steps <= 17 * 4 * 1024
    state = state.feed(b'"a"' + b"]" * 17)
    assert state.untracked or state.finished


def test_a_row_under_a_forking_schema_still_writes_a_valid_document() -> None:
    """Past the cap, llguidance alone decides: the document is still the schema's."""
    output_format = OutputFormat.json(_forking(17, titled=True))
    table = vocabulary_from_bytes([bytes([b]) for b in range(256)])
    row = ConstrainedRow(output_format, table, end_ids=[], token_budget=60)
    logits = torch.zeros(256)
    logits[ord('"')] = 3.0
    logits[ord("]")] = 2.0
    logits[ord("[")] = 1.0
    text = b""
    while not row.finished and len(text) < 60:
        token = row.choose(logits, None)
        row.took(token)
        text += bytes([token])
    assert json.loads(text) and row.finished


@pytest.mark.parametrize(
    "schema",
    [
        {"$ref": "#"},
        {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
        {"anyOf": [{"$ref": "#/anyOf/1"}, {"$ref": "#/anyOf/0"}]},
    ],
)
def test_a_schema_that_only_refers_to_itself_is_a_400_naming_the_problem(schema: Any) -> None:
    """It compiled, and the answer was 200 with empty content and `length` at 0 tokens."""
    with pytest.raises(InvalidRequest) as caught:
        parse_response_format(_response_format(schema))
    assert caught.value.param == "response_format.json_schema.schema"
    assert "no JSON document satisfies the schema" in caught.value.message


def test_a_forced_tool_whose_parameters_only_refer_to_themselves_is_a_400() -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"$ref": "#"}}}
    use = parse_tool_use({"tools": [tool], "tool_choice": "required"})
    assert use is not None
    with pytest.raises(InvalidRequest) as caught:
        forced_format(use)
    assert caught.value.param == "tools[0].function.parameters"
    assert "no JSON document satisfies the schema" in caught.value.message
