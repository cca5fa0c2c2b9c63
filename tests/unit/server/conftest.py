"""The tiny model, generated once per machine into the cache, for in-process component tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fusebox_server.model.tiny_model import ensure_model


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    return ensure_model("tiny")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir: Path) -> Any:
    from fusebox_server.model.tokenization import load_tokenizer

    return load_tokenizer(tiny_model_dir)
