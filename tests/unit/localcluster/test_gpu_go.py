"""The simulated GPUs' Go modules pass their own tests, so `make test` runs them.

Offline: `make setup` (build-binaries.sh) has put their modules in the Go
module cache; gpuctl, which the other two require, has no dependencies.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

LOCALCLUSTER = Path(__file__).resolve().parents[3] / "localcluster"


@pytest.mark.parametrize("module", ["gpuctl", "gpusim", "gpudra"])
def test_the_go_modules_tests_pass(module: str) -> None:
    go = shutil.which("go")
    assert go is not None, "go is not installed: run `make setup`"
    env = {**os.environ, "GOPROXY": "off", "GOFLAGS": "-mod=readonly"}
    result = subprocess.run(
        [go, "test", "./..."],
        cwd=LOCALCLUSTER / module,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
