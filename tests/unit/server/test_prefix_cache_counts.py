"""The prefix-cache counters measure what docs/metrics.md says: per request, a hit when its
prefill started from cached keys and values (a lookup whose copy failed is a miss), and
reused tokens that are a share of `fusebox_prompt_tokens_total`, so at most all of it.

A whole Runtime on the tiny model, its API driven through httpx in process.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from fusebox_server.config import ServerConfig
from fusebox_server.control.runtime import Runtime
from fusebox_server.http.app import COMPLETIONS_PATH, build_api_app
from fusebox_server.model.engine import Decoding
from fusebox_server.model.prefix_cache import BLOCK_TOKENS, PrefixCacheFigures

from .runtime_runs import run_with_runtime

PROMPT = " ".join(f"word{index}" for index in range(40))  # more than two blocks of tokens


def _requests(
    tiny_model_dir: Path, choices: list[int], after_first: Callable[[], None] = lambda: None
) -> tuple[list[int], PrefixCacheFigures, int]:
    """Send the same prompt once per entry of `choices` (its `n`), the cache on, calling
    `after_first` after the first. The requests' prompt tokens as usage reports them, the
    cache's counters, and the runtime's prompt-token total."""
    config = ServerConfig(model_dir=tiny_model_dir, torch_threads=1)

    async def scenario(runtime: Runtime) -> tuple[list[int], PrefixCacheFigures, int]:
        prompt_tokens: list[int] = []
        transport = httpx.ASGITransport(app=build_api_app(runtime))
        async with httpx.AsyncClient(transport=transport, base_url="http://fusebox") as client:
            for index, n in enumerate(choices):
                if index == 1:
                    after_first()
                body = {"model": config.model_name, "prompt": PROMPT, "max_tokens": 4, "n": n}
                response = await client.post(COMPLETIONS_PATH, json={**body, "temperature": 0})
                assert response.status_code == 200, response.text
                assert all(choice["text"] for choice in response.json()["choices"])
                prompt_tokens.append(response.json()["usage"]["prompt_tokens"])
        assert runtime.worker is not None
        figures = runtime.worker.prefix_cache_figures()
        return prompt_tokens, figures, runtime.tokens.totals().prompt_total

    return run_with_runtime(config, scenario)


def test_a_request_with_several_choices_counts_one_hit_and_its_reused_tokens_once(
    tiny_model_dir: Path,
) -> None:
    prompt_tokens, figures, prompt_total = _requests(tiny_model_dir, [1, 3])
    assert prompt_tokens[0] > 2 * BLOCK_TOKENS
    reused = (prompt_tokens[0] - 1) // BLOCK_TOKENS * BLOCK_TOKENS
    assert (figures.hits_total, figures.misses_total) == (1, 1)
    assert figures.reused_tokens_total == reused
    assert prompt_total == sum(prompt_tokens)
    assert figures.reused_tokens_total <= prompt_total  # "the share of prefill work saved"


def test_a_cached_prefix_whose_copy_fails_counts_as_the_miss_it_ran_as(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def copy_fails(self: Decoding, prefix: Any) -> None:
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory")

    def break_reuse() -> None:
        monkeypatch.setattr(Decoding, "start_from_prefix", copy_fails)

    _, figures, _ = _requests(tiny_model_dir, [1, 1], break_reuse)
    assert (figures.hits_total, figures.misses_total, figures.reused_tokens_total) == (0, 2, 0)
