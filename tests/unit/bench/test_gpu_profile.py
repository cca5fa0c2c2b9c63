"""bench/gpu_profile.py end to end on the CPU (its --dry-run): both attention settings,
cold and warm steps, and the files the H200 run commits."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_the_dry_run_measures_both_attention_settings_and_writes_its_files(
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
    assert [(run["rows"], run["cudnn_sdp"]) for run in result["runs"]] == [(2, True), (2, False)]
    for run in result["runs"]:
        assert run["cold_ms_per_step"] > 0 and run["warm_ms_per_step"] > 0
        assert run["top_host_ops"]
    assert set(result["plain_ms_per_step"]) == {"2"}
    assert "| 2 | off |" in (out / "profile.md").read_text()
