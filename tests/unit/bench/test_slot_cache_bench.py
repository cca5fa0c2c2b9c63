"""bench/slot_cache_bench.py's drain: what it records of a burst leaving the slot cache."""

from __future__ import annotations

import pytest
import torch

from bench.slot_cache_bench import NEVER, drain
from fusebox_server.model import slot_batch
from fusebox_server.model.engine import load_model
from fusebox_server.model.tiny_model import ensure_model
from fusebox_server.model.tokenization import load_tokenizer


def test_a_drain_holds_less_cache_once_the_burst_thins_and_decodes_the_same_tokens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(slot_batch, "SHRINK_AFTER_SECONDS", 0.0)
    model_dir = ensure_model("tiny")
    loaded = load_model(
        "primary", model_dir, "none", torch.device("cpu"), load_tokenizer(model_dir)
    )
    prompts = [tuple(range(5, 5 + length)) for length in (3, 4, 5, 6, 7, 8, 9, 10)]
    lengths = [2, 2, 2, 2, 2, 2, 12, 12]  # six rows leave after two tokens, two run on
    shrinking = drain(loaded, prompts, lengths)
    monkeypatch.setattr(slot_batch, "SHRINK_AT", NEVER)
    growing_only = drain(loaded, prompts, lengths)
    assert shrinking["tokens"] == growing_only["tokens"]
    assert [len(tokens) for tokens in shrinking["tokens"]] == lengths
    assert growing_only["capacities"] == [[8, 64]]
    assert shrinking["capacities"] == [[8, 64], [4, 64]]  # 2 rows of 8 slots: halved
    assert shrinking["tail_steps"] == growing_only["tail_steps"] == 10
    assert shrinking["tail_mean_cache_bytes"] * 2 == growing_only["tail_mean_cache_bytes"]
    assert shrinking["peak_cache_bytes"] == growing_only["peak_cache_bytes"]
