"""The InferenceService spec's fields as the CRD declares them: defaults and bounds.

Why: a field's default and range are written once, in the CRD's OpenAPI schema
(crds/inferenceservice.yaml), where the API server applies them. The parser
(spec.py) asks this module for them instead of repeating the numbers, so a
default or a bound changes in one place and the operator cannot drift from the
API server. The operator package carries a byte copy of the CRD
(fusebox_operator/crds/, refreshed by scripts/gen_api_docs.py and checked by a
test), read once per process. No Kubernetes client: the file ships in the image.
"""

from __future__ import annotations

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
