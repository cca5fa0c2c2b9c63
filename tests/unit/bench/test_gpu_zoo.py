"""bench/gpu_zoo.py on the CPU (its --dry-run): the eager slot batch, teacher-forced on
transformers' batched generate, per family, and the files the H200 run commits."""

from __future__ import annotations

import json
from pathlib import Path

from bench.gpu_zoo import main


def test_the_dry_run_holds_the_slot_batch_to_transformers_per_family(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["--dry-run", "--out", str(out), "--families", "mistral", "--rows", "2"]) == 0
    result = json.loads((out / "zoo.json").read_text())
    [family] = result["families"]
    assert family["family"] == "mistral" and family["architecture"] == "MistralForCausalLM"
    [run] = family["runs"]
    assert run["rows"] == 2 and run["graphs_on"] is None  # graphs need CUDA
    # float32 on the CPU: teacher-forced logits equal to rounding, every argmax the same.
    assert run["max_abs_diff"]["slots-eager vs transformers"] < 1e-4
    assert run["agreement"] == {"slots-eager": 1.0}
    assert "| mistral | 2 | None |" in (out / "zoo.md").read_text()
