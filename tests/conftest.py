"""Marks every test with its tier from the folder it lives in, so
`pytest -m unit` and the Makefile's tier targets select by directory."""

from pathlib import Path

import pytest

_TIERS = ("unit", "integration", "e2e")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tests_root = Path(__file__).parent
    for item in items:
        relative = Path(str(item.path)).relative_to(tests_root)
        tier = relative.parts[0]
        if tier in _TIERS:
            item.add_marker(getattr(pytest.mark, tier))
