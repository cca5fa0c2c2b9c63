"""Layering (STYLE: kopf): pure modules import no I/O library, only the handlers know
kopf, only kube.py the Kubernetes client; and every library the operator imports is
declared for its image and pinned there as in the dev environment."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[3] / "operator" / "fusebox_operator"
REPO = PACKAGE.parents[1]
FORBIDDEN = {"kopf", "kubernetes", "aiohttp", "torch"}
# memo: what the handlers keep between calls (the tick's memory, the kube client).
IO_MODULES = {
    "kube",
    "kubelet_pressure",
    "telemetry",
    "actuator",
    "handlers",
    "tick",
    "memo",
    "__main__",
}
# Every other module is pure: a new one is checked without being listed.
PURE = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in IO_MODULES | {"__init__"})
DISTRIBUTIONS = {"yaml": "pyyaml", "prometheus_client": "prometheus-client"}
FIRST_PARTY = {"fusebox_operator", "fusebox_contract"}


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


def test_only_the_handlers_know_kopf() -> None:
    # The tick runs without kopf: a test drives it with plain inputs.
    users = sorted(
        p.stem
        for p in PACKAGE.glob("*.py")
        if any(r.split(".")[0] == "kopf" for r in imported_roots(p))
    )
    assert users == ["__main__", "handlers"]


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        name, sep, rest = line.partition("==")
        if sep and not line.startswith("#"):
            pins[name.strip().lower().replace("_", "-")] = rest.split()[0]
    return pins


def _requirements(path: Path) -> set[str]:
    names = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        name = line.split("#", 1)[0].strip()
        if name:
            names.add(name.lower().replace("_", "-"))
    return names


def test_every_library_the_operator_imports_is_declared_for_its_image() -> None:
    stdlib = set(sys.stdlib_module_names)
    roots = (
        {r.split(".")[0] for p in PACKAGE.glob("*.py") for r in imported_roots(p)}
        - stdlib
        - FIRST_PARTY
    )
    declared = _requirements(REPO / "operator" / "requirements.in")
    assert {DISTRIBUTIONS.get(root, root) for root in roots} <= declared


def test_the_operator_lock_pins_what_the_dev_environment_pins() -> None:
    image = _pins(REPO / "operator" / "requirements.lock")
    dev = _pins(REPO / "requirements-dev.lock")
    assert _requirements(REPO / "operator" / "requirements.in") <= set(image)
    assert {name: version for name, version in image.items() if dev.get(name) != version} == {}


PLUGIN = PACKAGE / "kubectl_plugin"
# What would let `kubectl fusebox` reach a pod or run as the operator does.
POD_REACHING = {"aiohttp", "kopf", "torch"} | {
    f"fusebox_operator.{name}" for name in ("telemetry", "actuator", "tick", "handlers", "memo")
}


def test_the_kubectl_plugin_prints_purely_and_talks_to_the_api_server_only() -> None:
    # views: pure (no client at all); cli: the kubernetes client, never a pod's port.
    views = imported_roots(PLUGIN / "views.py")
    assert {r.split(".")[0] for r in views} & FORBIDDEN == set()
    assert {r for r in views if r.startswith("fusebox_operator.")} & {
        f"fusebox_operator.{name}" for name in IO_MODULES
    } == set()
    for path in PLUGIN.glob("*.py"):
        roots = imported_roots(path)
        assert ({r.split(".")[0] for r in roots} | roots) & POD_REACHING == set(), path.name
