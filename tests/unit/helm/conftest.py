"""Render the chart with the real helm binary (built by `make setup-binaries`).

Helm is the edge these tests exercise, so nothing here re-implements its
template engine: every test runs `helm template` / `helm lint` and reads the
YAML it prints.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "helm" / "fusebox"
VALUES_DIR = Path(__file__).resolve().parent / "values"

Render = Callable[..., list[dict[str, Any]]]


class UniqueKeyLoader(yaml.SafeLoader):
    """Refuses a mapping that repeats a key, as strict loaders (kubectl's, Go's
    yaml.v3) do; PyYAML's own keeps the last value without a word."""


def _construct_unique_mapping(loader: UniqueKeyLoader, node: yaml.MappingNode) -> Any:
    keys = [loader.construct_object(key_node, deep=True) for key_node, _ in node.value]
    repeated = sorted({str(key) for key in keys if keys.count(key) > 1})
    if repeated:
        raise yaml.constructor.ConstructorError(
            None, None, f"repeated keys {repeated}", node.start_mark
        )
    return loader.construct_mapping(node, deep=True)


UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping
)


def load_documents(text: str) -> list[dict[str, Any]]:
    """The non-empty YAML documents of `text`, refusing repeated keys."""
    return [doc for doc in yaml.load_all(text, Loader=UniqueKeyLoader) if doc]


@pytest.fixture(scope="session")
def helm() -> Path:
    local = REPO / ".cache" / "bin" / "helm"
    if local.exists():
        return local
    found = shutil.which("helm")
    if found is None:
        pytest.fail("no helm binary: run `make setup-binaries` (it builds .cache/bin/helm)")
    return Path(found)


def run_helm(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helm), *args], capture_output=True, text=True, check=False, timeout=120
    )


@pytest.fixture(scope="session")
def render(helm: Path) -> Render:
    """`helm template` the chart with values files / --set pairs; returns the documents."""

    def template(
        *values_files: Path, sets: tuple[str, ...] = (), namespace: str = "fusebox-system"
    ) -> list[dict[str, Any]]:
        args = ["template", "fusebox", str(CHART), "--namespace", namespace, "--include-crds"]
        for path in values_files:
            args += ["--values", str(path)]
        for pair in sets:
            args += ["--set", pair]
        result = run_helm(helm, *args)
        assert result.returncode == 0, result.stderr
        return load_documents(result.stdout)

    return template


def is_hook(document: dict[str, Any]) -> bool:
    """A Helm hook (helm.sh/hook): made around an upgrade or uninstall, never part
    of the running release."""
    return "helm.sh/hook" in ((document.get("metadata") or {}).get("annotations") or {})


def release_objects(documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the release keeps in the cluster: every document but the hooks."""
    return [doc for doc in documents if not is_hook(doc)]


def hooks(documents: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    """The hooks helm runs on `event` (pre-upgrade, pre-delete, ...)."""
    return [
        doc
        for doc in documents
        if is_hook(doc) and event in doc["metadata"]["annotations"]["helm.sh/hook"].split(",")
    ]


def by_kind(documents: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The release's objects of `kind` (hooks are selected with `hooks`)."""
    return [doc for doc in release_objects(documents) if doc["kind"] == kind]


def one(documents: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(documents, kind)
    assert len(found) == 1, f"expected one {kind}, got {[d['metadata']['name'] for d in found]}"
    return found[0]


def env_of(deployment: dict[str, Any]) -> dict[str, str]:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {item["name"]: item.get("value", "") for item in container["env"]}
