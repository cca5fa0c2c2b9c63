"""The spec's size in bytes as the operator records it, and the budget it must fit.

Why: kopf keeps the spec it last handled in an annotation of the object
(`fusebox.dev/last-handled-configuration`, handlers.configure), and Kubernetes
refuses every write of an object whose annotations pass 256 KiB: the status
patch that would say anything is refused with it, for good. The CRD bounds
every string, list and map in characters, which bounds an ASCII spec (at most
100 KiB, tests/unit/operator/test_spec_bounds.py), but kopf writes JSON with
each non-ASCII character escaped (`\\u4f60`, 6 bytes; an emoji 12), so a spec
of Chinese canned answers within every CRD bound could still pass the limit.
The bound is therefore checked again here, in the bytes kopf writes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

SPEC_RECORD_BUDGET_BYTES = 100 * 1024
"""The most bytes a spec may take as kopf records it: the largest ASCII spec the CRD
admits, leaving room beside it for kubectl's last-applied copy and the rest."""


def recorded_bytes(value: Any) -> int:
    """Bytes of `value` as kopf's annotation holds it: json.dumps with no spaces, its
    default ASCII escapes (each character of the result is one byte)."""
    return len(json.dumps(value, separators=(",", ":")))


def _largest_part(value: Any, path: str) -> tuple[str, int]:
    """The field that makes `value` large: follow the largest child while it is most of
    its parent (a full map of equal entries is named as the map)."""
    size = recorded_bytes(value)
    if isinstance(value, Mapping):
        children = [(f"{path}.{key}", child) for key, child in value.items()]
    elif isinstance(value, list):
        children = [(f"{path}[{index}]", child) for index, child in enumerate(value)]
    else:
        return path, size
    if not children:
        return path, size
    name, child = max(children, key=lambda item: recorded_bytes(item[1]))
    if recorded_bytes(child) * 2 < size:
        return path, size
    return _largest_part(child, name)


def spec_size_problem(raw: Mapping[str, Any]) -> str | None:
    """Why the spec is too large to record, naming its largest field; None when it fits."""
    total = recorded_bytes(dict(raw))
    if total <= SPEC_RECORD_BUDGET_BYTES:
        return None
    path, size = _largest_part(dict(raw), "spec")
    return (
        f"spec takes {total} bytes as the operator records it (kopf's last-handled "
        f"annotation writes each non-ASCII character as a 6-byte \\u escape), over its "
        f"{SPEC_RECORD_BUDGET_BYTES}-byte budget within Kubernetes' 256 KiB of annotations: "
        f"{path} takes {size} bytes; shorten it"
    )
