"""The prompt encoder's bounded cache and pre-encoded templates, and streaming detokenization."""

from __future__ import annotations

import gc
import random
import string
from typing import Any

from fusebox_server.http.openai_schema import ChatMessage
from fusebox_server.model.memory import rss_bytes
from fusebox_server.model.tokenization import IncrementalDecoder, PromptEncoder

MIB = 1 << 20


_RNG = random.Random(7)
_WORDS = ["".join(_RNG.choices(string.ascii_lowercase, k=_RNG.randint(2, 9))) for _ in range(1000)]


def _prompt(index: int) -> str:
    # About 500 characters, so an uncapped cache of 20,000 would hold well over 100 MiB.
    start = (index * 7) % 900
    return f"{index} " + " ".join(_WORDS[start : start + 80])


def test_twenty_thousand_unique_prompts_never_exceed_the_cache_size(tiny_tokenizer: Any) -> None:
    encoder = PromptEncoder(tiny_tokenizer, cache_size=1000)
    for index in range(200):  # warm-up: allocator arenas, tokenizer buffers
        encoder.encode(_prompt(-index - 1), True)
    gc.collect()
    rss_before = rss_bytes()
    assert rss_before is not None
    for index in range(20_000):
        encoder.encode(_prompt(index), True)
        assert encoder.cache_entries <= 1000
    gc.collect()
    rss_after = rss_bytes()
    assert rss_after is not None
    assert encoder.cache_entries == 1000
    # 1,000 entries of ~150 ids are ~6 MiB of tuples and ints; 32 MiB leaves room for
    # allocator noise and is far below the >100 MiB that 20,000 cached entries would take.
    assert rss_after - rss_before < 32 * MIB


def test_a_zero_cache_size_caches_nothing(tiny_tokenizer: Any) -> None:
    encoder = PromptEncoder(tiny_tokenizer, cache_size=0)
    first = encoder.encode("hello there", True)
    assert encoder.encode("hello there", True) == first
    assert encoder.cache_entries == 0 and encoder.cache_hits_total == 0


def test_repeated_prompts_hit_the_cache_with_the_same_ids(tiny_tokenizer: Any) -> None:
    encoder = PromptEncoder(tiny_tokenizer, cache_size=10)
    first = encoder.encode("hello there", True)
    assert encoder.encode("hello there", True) == first
    assert encoder.cache_hits_total == 1


def test_templates_are_pre_encoded_and_counted_in_both_forms(tiny_tokenizer: Any) -> None:
    encoder = PromptEncoder(tiny_tokenizer, cache_size=10, templates=["你好", "Hello, world."])
    chat_text = encoder.render_chat((ChatMessage(role="user", content="你好"),))
    ids = encoder.encode(chat_text, False)
    assert ids == encoder.encode_uncached(chat_text, False)
    assert encoder.encode("Hello, world.", True) == encoder.encode_uncached("Hello, world.", True)
    assert encoder.template_hits_total == 2
    assert encoder.cache_entries == 0  # templates live outside the LRU


def test_incremental_decoding_reassembles_mixed_text(tiny_tokenizer: Any) -> None:
    text = "平台团队为许多产品组运行语言模型 and the server loads the model once."
    ids = tiny_tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids
    decoder = IncrementalDecoder(tiny_tokenizer)
    pieces = [decoder.push(token_id) for token_id in ids] + [decoder.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in piece for piece in pieces)
    assert sum(1 for piece in pieces if piece) > 5


def test_a_text_cut_to_a_token_limit_keeps_whole_characters_and_counts_them(
    tiny_tokenizer: Any,
) -> None:
    encoder = PromptEncoder(tiny_tokenizer, cache_size=0)
    text = "Hello 世界, a stored answer: 你好吗? ünïcödé"
    whole = len(encoder.encode_uncached(text, False))
    assert encoder.cut_to_tokens(text, whole) == (text, whole)  # within the limit: untouched
    assert encoder.cut_to_tokens(text, whole + 5) == (text, whole)
    previous = ""
    for limit in range(whole):
        cut, count = encoder.cut_to_tokens(text, limit)
        assert text.startswith(cut) and len(cut) < len(text)
        assert "\ufffd" not in cut  # never half a character
        assert count == len(encoder.encode_uncached(cut, False)) <= limit
        assert count >= limit - 4 and len(cut) >= len(previous)  # only a character's tokens
        previous = cut
    assert encoder.cut_to_tokens(text, 0) == ("", 0)
