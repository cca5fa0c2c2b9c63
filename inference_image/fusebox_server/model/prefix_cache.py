"""A bounded cache of prompt prefixes: which cached state a new prompt can start from.

Why: 30% of realistic requests open with the same 1,000-token system prompt,
and prefilling it again for every one of them is most of their time to first
token. This module decides what is kept and what matches; it knows nothing of
torch (the values are opaque, `prefix_kv.py` makes and cuts them), so its
rules are tested on their own.

- Matching is by token ids, in blocks of `BLOCK_TOKENS`: a prompt reuses the
  longest cached prefix that ends on a block boundary and leaves at least one
  of its tokens to run (the last token's logits are what a prefill is for).
  Each entry is indexed by a chained hash of every block boundary it holds,
  so a lookup is one hash per block of the prompt, and the ids are compared
  before a match counts (a hash collision is a miss, never wrong state).
- An entry is a whole prompt's block-aligned prefix, stored when that prompt
  missed. When a prompt matches an entry only part of the way (the two share
  a system prompt and differ after it), the shared part becomes its own entry:
  that is the prefix the next requests will hit, and the long entries that
  hold it can be evicted without losing it.
- The bound is bytes (`capacity_bytes`, 0 disables): least recently used
  entries go first, and an entry larger than the bound is not stored. `clear`
  empties it (empty_cache, the memory guard's early shedding, unload, swap).

Used only on the inference thread; the counters are plain ints that the
stats thread may read at any time. A lookup is not a use: the worker counts
each request once (`count`), when it knows whether the cached state served.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

# Tokens per block. A prefix is reused in whole blocks: 16 wastes at most 15 tokens of a
# match (1.5% of a 1,000-token system prompt), costs one tuple hash per 16 tokens of a
# prompt, and is vLLM's default block size, so prefix-hit figures compare like for like.
BLOCK_TOKENS = 16

Value = TypeVar("Value")


@dataclass(frozen=True)
class PrefixCacheFigures:
    """What the stats file reports: counters since start, and the cache's size now."""

    hits_total: int
    misses_total: int
    evictions_total: int
    reused_tokens_total: int
    entries: int
    bytes: int
    capacity_bytes: int


@dataclass
class _Entry(Generic[Value]):
    key: int  # its place in the LRU order and the hash index
    ids: tuple[int, ...]
    value: Value
    size_bytes: int
    hashes: tuple[int, ...]  # the chained hash at each of its block boundaries


@dataclass(frozen=True)
class PrefixMatch(Generic[Value]):
    """A cached value whose first `length` tokens are the prompt's first `length`."""

    value: Value
    length: int


def block_hashes(ids: Sequence[int], blocks: int) -> list[int]:
    """The chained hash of each of the first `blocks` blocks of `ids`: hash k covers ids
    [0, (k + 1) * BLOCK_TOKENS)."""
    hashes: list[int] = []
    running = 0
    for block in range(blocks):
        running = hash((running, tuple(ids[block * BLOCK_TOKENS : (block + 1) * BLOCK_TOKENS])))
        hashes.append(running)
    return hashes


class PrefixCache(Generic[Value]):
    """Prompt prefixes and their values, bounded by bytes, least recently used out first.

    `size_bytes(value)` is what a value holds; `cut(value, length)` is a new,
    independent value of its first `length` tokens (it must not share storage
    with `value`, or an evicted entry's bytes would stay held).
    """

    def __init__(
        self,
        capacity_bytes: int,
        size_bytes: Callable[[Value], int],
        cut: Callable[[Value, int], Value],
    ) -> None:
        self.capacity_bytes = max(0, capacity_bytes)
        self._size_bytes = size_bytes
        self._cut = cut
        self._entries: OrderedDict[int, _Entry[Value]] = OrderedDict()  # oldest use first
        self._by_hash: dict[int, dict[int, _Entry[Value]]] = {}
        self._next_key = 0
        self.bytes = 0
        self.hits_total = 0
        self.misses_total = 0
        self.evictions_total = 0
        self.reused_tokens_total = 0

    @property
    def enabled(self) -> bool:
        return self.capacity_bytes > 0

    def __len__(self) -> int:
        return len(self._entries)

    def figures(self) -> PrefixCacheFigures:
        return PrefixCacheFigures(
            hits_total=self.hits_total,
            misses_total=self.misses_total,
            evictions_total=self.evictions_total,
            reused_tokens_total=self.reused_tokens_total,
            entries=len(self._entries),
            bytes=self.bytes,
            capacity_bytes=self.capacity_bytes,
        )

    def count(self, reused_tokens: int) -> None:
        """Count one prompt: a hit that started from `reused_tokens` cached tokens, or a
        miss (0)."""
        if reused_tokens:
            self.hits_total += 1
            self.reused_tokens_total += reused_tokens
        else:
            self.misses_total += 1

    def match(self, ids: Sequence[int]) -> PrefixMatch[Value] | None:
        """The longest cached prefix of `ids` that leaves at least one token to run (not
        counted: see `count`). None when nothing matches a whole block (or the cache is off)."""
        if not self.enabled:
            return None
        blocks = (len(ids) - 1) // BLOCK_TOKENS
        hashes = block_hashes(ids, blocks)
        for block in range(blocks - 1, -1, -1):
            length = (block + 1) * BLOCK_TOKENS
            candidates = [
                entry
                for entry in self._by_hash.get(hashes[block], {}).values()
                if entry.ids[:length] == tuple(ids[:length])
            ]
            if not candidates:
                continue
            entry = min(candidates, key=lambda candidate: len(candidate.ids))
            self._touch(entry)
            if length < len(entry.ids):
                self._keep_shared(entry, length)
            return PrefixMatch(entry.value, length)
        return None

    def insert(self, ids: Sequence[int], value: Value) -> None:
        """Keep the block-aligned prefix of a prompt that `value` holds the state of.

        Nothing is stored when the prompt is shorter than a block, when its
        prefix is cached already, or when it alone would not fit the bound.
        """
        length = len(ids) // BLOCK_TOKENS * BLOCK_TOKENS
        if not self.enabled or length == 0:
            return
        prefix = tuple(ids[:length])
        existing = self._exact(prefix)
        if existing is not None:
            self._touch(existing)
            return
        self._add(prefix, self._cut(value, length))

    def clear(self) -> int:
        """Drop every entry; returns the bytes they held."""
        freed = self.bytes
        self._entries.clear()
        self._by_hash.clear()
        self.bytes = 0
        return freed

    def shed(self) -> int:
        """Evict every entry because memory runs short; returns the bytes freed."""
        self.evictions_total += len(self._entries)
        return self.clear()

    # ----- internals -----
    def _exact(self, prefix: tuple[int, ...]) -> _Entry[Value] | None:
        blocks = len(prefix) // BLOCK_TOKENS
        last = block_hashes(prefix, blocks)[-1]
        for entry in self._by_hash.get(last, {}).values():
            if entry.ids == prefix:
                return entry
        return None

    def _keep_shared(self, entry: _Entry[Value], length: int) -> None:
        """The first `length` tokens of `entry`, matched by another prompt, as their own entry."""
        prefix = entry.ids[:length]
        if self._exact(prefix) is None:
            self._add(prefix, self._cut(entry.value, length))

    def _add(self, prefix: tuple[int, ...], value: Value) -> None:
        size = self._size_bytes(value)
        if size > self.capacity_bytes:
            return
        while self._entries and self.bytes + size > self.capacity_bytes:
            _, oldest = self._entries.popitem(last=False)
            self._unindex(oldest)
            self.evictions_total += 1
        hashes = tuple(block_hashes(prefix, len(prefix) // BLOCK_TOKENS))
        key = self._next_key
        self._next_key += 1
        entry = _Entry(key, prefix, value, size, hashes)
        self._entries[key] = entry
        for block_hash in hashes:
            self._by_hash.setdefault(block_hash, {})[key] = entry
        self.bytes += size

    def _unindex(self, entry: _Entry[Value]) -> None:
        self.bytes -= entry.size_bytes
        for block_hash in entry.hashes:
            holders = self._by_hash.get(block_hash)
            if holders is None:
                continue
            holders.pop(entry.key, None)
            if not holders:
                del self._by_hash[block_hash]

    def _touch(self, entry: _Entry[Value]) -> None:
        self._entries.move_to_end(entry.key)
