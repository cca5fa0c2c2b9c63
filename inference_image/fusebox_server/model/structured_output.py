"""Constrained decoding: a row's next token keeps its text a prefix of a JSON document.

Why: `response_format` json_object / json_schema promise a caller text that
parses (and validates); a model, above all a small or random one, does not
keep that promise by itself. The grammar (`json_grammar`) says which bytes may
come next; here the token table and the choice make it hold for tokens:

- `TokenVocabulary` is each token's bytes, computed once per tokenizer (a
  128k vocabulary is never decoded per step), with each token's first byte as
  a tensor: one gather masks every token that cannot start here.
- `ConstrainedRow.choose` picks the row's token: greedy takes the first valid
  candidate in logit order; sampling is rejection sampling (draws from the
  model's distribution, then from the masked one, the first valid wins), then
  a scan by logit order. End of sequence is valid only once the document is
  whole, and a token is valid only if the document can still close within the
  row's token budget.

docs/decisions/structured-output.md says why this way, and what it costs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import torch

from fusebox_server.model.json_grammar import (
    JSON_OBJECT,
    DocumentState,
    OutputFormat,
    UnsupportedSchema,
)

__all__ = [
    "JSON_OBJECT",
    "ConstrainedRow",
    "DocumentState",
    "OutputFormat",
    "TokenVocabulary",
    "UnsupportedSchema",
    "build_vocabulary",
    "vocabulary_of",
]

SAMPLE_TRIES: Final = 8
"""Draws per round (one from the model's distribution, one from the masked one) before a
sampled row falls back to scanning its candidates in logit order."""
GREEDY_WINDOW: Final = 32
"""Candidates checked from one top-k before the whole row is sorted."""


# ----- tokens -----


@dataclass(frozen=True)
class TokenVocabulary:
    """Every token's bytes (None: a special token, never inside a document), and as a tensor
    each token's first byte (256: none), to mask a step's logits with one gather."""

    token_bytes: tuple[bytes | None, ...]
    first_byte: torch.Tensor
    _by_width: dict[tuple[int, str], torch.Tensor] = field(default_factory=dict, compare=False)

    def first_bytes_for(self, width: int, device: torch.device) -> torch.Tensor:
        """`first_byte` as wide as a row of logits (ids past the tokenizer: none), kept
        per width and device."""
        key = (width, str(device))
        table = self._by_width.get(key)
        if table is None:
            table = torch.full((width,), 256, dtype=torch.long)
            shared = min(width, self.first_byte.shape[0])
            table[:shared] = self.first_byte[:shared]
            table = self._by_width[key] = table.to(device)
        return table


_VOCABULARY_ATTRIBUTE: Final = "_fusebox_token_vocabulary"
_BYTE_FALLBACK: Final = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def vocabulary_of(tokenizer: Any) -> TokenVocabulary:
    """The tokenizer's `TokenVocabulary`, built once and kept on the tokenizer."""
    cached = getattr(tokenizer, _VOCABULARY_ATTRIBUTE, None)
    if isinstance(cached, TokenVocabulary):
        return cached
    vocabulary = build_vocabulary(tokenizer)
    setattr(tokenizer, _VOCABULARY_ATTRIBUTE, vocabulary)
    return vocabulary


def build_vocabulary(tokenizer: Any) -> TokenVocabulary:
    """Each token's bytes from its vocabulary spelling, without decoding token by token.

    Byte-level BPE spells bytes as characters (`tokenization.BYTE_LEVEL_ALPHABET`);
    SentencePiece spells a space `▁` and a byte `<0xNN>`. Special tokens have none.
    """
    from fusebox_server.model.tokenization import BYTE_LEVEL_ALPHABET, WORD_START

    size = len(tokenizer)
    spellings = tokenizer.convert_ids_to_tokens(list(range(size)))
    special = set(getattr(tokenizer, "all_special_ids", ()))
    for token_id, added in getattr(tokenizer, "added_tokens_decoder", {}).items():
        if getattr(added, "special", False):
            special.add(int(token_id))
    decoder = type(getattr(tokenizer.backend_tokenizer, "decoder", None)).__name__
    byte_level = "ByteLevel" in decoder or _spelt_as_bytes(spellings)
    table: list[bytes | None] = []
    for token_id, spelling in enumerate(spellings):
        if token_id in special or not isinstance(spelling, str) or not spelling:
            table.append(None)
            continue
        fallback = _BYTE_FALLBACK.fullmatch(spelling)
        if fallback is not None:
            table.append(bytes([int(fallback.group(1), 16)]))
        elif byte_level and all(char in BYTE_LEVEL_ALPHABET for char in spelling):
            table.append(bytes(BYTE_LEVEL_ALPHABET[char] for char in spelling))
        else:
            table.append(spelling.replace(WORD_START, " ").encode("utf-8"))
    first = torch.tensor([data[0] if data else 256 for data in table], dtype=torch.long)
    return TokenVocabulary(tuple(table), first)


def _spelt_as_bytes(spellings: Sequence[Any]) -> bool:
    """Byte-level BPE spells a space `Ġ`; a vocabulary with `Ġ`-words and no `▁` is one."""
    sample = [s for s in spellings[:4096] if isinstance(s, str)]
    return any(s.startswith("\u0120") for s in sample) and not any("\u2581" in s for s in sample)


# ----- a row's choice -----

Sampler = Callable[[torch.Tensor, int], list[int]]
"""Draws `count` token ids in turn from a row of (masked) logits, repeats dropped: the first
valid one is a draw from the model's distribution over the valid tokens (rejection
sampling)."""


class ConstrainedRow:
    """One row's document so far, and the choice of its next token under it.

    `token_budget` is the most tokens the row may generate: a token after which
    the document could not be closed within what is left is not valid (every
    byte a document needs has a token of its own in byte-level and
    byte-fallback vocabularies).
    """

    def __init__(
        self,
        output_format: OutputFormat,
        vocabulary: TokenVocabulary,
        end_ids: Iterable[int],
        token_budget: int,
    ) -> None:
        self.output_format = output_format
        self.state = output_format.start()
        self.vocabulary = vocabulary
        self.end_ids = frozenset(end_ids)
        self.tokens_left = token_budget
        self._tried: dict[int, DocumentState] = {}

    @property
    def complete(self) -> bool:
        return self.state.complete

    @property
    def finished(self) -> bool:
        return self.state.finished

    def allows(self, token_id: int, budgeted: bool = True) -> bool:
        """Whether the token may come next (its state is kept for `took`)."""
        if token_id in self.end_ids:
            return self.state.complete
        if not 0 <= token_id < len(self.vocabulary.token_bytes):
            return False
        data = self.vocabulary.token_bytes[token_id]
        if data is None:
            return False
        after = self._tried.get(token_id)
        if after is None:
            after = self._tried[token_id] = self.state.feed(data)
        if not after.valid:
            return False
        return not budgeted or after.min_close <= self.tokens_left - 1

    def took(self, token_id: int) -> None:
        """The row generated this token: the document goes on from it."""
        if token_id not in self.end_ids:
            after = self._tried.get(token_id)
            data = self.vocabulary.token_bytes[token_id]
            if after is None and data is not None:
                after = self.state.feed(data)
            if after is not None:
                self.state = after
        self.tokens_left -= 1
        self._tried = {}

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """The logits with every token that cannot start here at -inf (a new tensor)."""
        must_shorten = self.state.min_close > self.tokens_left - 1
        allowed = self.output_format.first_bytes(self.state, must_shorten) + [False]
        table = torch.tensor(allowed, dtype=torch.bool, device=logits.device)
        keep = table[self.vocabulary.first_bytes_for(logits.shape[-1], logits.device)]
        if self.state.complete:
            for end in self.end_ids:
                if end < keep.shape[0]:
                    keep[end] = True
        return logits.float().masked_fill(~keep, -math.inf)

    def choose(self, logits: torch.Tensor, sample: Sampler | None) -> int:
        """The row's next token from its (adjusted) logits; `sample` None: greedy.

        The model's own first choices are tried before anything is masked (inside a
        string nearly every token fits, and the mask costs 256 parser steps); sampling
        is rejection sampling, so a valid draw keeps the model's distribution over the
        valid tokens. When nothing fits the budget (a tokenizer without some byte), the
        grammar alone decides; when nothing fits at all, an end-of-sequence id ends the
        row.
        """
        rows = logits.float()
        masked: torch.Tensor | None = None
        if sample is None:
            best = int(torch.argmax(rows).item())  # a quarter of a top-k on 128k logits
            if self.allows(best):
                return best
            found = self._scan(rows, budgeted=True, window_only=True)
            if found is not None:
                return found
        else:
            for _ in range(2):  # the model's own draws, then draws among what can start here
                drawn = sample(rows if masked is None else masked, SAMPLE_TRIES)
                for token in drawn:
                    if self.allows(token):
                        return token
                if masked is None:
                    masked = self.mask(rows)
                if drawn:
                    masked[torch.tensor(drawn, device=masked.device)] = -math.inf
        if masked is None:
            masked = self.mask(rows)
        for budgeted in (True, False):
            found = self._scan(masked if budgeted else rows, budgeted)
            if found is not None:
                return found
        return min(self.end_ids) if self.end_ids else int(torch.argmax(rows).item())

    def _scan(self, logits: torch.Tensor, budgeted: bool, window_only: bool = False) -> int | None:
        """The first valid token in descending logit order (`window_only`: among the
        first GREEDY_WINDOW)."""
        window = min(GREEDY_WINDOW, logits.shape[-1])
        values, ids = torch.topk(logits, window)
        for value, token in zip(values.tolist(), ids.tolist(), strict=True):
            if value == -math.inf:
                return None
            if self.allows(token, budgeted):
                return int(token)
        if window_only:
            return None
        order = torch.argsort(logits, descending=True)
        finite = int(torch.isfinite(logits).sum().item())
        for token in order[window:finite].tolist():
            if self.allows(token, budgeted):
                return int(token)
        return None
