"""The cluster registry's integration tests: the real distribution registry, podman,
helm and containerd on loopback, in a work directory of their own."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from registry_harness import unmount_under  # noqa: E402


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    # Under /tmp with short names: podman refuses a runroot longer than 50 characters.
    path = Path(tempfile.mkdtemp(prefix="fbx-reg-", dir="/tmp"))
    yield path
    unmount_under(path)
    shutil.rmtree(path, ignore_errors=True)
