"""The prefix cache's own rules, on plain values: matching by blocks, LRU, the byte bound.

The values here are tuples of token ids standing in for keys and values (one
byte per token), so what a match hands back can be checked token by token.
"""

from __future__ import annotations

import pytest

from fusebox_server.model import prefix_cache
from fusebox_server.model.prefix_cache import BLOCK_TOKENS, PrefixCache

B = BLOCK_TOKENS


def _cache(capacity_bytes: int) -> PrefixCache[tuple[int, ...]]:
    return PrefixCache(capacity_bytes, len, lambda value, length: value[:length])


def _ids(start: int, count: int) -> tuple[int, ...]:
    return tuple(range(start, start + count))


SYSTEM = _ids(1000, 3 * B + 5)  # a shared system prompt, not block-aligned


def test_a_prompt_reuses_the_longest_block_aligned_prefix_it_shares() -> None:
    cache = _cache(10_000)
    first = SYSTEM + _ids(1, 40)
    cache.insert(first, first)
    second = SYSTEM + _ids(500, 30)
    found = cache.match(second)
    assert found is not None
    assert found.length == 3 * B  # the shared 3 blocks; the 5 tokens past them do not count
    assert found.value[: found.length] == second[: found.length]


def test_a_prompt_sharing_less_than_a_block_misses() -> None:
    cache = _cache(10_000)
    cache.insert(_ids(0, 4 * B), _ids(0, 4 * B))
    assert cache.match(_ids(0, B - 1) + _ids(900, 40)) is None
    assert cache.match(_ids(7, 4 * B)) is None


def test_a_lookup_is_not_counted_until_the_caller_counts_what_it_used() -> None:
    cache = _cache(10_000)
    cache.insert(SYSTEM + _ids(1, 40), SYSTEM + _ids(1, 40))
    assert cache.match(SYSTEM + _ids(500, 30)) is not None
    assert cache.match(_ids(7, 4 * B)) is None
    assert (cache.hits_total, cache.misses_total, cache.reused_tokens_total) == (0, 0, 0)
    cache.count(3 * B)
    cache.count(0)
    assert (cache.hits_total, cache.misses_total, cache.reused_tokens_total) == (1, 1, 3 * B)


def test_the_last_prompt_token_always_runs_even_when_the_whole_prompt_is_cached() -> None:
    cache = _cache(10_000)
    prompt = _ids(0, 3 * B)
    cache.insert(prompt, prompt)
    found = cache.match(prompt)
    assert found is not None
    assert found.length == 2 * B  # 3 blocks would leave nothing to compute the logits of


def test_a_partly_matched_entry_leaves_its_shared_part_as_an_entry_of_its_own() -> None:
    cache = _cache(10_000)
    first = SYSTEM + _ids(1, 40)
    cache.insert(first, first)
    cache.match(SYSTEM + _ids(500, 30))
    assert len(cache) == 2
    assert cache.bytes == len(first) // B * B + 3 * B
    # The long entry can go; the shared prefix stays and keeps matching.
    cache.insert(_ids(5000, 60), _ids(5000, 60))
    found = cache.match(SYSTEM + _ids(700, 20))
    assert found is not None and found.length == 3 * B


def test_the_least_recently_used_entry_is_evicted_first_and_the_bound_holds() -> None:
    cache = _cache(3 * 2 * B)  # three entries of two blocks
    prompts = [_ids(start, 2 * B) for start in (0, 100, 200)]
    for prompt in prompts:
        cache.insert(prompt, prompt)
    assert cache.match(prompts[0] + (1,)) is not None  # used: now the most recent
    cache.insert(_ids(300, 2 * B), _ids(300, 2 * B))
    assert cache.bytes <= cache.capacity_bytes
    assert cache.evictions_total == 1
    assert cache.match(prompts[1] + (1,)) is None  # the least recently used went
    assert cache.match(prompts[0] + (1,)) is not None
    assert cache.match(prompts[2] + (1,)) is not None


def test_an_entry_larger_than_the_bound_is_not_stored_and_evicts_nothing() -> None:
    cache = _cache(4 * B)
    small = _ids(0, 2 * B)
    cache.insert(small, small)
    cache.insert(_ids(100, 5 * B), _ids(100, 5 * B))
    assert len(cache) == 1 and cache.evictions_total == 0
    assert cache.match(small + (1,)) is not None


def test_a_prompt_cached_already_is_not_stored_twice() -> None:
    cache = _cache(10_000)
    prompt = _ids(0, 2 * B + 3)
    cache.insert(prompt, prompt)
    cache.insert(prompt, prompt)
    assert len(cache) == 1 and cache.bytes == 2 * B


def test_a_zero_bound_disables_the_cache() -> None:
    cache = _cache(0)
    prompt = _ids(0, 4 * B)
    cache.insert(prompt, prompt)
    assert not cache.enabled
    assert cache.match(prompt) is None
    assert (len(cache), cache.bytes, cache.misses_total) == (0, 0, 0)


def test_shedding_empties_the_cache_and_counts_each_entry_evicted() -> None:
    cache = _cache(10_000)
    for start in (0, 100):
        cache.insert(_ids(start, 2 * B), _ids(start, 2 * B))
    assert cache.shed() == 4 * B
    figures = cache.figures()
    assert (figures.entries, figures.bytes, figures.evictions_total) == (0, 0, 2)
    assert cache.match(_ids(0, 2 * B + 1)) is None


def test_a_hash_collision_is_a_miss_not_someone_elses_prefix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every block hashes alike: only the comparison of ids can tell the prompts apart.
    monkeypatch.setattr(prefix_cache, "block_hashes", lambda ids, blocks: [7] * blocks)
    cache = _cache(10_000)
    prompt = _ids(0, 2 * B)
    cache.insert(prompt, prompt)
    assert cache.match(_ids(50, 2 * B + 1)) is None
    assert cache.match(prompt + (1,)) is not None
