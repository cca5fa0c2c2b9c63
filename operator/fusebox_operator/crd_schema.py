"""The InferenceService spec's fields as the CRD declares them: defaults and bounds.

Why: a field's default and range are written once, in the CRD's OpenAPI schema
(crds/inferenceservice.yaml), where the API server applies them. The parser
(spec.py) asks this module for them instead of repeating the numbers, so a
default or a bound changes in one place and the operator cannot drift from the
API server. The operator package carries a byte copy of the CRD
(fusebox_operator/crds/, refreshed by scripts/gen_api_docs.py and checked by a
test), read once per process. No Kubernetes client: the file ships in the image.

`SpecSchema.violations` walks a raw spec along the same schema for what the API
server refuses by the schema's shape alone: a field it does not declare, and a
string under its minLength, or a string, list or map over its maxLength, maxItems
or maxProperties. Driven by the schema, it covers a field added later without a
line of parser code.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

CRD_RESOURCE = ("crds", "inferenceservice.yaml")
"""Where the CRD copy lies inside the fusebox_operator package."""


@dataclass(frozen=True)
class FieldSchema:
    """One field under `.spec`, as its schema node says (None: the schema does not say)."""

    path: str  # dotted below .spec: "telemetry.wedgeAfterSeconds"
    default: Any
    minimum: float | None
    maximum: float | None
    exclusive_minimum: bool
    max_length: int | None
    enum: tuple[str, ...]

    @classmethod
    def from_node(cls, path: str, node: Mapping[str, Any]) -> FieldSchema:
        return cls(
            path=path,
            default=node.get("default"),
            minimum=node.get("minimum"),
            maximum=node.get("maximum"),
            exclusive_minimum=bool(node.get("exclusiveMinimum", False)),
            max_length=node.get("maxLength"),
            enum=tuple(node.get("enum") or ()),
        )


class SpecSchema:
    """The `.spec` schema of one CRD; `field(path)` for a field's declaration."""

    def __init__(self, crd: Mapping[str, Any]) -> None:
        version = crd["spec"]["versions"][0]
        spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
        self._node: Mapping[str, Any] = spec
        self._fields = dict(_fields(spec, ""))

    def field(self, path: str) -> FieldSchema:
        try:
            return self._fields[path]
        except KeyError:
            raise KeyError(f"the CRD declares no field spec.{path}") from None

    def children(self, path: str) -> tuple[str, ...]:
        """The names of the fields directly below `path`, in the CRD's order."""
        prefix = f"{path}."
        return tuple(
            name[len(prefix) :]
            for name in self._fields
            if name.startswith(prefix) and "." not in name[len(prefix) :]
        )

    def violations(self, raw: Any) -> Iterator[str]:
        """What the API server would refuse in `raw` (a `.spec`) by the schema's shape:
        each unknown field and each value over (or a string under) its declared size,
        as a message naming the field's full path. Values of another type are the
        parser's to refuse."""
        return _violations(raw, self._node, "spec")


def _violations(value: Any, node: Mapping[str, Any], path: str) -> Iterator[str]:
    if isinstance(value, str):
        most = node.get("maxLength")
        if most is not None and len(value) > most:
            yield f"{path} must be at most {most} characters, got {len(value)}"
        least = node.get("minLength")
        if least is not None and len(value) < least:
            # An empty blocked term would match nothing and be skipped: refused instead.
            yield (
                f"{path} must not be empty"
                if least == 1
                else f"{path} must be at least {least} characters, got {len(value)}"
            )
    elif isinstance(value, list):
        most = node.get("maxItems")
        if most is not None and len(value) > most:
            yield f"{path} must have at most {most} items, got {len(value)}"
        items = node.get("items") or {}
        for index, item in enumerate(value):
            yield from _violations(item, items, f"{path}[{index}]")
    elif isinstance(value, Mapping):
        yield from _object_violations(value, node, path)


def _object_violations(
    value: Mapping[Any, Any], node: Mapping[str, Any], path: str
) -> Iterator[str]:
    most = node.get("maxProperties")
    if most is not None and len(value) > most:
        yield f"{path} must have at most {most} entries, got {len(value)}"
    declared: Mapping[str, Any] = node.get("properties") or {}
    free = node.get("additionalProperties")
    for key, item in value.items():
        if key in declared:
            yield from _violations(item, declared[key], f"{path}.{key}")
        elif isinstance(free, Mapping):  # a map: any key, each value as the schema says
            yield from _violations(item, free, f"{path}[{key!r}]")
        elif not node.get("x-kubernetes-preserve-unknown-fields"):
            # The API server prunes such a field (kubectl's strict validation refuses
            # it): a typo would silently fall back to the default.
            close = difflib.get_close_matches(str(key), declared, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            yield f"{path}.{key}: unknown field{hint}"


def _fields(node: Mapping[str, Any], path: str) -> Iterator[tuple[str, FieldSchema]]:
    for name, child in (node.get("properties") or {}).items():
        child_path = f"{path}.{name}" if path else name
        yield child_path, FieldSchema.from_node(child_path, child)
        yield from _fields(child, child_path)


@functools.cache
def spec_schema() -> SpecSchema:
    """The schema of the CRD the operator ships with, loaded once."""
    text = resources.files("fusebox_operator").joinpath(*CRD_RESOURCE).read_text("utf-8")
    # libyaml's loader when the wheel has it: a tenth of the pure-Python one's 50 ms.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return SpecSchema(yaml.load(text, Loader=loader))


def crd_default(path: str) -> Any:
    """The shipped CRD's default of a field (for the spec dataclasses' own defaults)."""
    return spec_schema().field(path).default
