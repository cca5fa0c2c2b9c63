"""A Python process started with one of the fleet bench's probes (bench/fleet/*_probe,
each a `sitecustomize`) on its path, for the probes' tests: it runs `script`, which
prints "ready" once it holds what the test looks for; killed on leaving."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def probed_process(
    script: str, probe: Path, env: dict[str, str]
) -> Iterator[subprocess.Popen[str]]:
    with subprocess.Popen(
        [sys.executable, "-c", script],
        env={**os.environ, "PYTHONPATH": str(probe), **env},
        stdout=subprocess.PIPE,
        text=True,
    ) as process:
        try:
            assert process.stdout is not None and process.stdout.readline().strip() == "ready"
            yield process
        finally:
            process.kill()
