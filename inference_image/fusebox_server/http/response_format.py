"""`response_format` as OpenAI sends it, into the engine's `OutputFormat`.

Why its own module: the body's shape (`{"type": "json_schema", "json_schema":
{"name", "schema", "strict", "description"}}`) is the transport's business,
the grammar is the model's (`model.structured_output`, llguidance's matcher);
here one meets the other, and a schema llguidance cannot enforce becomes a 400
on `response_format.json_schema.schema` with llguidance's message, which names
the keyword (`uniqueItems`, `not`, ...): never a schema silently half-enforced.
So does a schema past the size limits (`json_grammar.check_schema_size`) and one no
document satisfies. `json_schema.description` is checked and accepted, as OpenAI
accepts it, and steers nothing here: the schema alone constrains the output
(docs/server.md says so).
"""

from __future__ import annotations

import re
from typing import Any, Final

from fusebox_server.errors import InvalidRequest, SchemaError
from fusebox_server.model.json_grammar import OutputFormat, UnsupportedSchema

PARAM: Final = "response_format"
SCHEMA_PARAM: Final = "response_format.json_schema.schema"
JSON_SCHEMA_FIELDS: Final = frozenset({"name", "schema", "strict", "description"})
NAME_PATTERN: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""OpenAI's rule for `json_schema.name`."""


def parse_response_format(body: dict[str, Any]) -> OutputFormat | None:
    """None for free text (absent or `text`); else the format every choice must meet."""
    value = body.get(PARAM)
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise SchemaError("'response_format' must be an object with a 'type'", param=PARAM)
    kind = value["type"]
    if kind not in ("text", "json_object", "json_schema"):
        raise InvalidRequest(
            f"'response_format.type' must be text, json_object or json_schema, got {kind!r}",
            param=f"{PARAM}.type",
        )
    allowed = {"type", "json_schema"} if kind == "json_schema" else {"type"}
    for key in value:
        if key not in allowed:
            raise InvalidRequest(
                f"'response_format.{key}' is not a field of a {kind} response format",
                param=f"{PARAM}.{key}",
            )
    if kind == "text":
        return None
    if kind == "json_object":
        return OutputFormat.json(None)
    return _json_schema(value.get("json_schema"))


def _json_schema(value: object) -> OutputFormat:
    param = f"{PARAM}.json_schema"
    if not isinstance(value, dict):
        raise SchemaError(f"'{param}' must be an object with a 'name'", param=param)
    for key in value:
        if key not in JSON_SCHEMA_FIELDS:
            raise InvalidRequest(
                f"'{param}.{key}' is not a field of json_schema", param=f"{param}.{key}"
            )
    name = value.get("name")
    if not isinstance(name, str) or NAME_PATTERN.fullmatch(name) is None:
        raise InvalidRequest(
            f"'{param}.name' must be 1 to 64 letters, digits, '_' or '-'", param=f"{param}.name"
        )
    strict = value.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise SchemaError(f"'{param}.strict' must be a boolean", param=f"{param}.strict")
    # Accepted, as OpenAI does, and steers nothing: the schema alone constrains the output
    # (the model is not told the description; docs/server.md).
    if not isinstance(value.get("description", ""), str):
        raise SchemaError(f"'{param}.description' must be a string", param=f"{param}.description")
    schema = value.get("schema", {})
    if not isinstance(schema, dict):
        raise SchemaError(f"'{SCHEMA_PARAM}' must be an object", param=SCHEMA_PARAM)
    try:
        return OutputFormat.json(schema)
    except UnsupportedSchema as error:
        where = f"{SCHEMA_PARAM}.{error.path}" if error.path else SCHEMA_PARAM
        raise InvalidRequest(f"'{where}' cannot be enforced: {error.reason}", param=where) from None
