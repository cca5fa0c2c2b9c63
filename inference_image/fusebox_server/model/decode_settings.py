"""What the engine needs to know to decode one request, in the engine's own terms.

Why: the model layer must not speak OpenAI. The HTTP layer parses a body
into `openai_schema.OpenAISampling` (with `max_tokens`, and which field it
came from for an error) and resolves the token budget; it then hands the
engine and the worker this, which names no API field. Pure data: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DecodeSettings:
    max_new_tokens: int
    """The most tokens to generate; the budget is already resolved (limit, context window)."""
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]
    """Sequences that end the text; the stop itself is not returned."""
