"""Every parameter the official `openai` client can send, and what this server does with it.

Why: a parameter the server silently ignores is a lie to the caller (it
asked for `logprobs` and got none, for `tools` and got prose). Each
parameter of `chat.completions.create` and `completions.create` has one row
here: HONOURED (parsed and acted on by `openai_schema`), REFUSED (a 400
naming it unless it carries its "off" value, which is what it means anyway),
or CLIENT_SIDE (the client consumes it; it never reaches the body). A body
key with no row for its route is refused with a 400 naming it, which is how
unknown `extra_body` keys end. A unit test compares this table with the
installed client's signatures, so a new client parameter without a row
fails. Pure data and one pure check; docs/server.md renders the same table.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from fusebox_server.errors import InvalidRequest
from fusebox_server.http.rendering import Kind
from fusebox_server.model.json_grammar import (
    MAX_SCHEMA_BYTES,
    MAX_SCHEMA_NESTING,
    MAX_SCHEMA_PROPERTIES,
)


class Treatment(enum.StrEnum):
    HONOURED = "honoured"
    REFUSED = "refused"
    CLIENT_SIDE = "client_side"


def _absent(value: object) -> bool:
    return value is None


def _one_of(*neutral: object) -> Callable[[object], bool]:
    def accepts(value: object) -> bool:
        return value is None or any(value == item and type(value) is type(item) for item in neutral)

    return accepts


@dataclass(frozen=True)
class Parameter:
    name: str
    treatment: Treatment
    how: str
    """Why and how, one sentence, as docs/server.md shows it."""
    routes: frozenset[Kind] = frozenset({Kind.CHAT, Kind.COMPLETION})
    accepts: Callable[[object], bool] = _absent
    """For REFUSED rows: the values that mean "off" and are accepted."""


CHAT_ONLY: Final = frozenset({Kind.CHAT})
COMPLETION_ONLY: Final = frozenset({Kind.COMPLETION})
H, R, C = Treatment.HONOURED, Treatment.REFUSED, Treatment.CLIENT_SIDE

PARAMETERS: Final[tuple[Parameter, ...]] = (
    # ----- honoured -----
    Parameter("model", H, "must name the served model (`--model-name`), else 404"),
    Parameter(
        "messages",
        H,
        "rendered by the model's chat template; `developer` as `system`",
        CHAT_ONLY,
    ),
    Parameter(
        "prompt",
        H,
        "a string, or a list of exactly one string (token arrays: 400)",
        COMPLETION_ONLY,
    ),
    Parameter("max_tokens", H, "caps new tokens; at most `--max-new-tokens`, else 400"),
    Parameter(
        "max_completion_tokens",
        H,
        "as `max_tokens`; both may be sent only with the same value, else 400",
        CHAT_ONLY,
    ),
    Parameter(
        "temperature",
        H,
        "0 is greedy (so is anything below 1e-5, which float32 sampling cannot divide by); 0 to 2",
    ),
    Parameter(
        "top_p", H, "nucleus sampling; above 0, at most 1; the most likely token is always kept"
    ),
    Parameter(
        "seed",
        H,
        "the same seed and body give the same output; "
        "an integer from -2^63 to 2^64 - 1 (signed or unsigned 64-bit)",
    ),
    Parameter(
        "stop",
        H,
        "up to 4 non-empty strings of at most 256 characters; "
        "the output ends before the earliest one in it",
    ),
    Parameter(
        "n",
        H,
        "1 to 128 choices, at most `--max-concurrency` (each holds a running slot); "
        "with `seed`, choice i samples with `seed + i`",
    ),
    Parameter("stream", H, "SSE chunks, then `data: [DONE]`"),
    Parameter(
        "presence_penalty",
        H,
        "-2 to 2, subtracted from the logit of every token already generated (not the prompt)",
    ),
    Parameter(
        "frequency_penalty",
        H,
        "-2 to 2, times how often each token was generated, subtracted from its logit",
    ),
    Parameter(
        "logit_bias",
        H,
        "token id to -100..100, added to its logit; an id outside the vocabulary: 400",
    ),
    Parameter(
        "logprobs",
        H,
        "chat: `true` returns each token's log-probability; completions: 0 to 5 "
        "alternatives per token; of the model's raw distribution",
    ),
    Parameter(
        "top_logprobs", H, "0 to 20 alternatives per token; needs `logprobs: true`", CHAT_ONLY
    ),
    Parameter(
        "stream_options",
        H,
        "`include_usage` adds a final usage chunk; `include_obfuscation: true` is refused",
    ),
    Parameter(
        "response_format",
        H,
        "`json_object` and `json_schema` enforced by llguidance's constrained decoding (the "
        "text parses, and validates, `pattern`, `format`, `minLength`, `minItems`, `oneOf` "
        "included); closed within `max_tokens` when it can be for the pydantic subset "
        "(docs/server.md), else a tight `max_tokens` ends with `length` and a cut document, "
        "as OpenAI does; a keyword llguidance refuses (`uniqueItems`, `not`, `if`): 400 "
        "naming `response_format.json_schema.schema` and the keyword; so is a schema past "
        f"{MAX_SCHEMA_BYTES // 1024} KiB of JSON, {MAX_SCHEMA_PROPERTIES:,} properties or "
        f"{MAX_SCHEMA_NESTING} levels of nesting (naming the limit), or one no document "
        'satisfies (`{"$ref": "#"}`); `json_schema.description` is accepted and does '
        "not steer generation",
        CHAT_ONLY,
    ),
    Parameter("user", H, "a string, logged on the request's line as `user`; no effect on output"),
    Parameter(
        "safety_identifier",
        H,
        "a string, logged as `safety_identifier`; no effect on output",
        CHAT_ONLY,
    ),
    Parameter(
        "prompt_cache_key",
        H,
        "a string, logged as `prompt_cache_key`; the tokenizer cache is keyed by text "
        "already, so it changes nothing else",
        CHAT_ONLY,
    ),
    Parameter(
        "tools",
        H,
        "functions rendered by the chat template and the reply parsed in the family's call "
        "format into `tool_calls`; a template without tools: 400; with a JSON "
        "`response_format` under `auto`, 400 naming `response_format` where the family's "
        "call is not JSON (Hermes, Mistral: it could never be written), accepted for "
        "Llama 3, whose JSON call comes back as a call",
        CHAT_ONLY,
    ),
    Parameter(
        "tool_choice",
        H,
        "`none`, `auto`, or a call forced by constraining the output with llguidance: a "
        "named function to its `parameters`, `required` to a list of one or more calls of "
        "the tools (a keyword it refuses: 400 naming the tool's `parameters`); a forced "
        "call cut short (`max_tokens`, a stop sequence) is still the call, its arguments as "
        'far as written, with the generation\'s `finish_reason` (`"length"`), streamed or '
        "not, as OpenAI does",
        CHAT_ONLY,
    ),
    Parameter(
        "parallel_tool_calls",
        H,
        "`false`: one call (only the first of an `auto` reply; `required` forced to "
        "exactly one); `true` (the default): every call, `required` included",
        CHAT_ONLY,
    ),
    # ----- refused unless off -----
    Parameter("functions", R, "the deprecated form of `tools`: send `tools`", CHAT_ONLY),
    Parameter(
        "function_call",
        R,
        'the deprecated form of `tool_choice`: `"none"` accepted',
        CHAT_ONLY,
        _one_of("none"),
    ),
    Parameter("audio", R, "text only", CHAT_ONLY),
    Parameter("modalities", R, 'text only: `["text"]` accepted', CHAT_ONLY, _one_of(["text"])),
    Parameter("prediction", R, "no predicted outputs", CHAT_ONLY),
    Parameter("reasoning_effort", R, "not a reasoning model", CHAT_ONLY),
    Parameter("verbosity", R, "not a reasoning model; no verbosity control", CHAT_ONLY),
    Parameter("web_search_options", R, "no web search", CHAT_ONLY),
    Parameter(
        "store", R, "nothing is stored: `false` accepted, `true` 400", CHAT_ONLY, _one_of(False)
    ),
    Parameter("metadata", R, "kept only with `store`, which is refused", CHAT_ONLY),
    Parameter(
        "service_tier",
        R,
        "one tier: `auto` and `default` accepted, others 400",
        CHAT_ONLY,
        _one_of("auto", "default"),
    ),
    Parameter("prompt_cache_retention", R, "no prompt cache retention policy", CHAT_ONLY),
    Parameter("prompt_cache_options", R, "no prompt cache options", CHAT_ONLY),
    Parameter("moderation", R, "no moderation pass", CHAT_ONLY),
    Parameter(
        "echo", R, "the prompt is not echoed: `false` accepted", COMPLETION_ONLY, _one_of(False)
    ),
    Parameter("best_of", R, "1 accepted, other counts 400", COMPLETION_ONLY, _one_of(1)),
    Parameter("suffix", R, 'no insertion: `""` accepted', COMPLETION_ONLY, _one_of("")),
    # ----- consumed by the client -----
    Parameter("extra_body", C, "merged into the body: each key meets its row, unknown keys 400"),
    Parameter("extra_headers", C, "sent as headers (`X-Request-Id` is honoured, others unread)"),
    Parameter("extra_query", C, "sent as a query string: any query parameter is refused, 400"),
    Parameter("timeout", C, "the client's own timeout; never sent"),
)

BY_NAME: Final[Mapping[str, Parameter]] = {row.name: row for row in PARAMETERS}


def body_parameters(kind: Kind) -> frozenset[str]:
    """The names a request body of this route may carry."""
    return frozenset(row.name for row in PARAMETERS if kind in row.routes and row.treatment != C)


def check_parameters(body: Mapping[str, Any], kind: Kind) -> None:
    """A 400 naming the first key that has no row for this route or asks for a refused feature."""
    allowed = body_parameters(kind)
    for name, value in body.items():
        if name not in allowed:
            raise InvalidRequest(
                f"unknown parameter {name!r} for the {kind.value} route", param=name
            )
        row = BY_NAME[name]
        if row.treatment == R and not row.accepts(value):
            raise InvalidRequest(f"{name!r} is not supported: {row.how}", param=name)


def check_query(query: Mapping[str, str]) -> None:
    """A 400 naming the first query parameter: the generation routes read none."""
    for name in query:
        raise InvalidRequest(f"unknown query parameter {name!r}", param=name)
