"""Greedy decoding of one row through either decode batch, for the tests that hold a prompt's
tokens to those of another way of prefilling it (chunked, or from the prefix cache).

Why shared: the server tier (chunked prefill) and the zoo tier (prefix reuse per family)
make the same claim, "this prefill decodes what a whole prefill decodes", and must decode
both sides the same way for the comparison to mean anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fusebox_server.model.decode_settings import DecodeSettings
from fusebox_server.model.engine import DecodeBatch, Decoding
from fusebox_server.model.slot_batch import SlotBatch

NEW_TOKENS = 8
GREEDY = DecodeSettings(max_new_tokens=NEW_TOKENS, temperature=0.0, top_p=1.0, seed=None, stop=())
BATCHES: dict[str, Any] = {
    "DecodeBatch": DecodeBatch,
    "SlotBatch": lambda loaded: SlotBatch(loaded, graphs=False),  # what the graphs replay, eager
}


def chat_prompts(tokenizer: Any, system: str, questions: Sequence[str]) -> list[tuple[int, ...]]:
    """Each question after the shared system prompt, as the model's chat template tokenises it."""
    return [
        tuple(
            tokenizer.apply_chat_template(
                [{"role": "system", "content": system}, {"role": "user", "content": question}],
                tokenize=True,
                add_generation_prompt=True,
                return_dict=False,
            )
        )
        for question in questions
    ]


def decode_greedily(batch: Any, row: Decoding) -> list[int]:
    """`row`'s NEW_TOKENS tokens: its first from its prefill, the rest from `batch`'s steps."""
    tokens = [row.step()]
    batch.add(row)
    while len(tokens) < NEW_TOKENS:
        [token] = batch.step()
        assert isinstance(token, int)
        tokens.append(token)
    return tokens
