"""The contract stays stdlib-only: the operator's image, the server's and the sidecar's
all install it, so an import of anything else would put that library in all three
(or break the one that lacks it). Every module is parsed, so a new one is checked too."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[3] / "contract" / "fusebox_contract"
MODULES = sorted(PACKAGE.rglob("*.py"))


def imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # a relative import stays inside the package
                roots.add("fusebox_contract")
            elif node.module:
                roots.add(node.module.split(".")[0])
    return roots


def test_the_contract_has_modules_to_check() -> None:
    assert {p.stem for p in MODULES} >= {"admin", "names", "stats"}


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.stem)
def test_a_contract_module_imports_only_the_standard_library(path: Path) -> None:
    allowed = set(sys.stdlib_module_names) | {"__future__", "fusebox_contract"}
    assert imported_roots(path) - allowed == set()
