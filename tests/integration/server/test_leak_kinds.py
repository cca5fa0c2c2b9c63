"""Each leak kind, grown by real requests, is freed by exactly its ladder step.

One server arms every CPU leak kind (off until a test switches one on). A
test grows one kind with a few requests, then runs the ladder's steps in
order through the admin API (gc, empty_cache, unload+load) and finds the
first whose own before/after RSS shows the leak gone: that is the lowest
step that cures the kind. The actions' per-kind figures must agree.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from fusebox_server_harness import ServerProcess

from fusebox_contract.admin import ActionResult, ErrorAnswer, FaultsRequest, FaultsResult
from fusebox_contract.names import ActionType, Fault, Variant

MIB = 1 << 20
LEAK_MIB = 32
REQUESTS = 4
LEAKED = LEAK_MIB * REQUESTS * MIB
KINDS_ARMED = (Fault.LEAK_CYCLES, Fault.LEAK_ALLOCATOR, Fault.LEAK_PROMPT_CACHE)
KINDS = "leak:0," + ",".join(f"{kind}:0" for kind in KINDS_ARMED)


@pytest.fixture(scope="module")
def leaky(start_server: Any) -> Iterator[ServerProcess]:
    server = start_server(env={"FUSEBOX_FAULTS": KINDS})
    yield server
    server.stop()


def freed_bytes(result: ActionResult) -> int:
    before, after = result.memory_before.rss_bytes, result.memory_after.rss_bytes
    assert before is not None and after is not None
    return before - after


def grow(server: ServerProcess, fault: Fault) -> None:
    server.set_faults(**{fault: LEAK_MIB})
    try:
        for _ in range(REQUESTS):
            assert server.chat("hi", max_tokens=1).status_code == 200
    finally:
        server.set_faults(**{fault: 0})


def lowest_curing_step(server: ServerProcess) -> tuple[str, list[ActionResult]]:
    """Run gc, empty_cache, then unload+load; the first that frees most of the leak."""
    results = []
    for step in ("gc", "empty_cache", "reload"):
        if step == "reload":
            unload = server.act(ActionType.UNLOAD)
            load = server.act(ActionType.LOAD, Variant.PRIMARY)
            result = replace(load, memory_before=unload.memory_before)
        else:
            result = server.act(ActionType(step))
        results.append(result)
        if freed_bytes(result) >= 0.7 * LEAKED:
            return step, results
    return "none", results


@pytest.mark.parametrize(
    ("fault", "cure"),
    [
        (Fault.LEAK_CYCLES, "gc"),
        (Fault.LEAK_ALLOCATOR, "empty_cache"),
        (Fault.LEAK_PROMPT_CACHE, "empty_cache"),
        (Fault.LEAK, "reload"),
    ],
)
def test_each_leak_kind_is_cured_by_its_lowest_ladder_step(
    leaky: ServerProcess, fault: Fault, cure: str
) -> None:
    leaky.act(ActionType.EMPTY_CACHE)  # start from a trimmed heap
    loads = leaky.state().model_loads
    assert loads is not None
    grow(leaky, fault)

    step, results = lowest_curing_step(leaky)

    assert step == cure, [(r.type, freed_bytes(r) // MIB) for r in results]
    for result in results[:-1]:
        assert freed_bytes(result) < 0.3 * LEAKED, f"{result.type} freed part of the leak"
    if fault != Fault.LEAK:
        before, after = results[0].leaks_before, results[-1].leaks_after
        assert before is not None and after is not None
        assert (before[fault] or 0) >= 0.9 * LEAKED, before
        assert (after[fault] or 0) < 0.1 * LEAKED, after
        assert leaky.state().model_loads == loads
    else:
        assert leaky.state().model_loads == loads + 1


def test_faults_change_only_armed_kinds_and_refuse_unknown_ones_by_name(
    leaky: ServerProcess,
) -> None:
    answer = leaky.send(FaultsRequest({Fault.LEAK_CYCLES: 0}))
    assert answer.status_code == 200
    assert FaultsResult.parse(answer.json()).values == {
        fault: 0 for fault in (Fault.LEAK, *KINDS_ARMED)
    }
    not_armed = leaky.send(FaultsRequest({Fault.SLOW: 5}))
    assert not_armed.status_code == 403
    assert ErrorAnswer.parse(not_armed.json()).message == "fault 'slow' was not armed at start"
    unknown = leaky.admin.put(FaultsRequest.path, json={"leak_disk": 1})
    assert unknown.status_code == 400
    error = ErrorAnswer.parse(unknown.json())
    assert error.param == "leak_disk" and error.message.startswith("unknown fault 'leak_disk'")
    assert leaky.state().faults == {fault: 0 for fault in (Fault.LEAK, *KINDS_ARMED)}
