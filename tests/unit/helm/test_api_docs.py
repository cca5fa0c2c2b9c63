"""docs/api.md and the chart's CRD copy are generated from crds/ and must not go stale."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from types import ModuleType

import yaml

from .conftest import REPO

SCRIPT = REPO / "scripts" / "gen_api_docs.py"


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_api_docs", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_api_docs_are_up_to_date_with_the_crd() -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_every_crd_field_is_documented_with_type_default_and_meaning() -> None:
    generator = load_generator()
    crd = yaml.safe_load((REPO / "crds" / "inferenceservice.yaml").read_text())
    text = generator.render_api_docs(crd)
    rows = {
        line.split("|")[1].strip().strip("`"): line
        for line in text.splitlines()
        if line.startswith("| `")
    }
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    for root in ("spec", "status"):
        for path, field in generator.walk(schema[root], root):
            assert path in rows, f"{path} missing from docs/api.md"
            assert field["description"].split()[0] in rows[path]
            if "default" in field:
                assert generator.inline(field["default"]) in rows[path]
    assert "| `spec.breaker.latency.p99ThresholdMillis` | number | `200` |" in text


def test_a_stale_api_doc_is_reported(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    generator = load_generator()
    stale = tmp_path / "api.md"
    stale.write_text("# old\n")
    chart_crd = tmp_path / "crd.yaml"
    monkeypatch.setattr(generator, "OUTPUT", stale)
    monkeypatch.setattr(generator, "CHART_CRD", chart_crd)
    assert generator.main(["--check"]) == 1
    assert generator.main([]) == 0
    assert generator.main(["--check"]) == 0
    assert chart_crd.read_bytes() == (REPO / "crds" / "inferenceservice.yaml").read_bytes()
