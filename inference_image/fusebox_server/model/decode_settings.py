"""What the engine needs to know to decode one request, in the engine's own terms.

Why: the model layer must not speak OpenAI. The HTTP layer parses a body
into `openai_schema.OpenAISampling` (with `max_tokens`, and which field it
came from for an error) and resolves the token budget; it then hands the
engine and the worker this, which names no API field. Pure data: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from fusebox_server.model.json_grammar import OutputFormat

SEED_HIGHEST = (1 << 64) - 1
"""The largest seed torch's generator takes (a signed 64-bit value or an unsigned one)."""


@dataclass(frozen=True)
class RepeatPenalties:
    """Subtracted from a token's logit once it has been generated: `presence` once, and
    `frequency` times the number of times it was generated (the prompt does not count)."""

    presence: float = 0.0
    frequency: float = 0.0

    @property
    def active(self) -> bool:
        return self.presence != 0.0 or self.frequency != 0.0


@dataclass(frozen=True)
class DecodeSettings:
    max_new_tokens: int
    """The most tokens to generate; the budget is already resolved (limit, context window)."""
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]
    """Sequences that end the text; the stop itself is not returned."""
    top_alternatives: int | None = None
    """None: no scores. Else every generated token is reported with its log-probability
    and this many most likely alternatives (0 for none), all from the model's raw
    distribution: before temperature, top_p, penalties and bias."""
    repeat_penalties: RepeatPenalties = RepeatPenalties()
    token_bias: tuple[tuple[int, float], ...] = ()
    """(token id, amount) pairs added to the logits before a token is chosen."""
    output_format: OutputFormat | None = None
    """None: free text. Else every token keeps the text a prefix of a document of this
    format (`json_grammar`, chosen by `structured_output`), and the row ends when the
    document is whole."""


def choice_seed(seed: int, index: int) -> int:
    """The seed of the index-th of several generations of one request: `seed + index`
    (as vLLM derives them), wrapped past the largest seed. Choice 0 keeps the request's
    seed, so its text is the same with n=1 and with n=3."""
    value = seed + index
    return value if value <= SEED_HIGHEST else value - (1 << 64)


def earliest_stop(text: str, stops: tuple[str, ...], searched_to: int = 0) -> int | None:
    """Where the text ends for its stop sequences: the earliest index at which any of
    them occurs (not the first of the list that occurs anywhere: one piece of text can
    hold two), or None. `searched_to`: the text before it was searched already, so a stop
    can only end past it."""
    found = (text.find(stop, max(0, searched_to - len(stop))) if stop else -1 for stop in stops)
    return min((index for index in found if index >= 0), default=None)
