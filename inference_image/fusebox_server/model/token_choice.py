"""What a row's logits become before its token is chosen, and how the chosen token is scored.

Why: repeat penalties, a token bias and reported log-probabilities are per
row, while a batch decodes every row in one forward pass. These pure torch
functions work on one row's last-position logits (a 1-D tensor), so both
batches (`engine.DecodeBatch`, `slot_batch.SlotBatch`) and a lone prefill
apply them the same way, and the unit tests hold them to hand-computed
values. Rows that need none of this keep the batch's one shared argmax.

Scores are of the model's raw distribution, the log-softmax of its logits
before temperature, top_p, penalties and bias (vLLM's default,
`raw_logprobs`): a caller sees what the model thought, whatever it was
then told to prefer. docs/decisions/sampling-surface.md says why.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fusebox_server.model.decode_settings import DecodeSettings, RepeatPenalties

LOGPROB_FLOOR = -9999.0
"""A log-probability below this (float32 underflow gives -inf, which JSON cannot carry) is
reported as this, as vLLM does."""


@dataclass(frozen=True)
class TokenScore:
    """A generated token's log-probability, and the most likely tokens at its position."""

    token_id: int
    logprob: float
    alternatives: tuple[tuple[int, float], ...]
    """(token id, log-probability), most likely first."""


def adjusts_logits(settings: DecodeSettings) -> bool:
    return settings.repeat_penalties.active or bool(settings.token_bias)


class RowAdjustments:
    """One row's penalties and bias, and the counts of the tokens it has generated.

    The counts are a vocabulary-wide float tensor on the row's device, made at
    the first token (the logits' width is the vocabulary), and only for a row
    with penalties.
    """

    def __init__(self, settings: DecodeSettings) -> None:
        self.penalties = settings.repeat_penalties
        self.bias = settings.token_bias
        self.counts: torch.Tensor | None = None
        self._bias_ids: torch.Tensor | None = None
        self._bias_values: torch.Tensor | None = None

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """The row's logits (float32) with its penalties and bias applied; a new tensor."""
        adjusted = logits.float()
        if self.penalties.active and self.counts is not None:
            adjusted = penalised(adjusted, self.counts, self.penalties)
        if self.bias:
            if self._bias_ids is None or self._bias_values is None:
                self._bias_ids, self._bias_values = bias_tensors(
                    self.bias, logits.shape[-1], logits.device
                )
            adjusted = adjusted.index_add(0, self._bias_ids, self._bias_values)
        return adjusted

    def took(self, token_id: int, vocabulary: int, device: torch.device) -> None:
        """Count a generated token (only penalties read the counts)."""
        if not self.penalties.active:
            return
        if self.counts is None:
            self.counts = torch.zeros(vocabulary, dtype=torch.float32, device=device)
        self.counts[token_id] += 1


def penalised(
    logits: torch.Tensor, counts: torch.Tensor, penalties: RepeatPenalties
) -> torch.Tensor:
    """The presence and frequency penalties over the generated tokens' counts."""
    seen = (counts > 0).to(logits.dtype)
    return logits - penalties.frequency * counts - penalties.presence * seen


def bias_tensors(
    bias: tuple[tuple[int, float], ...], vocabulary: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The bias as (ids, amounts) tensors; an id outside the logits is a ValueError.

    The HTTP layer refuses such ids with a 400 first; this keeps an indexing
    error (on CUDA a device-side assert that poisons the process) from ever
    reaching the device.
    """
    outside = [token for token, _ in bias if not 0 <= token < vocabulary]
    if outside:
        raise ValueError(f"token ids {outside} are outside the vocabulary of {vocabulary}")
    ids = torch.tensor([token for token, _ in bias], dtype=torch.long, device=device)
    amounts = torch.tensor([amount for _, amount in bias], dtype=torch.float32, device=device)
    return ids, amounts


def score_token(logits: torch.Tensor, token_id: int, alternatives: int) -> TokenScore:
    """The token's log-probability under the raw logits, and the `alternatives` most likely
    tokens; one transfer from the device."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = logprobs[token_id].reshape(1)
    if alternatives > 0:
        values, ids = torch.topk(logprobs, min(alternatives, logprobs.shape[-1]))
        both = torch.cat([chosen, values]).tolist()
        top_ids = ids.tolist()
    else:
        both, top_ids = chosen.tolist(), []
    floor = [max(value, LOGPROB_FLOOR) for value in both]
    return TokenScore(token_id, floor[0], tuple(zip(top_ids, floor[1:], strict=True)))
