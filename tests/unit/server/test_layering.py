"""Layering of the server (STYLE: KServe/TGI, "the model is separate from the transport").

A module's layer is the sub-package it lives in (docs/decisions/server-layers.md):
`fusebox_server.http` (the transport), `fusebox_server.control`,
`fusebox_server.model`, and the package root for what every layer reads
(`config`, `errors`) and for the entry point `__main__` (transport: it starts the
server). Imports go one way: http -> control -> model -> shared. A layer may import
its own modules and those of the layers below it, never one above. Only the
transport names the HTTP stack (starlette, uvicorn), and no model module names an
OpenAI request field. A module at the root that is not shared or the entry point,
or a sub-package that is not a layer, fails here: whoever adds one decides where it
belongs. Imports inside functions count too: `ast.walk` sees every one.

Beside the layers, a tool package (`zoo`, the generated model families) may import
`model` and the shared modules; nothing in the server imports a tool.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Final

import pytest

PACKAGE = Path(__file__).resolve().parents[3] / "inference_image" / "fusebox_server"

# The layers, top to bottom: each may import itself and those after it.
LAYERS: Final = ("http", "control", "model", "shared")
SUB_PACKAGES: Final = frozenset({"http", "control", "model"})
# Tools beside the server: they may import these layers; no layer imports them.
# The model fetcher (an init container's command) needs nothing of the server's.
TOOLS: Final = {"zoo": frozenset({"model", "shared"}), "fetch": frozenset()}
# The package root holds the shared settings and domain errors, and the entry point.
ROOT_MODULES: Final = {"__main__": "http", "config": "shared", "errors": "shared"}
HTTP_STACK: Final = frozenset({"starlette", "uvicorn", "openai", "httpx", "h11"})
# OpenAI's names for the token budget; the engine's own is `max_new_tokens`.
OPENAI_ONLY_FIELDS: Final = frozenset({"max_tokens", "max_completion_tokens", "max_tokens_param"})

# Dotted names below the package ("model.engine", "config"), without the `__init__`s.
MODULES: Final = sorted(
    ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
    for path in PACKAGE.rglob("*.py")
    if path.stem != "__init__"
)


def layer_of(module: str) -> str | None:
    """The layer of `model.engine` is its package; of a root module, ROOT_MODULES says.

    None for a module in no layer (at the root but not listed, or in another package):
    the first two tests fail on it, the others leave it out.
    """
    package, _, name = module.rpartition(".")
    if package:
        return package if package in SUB_PACKAGES or package in TOOLS else None
    return ROOT_MODULES.get(name)


PLACED: Final = [module for module in MODULES if layer_of(module) is not None]
SERVER: Final = [module for module in PLACED if layer_of(module) not in TOOLS]


def tree_of(module: str) -> ast.Module:
    return ast.parse((PACKAGE / f"{module.replace('.', '/')}.py").read_text(encoding="utf-8"))


def imports_of(module: str) -> tuple[set[str], set[str]]:
    """The layers of the package this module imports, and the roots of everything else."""
    layers: set[str] = set()
    other: set[str] = set()
    for node in ast.walk(tree_of(module)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module == "fusebox_server":
            names = [f"fusebox_server.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 and node.module, f"{module}: a relative import"
            names = [node.module]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] != "fusebox_server":
                other.add(parts[0])
            elif len(parts) > 1:
                layers.add(layer_of(".".join(parts[1:3])) or parts[1])
    return layers, other


def identifiers_of(module: str) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree_of(module)):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.arg):
            found.add(node.arg)
        elif isinstance(node, ast.keyword) and node.arg:
            found.add(node.arg)
    return found


def test_the_sub_packages_are_the_layers() -> None:
    found = {path.name for path in PACKAGE.iterdir() if path.is_dir() and any(path.glob("*.py"))}
    assert found == SUB_PACKAGES | set(TOOLS), "a sub-package that is not a layer, or one gone"
    nested = [module for module in MODULES if module.count(".") > 1]
    assert nested == [], "a layer is one level: no sub-package inside it"


def test_the_root_holds_only_the_shared_modules_and_the_entry_point() -> None:
    at_root = {module for module in MODULES if "." not in module}
    assert at_root == set(ROOT_MODULES), "move the module into the sub-package of its layer"


@pytest.mark.parametrize("package", sorted(SUB_PACKAGES | set(TOOLS) | {""}))
def test_a_package_init_defines_nothing(package: str) -> None:
    # One name per thing: no sub-package re-exports its modules.
    init = ast.parse((PACKAGE / package / "__init__.py").read_text(encoding="utf-8"))
    body = [node for node in init.body if not isinstance(node, ast.Expr)]
    assert body == [], f"{package or 'fusebox_server'}/__init__.py holds only its docstring"


@pytest.mark.parametrize("module", SERVER)
def test_a_module_imports_only_its_own_layer_and_the_layers_below(module: str) -> None:
    layer = layer_of(module)
    assert layer is not None
    imported, _ = imports_of(module)
    assert imported <= set(LAYERS), f"{module} imports what is in no layer: {sorted(imported)}"
    above = {other for other in imported if LAYERS.index(other) < LAYERS.index(layer)}
    assert above == set(), f"{module} ({layer}) imports from a layer above: {sorted(above)}"


@pytest.mark.parametrize("module", [m for m in SERVER if layer_of(m) != "http"])
def test_only_the_transport_layer_names_the_http_stack(module: str) -> None:
    _, other = imports_of(module)
    assert other & HTTP_STACK == set()


@pytest.mark.parametrize("module", [m for m in PLACED if layer_of(m) == "model"])
def test_no_model_module_names_an_openai_request_field(module: str) -> None:
    assert identifiers_of(module) & OPENAI_ONLY_FIELDS == set()


@pytest.mark.parametrize("module", [m for m in PLACED if layer_of(m) in TOOLS])
def test_a_tool_imports_only_itself_and_the_layers_it_may(module: str) -> None:
    tool = layer_of(module)
    assert tool is not None
    imported, other = imports_of(module)
    assert imported <= {tool} | TOOLS[tool], f"{module} imports {sorted(imported)}"
    assert other & HTTP_STACK == set()


@pytest.mark.parametrize("module", SERVER)
def test_nothing_in_the_server_imports_a_tool(module: str) -> None:
    imported, _ = imports_of(module)
    assert imported & set(TOOLS) == set(), f"{module} imports a tool: {sorted(imported)}"


def test_the_checks_see_imports_inside_functions() -> None:
    # A lazy import is an import: tokenization imports transformers only in `load_tokenizer`.
    _, other = imports_of("model.tokenization")
    assert "transformers" in other
