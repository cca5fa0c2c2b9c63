"""The suite's own rule: a skip fails the run unless it is listed with its reason.

Proven by running pytest on a throwaway suite that uses the real
tests/conftest.py, as `make test` would."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).resolve().parents[2] / "conftest.py"
SAMPLE = (
    "import pytest\n\n"
    "def test_runs():\n    assert True\n\n"
    "def test_skips():\n    pytest.skip('no such device here')\n"
)
# A whole file skipped while pytest collects it: no test of it ever runs.
MODULE_SKIP = (
    "import pytest\n\n"
    "pytest.importorskip('no_such_driver_here')\n\n"
    "def test_needs_the_driver():\n    assert True\n"
)


def _run_suite(
    tmp_path: Path, allowed: str, sample: str = SAMPLE
) -> subprocess.CompletedProcess[str]:
    suite = tmp_path / "tests"
    suite.mkdir(parents=True)
    conftest = CONFTEST.read_text()
    marker = "ALLOWED_SKIPS: dict[str, str] = {\n"
    assert marker in conftest
    (suite / "conftest.py").write_text(conftest.replace(marker, marker + allowed))
    (suite / "test_sample.py").write_text(sample)
    (suite / "test_other.py").write_text("def test_elsewhere():\n    assert True\n")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(suite)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_an_unlisted_skip_fails_the_run_and_names_the_test(tmp_path: Path) -> None:
    run = _run_suite(tmp_path, "")
    assert run.returncode == 1, run.stdout
    assert "skips not allowed" in run.stdout
    assert "test_sample.py::test_skips: Skipped: no such device here" in run.stdout


def test_a_listed_skip_passes(tmp_path: Path) -> None:
    run = _run_suite(tmp_path, '    "tests/test_sample.py::test_skips": "needs a device",\n')
    assert run.returncode == 0, run.stdout
    assert "skips not allowed" not in run.stdout


def test_a_file_skipped_while_collected_fails_the_run_unless_listed(tmp_path: Path) -> None:
    run = _run_suite(tmp_path / "unlisted", "", MODULE_SKIP)
    assert run.returncode == 1, run.stdout
    assert "tests/test_sample.py: Skipped: could not import 'no_such_driver_here'" in run.stdout
    listed = _run_suite(
        tmp_path / "listed", '    "tests/test_sample.py": "needs the driver",\n', MODULE_SKIP
    )
    assert listed.returncode == 0, listed.stdout
