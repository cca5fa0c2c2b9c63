"""The CRD is structural, documented, and its defaults agree with spec.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import yaml

from fusebox_operator.spec import parse_spec

from .conftest import REPO

CRD = yaml.safe_load((REPO / "crds" / "inferenceservice.yaml").read_text(encoding="utf-8"))
SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def walk(schema: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, child in (schema.get("properties") or {}).items():
        yield from walk(child, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from walk(schema["additionalProperties"], f"{path}{{}}")


def test_every_field_has_a_type_and_a_description() -> None:
    missing = [
        path
        for path, node in walk(SCHEMA, "")
        if "type" not in node or not str(node.get("description", "")).strip()
    ]
    assert missing == []


SCHEMA_KEYWORDS = {
    "type",
    "description",
    "properties",
    "items",
    "additionalProperties",
    "required",
    "default",
    "enum",
    "pattern",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "maxLength",
    "maxItems",
    "maxProperties",
    "format",
    "x-kubernetes-validations",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-preserve-unknown-fields",
}


def test_every_schema_node_uses_only_known_keywords() -> None:
    # Catches YAML slips such as an unquoted comma in a flow-mapping description.
    unknown = [(path, sorted(set(node) - SCHEMA_KEYWORDS)) for path, node in walk(SCHEMA, "")]
    assert [entry for entry in unknown if entry[1]] == []


def test_schema_is_structural() -> None:
    # Structural: no value validation without a type, objects declare their properties
    # (or preserve unknown fields explicitly), no $ref or anyOf at the field roots.
    for path, node in walk(SCHEMA, ""):
        assert "$ref" not in node, path
        if node.get("type") == "object" and path.count(".") > 1:
            assert (
                "properties" in node
                or "additionalProperties" in node
                or node.get("x-kubernetes-preserve-unknown-fields") is True
            ), path


def test_names_scope_and_subresources() -> None:
    names = CRD["spec"]["names"]
    assert (names["plural"], names["shortNames"], names["categories"]) == (
        "inferenceservices",
        ["fis"],
        ["fusebox"],
    )
    version = CRD["spec"]["versions"][0]
    assert CRD["spec"]["scope"] == "Namespaced" and version["subresources"] == {"status": {}}
    columns = [c["name"].upper() for c in version["additionalPrinterColumns"]]
    assert columns == ["READY", "BREAKER", "TIER", "VARIANT", "GPU-MEM", "RSS", "AGE"]


def schema_defaults(node: dict[str, Any]) -> Any:
    """The object the API server would default an empty object of this schema to."""
    result = {}
    for name, child in (node.get("properties") or {}).items():
        if "default" in child:
            value = child["default"]
            result[name] = schema_defaults(child) if value == {} else value
    return result


def test_crd_defaults_equal_spec_py_defaults() -> None:
    spec_schema = SCHEMA["properties"]["spec"]
    defaulted = schema_defaults(spec_schema)
    defaulted["model"] = {"name": "chat", "source": "pvc://models/tiny"}
    defaulted["fallback"] = {"quantization": "int8"}
    from_crd = parse_spec(defaulted)
    from_code = parse_spec({"model": defaulted["model"], "fallback": defaulted["fallback"]})
    assert from_crd == from_code


def test_ratio_and_percent_bounds_are_in_the_schema() -> None:
    breaker = SCHEMA["properties"]["spec"]["properties"]["breaker"]["properties"]
    admit = breaker["halfOpen"]["properties"]["admitPercent"]
    assert (admit["minimum"], admit["maximum"]) == (1, 100)
    rate = breaker["quality"]["properties"]["maxFailureRate"]
    assert rate["exclusiveMinimum"] is True and rate["maximum"] == 1
