"""Builds into the shared cache take turns: a second build waits for the first.

Two checkouts on one machine (or `make demo` beside `make test`) used to
share one half-written `<key>.tmp` directory. Each builder now holds a lock
named after what it builds; these tests hold that lock and watch the real
script wait before it writes anything.
"""

from __future__ import annotations

import fcntl
import os
import selectors
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
WAIT_SECONDS = 20.0


@contextmanager
def held(lock: Path) -> Iterator[None]:
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _wait_for_line(process: subprocess.Popen[str], needle: str) -> str:
    """Stderr until a line holds `needle`, the process ends, or WAIT_SECONDS pass."""
    assert process.stderr is not None
    seen = ""
    deadline = time.monotonic() + WAIT_SECONDS
    with selectors.DefaultSelector() as selector:
        selector.register(process.stderr, selectors.EVENT_READ)
        while needle not in seen and time.monotonic() < deadline:
            if not selector.select(timeout=deadline - time.monotonic()):
                break
            chunk = os.read(process.stderr.fileno(), 4096).decode()
            if not chunk:
                break
            seen += chunk
    return seen


@pytest.mark.parametrize(
    ("script", "name", "written"),
    [
        ("scripts/setup-python.sh", "python", "venv-"),
        ("localcluster/build-binaries.sh", "binaries", "bin-"),
        ("localcluster/build-images.sh", "images", "podman/base.recipe"),
    ],
)
def test_a_build_waits_while_another_holds_its_cache_lock(
    tmp_path: Path, script: str, name: str, written: str
) -> None:
    cache = tmp_path / "cache"
    env = {**os.environ, "FUSEBOX_CACHE": str(cache)}
    with held(cache / f".{name}.lock"):
        with subprocess.Popen(
            ["bash", str(ROOT / script)],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        ) as process:
            try:
                said = _wait_for_line(process, "waiting for it to finish")
                assert f"{name}: another build holds {cache}/.{name}.lock" in said, said
                time.sleep(0.5)
                assert process.poll() is None, "the build went on while the lock was held"
                assert not list(cache.glob(f"{written}*")), "it wrote into the cache while waiting"
            finally:
                os.killpg(process.pid, 9)


def test_the_lock_is_free_again_when_the_build_exits(tmp_path: Path) -> None:
    lock = ROOT / "scripts" / "lib" / "cache-lock.sh"
    done = subprocess.run(
        ["bash", "-c", f'. "{lock}" && cache_lock "$1" python && echo held', "_", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=WAIT_SECONDS,
    )
    assert done.stdout.strip() == "held" and done.stderr == ""
    with open(tmp_path / ".python.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises if still held
