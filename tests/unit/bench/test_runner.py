"""`make bench` (= `python -m bench`): every benchmark script is in the plan,
and one whose prerequisite is absent is skipped with its reason, not failed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def _bench(*arguments: str, **environ: str) -> subprocess.CompletedProcess[str]:
    clean = {
        key: value
        for key, value in os.environ.items()
        if key not in ("FUSEBOX_KUBECONFIG", "KUBECONFIG", "KUBECTL")
    }
    return subprocess.run(
        [sys.executable, "-m", "bench", *arguments],
        cwd=REPO,
        env={**clean, **environ},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_plan_runs_every_benchmark_script_in_bench() -> None:
    result = _bench("--list")

    assert result.returncode == 0, result.stderr
    for script in sorted((REPO / "bench").glob("*_bench.py")):
        assert script.name in result.stdout, script.name
    assert "gpu_check.py" not in result.stdout


def test_without_a_cluster_the_operator_scale_benchmark_is_skipped_with_the_reason() -> None:
    listing = _bench("--list")
    run = _bench("operator-scale")

    assert "operator-scale: skip: no cluster: set FUSEBOX_KUBECONFIG" in listing.stdout
    assert run.returncode == 0, run.stderr
    assert "bench: operator-scale skipped: no cluster" in run.stdout


def test_with_a_kubeconfig_the_operator_scale_benchmark_gets_it(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\n")

    listing = _bench("--list", "operator-scale", FUSEBOX_KUBECONFIG=str(kubeconfig), KUBECTL="sh")

    assert f"operator_bench.py scale --kubeconfig {kubeconfig}" in listing.stdout


def test_an_unknown_benchmark_name_is_refused() -> None:
    result = _bench("no-such-bench")

    assert result.returncode == 2
    assert "operator-reaction" in result.stderr
