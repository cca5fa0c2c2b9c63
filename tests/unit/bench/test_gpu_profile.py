"""bench/gpu_profile.py end to end on the CPU (its --dry-run): the CPU's batch and the slot
batch (graphs need CUDA), cold and warm steps, token agreement, and the files the H200 run
commits."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_the_dry_run_measures_each_batch_and_writes_its_files(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "gpu_profile.py"),
            "--dry-run",
            "--out",
            str(out),
            "--work-dir",
            str(tmp_path / "work"),
            "--rows",
            "2",
            "--steps",
            "2",
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )

    result = json.loads((out / "profile.json").read_text())
    runs = result["runs"]
    assert [(run["batch"], run["rows"]) for run in runs] == [
        ("decode-batch", 2),
        ("slots-eager", 2),
    ]
    for run in runs:
        assert run["cold_ms_per_step"] > 0 and run["warm_ms_per_step"] > 0
        assert run["top_host_ops"] and not run["graphs_on"]
    # float32 on the CPU: the slot batch decodes exactly what the CPU's batch decodes.
    assert runs[1]["agreement"] == {"decode-batch": 1.0}
    assert set(result["plain_ms_per_step"]) == {"2"}
    assert "| slots-eager | 2 |" in (out / "profile.md").read_text()
