"""One e2e session per machine: the lock waits for a live holder and names it, a
killed holder's lock is free at once, and a killed session's releases and
finalized services are picked out of what the cluster lists."""

from __future__ import annotations

import contextlib
import importlib.util
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "e2e_leftovers", Path(__file__).resolve().parents[2] / "e2e" / "leftovers.py"
)
assert _spec and _spec.loader
leftovers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(leftovers)

HOLD = """
import fcntl, sys, time
handle = open(sys.argv[1], "a+")
fcntl.flock(handle, fcntl.LOCK_EX)
handle.seek(0); handle.truncate(); handle.write("pid holder: other session"); handle.flush()
print("held", flush=True)
time.sleep(60)
"""


@contextlib.contextmanager
def lock_held_elsewhere(path: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holding the lock until it is killed (or the block ends)."""
    with subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True
    ) as holder:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        try:
            yield holder
        finally:
            holder.kill()


def test_a_live_holder_is_waited_for_then_named(tmp_path: Path) -> None:
    lock = tmp_path / "lock"
    with lock_held_elsewhere(lock):
        with pytest.raises(leftovers.SessionBusy, match="pid holder: other session"):
            with leftovers.session_lock(lock, wait_seconds=0.2, say=lambda _: None):
                pytest.fail("entered while another session held the lock")


def test_a_killed_holder_leaves_the_lock_free(tmp_path: Path) -> None:
    lock = tmp_path / "lock"
    with lock_held_elsewhere(lock) as holder:
        holder.kill()
        holder.wait()
        started = time.monotonic()
        with leftovers.session_lock(lock, wait_seconds=30, say=pytest.fail):
            assert lock.read_text().startswith("pid ")
        assert time.monotonic() - started < leftovers.LOCK_POLL_SECONDS


def test_the_lock_is_waited_for_until_the_holder_ends(tmp_path: Path) -> None:
    lock = tmp_path / "lock"
    said: list[str] = []
    with lock_held_elsewhere(lock) as holder:
        threading.Timer(1, holder.kill).start()
        with leftovers.session_lock(lock, wait_seconds=30, say=said.append):
            assert holder.poll() is not None
    assert said == ["e2e: waiting for another session to end (pid holder: other session)"]


def test_releases_in_the_stale_namespaces_are_picked() -> None:
    releases = [
        {"name": "e2e-1a2b3c", "namespace": "fusebox-e2e-1a2b3c"},
        {"name": "fusebox", "namespace": "fusebox-system"},
        {"name": "standin-9f", "namespace": "standin-demo-9f"},
    ]
    stale = ["e2e-test-x-1", "fusebox-e2e-1a2b3c", "standin-demo-9f"]
    assert leftovers.releases_in(releases, stale) == [
        ("fusebox-e2e-1a2b3c", "e2e-1a2b3c"),
        ("standin-demo-9f", "standin-9f"),
    ]


def test_only_finalized_services_in_the_stale_namespaces_are_picked() -> None:
    def service(namespace: str, name: str, *finalizers: str) -> dict[str, object]:
        return {"metadata": {"namespace": namespace, "name": name, "finalizers": list(finalizers)}}

    listing = {
        "items": [
            service("e2e-a", "chat", "kopf.zalando.org/KopfFinalizerMarker"),
            service("e2e-a", "released"),
            service("fusebox-demo", "demo-chat", "kopf.zalando.org/KopfFinalizerMarker"),
        ]
    }
    assert leftovers.finalized_services(listing, ["e2e-a"]) == [("e2e-a", "chat")]
