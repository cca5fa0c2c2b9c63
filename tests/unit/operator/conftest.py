"""Fixtures of the operator's unit tests: golden YAML snapshots and sample specs."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

SNAPSHOTS = Path(__file__).parent / "snapshots"
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def snapshot() -> Callable[[str, Any], None]:
    """Compare an object to snapshots/NAME.yaml; FUSEBOX_UPDATE_SNAPSHOTS=1 rewrites it."""

    def check(name: str, obj: Any) -> None:
        path = SNAPSHOTS / f"{name}.yaml"
        text = yaml.safe_dump(obj, sort_keys=True, allow_unicode=True, width=100)
        if os.environ.get("FUSEBOX_UPDATE_SNAPSHOTS") == "1":
            path.write_text(text, encoding="utf-8")
            return
        if not path.exists():
            pytest.fail(f"missing snapshot {path.name}: run `make snapshots`")
        assert text == path.read_text(encoding="utf-8"), (
            f"{name} differs from snapshots/{path.name}; if intended, run `make snapshots`"
        )

    return check


def load_example(name: str) -> dict[str, Any]:
    document = yaml.safe_load((REPO / "crds" / "examples" / name).read_text(encoding="utf-8"))
    assert isinstance(document, dict)
    return document
