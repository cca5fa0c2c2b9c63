"""FUSEBOX_KUBECONFIG points the e2e tier at an existing cluster instead of starting one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[2]


def test_fusebox_kubeconfig_makes_the_e2e_tier_use_that_cluster(
    cluster: Any, tmp_path: Path
) -> None:
    kubeconfig = tmp_path / "elsewhere.kubeconfig"
    shutil.copyfile(cluster.kubeconfig, kubeconfig)
    node = cluster.kubectl("get", "nodes", "-o", "jsonpath={.items[0].metadata.name}").stdout
    env = {
        **os.environ,
        "FUSEBOX_KUBECONFIG": str(kubeconfig),
        "PROBE_EXPECTED_NODE": node,
        # Were the fixture to ignore FUSEBOX_KUBECONFIG, it would find no
        # localcluster here and start one, which collides with the running
        # cluster's namespace and fails the child run.
        "FUSEBOX_LOCALCLUSTER_DIR": str(tmp_path / "no-cluster-here"),
    }
    child = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(HERE / "probe_external_cluster.py"),
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert child.returncode == 0, child.stdout + child.stderr
    assert "1 passed" in child.stdout
    assert not (tmp_path / "no-cluster-here").exists()
