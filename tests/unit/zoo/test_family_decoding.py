"""Per family, in float32 on the CPU: Fusebox decodes exactly what transformers' `generate` does.

The reference is transformers alone: the family's release loaded as saved
(no Fusebox kernels), each prompt decoded greedily on its own. Fusebox loads
the same release through `engine.load_model` (fused and packed CPU kernels,
its attention for one query row where it takes the model), prefills prompts
in groups (left-padded), and decodes them in a batch that rows join and
leave at different steps: once through `DecodeBatch`, once through the slot
batch that the CUDA graphs replay, run eagerly. Every row's tokens must be
the reference's.

Mistral's and Gemma 2's real windows (4,096) cannot be passed in a fast test,
so those two run with the release's config narrowed to a 4-token window
(the weights are the release's): every prompt here is longer, so sliding
layers attend to a window while Gemma 2's global layers attend to all.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from fusebox_server.model.decode_settings import DecodeSettings
from fusebox_server.model.engine import DecodeBatch, Decoding, LoadedModel, load_model, prefill
from fusebox_server.model.slot_batch import SlotBatch
from fusebox_server.zoo.families import FAMILIES
from fusebox_server.zoo.release import ensure_zoo_model

GREEDY = DecodeSettings(max_new_tokens=8, temperature=0.0, top_p=1.0, seed=None, stop=())
WINDOW = 4
NARROWED = {"mistral": WINDOW, "gemma2": WINDOW}
TEXTS = [
    "The quick brown fox jumps over",
    "你好，今天天气很好 🚀",
    "Hi",
    "Explain how a hash table works",
]
# How many tokens each row decodes: rows leave the batch at different steps.
COUNTS = [6, 3, 5, 4]
# The first rows prefill together and start; the others join after this many steps.
STARTERS, JOIN_AFTER = 2, 2
# What the CPU kernels do per family (`cpu_kernels.pack_for_cpu`): sibling groups fused
# (q/k/v and gate/up per layer; Phi-3 ships them fused; the MoE's shared expert has gate/up),
# and whether the one-query attention serves it.
KERNELS = {
    "llama3": (4, True),
    "qwen2.5": (4, True),
    "qwen3": (4, True),
    "mistral": (4, True),
    "gemma2": (4, False),
    "phi3": (0, True),
    "qwen2_moe": (4, True),
}

Batch = Callable[[LoadedModel], Any]
BATCHES: dict[str, Batch] = {
    "DecodeBatch": DecodeBatch,
    "SlotBatch": lambda loaded: SlotBatch(loaded, graphs=False),
}


def _narrowed(directory: Path, window: int, into: Path) -> Path:
    """The release with its config's sliding window narrowed; the other files linked."""
    into.mkdir(exist_ok=True)
    for path in directory.iterdir():
        if path.name != "config.json":
            (into / path.name).symlink_to(path)
    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    config["sliding_window"] = window
    (into / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return into


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """(name, release directory, tokenizer, prompts, the reference's tokens per prompt)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name = request.param
    directory = ensure_zoo_model(name)
    if name in NARROWED:
        directory = _narrowed(directory, NARROWED[name], tmp_path_factory.mktemp(name))
    tokenizer: Any = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    # Chat prompts (the template's special tokens, as the server renders them) and raw ones.
    chats = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        for text in TEXTS
    ]
    prompts = [
        tuple(tokenizer.encode(chat, add_special_tokens=False))
        if index % 2 == 0
        else tuple(tokenizer.encode(text, add_special_tokens=True))
        for index, (chat, text) in enumerate(zip(chats, TEXTS, strict=True))
    ]
    reference: Any = AutoModelForCausalLM.from_pretrained(str(directory), local_files_only=True)
    reference.eval()
    expected = []
    for prompt, count in zip(prompts, COUNTS, strict=True):
        output = reference.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones((1, len(prompt)), dtype=torch.long),
            max_new_tokens=count,
            min_new_tokens=count,
            do_sample=False,
        )
        expected.append(output[0, len(prompt) :].tolist())
    return name, directory, tokenizer, prompts, expected


@pytest.fixture(scope="module")
def loaded(family: Any) -> LoadedModel:
    _, directory, tokenizer, _, _ = family
    return load_model("primary", directory, "none", torch.device("cpu"), tokenizer)


def _decode_joining_and_leaving(
    batch: Any, loaded: LoadedModel, prompts: list[tuple[int, ...]]
) -> list[list[int]]:
    rows = [Decoding(loaded, prompt, GREEDY) for prompt in prompts]
    tokens: dict[int, list[int]] = {id(row): [] for row in rows}
    wanted = {id(row): count for row, count in zip(rows, COUNTS, strict=True)}

    def join(joiners: list[Decoding]) -> None:
        for row, token in zip(joiners, prefill(loaded, joiners), strict=True):
            assert isinstance(token, int)
            tokens[id(row)].append(token)
        batch.add(*joiners)

    def step() -> None:
        for row, token in zip(list(batch.rows), batch.step(), strict=True):
            assert isinstance(token, int)
            tokens[id(row)].append(token)
        for row in list(batch.rows):
            if len(tokens[id(row)]) == wanted[id(row)]:
                batch.remove(row)

    join(rows[:STARTERS])
    for _ in range(JOIN_AFTER):
        step()
    join(rows[STARTERS:])
    while len(batch):
        step()
    return [tokens[id(row)] for row in rows]


@pytest.mark.parametrize("batch_kind", sorted(BATCHES))
def test_rows_joining_and_leaving_decode_what_transformers_generates(
    family: Any, loaded: LoadedModel, batch_kind: str
) -> None:
    name, _, _, prompts, expected = family
    decoded = _decode_joining_and_leaving(BATCHES[batch_kind](loaded), loaded, prompts)
    assert decoded == expected, f"{name} through {batch_kind}"


def test_the_cpu_kernels_take_what_they_handle_and_decline_the_rest(
    family: Any, loaded: LoadedModel
) -> None:
    name = family[0]
    groups, single_query = KERNELS[name]
    assert loaded.kernels["fused_projection_groups"] == groups
    assert loaded.kernels["packed_linear_layers"] > 0
    assert loaded.kernels["single_query_attention"] is single_query
    declined = loaded.kernels["single_query_attention_declined"]
    if name == "gemma2":
        assert declined == "attention logits are soft-capped"
    else:
        assert declined is None


def test_every_end_id_of_the_family_ends_a_generation(family: Any, loaded: LoadedModel) -> None:
    name = family[0]
    decoding = Decoding(loaded, (1, 2, 3), GREEDY)
    ends = set(FAMILIES[name].generation_eos)
    assert ends <= loaded.eos_token_ids
    assert all(decoding.is_end(token) for token in ends)
    assert not decoding.is_end(max(loaded.eos_token_ids) + 1)
