"""Validation of OpenAI request bodies into plain dataclasses.

Why: the peer answers 500 to ill-typed `messages` (FACTS.md); here every
field is checked before any model work, and each problem becomes a 400
(a value we refuse) or a 422 (a wrong type or a missing field) naming the
parameter. Pure functions: bytes in, a request or a domain error out.
Every top-level key must have a row in `openai_parameters` (a 400 names
any other, and any refused feature), so nothing a client sends is silently
ignored. Hostile JSON (duplicate keys, lone surrogate escapes, numbers no
float or 64-bit seed can hold, nesting past the parser's depth) ends as a
400 too, never as an exception in the engine.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from typing import Any, Final

from fusebox_server.errors import InvalidJson, InvalidRequest, SchemaError
from fusebox_server.http.openai_parameters import check_parameters
from fusebox_server.http.rendering import Kind
from fusebox_server.http.response_format import parse_response_format
from fusebox_server.http.tool_calls import HistoryCall, ToolUse, parse_history_calls, parse_tool_use
from fusebox_server.model.json_grammar import OutputFormat

ROLES = ("system", "user", "assistant", "developer", "tool")
SEED_RANGE = (-(1 << 63), (1 << 64) - 1)
"""What `torch.Generator.manual_seed` takes."""
LOGGED_IDENTIFIERS = ("user", "safety_identifier", "prompt_cache_key")
"""Honoured by logging them on the request's line; they change no output."""
STREAM_OPTIONS = ("include_usage", "include_obfuscation")


@dataclass(frozen=True)
class OpenAISampling:
    """The body's sampling fields, as OpenAI names them.

    Read only by the HTTP layer, which resolves the token budget and hands the
    engine a `decode_settings.DecodeSettings` that names no API field.
    """

    max_tokens: int | None
    """`max_completion_tokens`, else `max_tokens`; None when neither was sent."""
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]
    max_tokens_param: str = "max_tokens"
    """The field `max_tokens` came from, for an error that names it."""
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, bias) pairs; ids are checked against the vocabulary by `check_logit_bias`."""
    logprobs: int | None = None
    """How many alternatives to report per token (chat `top_logprobs`, completion
    `logprobs`); None when no log-probabilities were asked for."""
    output_format: OutputFormat | None = None
    """`response_format` json_object / json_schema; None for free text."""


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str
    tool_calls: tuple[HistoryCall, ...] = ()
    """An assistant turn's calls, sent back as history."""
    tool_call_id: str | None = None
    """A `tool` turn: the call it answers."""
    name: str | None = None
    """The participant's name: passed to the template, which decides what it shows."""

    def template_message(self) -> dict[str, Any]:
        """The message as chat templates read it (calls with decoded arguments)."""
        message: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.name is not None:
            message["name"] = self.name
        if self.tool_calls:
            message["tool_calls"] = [call.template_entry() for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: tuple[ChatMessage, ...]
    stream: bool
    include_usage: bool
    sampling: OpenAISampling
    wants_json: bool
    identifiers: tuple[tuple[str, str], ...] = ()
    tool_use: ToolUse | None = None
    """The request's tools and `tool_choice`; None when it declares no tools."""


@dataclass(frozen=True)
class CompletionRequest:
    model: str
    prompt: str
    stream: bool
    include_usage: bool
    sampling: OpenAISampling
    wants_json: bool = False
    identifiers: tuple[tuple[str, str], ...] = ()


def _object_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for key, item in pairs:
        if key in value:
            raise InvalidJson(f"request body repeats the key {key!r}", param=key)
        value[key] = item
    return value


def parse_json_body(body: bytes) -> dict[str, Any]:
    """Strict UTF-8, JSON, an object at the top."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InvalidJson(f"request body is not valid UTF-8: {error.reason}") from error
    try:
        value = json.loads(text, object_pairs_hook=_object_without_duplicates)
        # A lone surrogate escape (\ud800) loads as a str no codec can write.
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidJson("request body has an invalid \\u escape (a lone surrogate)") from None
    except ValueError as error:
        raise InvalidJson(f"request body is not valid JSON: {error}") from error
    except RecursionError:
        raise InvalidJson("request body nests JSON too deeply") from None
    if not isinstance(value, dict):
        raise SchemaError("request body must be a JSON object")
    return value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _optional_int(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not _is_int(value):
        raise SchemaError(f"'{name}' must be an integer", param=name)
    if value < 1:
        raise InvalidRequest(f"'{name}' must be at least 1, got {value}", param=name)
    return int(value)


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if not _is_number(value):
        raise SchemaError(f"'{name}' must be a number", param=name)
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number) or not low <= number <= high:
        raise InvalidRequest(f"'{name}' must be between {low} and {high}, got {value}", param=name)
    return number


def _bool(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise SchemaError(f"'{name}' must be a boolean", param=name)
    return value


N_MAX: Final = 128
"""OpenAI's own limit on `n`; the server's concurrency limit may be lower (a 400 then)."""
CHAT_TOP_LOGPROBS_MAX: Final = 20
COMPLETION_LOGPROBS_MAX: Final = 5
LOGIT_BIAS_MAX: Final = 100.0
LOGIT_BIAS_ID_DIGITS_MAX: Final = 18
"""A token id longer than this (leading zeros aside) is in no vocabulary; it is refused
before `int()`, which raises past 4,300 digits."""
LOGIT_BIAS_ENTRIES_MAX: Final = 1024
"""Each entry is a scatter into every step's logits; OpenAI documents no count limit."""


def _bounded_int(body: dict[str, Any], name: str, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not _is_int(value):
        raise SchemaError(f"'{name}' must be an integer", param=name)
    if not low <= value <= high:
        raise InvalidRequest(f"'{name}' must be between {low} and {high}, got {value}", param=name)
    return int(value)


def _logit_bias(body: dict[str, Any]) -> tuple[tuple[int, float], ...]:
    """Token id strings to biases in -100..100; ids are non-negative decimal integers."""
    value = body.get("logit_bias")
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise SchemaError("'logit_bias' must be an object", param="logit_bias")
    if len(value) > LOGIT_BIAS_ENTRIES_MAX:
        raise InvalidRequest(
            f"'logit_bias' takes at most {LOGIT_BIAS_ENTRIES_MAX} tokens", param="logit_bias"
        )
    keys: dict[int, str] = {}
    pairs: list[tuple[int, float]] = []
    for key, bias in value.items():
        if not (key.isascii() and key.isdigit()):
            raise InvalidRequest(
                f"'logit_bias' keys must be token ids, got {key!r}", param="logit_bias"
            )
        digits = key.lstrip("0") or "0"
        if len(digits) > LOGIT_BIAS_ID_DIGITS_MAX:  # and before int(): over 4,300 digits raises
            raise InvalidRequest(
                f"'logit_bias' names a token id of {len(digits)} digits, outside any vocabulary",
                param="logit_bias",
            )
        token = int(digits)
        if token in keys:
            # Two spellings of one id ("1", "01") would add up past -100..100.
            raise InvalidRequest(
                f"'logit_bias' names token id {token} twice: {keys[token]!r} and {key!r}",
                param="logit_bias",
            )
        keys[token] = key
        number = _number({"logit_bias": bias}, "logit_bias", 0.0, -LOGIT_BIAS_MAX, LOGIT_BIAS_MAX)
        pairs.append((token, number))
    return tuple(pairs)


def check_logit_bias(bias: tuple[tuple[int, float], ...], vocabulary_size: int) -> None:
    """A 400 naming `logit_bias` for a token id the model does not have."""
    outside = sorted(token for token, _ in bias if token >= vocabulary_size)
    if outside:
        raise InvalidRequest(
            f"'logit_bias' names token ids outside the vocabulary of {vocabulary_size} "
            f"tokens: {outside[:5]}",
            param="logit_bias",
        )


def _chat_logprobs(body: dict[str, Any]) -> int | None:
    wanted = _bool(body, "logprobs")
    top = _bounded_int(body, "top_logprobs", 0, CHAT_TOP_LOGPROBS_MAX)
    if top is not None and not wanted:
        raise InvalidRequest("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    return (top or 0) if wanted else None


# The longest stop sequence: every decoding step holds back and searches up to this many
# characters per sequence, so an unbounded one (300,000 characters) slowed every row of the batch.
STOP_MAX_CHARS: Final = 256


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise SchemaError("'stop' must be a string or a list of strings", param="stop")
    if len(value) > 4:
        raise InvalidRequest("'stop' takes at most 4 sequences", param="stop")
    if any(item == "" for item in value):
        raise InvalidRequest("'stop' sequences must not be empty", param="stop")
    if any(len(item) > STOP_MAX_CHARS for item in value):
        raise InvalidRequest(
            f"'stop' sequences must be at most {STOP_MAX_CHARS} characters", param="stop"
        )
    return tuple(value)


def _common(body: dict[str, Any]) -> tuple[str, bool, bool, OpenAISampling]:
    model = body.get("model")
    if model is None:
        raise SchemaError("'model' is required", param="model")
    if not isinstance(model, str):
        raise SchemaError("'model' must be a string", param="model")
    n = _bounded_int(body, "n", 1, N_MAX) or 1
    stream = _bool(body, "stream")
    include_usage = _stream_options(body, stream)
    legacy_max_tokens = _optional_int(body, "max_tokens")  # checked even when not used
    max_tokens_param = "max_completion_tokens"
    max_tokens = _optional_int(body, max_tokens_param)
    if max_tokens is None:
        max_tokens_param, max_tokens = "max_tokens", legacy_max_tokens
    elif legacy_max_tokens is not None and legacy_max_tokens != max_tokens:
        raise InvalidRequest(
            f"'max_tokens' ({legacy_max_tokens}) and 'max_completion_tokens' ({max_tokens}) "
            "differ: send one of them",
            param="max_completion_tokens",  # the field a client varies (max_tokens is legacy)
        )
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise SchemaError("'seed' must be an integer", param="seed")
    if seed is not None and not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise InvalidRequest("'seed' must fit in 64 bits", param="seed")
    sampling = OpenAISampling(
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0),
        seed=seed,
        stop=_stop(body),
        max_tokens_param=max_tokens_param,
        n=n,
        presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        logit_bias=_logit_bias(body),
    )
    if sampling.top_p == 0.0:
        raise InvalidRequest("'top_p' must be greater than 0", param="top_p")
    return model, stream, include_usage, sampling


def _stream_options(body: dict[str, Any], stream: bool) -> bool:
    """Whether a final usage chunk is wanted; options are refused without a stream."""
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise SchemaError("'stream_options' must be an object", param="stream_options")
    if not stream:
        raise InvalidRequest(
            "'stream_options' is only allowed with 'stream': true", param="stream_options"
        )
    for name, value in options.items():
        param = f"stream_options.{name}"
        if name not in STREAM_OPTIONS:
            raise InvalidRequest(f"unknown stream option {name!r}", param=param)
        if value is not None and not isinstance(value, bool):
            raise SchemaError(f"'{param}' must be a boolean", param=param)
    if options.get("include_obfuscation"):
        raise InvalidRequest(
            "'stream_options.include_obfuscation' is not supported: chunks carry no padding",
            param="stream_options.include_obfuscation",
        )
    return bool(options.get("include_usage"))


def _identifiers(body: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    found: list[tuple[str, str]] = []
    for name in LOGGED_IDENTIFIERS:
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, str):
            raise SchemaError(f"'{name}' must be a string", param=name)
        found.append((name, value))
    return tuple(found)


TEXT_PART_KEYS: Final = frozenset({"type", "text"})


def _content(value: object, index: int) -> str:
    param = f"messages[{index}].content"
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts: list[str] = []
        for number, part in enumerate(value):
            if not isinstance(part, dict) or part.get("type") != "text":
                raise InvalidRequest(f"'{param}' supports only text parts", param=param)
            for key in part:
                if key not in TEXT_PART_KEYS:  # e.g. cache_control: refused, never dropped
                    at = f"{param}[{number}].{key}"
                    raise InvalidRequest(f"'{at}' is not a field of a text part", param=at)
            text = part.get("text")
            if not isinstance(text, str):
                raise SchemaError(f"'{param}' text parts need a string 'text'", param=param)
            parts.append(text)
        return "".join(parts)
    if value is None:
        return ""
    raise SchemaError(f"'{param}' must be a string or a list of text parts", param=param)


MESSAGE_KEYS: Final = {
    "system": frozenset({"role", "content", "name"}),
    "developer": frozenset({"role", "content", "name"}),
    "user": frozenset({"role", "content", "name"}),
    "assistant": frozenset({"role", "content", "name", "tool_calls", "refusal"}),
    "tool": frozenset({"role", "content", "tool_call_id", "name"}),
}
"""The keys each role's message may carry; any other is a 400 naming it, never dropped."""
ASSISTANT_OFF_KEYS: Final[dict[str, tuple[object, ...]]] = {
    "function_call": (None,),
    "audio": (None,),
    "annotations": (None, []),
}
"""Keys of an OpenAI reply's message that a client sends back as history, accepted only
with the value that means none (this server writes no such thing)."""


def _message(message: dict[str, Any], role: str, index: int) -> ChatMessage:
    for key, value in message.items():
        if key in MESSAGE_KEYS[role]:
            continue
        param = f"messages[{index}].{key}"
        if role == "assistant" and value in ASSISTANT_OFF_KEYS.get(key, ()):
            continue
        raise InvalidRequest(f"'{param}' is not supported on a {role} message", param=param)
    name = message.get("name")
    if name is not None and not isinstance(name, str):
        param = f"messages[{index}].name"
        raise SchemaError(f"'{param}' must be a string", param=param)
    content = _content(message.get("content"), index)
    refusal = message.get("refusal")
    if refusal is not None:
        param = f"messages[{index}].refusal"
        if not isinstance(refusal, str):
            raise SchemaError(f"'{param}' must be a string", param=param)
        if content and refusal:
            raise InvalidRequest(f"'{param}' and 'content' cannot both be sent", param=param)
        content = content or refusal  # the assistant's words, as the template reads them
    calls = parse_history_calls(message.get("tool_calls"), index)
    if calls and role != "assistant":
        param = f"messages[{index}].tool_calls"
        raise InvalidRequest(f"'{param}' is only allowed on assistant messages", param=param)
    call_id = message.get("tool_call_id")
    if role == "tool" and not isinstance(call_id, str):
        param = f"messages[{index}].tool_call_id"
        raise InvalidRequest(f"'{param}' must be a string on a tool message", param=param)
    return ChatMessage(
        # OpenAI's `developer` is the system turn of its newer models: templates know
        # `system`, and a `developer` header would be one the model never saw in training.
        role="system" if role == "developer" else role,
        content=content,
        tool_calls=calls,
        tool_call_id=call_id if role == "tool" else None,
        name=name,
    )


def parse_chat_request(body: dict[str, Any]) -> ChatRequest:
    check_parameters(body, Kind.CHAT)
    model, stream, include_usage, sampling = _common(body)
    output_format = parse_response_format(body)
    sampling = replace(sampling, logprobs=_chat_logprobs(body), output_format=output_format)
    messages = body.get("messages")
    if messages is None:
        raise SchemaError("'messages' is required", param="messages")
    if not isinstance(messages, list):
        raise SchemaError("'messages' must be a list", param="messages")
    if not messages:
        raise InvalidRequest("'messages' must not be empty", param="messages")
    parsed: list[ChatMessage] = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise SchemaError(f"'messages[{index}]' must be an object", param=f"messages[{index}]")
        role = message.get("role")
        if not isinstance(role, str):
            raise SchemaError(
                f"'messages[{index}].role' must be a string", param=f"messages[{index}].role"
            )
        if role not in ROLES:
            raise InvalidRequest(
                f"'messages[{index}].role' must be one of {', '.join(ROLES)}, got {role!r}",
                param=f"messages[{index}].role",
            )
        parsed.append(_message(message, role, index))
    return ChatRequest(
        model=model,
        messages=tuple(parsed),
        stream=stream,
        include_usage=include_usage,
        sampling=sampling,
        wants_json=output_format is not None,
        identifiers=_identifiers(body),
        tool_use=parse_tool_use(body),
    )


def parse_completion_request(body: dict[str, Any]) -> CompletionRequest:
    check_parameters(body, Kind.COMPLETION)
    model, stream, include_usage, sampling = _common(body)
    logprobs = _bounded_int(body, "logprobs", 0, COMPLETION_LOGPROBS_MAX)
    sampling = replace(sampling, logprobs=logprobs)
    prompt = body.get("prompt")
    if prompt is None:
        raise SchemaError("'prompt' is required", param="prompt")
    if isinstance(prompt, list):
        if len(prompt) != 1 or not isinstance(prompt[0], str):
            raise InvalidRequest(
                "'prompt' must be a string or a list of one string", param="prompt"
            )
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise SchemaError("'prompt' must be a string", param="prompt")
    return CompletionRequest(
        model=model,
        prompt=prompt,
        stream=stream,
        include_usage=include_usage,
        sampling=sampling,
        identifiers=_identifiers(body),
    )
