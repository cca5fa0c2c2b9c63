"""Tool calling: the request's tools and choice, the family's call formats, and the replies.

Why: a model calls a tool by writing text in its family's format (Qwen's
`<tool_call>{json}</tool_call>`, Llama 3's bare `{"name": .., "parameters": ..}`,
Mistral's `[TOOL_CALLS][...]`); OpenAI clients expect `message.tool_calls`.
This module validates `tools` / `tool_choice` / `parallel_tool_calls` (a 400
naming the bad path), picks the parser from the chat template's own text,
turns generated text into calls (text that does not parse stays content,
never an error; a forced call cut short is still the call, as OpenAI's is),
builds the JSON schema that forces a call when the request requires one
(compiled by `model.structured_output`), refuses a JSON `response_format`
that would leave `auto`'s calls unwritable, and splits a stream into content
and call deltas, with the finish reason the whole answer would have. Pure
functions and one small stateful splitter; no I/O.
"""

from __future__ import annotations

import enum
import json
import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final

from fusebox_server.errors import InvalidRequest
from fusebox_server.model.structured_output import OutputFormat, UnsupportedSchema

NAME_PATTERN: Final = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
"""OpenAI's rule for a function name."""
TOOLS_MAX: Final = 128
"""OpenAI's own limit on `tools`."""


class ChoiceMode(enum.StrEnum):
    NONE = "none"
    AUTO = "auto"
    REQUIRED = "required"
    NAMED = "named"


@dataclass(frozen=True)
class FunctionTool:
    name: str
    description: str | None
    parameters: Mapping[str, Any]
    """A JSON schema of the arguments object (`{"type": "object"}` when the tool sent none)."""
    strict: bool = False
    """The client asks for arguments that conform: enforced only on a forced call."""

    def template_entry(self) -> dict[str, Any]:
        """The tool as chat templates read it (the OpenAI shape, as transformers passes it)."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = dict(self.parameters)
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolUse:
    """What a request asks of tools: its tools, the choice, and whether calls may be several."""

    tools: tuple[FunctionTool, ...]
    mode: ChoiceMode
    named: str | None = None
    """The function `tool_choice` names (mode NAMED)."""
    parallel: bool = True

    @property
    def parses_calls(self) -> bool:
        """Whether the reply is read for calls: `none` asks for text only."""
        return self.mode != ChoiceMode.NONE

    @property
    def forced(self) -> bool:
        """`required` or a named function: the output is constrained to a call."""
        return self.mode in (ChoiceMode.REQUIRED, ChoiceMode.NAMED)

    def tool(self, name: str) -> FunctionTool | None:
        return next((tool for tool in self.tools if tool.name == name), None)


@dataclass(frozen=True)
class FunctionCall:
    """A call as the model wrote it: the function's name and its arguments as JSON text."""

    name: str
    arguments: str


@dataclass(frozen=True)
class HistoryCall:
    """A call of an earlier assistant turn, sent back in `messages[i].tool_calls`."""

    id: str
    name: str
    arguments: Any
    """The decoded arguments: chat templates write them with `tojson`."""

    def template_entry(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


# ----- the request -----
def _bad(message: str, param: str) -> InvalidRequest:
    return InvalidRequest(message, param=param)


def _function_tool(value: object, index: int) -> FunctionTool:
    path = f"tools[{index}]"
    if not isinstance(value, dict):
        raise _bad(f"'{path}' must be an object", path)
    if value.get("type") != "function":
        raise _bad(f"'{path}.type' must be 'function'", f"{path}.type")
    unknown = sorted(set(value) - {"type", "function"})
    if unknown:
        raise _bad(f"'{path}' has an unknown key {unknown[0]!r}", f"{path}.{unknown[0]}")
    function = value.get("function")
    if not isinstance(function, dict):
        raise _bad(f"'{path}.function' must be an object", f"{path}.function")
    unknown = sorted(set(function) - {"name", "description", "parameters", "strict"})
    if unknown:
        key = unknown[0]
        raise _bad(f"'{path}.function' has an unknown key {key!r}", f"{path}.function.{key}")
    name = function.get("name")
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise _bad(
            f"'{path}.function.name' must be 1 to 64 letters, digits, '_' or '-'",
            f"{path}.function.name",
        )
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise _bad(
            f"'{path}.function.description' must be a string", f"{path}.function.description"
        )
    strict = function.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise _bad(f"'{path}.function.strict' must be a boolean", f"{path}.function.strict")
    parameters = function.get("parameters")
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
    if not isinstance(parameters, dict):
        raise _bad(
            f"'{path}.function.parameters' must be a JSON schema object",
            f"{path}.function.parameters",
        )
    if parameters.get("type", "object") != "object":
        raise _bad(
            f"'{path}.function.parameters' must describe an object (type 'object')",
            f"{path}.function.parameters.type",
        )
    return FunctionTool(name, description, parameters, strict=bool(strict))


def _choice(value: object, names: Sequence[str]) -> tuple[ChoiceMode, str | None]:
    if value is None:
        return (ChoiceMode.AUTO if names else ChoiceMode.NONE), None
    if isinstance(value, str):
        if value not in ("none", "auto", "required"):
            raise _bad(
                f"'tool_choice' must be none, auto, required or a function, got {value!r}",
                "tool_choice",
            )
        return ChoiceMode(value), None
    if not isinstance(value, dict) or value.get("type") != "function":
        raise _bad(
            '\'tool_choice\' must be a string or {"type": "function", "function": {"name": ...}}',
            "tool_choice",
        )
    function = value.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise _bad("'tool_choice.function.name' must be a string", "tool_choice.function.name")
    if name not in names:
        raise _bad(
            f"'tool_choice' names the function {name!r}, which is not in 'tools'",
            "tool_choice",
        )
    return ChoiceMode.NAMED, name


def parse_tool_use(body: Mapping[str, Any]) -> ToolUse | None:
    """The request's tools, or None when it declares none (`tools` absent, null or [])."""
    value = body.get("tools")
    if value is not None and not isinstance(value, list):
        raise _bad("'tools' must be a list", "tools")
    tools = tuple(_function_tool(item, index) for index, item in enumerate(value or []))
    if len(tools) > TOOLS_MAX:
        raise _bad(f"'tools' takes at most {TOOLS_MAX} functions", "tools")
    names = [tool.name for tool in tools]
    for index, name in enumerate(names):
        if name in names[:index]:
            raise _bad(f"'tools' declares the function {name!r} twice", f"tools[{index}]")
    mode, named = _choice(body.get("tool_choice"), names)
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise _bad("'parallel_tool_calls' must be a boolean", "parallel_tool_calls")
    if not tools:
        if mode != ChoiceMode.NONE:
            raise _bad(f"'tool_choice' {mode.value!r} needs 'tools'", "tool_choice")
        if parallel is not None:
            raise _bad("'parallel_tool_calls' needs 'tools'", "parallel_tool_calls")
        return None
    if mode == ChoiceMode.AUTO:
        for index, tool in enumerate(tools):
            if tool.strict:
                # The model writes a call freely under auto; nothing holds its arguments
                # to the schema, so strict would be a promise not kept.
                param = f"tools[{index}].function.strict"
                raise _bad(
                    f"'{param}': strict arguments are enforced only when 'tool_choice' is "
                    "'required' or names the function; send strict false, or force the call",
                    param,
                )
    return ToolUse(tools, mode, named, True if parallel is None else parallel)


def parse_history_calls(value: object, index: int) -> tuple[HistoryCall, ...]:
    """An assistant message's `tool_calls`: OpenAI's shape, arguments a JSON string."""
    path = f"messages[{index}].tool_calls"
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _bad(f"'{path}' must be a list", path)
    calls: list[HistoryCall] = []
    for number, call in enumerate(value):
        at = f"{path}[{number}]"
        if not isinstance(call, dict) or call.get("type", "function") != "function":
            raise _bad(f"'{at}' must be an object of type 'function'", at)
        call_id = call.get("id")
        if not isinstance(call_id, str):
            raise _bad(f"'{at}.id' must be a string", f"{at}.id")
        function = call.get("function")
        if not isinstance(function, dict):
            raise _bad(f"'{at}.function' must be an object", f"{at}.function")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise _bad(f"'{at}.function.name' must be a non-empty string", f"{at}.function.name")
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            raise _bad(
                f"'{at}.function.arguments' must be a JSON string", f"{at}.function.arguments"
            )
        try:
            decoded = json.loads(arguments)
        except (ValueError, RecursionError):
            raise _bad(
                f"'{at}.function.arguments' is not valid JSON (or nests too deeply)",
                f"{at}.function.arguments",
            ) from None
        calls.append(HistoryCall(call_id, name, decoded))
    return tuple(calls)


# ----- the family's format -----
class CallFormat(enum.StrEnum):
    """How a family's model writes a call, as its chat template teaches it."""

    HERMES = "hermes"
    """Qwen 2.5 / 3 (Hermes): any number of `<tool_call>{"name", "arguments"}</tool_call>`."""
    LLAMA3_JSON = "llama3_json"
    """Llama 3.x: the whole answer is `{"name": .., "parameters": {..}}` (several joined by ';')."""
    MISTRAL = "mistral"
    """Mistral: `[TOOL_CALLS]` then a JSON list of `{"name": .., "arguments": {..}}`."""


def format_of_template(source: str) -> CallFormat | None:
    """The call format a chat template teaches, from the markers it writes; None if none."""
    if "[TOOL_CALLS]" in source:
        return CallFormat.MISTRAL
    if "<tool_call>" in source:
        return CallFormat.HERMES
    if '"parameters"' in source:
        return CallFormat.LLAMA3_JSON
    return None


JSON_CALL_FORMATS: Final = frozenset({CallFormat.LLAMA3_JSON})
"""Formats whose call is a bare JSON document, which a JSON `response_format` can allow."""


def check_json_answer(use: ToolUse | None, call_format: CallFormat | None) -> None:
    """A JSON `response_format` with tools under `auto`: a 400 naming `response_format`
    when the JSON grammar would forbid the family's call (Hermes' `<tool_call>`,
    Mistral's `[TOOL_CALLS]`), so the model could never call a tool and the client would
    not be told. Llama 3 writes a call as a JSON object, which the format can shape, and
    `auto` reads it back as a call; `none` asks for no calls; a forced call is refused
    with `response_format` already (`tool_choice`), both constraining the output."""
    if use is None or use.mode != ChoiceMode.AUTO or call_format in JSON_CALL_FORMATS:
        return
    marker = MARKERS.get(call_format) if call_format is not None else None
    raise _bad(
        "'response_format' constrains the answer to JSON, and this model writes a tool "
        f"call as {marker or 'text'} outside JSON, so under tool_choice 'auto' it could "
        "never call the tools: drop 'response_format', or send tool_choice 'none' for "
        "a JSON answer",
        "response_format",
    )


@dataclass(frozen=True)
class ParsedReply:
    content: str | None
    calls: tuple[FunctionCall, ...]
    cut: bool = False
    """A forced call the generation stopped before it closed (`max_tokens`, a stop
    sequence): `calls` hold what was written, the last one's arguments as far as they
    go, and the finish reason stays the generation's, as OpenAI's does."""

    def finish_reason(self, generated: str) -> str:
        """The choice's `finish_reason`: `tool_calls` for whole calls, else the
        generation's own (`length` for a call cut by `max_tokens`)."""
        return "tool_calls" if self.calls and not self.cut else generated


HERMES_CALL: Final = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def content_beside_calls(before: str, outside: str) -> str | None:
    """The `content` of a reply with calls: the text outside them (`outside`), less the
    whitespace that ends it, and less the whitespace that opens it when there is no text
    before the first call (`before`): the newlines a model writes around its calls.

    Exactly what a stream can send as the text comes (`StreamSplitter`), so streamed
    deltas join to the unstreamed content: text goes out as written, except whitespace,
    held until text follows it.
    """
    content = outside.rstrip()
    if not before.strip():
        content = content.lstrip()
    return content or None


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_DECODER: Final = json.JSONDecoder(parse_float=Decimal, parse_constant=_not_json)
"""A model's JSON: a fraction or exponent kept as written (`9e999` is a JSON number, which
a float would make `Infinity`, and `Infinity` is not JSON), NaN and Infinity refused."""


def _json_text(value: Any) -> str:
    """`value` as `json.dumps` spells it (`", "`, `": "`, no ASCII escapes), each number
    as decoded by `_DECODER`: never NaN or Infinity."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_json_text(k)}: {_json_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_json_text(item) for item in value) + "]"
    if isinstance(value, Decimal):
        return str(value)
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def _call_of(value: object, argument_keys: tuple[str, ...]) -> FunctionCall | None:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments: object = {}
    for key in argument_keys:
        if key in value:
            arguments = value[key]
            break
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = _DECODER.decode(arguments)
        except (ValueError, RecursionError):
            return None
    if not isinstance(arguments, dict):
        return None
    return FunctionCall(value["name"], _json_text(arguments))


def _json_values(text: str, separators: str) -> list[Any] | None:
    """Every JSON value of `text`, allowing `separators` and whitespace between them; None
    unless the values cover the whole text."""
    values: list[Any] = []
    position = 0
    while True:
        while position < len(text) and (text[position].isspace() or text[position] in separators):
            position += 1
        if position == len(text):
            return values
        try:
            value, position = _DECODER.raw_decode(text, position)
        except (ValueError, RecursionError):  # a model can nest brackets past the parser
            return None
        values.append(value)


def _parse_hermes(text: str) -> ParsedReply | None:
    blocks = list(HERMES_CALL.finditer(text))
    if not blocks:
        return None
    calls: list[FunctionCall] = []
    for block in blocks:
        try:
            value = _DECODER.decode(block.group(1))
        except (ValueError, RecursionError):
            return None
        call = _call_of(value, ("arguments", "parameters"))
        if call is None:
            return None
        calls.append(call)
    outside = HERMES_CALL.sub("", text)
    if "<tool_call>" in outside:  # an unfinished call: the text is not a clean reply
        return None
    return ParsedReply(content_beside_calls(text[: blocks[0].start()], outside), tuple(calls))


def _parse_llama3(text: str) -> ParsedReply | None:
    stripped = text.strip().removeprefix("<|python_tag|>")
    if not stripped.startswith("{"):
        return None
    values = _json_values(stripped, ";")
    if not values:
        return None
    calls = [_call_of(value, ("parameters", "arguments")) for value in values]
    if any(call is None for call in calls):
        return None
    return ParsedReply(None, tuple(call for call in calls if call is not None))


def _parse_mistral(text: str) -> ParsedReply | None:
    head, marker, tail = text.partition("[TOOL_CALLS]")
    if not marker:  # the marker is a special token a decoder may drop: the list alone
        head, tail = "", text.strip()
        if not tail.startswith("[{"):
            return None
    values = _json_values(tail, "")
    if values is None or len(values) != 1 or not isinstance(values[0], list) or not values[0]:
        return None
    calls = [_call_of(value, ("arguments", "parameters")) for value in values[0]]
    if any(call is None for call in calls):
        return None
    calls_made = tuple(call for call in calls if call is not None)
    return ParsedReply(content_beside_calls(head, head), calls_made)


PARSERS: Final = {
    CallFormat.HERMES: _parse_hermes,
    CallFormat.LLAMA3_JSON: _parse_llama3,
    CallFormat.MISTRAL: _parse_mistral,
}


def parse_reply(text: str, call_format: CallFormat, use: ToolUse) -> ParsedReply:
    """The generated text as content and calls. Text that is not a clean set of calls to
    declared functions stays content, whole; with `parallel_tool_calls: false` only the
    first call is kept."""
    parsed = PARSERS[call_format](text)
    if parsed is None or any(use.tool(call.name) is None for call in parsed.calls):
        return ParsedReply(text, ())
    if not use.parallel:
        return ParsedReply(parsed.content, parsed.calls[:1])
    return parsed


# ----- forcing a call -----
def forced_schema(use: ToolUse) -> dict[str, Any]:
    """The JSON schema the output is constrained to when a call is forced.

    A named function: its arguments object (the output is the arguments).
    `required`: as vLLM, a list of one or more `{"name": .., "parameters": ..}` objects,
    any of the tools (`minItems: 1`, so `[]`, no call at all, cannot be written); with
    `parallel_tool_calls: false`, one such object, not a list.
    """
    if use.mode == ChoiceMode.NAMED:
        tool = use.tool(use.named or "")
        assert tool is not None  # parse_tool_use checked the name
        return dict(tool.parameters)
    definitions: dict[str, Any] = {}
    calls = []
    for index, tool in enumerate(use.tools):
        parameters = _rebased(tool.parameters, f"tool{index}", definitions)
        calls.append(
            {
                "type": "object",
                "properties": {"name": {"const": tool.name}, "parameters": parameters},
                "required": ["name", "parameters"],
                "additionalProperties": False,
            }
        )
    call: dict[str, Any] = calls[0] if len(calls) == 1 else {"anyOf": calls}
    schema = call if not use.parallel else {"type": "array", "items": call, "minItems": 1}
    return {"$defs": definitions, **schema} if definitions else schema


_DEFINITION_KEYS: Final = ("$defs", "definitions")
_DATA_KEYS: Final = frozenset({"const", "enum", "default", "examples"})
"""Keys whose values are JSON data, not schemas: a `$ref` inside them is not a reference."""
_NAMED_SCHEMA_KEYS: Final = frozenset(
    {"properties", "patternProperties", "dependentSchemas", *_DEFINITION_KEYS}
)
"""Keys whose values map names to schemas: a property may be called `$ref` or `enum`."""


def _rebased(
    parameters: Mapping[str, Any], prefix: str, definitions: dict[str, Any]
) -> dict[str, Any]:
    """A tool's parameters schema as it reads when nested in the forced schema.

    A tool's `$ref`s point into its own document (`#/$defs/Address`, as pydantic writes
    nested models); nested under the call's `parameters`, `#` would be the combined
    schema's root. So its `$defs` / `definitions` move to the root's `$defs` under
    `{prefix}.$defs.NAME` (a flat `#/$defs/NAME`, which ours' closing bookkeeping follows
    too), and any other local reference (`#`, `#/properties/..`) points into a copy of
    the whole schema at `$defs[prefix]`. A schema without `$ref` is left as it is.
    """
    references: list[str] = []

    def note(reference: str) -> str:
        references.append(reference)
        return reference

    _walk(parameters, note)
    if not references:
        return dict(parameters)
    own = {key: item for key, item in parameters.items() if key not in _DEFINITION_KEYS}

    def rebase(reference: str) -> str:
        for key in _DEFINITION_KEYS:
            head = f"#/{key}/"
            if reference.startswith(head):
                return f"#/$defs/{prefix}.{key}.{reference.removeprefix(head)}"
        if reference != "#" and not reference.startswith("#/"):
            return reference  # not local: compiled as the client sent it (refused there)
        if prefix not in definitions:
            definitions[prefix] = {}  # taken before the copy is rewritten: it may refer to itself
            definitions[prefix] = _walk(own, rebase)
        return f"#/$defs/{prefix}{reference[1:]}"

    for key in _DEFINITION_KEYS:
        named = parameters.get(key)
        if isinstance(named, Mapping):
            for name, definition in named.items():
                definitions[f"{prefix}.{key}.{name}"] = _walk(definition, rebase)
    return dict(_walk(own, rebase))


def _walk(schema: Any, rebase: Callable[[str], str], names: bool = False) -> Any:
    """The schema with each `$ref` replaced by `rebase(ref)`."""
    if isinstance(schema, Mapping):
        if names:
            return {name: _walk(item, rebase) for name, item in schema.items()}
        return {
            key: rebase(item)
            if key == "$ref" and isinstance(item, str)
            else item
            if key in _DATA_KEYS
            else _walk(item, rebase, key in _NAMED_SCHEMA_KEYS)
            for key, item in schema.items()
        }
    if isinstance(schema, list):
        return [_walk(item, rebase) for item in schema]
    return schema


def forced_format(use: ToolUse) -> OutputFormat:
    """The grammar of a forced call; a tool whose schema llguidance cannot enforce is a 400
    on `tools[i].function.parameters` with llguidance's message, naming the keyword."""
    for index, tool in enumerate(use.tools):
        if use.mode == ChoiceMode.NAMED and tool.name != use.named:
            continue
        try:
            OutputFormat.json(tool.parameters)
        except RecursionError:
            param = f"tools[{index}].function.parameters"
            raise _bad(f"'{param}' nests too deeply to be enforced", param) from None
        except UnsupportedSchema as error:
            param = ".".join(filter(None, (f"tools[{index}].function.parameters", error.path)))
            reason = str(error).removeprefix(f"{error.path}: ")
            raise _bad(
                f"'tool_choice' {use.named or use.mode.value!r} cannot be enforced: "
                f"'{param}': {reason}",
                param,
            ) from None
    try:
        return OutputFormat.json(forced_schema(use))
    except (UnsupportedSchema, RecursionError) as error:
        # Each tool compiled alone; their combination (nested a few levels deeper, refs
        # rebased) can still be refused, as a whole: a 400 on `tools`, never a 500.
        reason = "it nests too deeply" if isinstance(error, RecursionError) else str(error)
        raise _bad(
            f"'tool_choice' {use.mode.value!r} cannot be enforced over these 'tools' "
            f"together: {reason}",
            "tools",
        ) from None


def parse_forced(text: str, use: ToolUse) -> ParsedReply:
    """A forced output as calls, in order.

    Text cut short (`max_tokens`, a stop sequence) is still the calls it began, marked
    `cut`, as OpenAI answers a forced call cut by `length`: a named function's output is
    its arguments, whatever they are; a `required` list gives its whole calls and the one
    being written once its name is. Only a list cut before any name stays content.
    """
    try:
        value: Any = _DECODER.decode(text)
    except (ValueError, RecursionError):
        if use.mode != ChoiceMode.NAMED:
            return _cut_forced_calls(text, use)
        value = None
    if use.mode == ChoiceMode.NAMED:
        # The arguments are the text as generated, as the stream sends them piece by piece.
        cut = not isinstance(value, dict)  # cut: the arguments as far as they were written
        return ParsedReply(None, (FunctionCall(use.named or "", text),), cut=cut)
    values = value if use.parallel and isinstance(value, list) else [value]
    calls = [_call_of(item, ("parameters",)) for item in values]
    if not calls or any(call is None or use.tool(call.name) is None for call in calls):
        return ParsedReply(text, ())
    return ParsedReply(None, tuple(call for call in calls if call is not None))


_FORCED_LIST_OPENING: Final = re.compile(r"\s*\[")
_FORCED_CALL_NAME: Final = re.compile(r'\s*\{\s*"name"\s*:\s*"([A-Za-z0-9_-]{1,64})"')
"""A forced call up to its name, the first of its keys as `forced_schema` orders them."""
_FORCED_CALL_ARGUMENTS: Final = re.compile(r'\s*,\s*"parameters"\s*:\s*')
"""What comes between a forced call's name and its arguments."""
_FORCED_CALL_CLOSING: Final = re.compile(r"\s*\}\s*,")
"""The end of one call of a forced list and the comma before the next."""


def _cut_forced_calls(text: str, use: ToolUse) -> ParsedReply:
    """A `required` output that does not parse, read as far as it goes: each call whose
    name was written, the last one's arguments as written (a prefix of its JSON)."""
    position = 0
    if use.parallel:
        opening = _FORCED_LIST_OPENING.match(text)
        if opening is None:
            return ParsedReply(text, ())
        position = opening.end()
    calls: list[FunctionCall] = []
    while (head := _FORCED_CALL_NAME.match(text, position)) is not None:
        name = head.group(1)
        if use.tool(name) is None:
            return ParsedReply(text, ())
        key = _FORCED_CALL_ARGUMENTS.match(text, head.end())
        if key is None:  # cut between the name and the arguments: none written yet
            calls.append(FunctionCall(name, ""))
            break
        try:
            arguments, position = _DECODER.raw_decode(text, key.end())
        except (ValueError, RecursionError):
            calls.append(FunctionCall(name, text[key.end() :]))
            break
        if not isinstance(arguments, dict):
            return ParsedReply(text, ())
        calls.append(FunctionCall(name, _json_text(arguments)))
        closing = _FORCED_CALL_CLOSING.match(text, position)
        if not use.parallel or closing is None:
            break
        position = closing.end()
    if not calls:
        return ParsedReply(text, ())
    return ParsedReply(None, tuple(calls), cut=True)


def read_reply(text: str, call_format: CallFormat | None, use: ToolUse) -> ParsedReply:
    """The reply of a request with tools, however it was produced; never an error."""
    try:
        if use.forced:
            return parse_forced(text, use)
        if use.mode == ChoiceMode.NONE or call_format is None:
            return ParsedReply(text, ())
        return parse_reply(text, call_format, use)
    except RecursionError:  # arguments nested past what the encoder writes back
        return ParsedReply(text, ())


# ----- the response -----
def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def message_calls(calls: Sequence[FunctionCall], ids: Sequence[str]) -> list[dict[str, Any]]:
    """`message.tool_calls` of a whole answer."""
    return [
        {
            "id": call_id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
        for call, call_id in zip(calls, ids, strict=True)
    ]


def delta_calls(calls: Sequence[FunctionCall], ids: Sequence[str]) -> list[dict[str, Any]]:
    """Stream deltas for whole calls: per call, one delta with its index, id and name, and
    its whole arguments (a client joins `arguments` pieces; one piece is a valid join)."""
    return [
        {
            "index": index,
            "id": call_id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
        for index, (call, call_id) in enumerate(zip(calls, ids, strict=True))
    ]


# ----- streaming -----
MARKERS: Final = {
    CallFormat.HERMES: "<tool_call>",
    CallFormat.MISTRAL: "[TOOL_CALLS]",
}


def _held_from(text: str, marker: str) -> int:
    """Where text that may be a call begins: the marker, or a tail that could start it."""
    found = text.find(marker)
    if found >= 0:
        return found
    for length in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:length]):
            return len(text) - length
    return len(text)


def _outside_calls(text: str, call_format: CallFormat | None) -> str:
    """The part of a reply with calls that is not a call (what the non-streamed content is)."""
    if call_format == CallFormat.HERMES:
        return HERMES_CALL.sub("", text)
    if call_format == CallFormat.MISTRAL:
        return text.partition("[TOOL_CALLS]")[0] if "[TOOL_CALLS]" in text else ""
    return ""


@dataclass
class StreamSplitter:
    """Splits one streamed choice of a tools request into content and calls.

    Content streams as it comes until text that may be a call begins (the family's
    marker, or for Llama 3 and Mistral an answer that opens with `{` or `[`); from there
    the text is held until the generation ends and is then parsed whole: its calls go
    out as call deltas, or, if it is not a clean call, as content. Where a call may
    follow (Hermes, Mistral), whitespace is held until text follows it, so the content
    sent is what the unstreamed answer has (`content_beside_calls`). A named function's
    output is its arguments, so each piece streams at once as an arguments delta.
    """

    use: ToolUse
    call_format: CallFormat | None
    text: str = ""
    sent: int = 0
    """Characters of `text` already sent as content."""
    named_id: str | None = field(default=None)

    def push(self, piece: str) -> tuple[str | None, list[dict[str, Any]] | None]:
        """(content, call deltas) to send for this piece; None where there is nothing."""
        self.text += piece
        if self.use.mode == ChoiceMode.NAMED:
            return None, self._named_delta(piece)
        end = self._streamable_end()
        if end <= self.sent:
            return None, None
        content = self.text[self.sent : end]
        self.sent = end
        return content, None

    def _named_delta(self, piece: str) -> list[dict[str, Any]] | None:
        if self.named_id is None:
            self.named_id = new_call_id()
            function = {"name": self.use.named, "arguments": piece}
            return [{"index": 0, "id": self.named_id, "type": "function", "function": function}]
        if not piece:
            return None
        return [{"index": 0, "function": {"arguments": piece}}]

    def _streamable_end(self) -> int:
        if self.use.forced:
            return 0
        if self.use.mode == ChoiceMode.NONE or self.call_format is None:
            return len(self.text)
        if self.call_format == CallFormat.HERMES:
            return self._unspaced_end(_held_from(self.text, MARKERS[CallFormat.HERMES]))
        opening = self.text.lstrip()
        if not opening:
            return self.sent
        if self.call_format == CallFormat.LLAMA3_JSON and opening[0] in "{<":
            return self.sent
        if self.call_format == CallFormat.MISTRAL:
            if opening[0] == "[":
                return self.sent
            return self._unspaced_end(_held_from(self.text, MARKERS[CallFormat.MISTRAL]))
        return len(self.text)

    def _unspaced_end(self, end: int) -> int:
        """`end` less the whitespace before it: a call may follow it, and then it is not
        content (`content_beside_calls`)."""
        return len(self.text[:end].rstrip())

    def finish(self) -> tuple[str | None, list[dict[str, Any]] | None]:
        """What is left to send once the generation ended: the rest as content, or calls."""
        if self.use.mode == ChoiceMode.NAMED:
            if self.named_id is None:  # nothing was generated: still name the call
                return None, self._named_delta("")
            return None, None
        parsed = read_reply(self.text, self.call_format, self.use)
        if parsed.calls:
            rest = None
            if not self.use.forced:
                # What was sent ends with text, never whitespace (`_unspaced_end`): the rest
                # of the content is the unsent text outside the calls, less its trailing
                # whitespace; when nothing was sent, the text before the first call was
                # whitespace only, so the opening whitespace goes too.
                before = self.text[: self.sent]
                rest = content_beside_calls(
                    before, _outside_calls(self.text[self.sent :], self.call_format)
                )
            ids = [new_call_id() for _ in parsed.calls]
            return rest, delta_calls(parsed.calls, ids)
        rest = self.text[self.sent :]
        self.sent = len(self.text)
        return (rest or None), None

    def finish_reason(self, generated: str) -> str:
        """The stream's `finish_reason`, as the same text unstreamed would have it:
        `tool_calls` for whole calls, else the generation's own."""
        return read_reply(self.text, self.call_format, self.use).finish_reason(generated)
