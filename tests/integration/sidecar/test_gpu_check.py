"""bench/gpu_check.py end to end: its CPU dry run with the tiny model writes
every artefact and passes its own checks; without CUDA it says so and runs
as that dry run."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "bench" / "gpu_check.py"


def _gpu_check(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The script with `args`, sampling every 0.5 s and settling 1 s after each action."""
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--interval-seconds", "0.5", "--settle-seconds", "1", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


def test_without_cuda_it_says_so_and_runs_as_a_dry_run(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    out = tmp_path / "out"
    without_cuda = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    result = _gpu_check(
        "--checks",
        "leak",
        "--model-dir",
        str(tiny_model_dir),
        "--requests",
        "2",
        "--out",
        str(out),
        env=without_cuda,
    )

    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "CUDA is not available here" in result.stdout and "dry run" in result.stdout
    assert "(dry run on CPU)" in (out / "summary.md").read_text()


def test_the_dry_run_records_the_leak_and_what_unload_frees(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    out = tmp_path / "out"
    result = _gpu_check(
        "--dry-run", "--model-dir", str(tiny_model_dir), "--requests", "4", "--out", str(out)
    )

    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    summary = (out / "summary.md").read_text()
    assert "FAIL" not in summary
    assert "PASS: unload frees the leak" in summary
    with (out / "samples.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert {"baseline", "leak", "unload", "swap:fallback"} <= {row["phase"] for row in rows}
    assert all(row["process_resident_memory_bytes"] for row in rows)
    assert (out / "memory.png").read_bytes().startswith(b"\x89PNG")
    assert (out / "actions.json").exists()
