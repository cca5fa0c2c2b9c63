"""The control files through which localcluster steers a simulated-GPU component.

The device plugin (localcluster/gpusim) and the DRA driver
(localcluster/gpudra) each poll a directory of their own shaped the same way:
a `count` file with the number of GPUs, and an `unhealthy/` directory where a
file named after a GPU's index marks that GPU unhealthy. Both read it with
the Go package localcluster/gpuctl; this module is the writing side.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class ControlFiles:
    """One component's control directory; each component adds the files only it has."""

    directory: Path

    @property
    def count_file(self) -> Path:
        """The number of GPUs; absent: the cluster's configured count."""
        return self.directory / "count"

    @property
    def unhealthy_dir(self) -> Path:
        """A file named after a GPU's index marks that GPU unhealthy."""
        return self.directory / "unhealthy"

    def flags(self, default_count: int) -> list[str]:
        """The component's flags naming these files (gpuctl.Flags declares them), and the
        count it serves until the count file exists (a component restarted on its own
        finds the file `up` wrote)."""
        return [
            f"--count-file={self.count_file}",
            f"--gpus={default_count}",
            f"--unhealthy-dir={self.unhealthy_dir}",
        ]


def write_count(control: ControlFiles, gpus: int) -> None:
    """Set the GPU count, replacing the file atomically: the component never reads half of it."""
    _write_atomically(control.count_file, f"{gpus}\n")


def read_count(control: ControlFiles) -> int:
    """The count last written; 0 before any."""
    try:
        return int(control.count_file.read_text())
    except FileNotFoundError:
        return 0


def mark_health(control: ControlFiles, index: int, *, healthy: bool) -> None:
    """Add or remove GPU `index`'s unhealthy mark; doing either twice changes nothing."""
    flag = control.unhealthy_dir / str(index)
    if healthy:
        flag.unlink(missing_ok=True)
    else:
        control.unhealthy_dir.mkdir(parents=True, exist_ok=True)
        flag.touch()


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
