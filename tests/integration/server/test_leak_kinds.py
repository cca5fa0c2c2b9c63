"""Each leak kind, grown by real requests, is freed by exactly its ladder step.

One server arms every CPU leak kind (off until a test switches one on). A
test grows one kind with a few requests, then runs the ladder's steps in
order through the admin API (gc, empty_cache, unload+load) and finds the
first whose own before/after RSS shows the leak gone: that is the lowest
step that cures the kind. The actions' per-kind figures must agree.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fusebox_server_harness import ServerProcess

MIB = 1 << 20
LEAK_MIB = 32
REQUESTS = 4
LEAKED = LEAK_MIB * REQUESTS * MIB
KINDS = "leak:0,leak_cycles:0,leak_allocator:0,leak_prompt_cache:0"


@pytest.fixture(scope="module")
def leaky(start_server: Any) -> Iterator[ServerProcess]:
    server = start_server(env={"FUSEBOX_FAULTS": KINDS})
    yield server
    server.stop()


def act(server: ServerProcess, type_: str, **extra: str) -> dict[str, Any]:
    response = server.admin.post(
        "/admin/v1/actions", json={"id": uuid.uuid4().hex, "type": type_, **extra}
    )
    assert response.status_code == 200, response.text
    return dict(response.json())


def freed_bytes(result: dict[str, Any]) -> int:
    return int(result["memory_before"]["rss_bytes"] - result["memory_after"]["rss_bytes"])


def grow(server: ServerProcess, fault: str) -> None:
    assert server.admin.put("/admin/v1/faults", json={fault: LEAK_MIB}).status_code == 200
    try:
        for _ in range(REQUESTS):
            assert server.chat("hi", max_tokens=1).status_code == 200
    finally:
        assert server.admin.put("/admin/v1/faults", json={fault: 0}).status_code == 200


def lowest_curing_step(server: ServerProcess) -> tuple[str, list[dict[str, Any]]]:
    """Run gc, empty_cache, then unload+load; the first that frees most of the leak."""
    results = []
    for step in ("gc", "empty_cache", "reload"):
        if step == "reload":
            unload = act(server, "unload")
            load = act(server, "load", variant="primary")
            result = {**load, "memory_before": unload["memory_before"]}
        else:
            result = act(server, step)
        results.append(result)
        if freed_bytes(result) >= 0.7 * LEAKED:
            return step, results
    return "none", results


@pytest.mark.parametrize(
    ("fault", "cure"),
    [
        ("leak_cycles", "gc"),
        ("leak_allocator", "empty_cache"),
        ("leak_prompt_cache", "empty_cache"),
        ("leak", "reload"),
    ],
)
def test_each_leak_kind_is_cured_by_its_lowest_ladder_step(
    leaky: ServerProcess, fault: str, cure: str
) -> None:
    act(leaky, "empty_cache")  # start from a trimmed heap
    loads = leaky.state()["model_loads"]
    grow(leaky, fault)

    step, results = lowest_curing_step(leaky)

    assert step == cure, [(r["type"], freed_bytes(r) // MIB) for r in results]
    for result in results[:-1]:
        assert freed_bytes(result) < 0.3 * LEAKED, f"{result['type']} freed part of the leak"
    if fault != "leak":
        held_before = results[0]["leaks_before"][fault]
        assert held_before >= 0.9 * LEAKED, results[0]["leaks_before"]
        assert results[-1]["leaks_after"][fault] < 0.1 * LEAKED, results[-1]["leaks_after"]
        assert leaky.state()["model_loads"] == loads
    else:
        assert leaky.state()["model_loads"] == loads + 1
