"""The inputs bench/grammar_engines_bench.py gives every grammar engine alike: three
schemas in the shape the `openai` client sends for a pydantic model (nested objects,
arrays, enums, optional fields, numbers) and a free object, each with one valid
document of a few hundred tokens; our grammar's unit-test documents; and the keywords
our grammar refuses with a 400, each with a document that breaks it."""

from __future__ import annotations

import json
from typing import Any


def schemas_and_documents() -> dict[str, tuple[dict[str, Any], str]]:
    """Each schema with one valid document of a few hundred tokens (`json.dumps` spacing)."""
    from typing import Literal as L

    from openai.lib._pydantic import to_strict_json_schema
    from pydantic import BaseModel

    class Address(BaseModel):
        street: str
        city: str
        postcode: str
        country: L["DE", "FR", "GB", "US", "CN"]

    class LineItem(BaseModel):
        sku: str
        description: str
        quantity: int
        unit_price: float
        tax: L["standard", "reduced", "zero"]

    class Invoice(BaseModel):
        number: str
        currency: L["EUR", "USD", "GBP"]
        billing: Address
        shipping: Address | None
        lines: list[LineItem]
        discount: float | None
        notes: str | None

    class Step(BaseModel):
        action: str
        expected: str
        passed: bool

    class Person(BaseModel):
        name: str
        email: str | None
        team: L["platform", "inference", "storage"] | None

    class Incident(BaseModel):
        title: str
        severity: L["sev1", "sev2", "sev3", "sev4"]
        services: list[str]
        reporter: Person
        assignees: list[Person]
        started_at: str
        error_rate: float
        latency_ms: list[float]
        steps: list[Step]
        root_cause: str | None

    class Location(BaseModel):
        name: str
        latitude: float
        longitude: float
        country: str | None

    class Filters(BaseModel):
        min_temperature_c: float | None
        max_wind_kmh: int | None
        conditions: list[L["sun", "cloud", "rain", "snow", "fog"]]

    class WeatherQuery(BaseModel):
        query: str
        units: L["metric", "imperial"]
        days: int
        locations: list[Location]
        filters: Filters | None
        include_hourly: bool

    invoice = Invoice(
        number="INV-2026-00417",
        currency="EUR",
        billing=Address(street="Hauptstraße 12", city="München", postcode="80331", country="DE"),
        shipping=None,
        lines=[
            LineItem(
                sku=f"GPU-{n:03d}",
                description=f"H100 node hour, pool {name}",
                quantity=n * 3,
                unit_price=2.5 + n / 4,
                tax=("standard", "reduced", "zero")[n % 3],
            )
            for n, name in enumerate(["east", "west", "北京", "paris", "batch", "spot"], 1)
        ],
        discount=-12.75,
        notes="Paid by transfer; reference 00417 ✅",
    )
    incident = Incident(
        title="Decode latency doubled on the llama3 pool after the int8 swap",
        severity="sev2",
        services=["fusebox-operator", "inference-llama3", "sidecar", "gateway"],
        reporter=Person(name="Ana Souza", email="ana@example.com", team="platform"),
        assignees=[
            Person(name="李雷", email=None, team="inference"),
            Person(name="Jo Smith", email="jo@example.org", team=None),
        ],
        started_at="2026-11-30T04:12:09Z",
        error_rate=0.0125,
        latency_ms=[41.5, 43.25, 88.0, 91.75, 120.5, 45.0],
        steps=[
            Step(action="Roll back to bf16", expected="p99 under 60 ms", passed=True),
            Step(action="Replay the trace with int8", expected="same p99", passed=False),
            Step(action="Pin the pool to H200 nodes", expected="no swap", passed=True),
        ],
        root_cause=None,
    )
    weather = WeatherQuery(
        query="Will it rain on the ride from Lyon to Genève this weekend?",
        units="metric",
        days=3,
        locations=[
            Location(name="Lyon", latitude=45.764, longitude=4.8357, country="FR"),
            Location(name="Annecy", latitude=45.8992, longitude=6.1294, country=None),
            Location(name="Genève", latitude=46.2044, longitude=6.1432, country="CH"),
        ],
        filters=Filters(min_temperature_c=-2.5, max_wind_kmh=40, conditions=["rain", "snow"]),
        include_hourly=False,
    )

    def document(model: BaseModel) -> str:
        return json.dumps(model.model_dump(), ensure_ascii=False)

    return {
        "json_object": ({"type": "object"}, document(incident)),
        "invoice": (to_strict_json_schema(Invoice), document(invoice)),
        "incident": (to_strict_json_schema(Incident), document(incident)),
        "weather_query": (to_strict_json_schema(WeatherQuery), document(weather)),
    }


# Our unit tests' documents (tests/unit/server/test_structured_output.py), text only: raw
# non-UTF-8 bytes cannot be spelt by a tokenizer's encode.
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
FREE_DOCUMENTS = (
    "{}",
    '{"a": 1}',
    '{"a": [1, 2.5, -0.5e10, 1E+5, -0, true, false, null]}',
    '{"nested": {"deeper": [[], [[]], {"x": "y"}]}}',
    '{"中文": "你好, 世界 😀"}',
    '{"escapes": "\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u00e9 \\ud83d\\ude00"}',
    ' {\n  "a" : 1 ,\n  "b" : 2\n}',
    "{",
    '{"a": 1.',
    '{"a": [1,',
    "[]",
    '"a"',
    "1",
    '{"a": 1}x',
    "{}{}",
    '{"a": 01}',
    '{"a": .5}',
    '{"a": 1.e5}',
    '{"a": +1}',
    '{"a": 1,}',
    '{"a" 1}',
    '{"a": "\\x41"}',
    '{"a": 1, "a": 2}',
    "{'a': 1}",
    "{" + " " * 8 + "}",
    '{"a":' + "[" * 40 + "]" * 40 + "}",
)
PERSON_DOCUMENTS = (
    '{"name": "Rex", "age": 3, "kind": "dog", "home": {"grid": [[1, -2], [], [0]]}}',
    '{"home": {"grid": []}, "kind": "cat", "age": null, "name": "\\u00e9"}',
    '{"name": "Rex"}',
    '{"name": 1',
    '{"name": "a", "age": 1.5',
    '{"name": "a", "age": "3"',
    '{"name": "a", "age": 3, "kind": "cow"',
    '{"name": "a", "other"',
    '{"name": "a", "name"',
    '{"name": "a", "age": 3, "kind": "cat", "home": {"grid": [[1.5',
    '{"name": "a", "age": 3, "kind": "cat", "home": {"grid": [1',
)
# Keywords ours refuses with a 400, each with a whole document that breaks it.
REFUSED_BY_OURS: tuple[tuple[str, dict[str, Any], str], ...] = (
    ("pattern", {"type": "string", "pattern": "^a+$"}, '"b"'),
    ("format: date-time", {"type": "string", "format": "date-time"}, '"yesterday"'),
    ("format: email", {"type": "string", "format": "email"}, '"no at sign"'),
    ("minLength", {"type": "string", "minLength": 3}, '"a"'),
    ("maxLength", {"type": "string", "maxLength": 2}, '"abcd"'),
    ("minimum", {"type": "integer", "minimum": 10}, "3"),
    ("maximum", {"type": "integer", "maximum": 9}, "42"),
    ("multipleOf", {"type": "integer", "multipleOf": 2}, "3"),
    ("minItems", {"type": "array", "items": {"type": "integer"}, "minItems": 2}, "[1]"),
    ("maxItems", {"type": "array", "items": {"type": "integer"}, "maxItems": 1}, "[1, 2]"),
    ("uniqueItems", {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "[1, 1]"),
    ("prefixItems", {"type": "array", "prefixItems": [{"type": "string"}], "items": False}, "[1]"),
    (
        "patternProperties",
        {"type": "object", "patternProperties": {"^x": {"type": "integer"}}},
        '{"xa": "s"}',
    ),
    ("minProperties", {"type": "object", "minProperties": 1}, "{}"),
    ("oneOf", {"oneOf": [{"type": "integer"}, {"type": "number"}]}, "1"),
    ("not", {"not": {"type": "string"}}, '"s"'),
    ("if/then", {"if": {"type": "integer"}, "then": {"minimum": 5}}, "1"),
    (
        "allOf of two",
        {"allOf": [{"type": "integer"}, {"minimum": 5}]},
        "1",
    ),
    (
        "recursive $ref",
        {
            "$defs": {
                "Node": {
                    "type": "object",
                    "properties": {"next": {"anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}]}},
                    "required": ["next"],
                    "additionalProperties": False,
                }
            },
            "$ref": "#/$defs/Node",
        },
        '{"next": {"next": 1}}',
    ),
)
