"""The one way this package talks to the API server: the kubectl it built.

Shelling out keeps localcluster free of third-party packages (it runs before
the Python environment exists) and exercises the same client users run.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from localcluster.processes import daemon_environment


class KubectlError(RuntimeError):
    """kubectl exited non-zero; the message carries its stderr."""


class Kubectl:
    def __init__(self, binary: Path, kubeconfig: Path) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig

    def run(
        self,
        *args: str,
        input_text: str | None = None,
        check: bool = True,
        timeout_seconds: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        try:
            result = subprocess.run(
                [
                    str(self.binary),
                    f"--kubeconfig={self.kubeconfig}",
                    "--request-timeout=20s",
                    *args,
                ],
                input=input_text,
                env=daemon_environment(os.environ),
                capture_output=True,
                text=True,
                check=False,
                timeout=timeout_seconds,
            )
        except subprocess.TimeoutExpired as err:
            raise KubectlError(
                f"kubectl {' '.join(args)}: timed out after {timeout_seconds} s"
            ) from err
        if check and result.returncode != 0:
            raise KubectlError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result

    def get_json(self, *args: str) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.run("get", *args, "-o", "json").stdout)
        return result

    def apply(self, manifest: str) -> None:
        self.run("apply", "-f", "-", input_text=manifest)
