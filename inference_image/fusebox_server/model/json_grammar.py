"""Structured output's formats: a schema compiled for llguidance, and how soon a document can close.

Why its own module: what a format is and what text closes it are pure logic,
tested on strings; which token a row takes under it is torch
(`structured_output`). No torch here.

- `OutputFormat.json(schema)` compiles the schema with llguidance, which
  enforces it while decoding (`structured_output`); a schema it cannot
  enforce is an `UnsupportedSchema` carrying llguidance's message, which
  names the keyword. Compiled formats are kept per schema (a bounded LRU).
- Beside it, ours' own compile of a documented subset (what the `openai`
  client's `beta.chat.completions.parse` sends for pydantic models in strict
  mode) and `DocumentState`, a byte-level parser with forks, kept for one job
  llguidance has no answer to: the fewest bytes that complete the document
  (`min_close`), so a row never takes a token after which its token budget
  could not close it, and a random model's endless string is closed in time.
  It also refuses a key twice in a free object (`json.loads` would keep only
  the last). For a schema outside the subset there is no such bookkeeping:
  a tight budget ends with `length` and a cut document, as OpenAI does.

docs/decisions/structured-output.md says why this way, and what it costs.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

WHITESPACE: Final = frozenset(b" \t\n\r")
WHITESPACE_RUN_BYTES: Final = 4
"""The most whitespace bytes in one gap between tokens of the document: a newline and a
short indent, too few for a model to pad forever."""
MAX_SCHEMA_DEPTH: Final = 64
"""How deep schemas may nest (through properties, items, anyOf, $ref): pydantic's are a
few levels; a body may nest hundreds, past what compiling (recursive) can take."""
MAX_NESTING: Final = 32
"""How deep a document of free shape (json_object) may nest objects and arrays."""
MAX_SCHEMA_BYTES: Final = 64 * 1024
"""The most bytes of a schema's JSON text (compact, UTF-8). A schema is compiled on the
request's path and its matcher built on the one inference thread: 64 KiB compiles and
builds in well under a second; 300 KiB took tens of seconds, and past about 10,000
properties llguidance's matcher panics."""
MAX_SCHEMA_PROPERTIES: Final = 1024
"""The most property names in a schema, every `properties` object counted together."""
MAX_SCHEMA_NESTING: Final = 100
"""The most levels of JSON objects and arrays in a schema's text, checked before anything
reads it recursively (llguidance's own reader stops near 125)."""
MAX_PARSES: Final = 1024
"""The most ways of reading the text that ours' bookkeeping follows at once. `anyOf`
options that read the same bytes fork it, and nested ones multiply the forks (17 levels of
two options: 131,072 after 17 bytes, seconds per token on the inference thread). Past the
cap the bookkeeping stops (`DocumentState.untracked`) and llguidance alone decides, as for
a schema outside ours' subset. 1,024 leaves room for 128 tools forced together."""
REASON_CHARS: Final = 300
"""The most characters of llguidance's refusal that reach a client."""
ANNOTATIONS: Final = frozenset(
    {"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated"}
)
"""Keywords that describe a value without constraining it: read past."""
TYPE_KEYWORDS: Final = {
    "object": frozenset({"properties", "required", "additionalProperties"}),
    "array": frozenset({"items", "minItems"}),
}
STRUCTURE_KEYWORDS: Final = frozenset(
    {"type", "enum", "const", "anyOf", "allOf", "$ref", "$defs", "definitions"}
)
UNREACHABLE: Final = 1 << 30
"""The cost of a state no bytes can complete."""
TYPES: Final = ("object", "array", "string", "number", "integer", "boolean", "null")
_T = TypeVar("_T")


class UnsupportedSchema(ValueError):
    """A schema this server cannot enforce; `path` is where (dotted, from the schema root)."""

    def __init__(self, path: Sequence[str], reason: str) -> None:
        self.path = ".".join(path)
        self.reason = reason
        super().__init__(f"{self.path or 'the schema'}: {reason}")


# ----- the schema, compiled -----


class Node:
    """A compiled schema: what a value at one place may be."""

    min_bytes: int = 1
    """The fewest bytes of a value this node accepts."""


class AnyNode(Node):
    """Any JSON value (json_object's values, a schema of `{}`)."""

    min_bytes = 1  # a digit


@dataclass(eq=False)
class StringNode(Node):
    min_bytes: int = 2


@dataclass(eq=False)
class NumberNode(Node):
    integer: bool
    min_bytes: int = 1


class LiteralTrie:
    """Exact texts as a trie of bytes: a byte is one lookup however many texts there are
    (a 5,000-value enum as a list cost 130 ms per step's first-byte mask)."""

    __slots__ = ("children", "text", "texts", "depth", "shortest")

    def __init__(self, depth: int = 0) -> None:
        self.children: dict[int, LiteralTrie] = {}
        self.text: bytes | None = None
        """The text that ends here, if one does."""
        self.texts: list[bytes] = []
        """Every text through here (for the cost of finishing one)."""
        self.depth = depth
        self.shortest = 1 << 30
        """The length of the shortest text through here."""

    @classmethod
    def of(cls, texts: Iterable[bytes]) -> LiteralTrie:
        root = cls()
        for text in texts:
            node = root
            node.texts.append(text)
            node.shortest = min(node.shortest, len(text))
            for byte in text:
                child = node.children.get(byte)
                if child is None:
                    child = node.children[byte] = cls(node.depth + 1)
                node = child
                node.texts.append(text)
                node.shortest = min(node.shortest, len(text))
            node.text = text
        return root

    def shortest_rest(self) -> int:
        return self.shortest - self.depth


@dataclass(eq=False)
class LiteralNode(Node):
    """One of these exact texts (enum, const, true/false, null)."""

    texts: tuple[bytes, ...]
    min_bytes: int = 0

    def __post_init__(self) -> None:
        self.min_bytes = min(len(text) for text in self.texts)
        self.trie = LiteralTrie.of(self.texts)


@dataclass(eq=False)
class ArrayNode(Node):
    items: Node
    min_items: int = 0
    """`minItems`: a forced `required` tool call is a list of at least one call."""
    min_bytes: int = 0

    def __post_init__(self) -> None:
        self.min_bytes = 1 + self.rest_cost(0)

    def rest_cost(self, written: int) -> int:
        """After `[` or a whole item: the items still owed, each after a comma but the
        first, then `]`."""
        owed = max(self.min_items - written, 0)
        if not owed:
            return 1
        commas = owed if written else owed - 1
        return owed * self.items.min_bytes + commas + 1


@dataclass(eq=False)
class UnionNode(Node):
    options: tuple[Node, ...]
    min_bytes: int = 0

    def __post_init__(self) -> None:
        self.min_bytes = min(option.min_bytes for option in self.options)


@dataclass(eq=False)
class ObjectNode(Node):
    properties: dict[str, Node]
    required: frozenset[str]
    additional: Node | None
    """The value of a key not in `properties`; None: no other key."""
    min_bytes: int = 0

    def __post_init__(self) -> None:
        self.key_texts = {_json_bytes(name): name for name in self.properties}
        self.key_texts_inner = {name: _json_bytes(name)[1:-1] for name in self.properties}
        self._entry_costs: dict[str, int] = {}
        self.min_bytes = 1 + self.open_cost(frozenset())
        self._key_tries: dict[frozenset[str], LiteralTrie | None] = {}

    def key_trie(self, seen: frozenset[str]) -> LiteralTrie | None:
        """The quoted names not yet written, as a trie (kept per set of names written)."""
        if seen not in self._key_tries:
            texts = [text for text, key in self.key_texts.items() if key not in seen]
            self._key_tries[seen] = LiteralTrie.of(texts) if texts else None
        return self._key_tries[seen]

    def value_of(self, key: str) -> Node | None:
        return self.properties.get(key, self.additional)

    def entry_cost(self, key: str) -> int:
        """`"key":value` at its shortest."""
        cost = self._entry_costs.get(key)
        if cost is None:
            cost = self._entry_costs[key] = (
                len(_json_bytes(key)) + 1 + self.properties[key].min_bytes
            )
        return cost

    def keys_left(self, seen: frozenset[str]) -> bool:
        return self.additional is not None or any(key not in seen for key in self.properties)

    def after_cost(self, seen: frozenset[str]) -> int:
        """After a value: a comma and an entry per missing required key, then `}`."""
        return 1 + sum(1 + self.entry_cost(key) for key in self.required - seen)

    def open_cost(self, seen: frozenset[str]) -> int:
        """After `{`: the required entries, separated, then `}`."""
        missing = self.required - seen
        if not missing:
            return 1
        return sum(self.entry_cost(key) for key in missing) + len(missing)

    def comma_cost(self, seen: frozenset[str]) -> int:
        """After a comma an entry must follow."""
        if self.required - seen:
            return self.open_cost(seen)
        costs = [self.entry_cost(key) for key in self.properties if key not in seen]
        if self.additional is not None:
            costs.append(3 + self.additional.min_bytes)  # "":value (or a one-letter key)
        return min(costs) + 1 if costs else UNREACHABLE


ANY: Final = AnyNode()
_ANY_LITERALS: Final = LiteralTrie.of((b"true", b"false", b"null"))
ANY_OBJECT: Final = ObjectNode({}, frozenset(), ANY)
ANY_ARRAY: Final = ArrayNode(ANY)
BOOLEAN: Final = LiteralNode((b"true", b"false"))
NULL: Final = LiteralNode((b"null",))


def _json_bytes(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


class _SchemaCompiler:
    """JSON Schema (the subset in the module docstring) to nodes; refuses the rest by name."""

    def __init__(self, root: Mapping[str, Any]) -> None:
        self.root = root
        self.compiled: dict[str, Node] = {}
        self.resolving: list[str] = []
        self.depth = 0

    def compile(self, schema: object, path: tuple[str, ...]) -> Node:
        self.depth += 1
        try:
            if self.depth > MAX_SCHEMA_DEPTH:
                # Named at the root: a path 64 levels long would name nothing readable.
                raise UnsupportedSchema((), f"nested deeper than {MAX_SCHEMA_DEPTH} levels")
            return self._compile(schema, path)
        finally:
            self.depth -= 1

    def _compile(self, schema: object, path: tuple[str, ...]) -> Node:
        if schema is True or schema == {}:
            return ANY
        if not isinstance(schema, Mapping):
            raise UnsupportedSchema(path, "a schema must be an object")
        types = self._types(schema, path)
        allowed = STRUCTURE_KEYWORDS | ANNOTATIONS
        for kind in types or TYPES:
            allowed |= TYPE_KEYWORDS.get(kind, frozenset())
        for keyword in schema:
            if keyword not in allowed:
                raise UnsupportedSchema(
                    (*path, keyword), f"the keyword {keyword!r} is not supported"
                )
        for defs in ("$defs", "definitions"):
            for name, definition in self._mapping(schema, defs, path).items():
                self._definition(f"#/{defs}/{name}", definition, (*path, defs, name))
        if "$ref" in schema:
            return self._reference(schema, path)
        if "anyOf" in schema:
            # Identical options collapse: each would fork the bookkeeping for nothing.
            options = tuple(dict.fromkeys(self._each(schema, "anyOf", path, distinct=True)))
            return options[0] if len(options) == 1 else UnionNode(options)
        if "allOf" in schema:
            parts = self._each(schema, "allOf", path)
            if len(parts) != 1:
                raise UnsupportedSchema((*path, "allOf"), "allOf of more than one schema")
            return parts[0]
        if "enum" in schema or "const" in schema:
            return self._literal(schema, types, path)
        if not types:
            if "properties" in schema or "additionalProperties" in schema:
                types = ("object",)
            elif "items" in schema:
                types = ("array",)
            else:
                return ANY
        nodes = [self._typed(kind, schema, path) for kind in types]
        return nodes[0] if len(nodes) == 1 else UnionNode(tuple(nodes))

    def _types(self, schema: Mapping[str, Any], path: tuple[str, ...]) -> tuple[str, ...]:
        value = schema.get("type")
        if value is None:
            return ()
        types = (value,) if isinstance(value, str) else value
        if not isinstance(types, list | tuple) or not types:
            raise UnsupportedSchema((*path, "type"), "type must be a name or a list of names")
        for kind in types:
            if kind not in TYPES:
                raise UnsupportedSchema((*path, "type"), f"unknown type {kind!r}")
        return tuple(types)

    def _mapping(self, schema: Mapping[str, Any], key: str, path: tuple[str, ...]) -> Any:
        value = schema.get(key, {})
        if not isinstance(value, Mapping):
            raise UnsupportedSchema((*path, key), f"{key} must be an object")
        return value

    def _each(
        self, schema: Mapping[str, Any], key: str, path: tuple[str, ...], distinct: bool = False
    ) -> list[Node]:
        """Each part compiled (`distinct`: a part spelt as an earlier one is left out)."""
        value = schema[key]
        if not isinstance(value, list) or not value:
            raise UnsupportedSchema((*path, key), f"{key} must be a non-empty list")
        spelt: set[str] = set()
        nodes = []
        for i, part in enumerate(value):
            if distinct:
                spelling = json.dumps(part, sort_keys=True)
                if spelling in spelt:
                    continue
                spelt.add(spelling)
            nodes.append(self.compile(part, (*path, key, str(i))))
        return nodes

    def _definition(self, ref: str, definition: object, path: tuple[str, ...]) -> Node:
        if ref in self.compiled:
            return self.compiled[ref]
        if ref in self.resolving:
            raise UnsupportedSchema(path, f"the recursive reference {ref!r} is not supported")
        self.resolving.append(ref)
        try:
            node = self.compile(definition, path)
        finally:
            self.resolving.pop()
        self.compiled[ref] = node
        return node

    def _reference(self, schema: Mapping[str, Any], path: tuple[str, ...]) -> Node:
        ref = schema["$ref"]
        match = (
            re.fullmatch(r"#/(\$defs|definitions)/([^/]+)", ref) if isinstance(ref, str) else None
        )
        if ref == "#":
            raise UnsupportedSchema((*path, "$ref"), "the recursive reference '#' is not supported")
        if match is None:
            raise UnsupportedSchema((*path, "$ref"), f"only #/$defs/NAME references: {ref!r}")
        definitions = self.root.get(match.group(1))
        if not isinstance(definitions, Mapping) or match.group(2) not in definitions:
            raise UnsupportedSchema((*path, "$ref"), f"{ref!r} names no definition")
        if ref in self.resolving:
            raise UnsupportedSchema(
                (*path, "$ref"), f"the recursive reference {ref!r} is not supported"
            )
        target = (match.group(1), match.group(2))
        return self._definition(ref, definitions[match.group(2)], target)

    def _literal(
        self, schema: Mapping[str, Any], types: tuple[str, ...], path: tuple[str, ...]
    ) -> Node:
        key = "const" if "const" in schema else "enum"
        values = [schema["const"]] if key == "const" else schema["enum"]
        if not isinstance(values, list) or not values:
            raise UnsupportedSchema((*path, key), "enum must be a non-empty list")
        kept = [value for value in values if not types or _type_of(value) in types]
        if not kept:
            raise UnsupportedSchema((*path, key), f"no {key} value is of type {list(types)}")
        return LiteralNode(tuple(dict.fromkeys(_json_bytes(value) for value in kept)))

    def _typed(self, kind: str, schema: Mapping[str, Any], path: tuple[str, ...]) -> Node:
        if kind == "string":
            return StringNode()
        if kind in ("number", "integer"):
            return NumberNode(integer=kind == "integer")
        if kind == "boolean":
            return BOOLEAN
        if kind == "null":
            return NULL
        if kind == "array":
            min_items = schema.get("minItems", 0)
            if isinstance(min_items, bool) or not isinstance(min_items, int) or min_items < 0:
                raise UnsupportedSchema((*path, "minItems"), "minItems must be an integer >= 0")
            items = self.compile(schema.get("items", True), (*path, "items"))
            return ArrayNode(items, min_items)
        properties = {
            name: self.compile(value, (*path, "properties", name))
            for name, value in self._mapping(schema, "properties", path).items()
        }
        required = schema.get("required", [])
        if not isinstance(required, list) or not all(isinstance(k, str) for k in required):
            raise UnsupportedSchema((*path, "required"), "required must be a list of names")
        additional_schema = schema.get("additionalProperties", True)
        additional = (
            None
            if additional_schema is False
            else self.compile(additional_schema, (*path, "additionalProperties"))
        )
        unknown = [key for key in required if key not in properties]
        if unknown and additional is None:
            raise UnsupportedSchema((*path, "required"), f"{unknown} are required but not allowed")
        for key in unknown:  # required, of the additional properties' schema
            assert additional is not None
            properties[key] = additional
        return ObjectNode(properties, frozenset(required), additional)


def _type_of(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


@dataclass(frozen=True)
class OutputFormat:
    """What a row's text must be: a JSON document of `schema` (None: any object, json_object).

    `grammar` is llguidance's compiled grammar, which decides what is valid;
    `closing_root` is ours' compiled schema (None where the schema uses a keyword
    ours does not know), kept only to know the fewest bytes that close the
    document, so a row's token budget can always close it.
    """

    schema: Mapping[str, Any] | None
    grammar: str
    closing_root: Node | None

    @classmethod
    def json(cls, schema: Mapping[str, Any] | None) -> OutputFormat:
        """None: any JSON object (`json_object`). Else the schema, or `UnsupportedSchema`
        with llguidance's message (which names the keyword it refuses), or naming the
        limit it is past (`check_schema_size`)."""
        if schema is None:
            return JSON_OBJECT
        check_schema_size(schema)
        try:
            # Keys in the schema's order: llguidance writes properties in that order.
            key = json.dumps(schema, allow_nan=False)
        except (TypeError, ValueError, RecursionError) as error:
            raise UnsupportedSchema((), f"not a JSON schema: {error}") from None
        return _compiled(key)

    def start(self) -> DocumentState | None:
        """Ours' closing bookkeeping at the start of a document; None: not known."""
        if self.closing_root is None:
            return None
        return DocumentState(((_Value(self.closing_root, 0), None),), (0,))


def check_schema_size(schema: object) -> None:
    """`UnsupportedSchema` naming the limit the schema is past: its nesting, its
    properties (`MAX_SCHEMA_PROPERTIES`) or its bytes (`MAX_SCHEMA_BYTES`). A walk
    without recursion, so a schema nested thousands deep costs a loop, not a crash."""
    properties, pending = 0, [(schema, 1)]
    while pending:
        value, level = pending.pop()
        if isinstance(value, Mapping):
            named = value.get("properties")
            if isinstance(named, Mapping):
                properties += len(named)
            children: Iterable[Any] = value.values()
        elif isinstance(value, list | tuple):
            children = value
        else:
            continue
        if level > MAX_SCHEMA_NESTING:
            raise UnsupportedSchema(
                (), f"nested deeper than the limit of {MAX_SCHEMA_NESTING} levels"
            )
        pending.extend((child, level + 1) for child in children)
    if properties > MAX_SCHEMA_PROPERTIES:
        raise UnsupportedSchema(
            (),
            f"{properties:,} properties, more than the limit of {MAX_SCHEMA_PROPERTIES:,}",
        )
    try:
        size = len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False).encode())
    except (TypeError, ValueError) as error:
        raise UnsupportedSchema((), f"not a JSON schema: {error}") from None
    if size > MAX_SCHEMA_BYTES:
        raise UnsupportedSchema(
            (),
            f"{size:,} bytes of JSON, more than the limit of "
            f"{MAX_SCHEMA_BYTES:,} bytes ({MAX_SCHEMA_BYTES // 1024} KiB)",
        )


def _llguidance_options() -> JsonCompileOptions:
    """llguidance's JSON options: whitespace runs bounded as ours (a random model pads
    forever otherwise), and `\\uXXXX` escapes of any character, as `json.dumps` writes
    them."""
    return {
        "whitespace_pattern": f"[ \\n]{{0,{WHITESPACE_RUN_BYTES}}}",
        "json_allow_general_unicode_escapes": True,
    }


COMPILED_SCHEMAS_KEPT: Final = 256
"""Compiled schemas kept (least recently used dropped): a client sends one schema many times."""


def _grammar(schema: Mapping[str, Any]) -> str:
    """llguidance's grammar of the schema, or `UnsupportedSchema` with its message.

    The grammar is also built into a matcher over the 256 bytes, here rather than on the
    inference thread: llguidance validates a grammar it cannot build (a grammar too big
    for its symbol table panics only there), and a schema that refers only to itself
    (`{"$ref": "#"}`) compiles, but no byte can start its document.
    """
    import llguidance

    options = _llguidance_options()
    grammar = _refused(
        lambda: llguidance.LLMatcher.grammar_from_json_schema(dict(schema), overrides=options)
    )
    message = _refused(lambda: llguidance.LLMatcher.validate_grammar(grammar))
    if message:
        raise UnsupportedSchema((), refusal_reason(message))
    matcher = _refused(lambda: llguidance.LLMatcher(_byte_tokenizer(), grammar, log_level=0))
    if matcher.is_error():
        raise UnsupportedSchema((), refusal_reason(matcher.get_error()))
    mask = _refused(matcher.compute_bitmask)
    first_bytes = [value for value in range(256) if mask[value // 8] >> (value % 8) & 1]
    if not first_bytes:
        raise UnsupportedSchema(
            (),
            "no JSON document satisfies the schema: it refers only to itself, with no "
            "value to end on",
        )
    for value in first_bytes:  # an object too wide for the parser fails at its `{`
        probe = matcher.deep_copy()
        if not probe.consume_token(value) or probe.is_error():
            raise UnsupportedSchema((), refusal_reason(probe.get_error()))
    return grammar


PANIC_REASON: Final = "the grammar compiler cannot build it (it is too large or too complex)"


def _refused(call: Callable[[], _T]) -> _T:
    """The call's result; llguidance's refusal, or its panic (a BaseException from Rust),
    as `UnsupportedSchema`."""
    try:
        return call()
    except Exception as error:
        raise UnsupportedSchema((), refusal_reason(str(error))) from None
    except BaseException as error:
        if type(error).__name__ != "PanicException":
            raise  # KeyboardInterrupt, SystemExit: not ours to swallow
        raise UnsupportedSchema((), PANIC_REASON) from None


def refusal_reason(message: str) -> str:
    """llguidance's refusal as a client may read it: on one line, without the parser's
    state dump, cut short. A panic's message (a Rust backtrace, with build paths) is
    never quoted."""
    if message.lstrip().startswith("panic") or "panicked at" in message or "backtrace" in message:
        return PANIC_REASON
    text = " ".join(message.split("<state>")[0].split()) or "refused by the grammar compiler"
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 3] + "..."


@functools.cache
def _byte_tokenizer() -> Any:
    """llguidance's tokenizer over the 256 bytes (and an end id): a grammar checked
    against it builds a matcher over any byte-complete vocabulary."""
    import llguidance

    class _Bytes:
        tokens = [bytes([value]) for value in range(256)] + [b""]
        eos_token_id = 256
        bos_token_id = None
        special_token_ids = [256]

        def __call__(self, text: str) -> list[int]:
            return list(text.encode("utf-8"))

    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes()), n_vocab=257)


@functools.lru_cache(maxsize=COMPILED_SCHEMAS_KEPT)
def _compiled(key: str) -> OutputFormat:
    schema = json.loads(key)
    grammar = _grammar(schema)
    try:
        closing_root: Node | None = _SchemaCompiler(schema).compile(schema, ())
    except (UnsupportedSchema, RecursionError):
        closing_root = None  # llguidance enforces it; a tight budget may cut the document
    return OutputFormat(schema, grammar, closing_root)


# ----- the parser: frames on a stack -----

_KEEP, _PUSH, _POP = 0, 1, 2
# Outcomes of feeding a frame one byte:
#   (_KEEP, frame, whitespace run)        the frame, changed, stays on top
#   (_PUSH, parent, child, refeed)        the frame becomes `parent`, `child` goes on top
#   (_POP, result, refeed)                the frame is done; `refeed`: the byte is its parent's
Outcome = tuple[Any, ...]


def _gap(frame: Any, byte: int, run: int) -> list[Outcome]:
    return [(_KEEP, frame, run + 1)] if run < WHITESPACE_RUN_BYTES else []


@dataclass(frozen=True, slots=True)
class _Value:
    """A value of `node` starts here (after optional whitespace)."""

    node: Node
    depth: int

    def feed(self, byte: int, run: int) -> list[Outcome]:
        if byte in WHITESPACE:
            return _gap(self, byte, run)
        outcomes: list[Outcome] = []
        for frame in _starts_by_byte(self.node, self.depth).get(byte, ()):
            outcomes.extend(frame.feed(byte, 0))
        return outcomes

    def cost(self, child: Any) -> int:
        return self.node.min_bytes

    def accepting(self) -> bool:
        return False


_NUMBER_FIRST: Final = b"-0123456789"


def _starts_by_byte(node: Node, depth: int) -> dict[int, tuple[Any, ...]]:
    """The frames a value of `node` can start as, by the byte each can start with; built
    once per node and depth and kept on the node (an `anyOf` of 128 tools tried every
    option for each of the 256 bytes of a mask: 80 ms)."""
    kept: dict[int, dict[int, tuple[Any, ...]]] = node.__dict__.setdefault("_starts", {})
    table = kept.get(depth)
    if table is None:
        grouped: dict[int, list[Any]] = {}
        for frame in _starts(node, depth):
            if isinstance(frame, _Object):
                first: Iterable[int] = b"{"
            elif isinstance(frame, _Array):
                first = b"["
            elif isinstance(frame, _String):
                first = b'"'
            elif isinstance(frame, _Number):
                first = _NUMBER_FIRST
            else:
                first = frame.node.children
            for byte in first:
                grouped.setdefault(byte, []).append(frame)
        table = kept[depth] = {
            byte: tuple(dict.fromkeys(frames)) for byte, frames in grouped.items()
        }
    return table


def _starts(node: Node, depth: int, expanded: set[int] | None = None) -> Iterable[Any]:
    """The frames a value of `node` starts as (a union reached twice is expanded once:
    nested unions that share options would otherwise multiply them)."""
    if isinstance(node, UnionNode):
        expanded = set() if expanded is None else expanded
        if id(node) in expanded:
            return
        expanded.add(id(node))
        for option in dict.fromkeys(node.options):
            yield from _starts(option, depth, expanded)
    elif isinstance(node, AnyNode):
        if depth < MAX_NESTING:
            yield _Object(ANY_OBJECT, _START, frozenset(), None, depth)
            yield _Array(ANY_ARRAY, _START, depth)
        yield _String(False)
        yield _Number(False, _N_START)
        yield _Literal(_ANY_LITERALS, False)
    elif isinstance(node, ObjectNode):
        yield _Object(node, _START, frozenset(), None, depth)
    elif isinstance(node, ArrayNode):
        yield _Array(node, _START, depth)
    elif isinstance(node, StringNode):
        yield _String(False)
    elif isinstance(node, NumberNode):
        yield _Number(node.integer, _N_START)
    elif isinstance(node, LiteralNode):
        yield _Literal(node.trie, False)


_START, _OPEN, _KEY, _COLON, _VALUE, _AFTER, _COMMA = range(7)


@dataclass(frozen=True, slots=True)
class _Object:
    node: ObjectNode
    phase: int
    seen: frozenset[str]
    key: str | None
    depth: int

    def _with(self, phase: int, seen: frozenset[str] | None = None, key: str | None = None) -> Any:
        return _Object(self.node, phase, self.seen if seen is None else seen, key, self.depth)

    def feed(self, byte: int, run: int) -> list[Outcome]:
        phase = self.phase
        if phase == _START:
            return [(_KEEP, self._with(_OPEN), 0)] if byte == 0x7B else []
        if byte in WHITESPACE:
            return _gap(self, byte, run)
        complete = not (self.node.required - self.seen)
        if phase in (_OPEN, _AFTER) and byte == 0x7D:  # }
            return [(_POP, None, False)] if complete else []
        if phase in (_OPEN, _COMMA) and byte == 0x22:  # "
            return self._key()
        if phase == _AFTER and byte == 0x2C:  # ,
            return [(_KEEP, self._with(_COMMA), 0)] if self.node.keys_left(self.seen) else []
        if phase == _COLON and byte == 0x3A:  # :
            assert self.key is not None
            value = self.node.value_of(self.key)
            assert value is not None
            parent = self._with(_VALUE, self.seen | {self.key})
            return [(_PUSH, parent, _Value(value, self.depth + 1), False)]
        return []

    def _key(self) -> list[Outcome]:
        if self.node.additional is None:
            trie = self.node.key_trie(self.seen)
            return [(_PUSH, self._with(_KEY), _Literal(trie, True), True)] if trie else []
        return [(_PUSH, self._with(_KEY), _String(True, _S_TEXT), False)]

    def child_done(self, result: Any) -> Any:
        if self.phase == _VALUE:
            return self._with(_AFTER)
        if isinstance(result, _KeyText):
            key = result.decoded()
        else:
            key = self.node.key_texts[result]
        if key is None or key in self.seen:
            return None  # a key twice is refused: json.loads would keep only the last
        return self._with(_COLON, key=key)

    def cost(self, child: Any) -> int:
        node, phase, seen = self.node, self.phase, self.seen
        if phase == _START:
            return node.min_bytes
        if phase == _OPEN:
            return node.open_cost(seen)
        if phase == _COMMA:
            return node.comma_cost(seen)
        if phase == _COLON:
            assert self.key is not None
            value = node.value_of(self.key)
            assert value is not None
            return 1 + value.min_bytes + node.after_cost(seen | {self.key})
        if phase == _KEY:
            return self._key_cost(child)
        return node.after_cost(seen)

    def _key_cost(self, child: Any) -> int:
        """After the key being written: its colon, its value, and the object's rest."""
        node, seen = self.node, self.seen
        if isinstance(child, _Literal):
            # One sum for the object's rest; a required key written takes its entry off it.
            done, after = child.node.depth, node.after_cost(seen)
            costs = []
            for text in child.node.texts:
                name = node.key_texts[text]
                rest = after - (1 + node.entry_cost(name) if name in node.required else 0)
                costs.append(len(text) - done + 1 + node.properties[name].min_bytes + rest)
            return min(costs)
        assert node.additional is not None
        key = _KeyText(child.text).decoded() if child.mode == _S_TEXT else None
        extend = 2 + node.additional.min_bytes + node.after_cost(seen)  # one more letter
        costs = [extend]
        if key is not None and key not in seen:
            costs.append(self._entry_rest(key))
        if child.mode == _S_TEXT:
            # The key being typed may become a required one: its letters left, then its
            # entry (without this, a free object owing a required key over-counted and a
            # tight budget found no token that fitted).
            for name in node.required - seen:
                spelled = node.key_texts_inner[name]
                if len(spelled) > len(child.text) and spelled.startswith(child.text):
                    costs.append(len(spelled) - len(child.text) + self._entry_rest(name))
        return min(costs)

    def _entry_rest(self, key: str) -> int:
        """The colon, the shortest value of `key`, and the object after it."""
        value = self.node.value_of(key)
        assert value is not None
        return 1 + value.min_bytes + self.node.after_cost(self.seen | {key})

    def accepting(self) -> bool:
        return False


@dataclass(frozen=True, slots=True)
class _Array:
    node: ArrayNode
    phase: int
    depth: int
    written: int = 0
    """Items written, counted up to `minItems` only (more changes nothing that matters)."""

    def _with(self, phase: int, written: int | None = None) -> _Array:
        return _Array(self.node, phase, self.depth, self.written if written is None else written)

    def feed(self, byte: int, run: int) -> list[Outcome]:
        phase = self.phase
        if phase == _START:
            return [(_KEEP, self._with(_OPEN), 0)] if byte == 0x5B else []
        if byte in WHITESPACE:
            return _gap(self, byte, run)
        if phase in (_OPEN, _AFTER) and byte == 0x5D:  # ]
            return [(_POP, None, False)] if self.written >= self.node.min_items else []
        if phase == _AFTER:
            return [(_KEEP, self._with(_COMMA), 0)] if byte == 0x2C else []
        return [(_PUSH, self._with(_VALUE), _Value(self.node.items, self.depth + 1), True)]

    def child_done(self, result: Any) -> Any:
        return self._with(_AFTER, min(self.written + 1, self.node.min_items))

    def cost(self, child: Any) -> int:
        node = self.node
        if self.phase == _START:
            return node.min_bytes
        if self.phase == _COMMA:  # an item, then what is still owed after it
            return node.items.min_bytes + node.rest_cost(self.written + 1)
        if self.phase == _VALUE:  # the item being written is the child's cost
            return node.rest_cost(self.written + 1)
        return node.rest_cost(self.written)

    def accepting(self) -> bool:
        return False


@dataclass(frozen=True, slots=True)
class _KeyText:
    """A free key's raw bytes between its quotes, as a result for its object."""

    raw: bytes

    def decoded(self) -> str | None:
        try:
            return str(json.loads(b'"' + self.raw + b'"'))
        except ValueError:
            return None


_S_START, _S_TEXT, _S_ESCAPE, _S_UNICODE, _S_UTF8 = range(5)
_HEX: Final = frozenset(b"0123456789abcdefABCDEF")
_ESCAPES: Final = frozenset(b'"\\/bfnrtu')


@dataclass(frozen=True, slots=True)
class _String:
    """A string, checked as UTF-8 byte by byte; a key keeps its bytes (`text`)."""

    is_key: bool
    mode: int = _S_START
    left: int = 0
    """Hex digits of a \\u escape, or continuation bytes of a character, still to come."""
    low: int = 0x80
    high: int = 0xBF
    """The range of the next continuation byte (narrower after E0, ED, F0, F4)."""
    text: bytes = b""

    def feed(self, byte: int, run: int) -> list[Outcome]:
        mode = self.mode
        if mode == _S_START:
            return [(_KEEP, self._next(_S_TEXT, byte=None), 0)] if byte == 0x22 else []
        if mode == _S_TEXT:
            if byte == 0x22:
                return [(_POP, _KeyText(self.text) if self.is_key else None, False)]
            if byte == 0x5C:
                return [(_KEEP, self._next(_S_ESCAPE, byte=byte), 0)]
            if byte < 0x20:
                return []
            if byte < 0x80:
                return [(_KEEP, self._next(_S_TEXT, byte=byte), 0)]
            return self._lead(byte)
        if mode == _S_ESCAPE:
            if byte not in _ESCAPES:
                return []
            if byte == 0x75:  # u
                return [(_KEEP, self._next(_S_UNICODE, byte=byte, left=4), 0)]
            return [(_KEEP, self._next(_S_TEXT, byte=byte), 0)]
        if mode == _S_UNICODE:
            if byte not in _HEX:
                return []
            left = self.left - 1
            return [(_KEEP, self._next(_S_UNICODE if left else _S_TEXT, byte=byte, left=left), 0)]
        if not self.low <= byte <= self.high:  # a continuation byte
            return []
        left = self.left - 1
        return [(_KEEP, self._next(_S_UTF8 if left else _S_TEXT, byte=byte, left=left), 0)]

    def _lead(self, byte: int) -> list[Outcome]:
        if 0xC2 <= byte <= 0xDF:
            left, low, high = 1, 0x80, 0xBF
        elif 0xE0 <= byte <= 0xEF:
            left = 2
            low, high = {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F)}.get(byte, (0x80, 0xBF))
        elif 0xF0 <= byte <= 0xF4:
            left = 3
            low, high = {0xF0: (0x90, 0xBF), 0xF4: (0x80, 0x8F)}.get(byte, (0x80, 0xBF))
        else:
            return []
        return [(_KEEP, self._next(_S_UTF8, byte=byte, left=left, low=low, high=high), 0)]

    def _next(
        self, mode: int, byte: int | None, left: int = 0, low: int = 0x80, high: int = 0xBF
    ) -> _String:
        text = self.text + bytes([byte]) if self.is_key and byte is not None else self.text
        return _String(self.is_key, mode, left, low, high, text)

    def cost(self, child: Any) -> int:
        if self.mode == _S_START:
            return 2
        pending = {_S_TEXT: 0, _S_ESCAPE: 1}.get(self.mode, self.left)
        return pending + 1

    def accepting(self) -> bool:
        return False


(_N_START, _N_SIGN, _N_ZERO, _N_INT, _N_DOT, _N_FRACTION, _N_EXP, _N_EXP_SIGN, _N_EXP_DIGITS) = (
    range(9)
)
_DIGITS: Final = frozenset(b"0123456789")
_NUMBER_ACCEPTING: Final = frozenset({_N_ZERO, _N_INT, _N_FRACTION, _N_EXP_DIGITS})


@dataclass(frozen=True, slots=True)
class _Number:
    """A JSON number (an integer: no fraction, no exponent); it ends at the first byte
    that cannot continue it, which then belongs to its parent."""

    integer: bool
    phase: int

    def feed(self, byte: int, run: int) -> list[Outcome]:
        phase = self._after(byte)
        if phase is not None:
            return [(_KEEP, _Number(self.integer, phase), 0)]
        return [(_POP, None, True)] if self.phase in _NUMBER_ACCEPTING else []

    def _after(self, byte: int) -> int | None:
        phase, digit = self.phase, byte in _DIGITS
        if phase in (_N_START, _N_SIGN):
            if byte == 0x30:
                return _N_ZERO
            if digit:
                return _N_INT
            return _N_SIGN if phase == _N_START and byte == 0x2D else None
        if phase == _N_INT and digit:
            return _N_INT
        if phase in (_N_ZERO, _N_INT) and not self.integer:
            if byte == 0x2E:
                return _N_DOT
            if byte in (0x65, 0x45):
                return _N_EXP
        if phase in (_N_DOT, _N_FRACTION) and digit:
            return _N_FRACTION
        if phase == _N_FRACTION and byte in (0x65, 0x45):
            return _N_EXP
        if phase == _N_EXP and byte in (0x2B, 0x2D):
            return _N_EXP_SIGN
        if phase in (_N_EXP, _N_EXP_SIGN, _N_EXP_DIGITS) and digit:
            return _N_EXP_DIGITS
        return None

    def cost(self, child: Any) -> int:
        return 0 if self.phase in _NUMBER_ACCEPTING else 1

    def accepting(self) -> bool:
        return self.phase in _NUMBER_ACCEPTING


@dataclass(frozen=True, slots=True)
class _Literal:
    """One of several exact texts, as far as `node` of their trie; a key's texts are its
    quoted names."""

    node: LiteralTrie
    is_key: bool

    def feed(self, byte: int, run: int) -> list[Outcome]:
        node = self.node
        outcomes: list[Outcome] = []
        if node.text is not None:  # whole here: the byte may be the parent's
            outcomes.append((_POP, node.text, True))
        child = node.children.get(byte)
        if child is not None:
            if child.text is not None and not child.children:
                outcomes.append((_POP, child.text, False))
            else:
                outcomes.append((_KEEP, _Literal(child, self.is_key), 0))
        return outcomes

    def cost(self, child: Any) -> int:
        return 0 if self.is_key else self.node.shortest_rest()

    def accepting(self) -> bool:
        return self.node.text is not None


Stack = tuple[Any, "Stack"] | None


def _feed(stack: Stack, run: int, byte: int, out: list[tuple[Stack, int]]) -> None:
    if stack is None:
        return  # the document is done: nothing may follow
    frame, below = stack
    for outcome in frame.feed(byte, run):
        if outcome[0] == _KEEP:
            out.append(((outcome[1], below), outcome[2]))
        elif outcome[0] == _PUSH:
            pushed: Stack = (outcome[2], (outcome[1], below))
            if outcome[3]:
                _feed(pushed, 0, byte, out)
            else:
                out.append((pushed, 0))
        elif below is None:
            if not outcome[2]:
                out.append((None, 0))
        else:
            parent = below[0].child_done(outcome[1])
            if parent is None:
                continue
            popped: Stack = (parent, below[1])
            if outcome[2]:
                _feed(popped, 0, byte, out)
            else:
                out.append((popped, 0))


def _cost(stack: Stack) -> int:
    total, child = 0, None
    while stack is not None:
        frame, stack = stack
        total += frame.cost(child)
        child = frame
    return total


class DocumentState:
    """The text so far, as every way the parser can be reading it (empty: not a prefix).

    `untracked`: the text forked into more than `MAX_PARSES` readings, and the
    bookkeeping stopped there; it knows nothing more (llguidance alone decides).
    """

    __slots__ = ("stacks", "runs", "untracked", "_min_close")

    def __init__(
        self, stacks: tuple[Stack, ...], runs: tuple[int, ...], untracked: bool = False
    ) -> None:
        self.stacks, self.runs, self.untracked = stacks, runs, untracked
        self._min_close: int | None = None

    def feed(self, data: bytes) -> DocumentState:
        """The state after `data`; each byte costs at most `MAX_PARSES` readings' work."""
        if self.untracked:
            return self
        configs = list(zip(self.stacks, self.runs, strict=True))
        for byte in data:
            after: list[tuple[Stack, int]] = []
            for stack, run in configs:
                _feed(stack, run, byte, after)
                if len(after) > MAX_PARSES:
                    return DocumentState((), (), untracked=True)
            configs = list(dict.fromkeys(after))
            if not configs:
                break
        return DocumentState(tuple(s for s, _ in configs), tuple(r for _, r in configs))

    @property
    def valid(self) -> bool:
        """The text is a prefix of some accepted document."""
        return bool(self.stacks)

    @property
    def complete(self) -> bool:
        """The text is a whole accepted document (it may still go on: `12` -> `123`)."""
        return any(
            stack is None or (stack[1] is None and stack[0].accepting()) for stack in self.stacks
        )

    @property
    def finished(self) -> bool:
        """The document is whole and nothing may follow it."""
        return bool(self.stacks) and all(stack is None for stack in self.stacks)

    @property
    def min_close(self) -> int:
        """The fewest bytes that make the text a whole document."""
        if self._min_close is None:
            costs = [_cost(stack) for stack in self.stacks]
            self._min_close = min(costs) if costs else UNREACHABLE
        return self._min_close


JSON_OBJECT: Final = OutputFormat(None, _grammar({"type": "object"}), ANY_OBJECT)
