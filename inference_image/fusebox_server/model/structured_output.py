"""Constrained decoding: a row's next token keeps its text a prefix of a JSON document.

Why: `response_format` json_object / json_schema and forced tool calls promise
a caller text that parses (and validates); a model, above all a small or
random one, does not keep that promise by itself. llguidance's matcher says
which tokens may come next (`json_grammar.OutputFormat` holds its compiled
grammar); here the token table and the choice make it hold:

- `TokenVocabulary` is each token's bytes, computed once per tokenizer (a
  128k vocabulary is never decoded per step), and llguidance's tokenizer
  built from them once, with the compiled matchers kept per format and
  copied per row.
- `ConstrainedRow.choose` picks the row's token: greedy takes the model's
  argmax when it fits (one token check), else the first valid candidate in
  logit order under llguidance's exact token mask; sampling is rejection
  sampling (draws from the model's distribution, then from the masked one,
  the first valid wins). End of sequence is valid only once the document is
  whole, and, where ours' bookkeeping knows the schema (`json_grammar`), a
  token is valid only if the document can still close within the row's
  token budget.

docs/decisions/structured-output.md says why this way, and what it costs.
"""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import llguidance
import torch

from fusebox_server.model.json_grammar import (
    JSON_OBJECT,
    DocumentState,
    OutputFormat,
    UnsupportedSchema,
    refusal_reason,
)

__all__ = [
    "JSON_OBJECT",
    "ConstrainedRow",
    "DocumentState",
    "OutputFormat",
    "TokenVocabulary",
    "UnsupportedSchema",
    "build_vocabulary",
    "vocabulary_from_bytes",
    "vocabulary_of",
]

SAMPLE_TRIES: Final = 8
"""Draws per round (one from the model's distribution, one from the masked one) before a
sampled row falls back to scanning its candidates in logit order."""
GREEDY_WINDOW: Final = 32
"""Candidates checked from one top-k before the whole row is sorted."""
MATCHERS_KEPT: Final = 64
"""Compiled matchers kept per tokenizer (least recently used dropped); a row gets a copy."""


# ----- tokens -----


@dataclass(frozen=True)
class TokenVocabulary:
    """Every token's bytes (None: a special token, never inside a document), the token of
    each single byte (-1: none; a tight budget closes a document byte by byte), and
    llguidance's tokenizer over the same bytes."""

    token_bytes: tuple[bytes | None, ...]
    byte_tokens: tuple[int, ...]
    matcher_tokenizer: Any
    _matchers: OrderedDict[str, Any] = field(default_factory=OrderedDict, compare=False)

    def matcher(self, output_format: OutputFormat) -> Any:
        """A fresh llguidance matcher of the format: a copy of one compiled per format."""
        prototype = self._matchers.get(output_format.grammar)
        if prototype is None:
            prototype = llguidance.LLMatcher(
                self.matcher_tokenizer, output_format.grammar, log_level=0
            )
            if prototype.is_error():
                # Built over the 256 bytes when compiled (`json_grammar._grammar`): a
                # refusal here is this vocabulary's, still the schema's, never a crash.
                raise UnsupportedSchema((), refusal_reason(prototype.get_error()))
            self._matchers[output_format.grammar] = prototype
            if len(self._matchers) > MATCHERS_KEPT:
                self._matchers.popitem(last=False)
        else:
            self._matchers.move_to_end(output_format.grammar)
        return prototype.deep_copy()


class _TableTokenizer:
    """What `llguidance.TokenizerWrapper` reads: our token table, one id past it as the
    end of sequence (ends are the row's business: `ConstrainedRow` decides them), and the
    tokenizer's encoding (llguidance tokenizes only for features not used here)."""

    def __init__(self, token_bytes: Sequence[bytes | None], encode: Callable[[str], list[int]]):
        self.tokens = [data or b"" for data in token_bytes] + [b""]
        self.eos_token_id = len(token_bytes)
        self.bos_token_id = None
        self.special_token_ids = [i for i, data in enumerate(token_bytes) if data is None]
        self.special_token_ids.append(self.eos_token_id)
        self._encode = encode

    def __call__(self, text: str) -> list[int]:
        return self._encode(text)


def vocabulary_from_bytes(
    token_bytes: Sequence[bytes | None], encode: Callable[[str], list[int]] | None = None
) -> TokenVocabulary:
    """The table, and llguidance's tokenizer built from it (ids past it are never valid)."""
    table = tuple(token_bytes)
    byte_tokens = [-1] * 256
    for token_id, data in enumerate(table):
        if data is not None and len(data) == 1 and byte_tokens[data[0]] < 0:
            byte_tokens[data[0]] = token_id
    wrapper = llguidance.TokenizerWrapper(_TableTokenizer(table, encode or _longest_match(table)))
    tokenizer = llguidance.LLTokenizer(wrapper, n_vocab=len(table) + 1)
    return TokenVocabulary(table, tuple(byte_tokens), tokenizer)


def _longest_match(table: Sequence[bytes | None]) -> Callable[[str], list[int]]:
    """An encoding by longest match, for a table without a tokenizer (llguidance tokenizes
    the bytes a grammar forces, and a mask there is wrong without it)."""
    ids = {data: token_id for token_id, data in enumerate(table) if data}
    longest = max((len(data) for data in ids), default=0)

    def encode(text: str) -> list[int]:
        data, out, at = text.encode("utf-8"), [], 0
        while at < len(data):
            for size in range(min(longest, len(data) - at), 0, -1):
                if data[at : at + size] in ids:
                    out.append(ids[data[at : at + size]])
                    at += size
                    break
            else:
                at += 1  # a byte no token spells: left out
        return out

    return encode


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

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    return vocabulary_from_bytes(table, encode)


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

    llguidance's matcher decides what is valid. `token_budget` is the most tokens
    the row may generate: where ours' bookkeeping knows the schema
    (`OutputFormat.start`), a token after which the document could not be closed
    within what is left is not valid either (every byte a document needs has a
    token of its own in byte-level and byte-fallback vocabularies).
    """

    def __init__(
        self,
        output_format: OutputFormat,
        vocabulary: TokenVocabulary,
        end_ids: Iterable[int],
        token_budget: int,
    ) -> None:
        self.output_format = output_format
        self.matcher = vocabulary.matcher(output_format)
        self.closing: DocumentState | None = output_format.start()
        self.vocabulary = vocabulary
        self.end_ids = frozenset(end_ids)
        self.tokens_left = token_budget
        self._tried: dict[int, DocumentState] = {}

    @property
    def complete(self) -> bool:
        """The text is a whole document (it may still go on: `12` -> `123`)."""
        return bool(self.matcher.is_accepting())

    @property
    def finished(self) -> bool:
        """The document is whole and nothing may follow it: the row ends."""
        return bool(self.matcher.is_stopped()) and not self.matcher.is_error()

    def allows(self, token_id: int, budgeted: bool = True) -> bool:
        """Whether the token may come next (ours' closing state is kept for `took`)."""
        if token_id in self.end_ids:
            return self.complete
        if not 0 <= token_id < len(self.vocabulary.token_bytes):
            return False
        data = self.vocabulary.token_bytes[token_id]
        if data is None or self.matcher.validate_tokens([token_id]) != 1:
            return False
        if self.closing is None:
            return True
        after = self._tried.get(token_id)
        if after is None:
            after = self._tried[token_id] = self.closing.feed(data)
        if after.untracked:  # forked past what ours follows: the grammar alone decides
            return True
        # Ours refuses what llguidance allows only where ours is stricter (a key twice,
        # deep free nesting): its verdict stands, unless nothing in the budget fitted and
        # the grammar alone decides (`budgeted` False).
        if not after.valid:
            return not budgeted
        return not budgeted or after.min_close <= self.tokens_left - 1

    def took(self, token_id: int) -> None:
        """The row generated this token: the document goes on from it."""
        if token_id not in self.end_ids:
            self.matcher.consume_token(token_id)
            data = self.vocabulary.token_bytes[token_id]
            if self.closing is not None and data is not None:
                after = self._tried.get(token_id) or self.closing.feed(data)
                # Past what ours follows (chosen by the grammar alone, or forked past
                # `MAX_PARSES`): llguidance goes on.
                self.closing = after if after.valid and not after.untracked else None
        self.tokens_left -= 1
        self._tried = {}

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """The logits with every token llguidance refuses here at -inf (a new tensor)."""
        size = len(self.vocabulary.token_bytes)
        words = torch.zeros(((size + 1 + 31) // 32,), dtype=torch.int32)
        self.matcher.unsafe_compute_mask_ptr(words.data_ptr(), words.numel() * 4)
        bits = (words.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
        allowed = bits.reshape(-1)[:size].bool()
        keep = torch.zeros(logits.shape[-1], dtype=torch.bool)
        shared = min(size, keep.shape[0])
        keep[:shared] = allowed[:shared]
        if self.complete:
            for end in self.end_ids:
                if end < keep.shape[0]:
                    keep[end] = True
        return logits.float().masked_fill(~keep.to(logits.device), -math.inf)

    @property
    def _must_shorten(self) -> bool:
        """Only a token that brings the end closer fits what is left of the budget."""
        return self.closing is not None and self.closing.min_close > self.tokens_left - 1

    def choose(self, logits: torch.Tensor, sample: Sampler | None) -> int:
        """The row's next token from its (adjusted) logits; `sample` None: greedy.

        The model's own first choices are tried before anything is masked (inside a
        string nearly every token fits: one token check); sampling is rejection
        sampling, so a valid draw keeps the model's distribution over the valid tokens.
        When the budget is tight, the single-byte tokens close the document. When
        nothing fits the budget (a tokenizer without some byte), the grammar alone
        decides; when nothing fits at all, an end-of-sequence id ends the row.
        """
        rows = logits.float()
        masked: torch.Tensor | None = None
        if sample is None:
            best = int(torch.argmax(rows).item())  # a quarter of a top-k on 128k logits
            if self.allows(best):
                return best
            # No second look at the unmasked row: llguidance's mask costs less than
            # a top-k over it.
        else:
            for _ in range(2):  # the model's own draws, then draws among what can come here
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
        if self._must_shorten:
            found = self._closing_byte(masked)
            if found is not None:
                return found
        for budgeted in (True, False):
            found = self._scan(masked if budgeted else rows, budgeted)
            if found is not None:
                return found
        if self.matcher.is_error():  # the parser gave up (a row past its limits): a refusal
            raise UnsupportedSchema((), refusal_reason(self.matcher.get_error()))
        return min(self.end_ids) if self.end_ids else int(torch.argmax(rows).item())

    def _closing_byte(self, masked: torch.Tensor) -> int | None:
        """The likeliest single-byte token (or end) that keeps the document closable."""
        candidates = [t for t in self.vocabulary.byte_tokens if 0 <= t < masked.shape[-1]]
        candidates += [t for t in self.end_ids if t < masked.shape[-1]]
        if not candidates:
            return None
        values = masked[torch.tensor(candidates, device=masked.device)]
        for index in torch.argsort(values, descending=True).tolist():
            if values[index] > -math.inf and self.allows(candidates[index]):
                return int(candidates[index])
        return None

    def _scan(self, logits: torch.Tensor, budgeted: bool, window_only: bool = False) -> int | None:
        """The first valid token in descending logit order (`window_only`: among the
        first GREEDY_WINDOW)."""
        best = int(torch.argmax(logits).item())  # under an exact mask, mostly the answer
        if logits[best] == -math.inf:
            return None
        if self.allows(best, budgeted):
            return best
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
