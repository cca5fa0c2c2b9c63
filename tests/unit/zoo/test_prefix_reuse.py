"""Per family, in float32 on the CPU: a prompt that starts from the prefix cache decodes the
same greedy tokens as the same prompt prefilled whole.

Two prompts share a long system prompt (more than one cache block) and differ
after it, as the realistic workload's do. The first is prefilled whole and its
prompt cached; the second matches the shared part, runs only its own rest, and
must then decode exactly what it decodes with no cache at all, through both
decode batches (`DecodeBatch`, and the slot batch the CUDA graphs replay, run
eagerly). Llama 3's shape (GQA, 128k vocabulary) and four other families.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from fusebox_server.model.engine import Decoding, LoadedModel, load_model
from fusebox_server.model.prefix_cache import BLOCK_TOKENS
from fusebox_server.model.prefix_kv import leading, new_prefix_cache, prompt_kv
from fusebox_server.zoo.release import ensure_zoo_model

from ..greedy_decoding import BATCHES, GREEDY, chat_prompts, decode_greedily

SYSTEM = (
    "You are a careful assistant for a platform team. Answer in short sentences, cite the "
    "runbook section you rely on, and say when you do not know. 你好，请用中文或英文回答。 "
    "def handler(event): return event['body']"
)
QUESTIONS = ("How do I drain a node safely?", "Why did my pod get OOMKilled at night?")
FAMILIES = ("llama3", "qwen2.5", "mistral", "gemma2", "phi3")


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest) -> tuple[str, LoadedModel, list[tuple[int, ...]]]:
    from transformers import AutoTokenizer

    directory = ensure_zoo_model(request.param)
    tokenizer: Any = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    prompts = chat_prompts(tokenizer, SYSTEM, QUESTIONS)
    loaded = load_model("primary", directory, "none", torch.device("cpu"), tokenizer)
    return request.param, loaded, prompts


@pytest.mark.parametrize("batch_kind", sorted(BATCHES))
def test_a_prefix_cache_hit_decodes_the_tokens_of_a_whole_prefill(
    family: tuple[str, LoadedModel, list[tuple[int, ...]]], batch_kind: str
) -> None:
    name, loaded, (first, second) = family
    make_batch = BATCHES[batch_kind]
    whole = decode_greedily(make_batch(loaded), Decoding(loaded, second, GREEDY))

    cache = new_prefix_cache(1 << 30)
    assert cache.match(first) is None
    earlier = Decoding(loaded, first, GREEDY)
    earlier.step()
    cache.insert(first, prompt_kv(earlier))
    found = cache.match(second)
    assert found is not None, name
    assert found.length >= 2 * BLOCK_TOKENS
    reusing = Decoding(loaded, second, GREEDY)
    reusing.start_from_prefix(leading(found.value, found.length))
    assert len(reusing.pending_prompt()) == len(second) - found.length  # only the rest runs

    assert decode_greedily(make_batch(loaded), reusing) == whole, f"{name} through {batch_kind}"
