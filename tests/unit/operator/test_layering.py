"""Pure modules never import kopf, kubernetes, aiohttp or torch (STYLE: kopf layering)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[3] / "operator" / "fusebox_operator"
PURE = ["spec", "sizing", "manifests", "policy", "status", "settings"]
FORBIDDEN = {"kopf", "kubernetes", "aiohttp", "torch"}
IO_MODULES = {"kube", "telemetry", "actuator", "handlers", "__main__"}


def imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            roots.add(node.module)
    return roots


@pytest.mark.parametrize("module", PURE)
def test_pure_module_imports_no_io_library(module: str) -> None:
    roots = imported_roots(PACKAGE / f"{module}.py")
    assert {r.split(".")[0] for r in roots} & FORBIDDEN == set()
    own = {r.split(".")[1] for r in roots if r.startswith("fusebox_operator.")}
    assert own & IO_MODULES == set(), f"{module} imports an I/O module"


def test_only_kube_py_imports_the_kubernetes_client() -> None:
    users = [
        p.stem
        for p in PACKAGE.glob("*.py")
        if any(r.split(".")[0] == "kubernetes" for r in imported_roots(p))
    ]
    assert users in ([], ["kube"])
