"""The leak faults: one per kind of memory a different ladder step frees.

Why: a leak that only a reload can free (the `leak` fault: blocks held by
the loaded model) makes every ladder climb the same rungs, and nothing shows
that a cheaper step ever suffices. Real leaks differ in what holds the
memory, and so in the lowest step that gets it back:

- `leak_cycles:N`   N MiB of reference cycles per request. Automatic
  collection is off while it leaks, as in latency-tuned servers that turn
  it off or freeze the heap after loading: only an explicit collection (the
  `gc` step) frees them.
- `leak_allocator:N` N MiB per request freed by the program but kept by the
  allocator. On CUDA, torch's caching allocator keeps the freed blocks
  (reserved, not allocated) until `torch.cuda.empty_cache()`. On CPU, the
  glibc analogue: blocks freed in the middle of the heap, behind small live
  allocations, stay resident until `malloc_trim(0)`. Each request's blocks
  are a little larger than the last's, as ever-longer prompts are, so the
  allocator cannot reuse the holes. The `empty_cache` step does both.
- `leak_prompt_cache:N` a prompt cache whose bound the fault removed: every
  request adds an N MiB entry that is never evicted. The `empty_cache` step
  clears the server's caches, this one included.
- `leak_pinned:N` (CUDA only) N MiB of pinned host staging buffers per
  request, kept by a staging cache; freed pinned memory then stays in
  torch's pinned-host cache, so the `empty_cache` step drops the buffers and
  empties that cache. Pinned memory is host RSS, not GPU memory.
- `leak` (the engine's `leak_block`) blocks held by the loaded model: only
  unload+reload (or a swap) drops them.

Everything grows on the inference worker thread, at the start of each
generation; `figures()` says what each kind holds now, so an admin action
can report what it freed.
"""

from __future__ import annotations

import ctypes
import gc
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import torch

from fusebox_contract.names import Fault

MIB: Final = 1 << 20
ALLOCATOR_BLOCK_BYTES: Final = 32 * 1024
"""Below glibc's mmap threshold, so the blocks come from the heap, not from mmap."""
ALLOCATOR_GROWTH_BYTES: Final = 16
"""How much larger each request's blocks are than the last's (one malloc size class)."""
ALLOCATOR_KEEP_BYTES: Final = 16
"""What stays live of each block: the small allocation that pins the hole behind it."""
OLDEST_GENERATION: Final = 2
"""`gc.collect()` with no argument collects it: the explicit collection of the gc step."""
CUDA_GROWTH_BYTES: Final = 2 * MIB
"""torch rounds large allocations to 2 MiB: one step more per request defeats reuse."""


def _libc() -> Any:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc.restype = ctypes.c_void_p
        libc.malloc.argtypes = [ctypes.c_size_t]
        libc.realloc.restype = ctypes.c_void_p
        libc.realloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        return libc
    except (OSError, AttributeError):
        return None


LIBC: Final = _libc()


def malloc_trim() -> bool:
    """Return free heap pages to the OS (glibc, every arena); False where there is no glibc."""
    if LIBC is None:
        return False
    LIBC.malloc_trim(0)
    return True


class _CycleNode:
    """One half of a reference cycle; the payload is what the cycle keeps alive."""

    def __init__(self, payload: bytearray | None) -> None:
        self.payload = payload
        self.partner: _CycleNode | None = None


@dataclass
class ReferenceCycles:
    """Cyclic garbage that only an explicit `gc.collect()` frees.

    Automatic collection goes off with the first cycle and comes back only
    after the fault is off *and* an explicit full collection ran: switching
    the fault off must not let a young-generation pass take the garbage the
    gc step is there to free.
    """

    garbage_bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _collection_was_enabled: bool | None = None  # None: this leak has not turned it off
    _off: bool = True

    def grow(self, mib: int) -> None:
        if mib <= 0:
            self.stopped()
            return
        self._off = False
        if self._collection_was_enabled is None:
            self._collection_was_enabled = gc.isenabled()
            gc.disable()
            if self._after_collection not in gc.callbacks:
                gc.callbacks.append(self._after_collection)
        payload = bytearray(b"\x01") * (mib * MIB)  # written, so resident
        first, second = _CycleNode(payload), _CycleNode(None)
        first.partner, second.partner = second, first
        size = len(payload)
        with self._lock:
            self.garbage_bytes += size
        weakref.finalize(first, self._collected, size)
        # Both nodes go out of scope here: unreachable, but each holds the other.

    def _collected(self, size: int) -> None:
        with self._lock:
            self.garbage_bytes -= size

    def stopped(self) -> None:
        """The fault is off: the next explicit full collection gives automatic collection back."""
        self._off = True

    def _after_collection(self, phase: str, info: dict[str, int]) -> None:
        if phase != "stop" or info.get("generation") != OLDEST_GENERATION:
            return
        if not self._off or self._collection_was_enabled is None:
            return
        if self._collection_was_enabled:
            gc.enable()
        self._collection_was_enabled = None  # the callback stays, inert until the next time


@dataclass
class AllocatorHoles:
    """Memory freed by the program but kept by the allocator (see the module docstring)."""

    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    requests: int = 0
    freed_bytes: int = 0  # freed into the allocator since the last empty_cache
    _keepers: list[int] = field(default_factory=list)  # the small live allocations (CPU)

    @property
    def available(self) -> bool:
        return self.device.type == "cuda" or LIBC is not None

    def grow(self, mib: int) -> None:
        if mib <= 0 or not self.available:
            return
        self.requests += 1
        if self.device.type == "cuda":
            size = mib * MIB + self.requests * CUDA_GROWTH_BYTES
            block = torch.empty(size, dtype=torch.uint8, device=self.device)
            block.fill_(1)
            del block  # back to torch's cache, reserved but not allocated
            self.freed_bytes += size
            return
        size = ALLOCATOR_BLOCK_BYTES + self.requests * ALLOCATOR_GROWTH_BYTES
        blocks = []
        for _ in range(max(1, mib * MIB // size)):
            address = LIBC.malloc(size)
            if not address:
                break
            ctypes.memset(address, 1, size)
            blocks.append(address)
        # Shrink each in place once all exist: its tail is freed between the kept
        # heads, where neither the top of the heap nor a smaller block can take it.
        for address in blocks:
            self._keepers.append(LIBC.realloc(address, ALLOCATOR_KEEP_BYTES) or address)
        self.freed_bytes += len(blocks) * (size - ALLOCATOR_KEEP_BYTES)

    def cached_bytes(self) -> int:
        if self.device.type == "cuda" and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            reserved = torch.cuda.memory_reserved(self.device)
            return int(reserved - torch.cuda.memory_allocated(self.device))
        return self.freed_bytes

    def released(self) -> None:
        """Called after empty_cache and malloc_trim gave the pages back."""
        self.freed_bytes = 0


@dataclass
class PromptCache:
    """A prompt cache the fault left without a bound: one entry per request, never evicted."""

    entries: dict[int, bytearray] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def grow(self, mib: int) -> None:
        if mib <= 0:
            return
        entry = bytearray(b"\x02") * (mib * MIB)
        with self._lock:
            self.entries[len(self.entries)] = entry

    def held_bytes(self) -> int:
        with self._lock:
            return sum(len(entry) for entry in self.entries.values())

    def clear(self) -> None:
        with self._lock:
            self.entries = {}


@dataclass
class PinnedStaging:
    """Pinned host buffers kept by a staging cache (CUDA only)."""

    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    buffers: list[torch.Tensor] = field(default_factory=list)

    @property
    def available(self) -> bool:
        return self.device.type == "cuda" and torch.cuda.is_available()

    def grow(self, mib: int) -> None:
        if mib <= 0 or not self.available:
            return
        buffer = torch.empty(mib * MIB, dtype=torch.uint8, pin_memory=True)
        buffer.fill_(1)
        self.buffers.append(buffer)

    def held_bytes(self) -> int:
        return sum(int(b.numel()) for b in self.buffers)

    def clear(self) -> None:
        self.buffers = []
        if self.available:
            # Freed pinned blocks stay in torch's host cache until this.
            torch._C._host_emptyCache()


class Leaks:
    """The leak kinds of one server; `grow` runs on the worker for every generation."""

    def __init__(self) -> None:
        self.cycles = ReferenceCycles()
        self.allocator = AllocatorHoles()
        self.prompt_cache = PromptCache()
        self.pinned = PinnedStaging()

    def grow(self, values: Mapping[Fault, int], device: torch.device) -> None:
        self.allocator.device = self.pinned.device = device
        self.cycles.grow(values.get(Fault.LEAK_CYCLES, 0))
        self.allocator.grow(values.get(Fault.LEAK_ALLOCATOR, 0))
        self.prompt_cache.grow(values.get(Fault.LEAK_PROMPT_CACHE, 0))
        self.pinned.grow(values.get(Fault.LEAK_PINNED, 0))

    def changed(self, values: Mapping[Fault, int]) -> None:
        """An admin change: a cycles leak switched off hands collection back (see above)."""
        if values.get(Fault.LEAK_CYCLES, 0) <= 0:
            self.cycles.stopped()

    def release_caches(self) -> None:
        """The server-held caches the `empty_cache` step clears (before the allocators')."""
        self.prompt_cache.clear()
        self.pinned.clear()

    def allocators_emptied(self) -> None:
        self.allocator.released()

    def figures(self) -> dict[Fault, int | None]:
        """Bytes each kind holds now (None: this kind cannot run on this device)."""
        return {
            Fault.LEAK_CYCLES: self.cycles.garbage_bytes,
            Fault.LEAK_ALLOCATOR: self.allocator.cached_bytes()
            if self.allocator.available
            else None,
            Fault.LEAK_PROMPT_CACHE: self.prompt_cache.held_bytes(),
            Fault.LEAK_PINNED: self.pinned.held_bytes() if self.pinned.available else None,
        }
