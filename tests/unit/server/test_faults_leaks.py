"""Each leak kind holds memory that exactly one ladder step gives back, measured as RSS.

Every test grows a kind in this process, then applies the steps in ladder
order and reads `/proc/self/statm`: the steps below the cure leave RSS up,
the cure brings it down. The sizes (64 MiB and up) dwarf what pytest
allocates meanwhile.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from fusebox_contract.names import Fault, Quantization
from fusebox_server.model.engine import LoadedModel
from fusebox_server.model.faults import Faults, parse_faults
from fusebox_server.model.leaks import Leaks, malloc_trim
from fusebox_server.model.memory import rss_bytes

MIB = 1 << 20
CPU = torch.device("cpu")


def rss() -> int:
    value = rss_bytes()
    assert value is not None
    return value


@pytest.fixture
def leaks() -> Iterator[Leaks]:
    leaks = Leaks()
    yield leaks
    leaks.changed({})  # automatic collection back on, whatever a test did
    leaks.release_caches()
    gc.collect()


def test_every_leak_kind_is_a_fault_name_the_server_accepts() -> None:
    spec = "leak:1,leak_cycles:2,leak_allocator:3,leak_prompt_cache:4,leak_pinned:5"
    assert parse_faults(spec) == {
        Fault.LEAK: 1,
        Fault.LEAK_CYCLES: 2,
        Fault.LEAK_ALLOCATOR: 3,
        Fault.LEAK_PROMPT_CACHE: 4,
        Fault.LEAK_PINNED: 5,
    }


def test_reference_cycles_survive_automatic_collection_and_gc_frees_them(leaks: Leaks) -> None:
    assert gc.isenabled()
    before = rss()
    for _ in range(4):
        leaks.grow({Fault.LEAK_CYCLES: 32}, CPU)
        [[] for _ in range(5000)]  # enough allocations to trigger automatic collection
    assert not gc.isenabled()
    assert leaks.figures()[Fault.LEAK_CYCLES] == 128 * MIB
    grown = rss()
    assert grown >= before + 120 * MIB

    gc.collect()

    assert leaks.figures()[Fault.LEAK_CYCLES] == 0
    assert rss() <= grown - 120 * MIB


def test_switching_the_cycles_leak_off_keeps_the_garbage_for_the_gc_step(leaks: Leaks) -> None:
    leaks.grow({Fault.LEAK_CYCLES: 8}, CPU)
    leaks.changed({Fault.LEAK_CYCLES: 0})
    [[] for _ in range(5000)]  # would trigger automatic collection, were it on
    assert leaks.figures()[Fault.LEAK_CYCLES] == 8 * MIB
    assert not gc.isenabled()

    gc.collect()

    assert leaks.figures()[Fault.LEAK_CYCLES] == 0
    assert gc.isenabled()


def test_allocator_holes_stay_resident_through_gc_and_malloc_trim_returns_them(
    leaks: Leaks,
) -> None:
    # Free heap left by earlier tests in this process (a decode batch's buffers) would
    # take the blocks without faulting new pages in; trimmed, reusing it grows RSS too.
    malloc_trim()
    before = rss()
    for _ in range(4):
        leaks.grow({Fault.LEAK_ALLOCATOR: 32}, CPU)
    held = leaks.figures()[Fault.LEAK_ALLOCATOR]
    assert held is not None and held >= 120 * MIB
    grown = rss()
    assert grown >= before + 120 * MIB, "freed blocks were reused or returned: no leak"

    gc.collect()
    assert rss() >= grown - 16 * MIB, "gc freed allocator-held memory"

    assert malloc_trim()
    assert rss() <= grown - 96 * MIB, "malloc_trim(0) did not give the freed heap pages back"


def test_the_prompt_cache_outlives_gc_and_release_caches_clears_it(leaks: Leaks) -> None:
    before = rss()
    for _ in range(4):
        leaks.grow({Fault.LEAK_PROMPT_CACHE: 32}, CPU)
    assert leaks.figures()[Fault.LEAK_PROMPT_CACHE] == 128 * MIB
    grown = rss()
    assert grown >= before + 120 * MIB

    gc.collect()
    assert rss() >= grown - 16 * MIB

    leaks.release_caches()
    assert leaks.figures()[Fault.LEAK_PROMPT_CACHE] == 0
    assert rss() <= grown - 120 * MIB


def test_pinned_creep_needs_a_cuda_device_and_says_so_on_cpu(leaks: Leaks) -> None:
    leaks.grow({Fault.LEAK_PINNED: 64}, CPU)
    assert leaks.figures()[Fault.LEAK_PINNED] is None


def test_faults_grow_every_armed_kind_and_the_model_kind_hangs_off_the_model(
    tmp_path: Path,
) -> None:
    faults = Faults(parse_faults("leak:2,leak_prompt_cache:3,slow:0"))
    loaded = LoadedModel(
        variant="primary",
        model_dir=tmp_path,
        model=None,
        device=CPU,
        eos_token_ids=frozenset(),
        parameter_bytes=0,
        quantization=Quantization.NONE,
        dtype="float32",
    )
    faults.grow_leaks(loaded)
    faults.grow_leaks(loaded)
    assert sum(t.numel() * t.element_size() for t in loaded.leaked) == 4 * MIB
    assert faults.leaks.figures()[Fault.LEAK_PROMPT_CACHE] == 6 * MIB
    faults.update({"leak": 0, "leak_prompt_cache": 0})
    faults.grow_leaks(loaded)
    assert len(loaded.leaked) == 2
    faults.leaks.release_caches()
