"""A prompt projects only its last position onto the vocabulary, and its tokens do not change.

With Llama 3's 128,256-token vocabulary the projection is most of a small
model's work: a 2,048-token prompt projected at every position would cost a
gigabyte of float32 logits for one token's choice (docs/decisions/
realistic-workload.md). These tests count what the projection computes, on
the llama3 zoo model, through the engine's own prefill paths.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from fusebox_server.model import engine
from fusebox_server.model.engine import Decoding, load_model
from fusebox_server.zoo.release import ensure_zoo_model

from .worker_jobs import GREEDY

TEXTS = [
    "The operator watches resident memory, GPU memory, latency and the quality of answers.",
    "请用一句话总结下面这段话。服务器只加载一次模型。",
    "def slope(points): return 0.0",
]


@pytest.fixture(scope="module")
def llama3() -> tuple[Path, Any]:
    from fusebox_server.model.tokenization import load_tokenizer

    directory = ensure_zoo_model("llama3")
    return directory, load_tokenizer(directory)


@pytest.fixture(scope="module")
def loaded(llama3: tuple[Path, Any]) -> engine.LoadedModel:
    directory, tokenizer = llama3
    return load_model("primary", directory, "none", torch.device("cpu"), tokenizer)


@pytest.fixture(scope="module")
def prompts(llama3: tuple[Path, Any]) -> list[tuple[int, ...]]:
    _, tokenizer = llama3
    return [tuple(tokenizer.backend_tokenizer.encode(text).ids) for text in TEXTS]


def _projected_shapes(loaded: engine.LoadedModel) -> tuple[list[tuple[int, ...]], Any]:
    """The output shape of every call of the vocabulary projection, and the hook's handle."""
    shapes: list[tuple[int, ...]] = []
    projection = loaded.model.get_output_embeddings()
    handle = projection.register_forward_hook(
        lambda module, inputs, output: shapes.append(tuple(output.shape))
    )
    return shapes, handle


def _full_projection_tokens(loaded: engine.LoadedModel, prompt: tuple[int, ...]) -> int:
    """The first token as a forward that projects every position chooses it."""
    with torch.inference_mode():
        logits = loaded.model(input_ids=torch.tensor([list(prompt)])).logits
    assert logits.shape == (1, len(prompt), 128_256)  # what the engine avoids
    return int(logits[0, -1].argmax())


def test_a_group_prefill_projects_one_position_per_row_and_chooses_the_same_tokens(
    loaded: engine.LoadedModel, prompts: list[tuple[int, ...]]
) -> None:
    assert len({len(prompt) for prompt in prompts}) == 3  # left padding is exercised
    expected = [_full_projection_tokens(loaded, prompt) for prompt in prompts]
    shapes, handle = _projected_shapes(loaded)
    try:
        tokens = engine.prefill(loaded, [Decoding(loaded, p, GREEDY) for p in prompts])
    finally:
        handle.remove()
    assert shapes == [(3, 1, 128_256)]
    assert tokens == expected


def test_a_lone_prompt_projects_only_its_last_position(
    loaded: engine.LoadedModel, prompts: list[tuple[int, ...]]
) -> None:
    expected = _full_projection_tokens(loaded, prompts[0])
    shapes, handle = _projected_shapes(loaded)
    try:
        token = Decoding(loaded, prompts[0], GREEDY).step()
    finally:
        handle.remove()
    assert shapes == [(1, 1, 128_256)]
    assert token == expected


def test_a_decode_step_projects_one_position_per_row(
    loaded: engine.LoadedModel, prompts: list[tuple[int, ...]]
) -> None:
    rows = [Decoding(loaded, prompt, GREEDY) for prompt in prompts]
    engine.prefill(loaded, rows)
    batch = engine.DecodeBatch(loaded)
    batch.add(*rows)
    shapes, handle = _projected_shapes(loaded)
    try:
        batch.step()
    finally:
        handle.remove()
    assert shapes == [(3, 1, 128_256)]
