"""One e2e session per machine, and what a killed session leaves behind.

The suite's operator release watches every `e2e-*` namespace. Two sessions on one
cluster would each reconcile the other's services: two operators acting on one
breaker, restoring their own NetworkPolicies over each other's, posting every
event twice. A session killed mid-run (its process gone) leaves exactly that
behind: its Helm release still running, its namespaces and pods still holding
the node's CPU, since `localcluster` keeps running without the process that
started it.

So a session first takes an exclusive lock on this machine (`flock`: the kernel
releases it when the holder dies, however it dies). It waits for a live holder,
naming it, and gives up after a bound. Holding the lock, whatever lies in the
suite's namespaces (`capacity.is_suite_namespace`) is nobody's and is removed
before the first install.

The selection is pure, so the unit tier checks it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

LOCK_PATH = Path(tempfile.gettempdir()) / "fusebox-e2e-session.lock"
LOCK_WAIT_SECONDS = 20 * 60
LOCK_POLL_SECONDS = 5


class SessionBusy(Exception):
    """Another live e2e session held the lock past the wait."""


@contextlib.contextmanager
def session_lock(
    path: Path = LOCK_PATH,
    wait_seconds: float = LOCK_WAIT_SECONDS,
    say: Callable[[str], None] = lambda line: print(line, file=sys.stderr),
) -> Iterator[None]:
    """Hold the machine's e2e lock for the block; wait for a live holder, naming it."""
    with open(path, "a+") as handle:
        deadline = time.monotonic() + wait_seconds
        announced = False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = _holder(path)
                if time.monotonic() >= deadline:
                    raise SessionBusy(
                        f"another e2e session ({holder}) still held this machine's cluster "
                        f"after a {wait_seconds:.0f} s wait; two sessions would reconcile "
                        "each other's services. Stop it, or wait for it to end"
                    ) from None
                if not announced:
                    say(f"e2e: waiting for another session to end ({holder})")
                    announced = True
                time.sleep(LOCK_POLL_SECONDS)
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}: {' '.join(sys.argv)}\n")
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _holder(path: Path) -> str:
    try:
        return path.read_text().strip() or "pid unknown"
    except OSError:
        return "pid unknown"


def releases_in(
    releases: Iterable[Mapping[str, Any]], namespaces: Iterable[str]
) -> list[tuple[str, str]]:
    """(namespace, release) for each Helm release (`helm list -A -o json`) living in
    one of `namespaces`: uninstalled first, since their ClusterRoles and bindings
    outlive the namespace."""
    wanted = set(namespaces)
    return sorted(
        (str(release["namespace"]), str(release["name"]))
        for release in releases
        if release.get("namespace") in wanted
    )


def finalized_services(
    listing: Mapping[str, Any], namespaces: Iterable[str]
) -> list[tuple[str, str]]:
    """(namespace, name) of each InferenceService in `namespaces` still holding a
    finalizer (from `kubectl get inferenceservices -A -o json`): with its operator gone
    or going, nobody would release it and the namespace would stay Terminating."""
    wanted = set(namespaces)
    return sorted(
        (item["metadata"]["namespace"], item["metadata"]["name"])
        for item in listing.get("items", [])
        if item["metadata"]["namespace"] in wanted and item["metadata"].get("finalizers")
    )
