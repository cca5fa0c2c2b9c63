"""The local memory guard inside a real memory cgroup, and the wedge fault.

The server starts inside a memory cgroup (v1 or v2) limited to 1.5 GiB, with
the leak fault holding 32 MiB per request: it must refuse new requests with
503 before the kernel's OOM killer acts, and stay alive. The wedge test
runs last because a wedged loop cannot be unwedged.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from fusebox_server_harness import ServerProcess

from fusebox_contract.admin import FaultsRequest
from fusebox_contract.names import (
    ActionType,
    Fault,
    Variant,
)
from fusebox_server.config import ServerConfig
from fusebox_server.control.guard import HYSTERESIS

CGROUP_ROOT = Path("/sys/fs/cgroup")
LIMIT_BYTES = 1536 << 20
MIB = 1 << 20


@dataclass(frozen=True)
class MemoryCgroup:
    """A memory cgroup made for one test module, on cgroup v1 or v2 alike."""

    path: Path
    version: int

    @classmethod
    def create(cls, limit_bytes: int) -> MemoryCgroup:
        name = f"fusebox-test-{uuid.uuid4().hex[:12]}"
        if os.geteuid() != 0:
            pytest.fail("the memory-guard tests need root to create a memory cgroup")
        if (CGROUP_ROOT / "memory" / "cgroup.procs").exists():
            path = CGROUP_ROOT / "memory" / name
            path.mkdir()
            (path / "memory.limit_in_bytes").write_text(str(limit_bytes))
            return cls(path, 1)
        if "memory" in (CGROUP_ROOT / "cgroup.controllers").read_text().split():
            # v2: a child of the root gets the memory controller once the root
            # delegates it (a no-op when it already does).
            (CGROUP_ROOT / "cgroup.subtree_control").write_text("+memory")
            path = CGROUP_ROOT / name
            path.mkdir()
            (path / "memory.max").write_text(str(limit_bytes))
            (path / "memory.swap.max").write_text("0")
            return cls(path, 2)
        pytest.fail("no memory cgroup controller on this machine (neither v1 nor v2)")

    @property
    def procs(self) -> Path:
        return self.path / "cgroup.procs"

    def oom_kills(self) -> int:
        """OOM kills inside this cgroup, as the kernel counts them."""
        events = self.path / ("memory.oom_control" if self.version == 1 else "memory.events")
        for line in events.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0  # kernels before 4.13 (v1) do not count kills

    def remove(self) -> None:
        for _ in range(100):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)  # the killed server's pages are still being uncharged
        self.path.rmdir()


@pytest.fixture(scope="module")
def cgroup() -> Iterator[MemoryCgroup]:
    made = MemoryCgroup.create(LIMIT_BYTES)
    yield made
    made.remove()


@pytest.fixture(scope="module")
def guarded(start_server: object, cgroup: MemoryCgroup) -> Iterator[ServerProcess]:
    procs = str(cgroup.procs)

    def join_cgroup() -> None:  # runs in the child before exec: all its memory is charged
        with open(procs, "w") as handle:
            handle.write(str(os.getpid()))

    server: ServerProcess = start_server(  # type: ignore[operator]
        flags={"heartbeat-timeout": 3},
        env={"FUSEBOX_FAULTS": "leak:32,wedge"},
        preexec=join_cgroup,
    )
    yield server
    server.stop(graceful=False)  # the wedge test leaves a loop that cannot handle SIGTERM


def test_memory_guard_refuses_before_the_oom_killer(
    guarded: ServerProcess, cgroup: MemoryCgroup
) -> None:
    assert str(guarded.pid) in cgroup.procs.read_text().split()
    assert guarded.stats()["cgroup_memory_limit_bytes"] == LIMIT_BYTES
    statuses: list[int] = []
    refusal = None
    for _ in range(60):
        response = guarded.chat("hi", max_tokens=1)
        statuses.append(response.status_code)
        if response.status_code != 200:
            refusal = response
            break
    assert refusal is not None, f"never refused after {len(statuses)} leaking requests"
    assert refusal.status_code == 503
    assert refusal.json()["error"]["code"] == "memory_pressure"
    assert int(refusal.headers["retry-after"]) > 0
    assert statuses.count(200) >= 5
    assert guarded.process.poll() is None
    assert cgroup.oom_kills() == 0
    stats = guarded.wait_for(
        lambda: (lambda s: s if s["state"]["memory_guard_active"] else None)(guarded.stats()),
        what="memory_guard_active in the stats file",
    )
    # The kernel enforces the cgroup's charge, not RSS: RSS also counts shared library
    # pages charged to whichever cgroup read them first, and once passed the limit
    # (1.632 GB against 1.611) with no OOM kill. The guard acted on real pressure:
    # its own figure at least the release level (the default ratio less the hysteresis).
    assert stats["cgroup_memory_usage_bytes"] < LIMIT_BYTES
    pressure = max(stats["rss_bytes"], stats["cgroup_memory_usage_bytes"]) / LIMIT_BYTES
    assert pressure >= ServerConfig.memory_guard_ratio - HYSTERESIS, stats
    assert guarded.client.get("/healthz").status_code == 200

    # The operator's ladder recovers: unload drops the leaked blocks, the guard releases.
    guarded.send(FaultsRequest({Fault.LEAK: 0})).raise_for_status()
    unload = guarded.act(ActionType.UNLOAD)
    freed = (unload.memory_before.rss_bytes or 0) - (unload.memory_after.rss_bytes or 0)
    assert freed > 128 * MIB
    guarded.act(ActionType.LOAD, Variant.PRIMARY)
    guarded.wait_for(
        lambda: not guarded.stats()["state"]["memory_guard_active"], what="the guard to release"
    )
    assert guarded.chat("hi", max_tokens=1).status_code == 200
    assert guarded.process.poll() is None


def test_wedged_event_loop_fails_healthz_while_the_process_lives(
    guarded: ServerProcess,
) -> None:
    assert guarded.client.get("/healthz").status_code == 200
    response = guarded.send(FaultsRequest({Fault.WEDGE: 1}))
    assert response.status_code == 200

    def healthz_fails() -> bool:
        try:
            return guarded.client.get("/healthz", timeout=1).status_code != 200
        except httpx.TimeoutException:
            return True

    guarded.wait_for(healthz_fails, what="/healthz to fail")
    for _ in range(3):
        assert healthz_fails()
    assert guarded.process.poll() is None
    # The stats thread still writes, and its loop heartbeat shows which part is stuck.
    stats = guarded.wait_for(
        lambda: (lambda s: s if s["written_at"] - s["heartbeats"]["loop"] > 3 else None)(
            json.loads(guarded.stats_file.read_text())
        ),
        what="a stale loop heartbeat in a fresh stats file",
    )
    assert stats["written_at"] - stats["heartbeats"]["worker"] < 3
