"""bench/gpu_sampling.py end to end on the CPU (its --dry-run): mixed rows in one slot batch,
each kind of row checked against the row decoded alone, and the files the device run writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_the_dry_run_decodes_every_kind_of_row_as_alone_and_writes_its_files(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "gpu_sampling.py"),
            "--dry-run",
            "--rows",
            "5",
            "--steps",
            "3",
            "--out",
            str(out),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    result = json.loads((out / "sampling.json").read_text())
    assert result["rows_agreeing_with_alone"] == {
        kind: "1/1" for kind in ("plain", "penalised", "biased", "scored", "sampled")
    }
    assert result["plain_rows_same_in_both_runs"] == "1/1"
    assert set(result["median_step_ms"]) == {"plain", "mixed"}
    assert "| mixed |" in (out / "sampling.md").read_text()
