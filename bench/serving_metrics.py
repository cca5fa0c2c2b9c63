"""What one load run measured, from each streamed response's timings: the metric math alone.

Why a module of its own: the figures a reader compares (tokens/s, time to
first token, inter-token latency, request latency) are defined here once,
as pure functions of the recorded timings, so the unit tests can hold them
to hand-computed values and every benchmark reports the same thing.

Definitions (all times in seconds, all latencies from the request's
*scheduled* send time, which for a closed loop is when its client sent it
and for an open loop is its Poisson arrival, so a server that falls behind
is charged for the wait, with no coordinated omission):

- tokens/s: the completion tokens the server reported in `usage`, summed,
  over the wall time from the first scheduled send to the last response's
  end. A response without `usage` is an error (`MissingUsage`): counting
  `max_tokens` instead would credit a server for tokens it never sent.
- time to first token (TTFT): to the first chunk that carries text, over
  the responses whose text streamed (`streamed`: more than one text chunk,
  or a one-token answer). A response whose whole text comes in one chunk
  at its end has no observable first token: the random-weight models
  generate byte tokens that form no character for a long stretch, and a
  server holds such bytes back until they do (or, as `transformers serve`
  does, drops them and sends no text at all). Counting such a response's
  end as its first token would charge the server for the detokenizer's
  hold-back, not its scheduling; they are counted in `ttft_unobserved`.
- inter-token latency (ITL): the gaps between consecutive text-carrying
  chunks, pooled over all requests. A server that coalesces several tokens
  into one network write shows near-zero gaps there, so the per-request
  time per output token (TPOT: (end - first token) / (tokens - 1)) is
  reported beside it, which chunking cannot change.
- request latency: to the end of the response.
Percentiles are nearest-rank (the smallest value with at least q of the
values at or below it), so p99 of 10 values is their maximum.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


class MissingUsage(RuntimeError):
    """A response carried no `usage`: its tokens cannot be counted, and the run fails."""


@dataclass
class ResponseRecord:
    """One request as the client saw it: when it was due, what came back and when."""

    index: int
    scheduled: float  # when the request was due to be sent (perf_counter seconds)
    sent: float = math.nan
    chunk_times: list[float] = field(default_factory=list)  # text-carrying chunks' arrivals
    finished: float = math.nan
    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: str | None = None

    def streamed(self) -> bool:
        """Whether the time to first token is observable (see the module's docstring)."""
        if not self.chunk_times:
            return False
        return len(self.chunk_times) > 1 or self.completion_tokens == 1

    def to_json(self) -> dict[str, Any]:
        """What a result file keeps of the response (times relative to its schedule)."""
        first = self.chunk_times[0] - self.scheduled if self.chunk_times else None
        return {
            "index": self.index,
            "text": self.text,
            "finish_reason": self.finish_reason,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "ttft_seconds": first,
            "text_chunks": len(self.chunk_times),
            "latency_seconds": self.finished - self.scheduled,
            "error": self.error,
        }


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank q-quantile (0 < q <= 1) of `values`; NaN when there are none."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def _p50_p99(values: Sequence[float]) -> dict[str, float]:
    return {"p50": percentile(values, 0.5), "p99": percentile(values, 0.99)}


def summarize(records: Sequence[ResponseRecord]) -> dict[str, Any]:
    """The run's figures; raises MissingUsage when a finished response lacks `usage`."""
    failed = [record for record in records if record.error is not None]
    done = [record for record in records if record.error is None]
    missing = [record.index for record in done if record.completion_tokens is None]
    if missing:
        raise MissingUsage(f"responses {missing[:10]} carry no usage.completion_tokens")
    tokens = sum(record.completion_tokens or 0 for record in done)
    start = min((record.scheduled for record in records), default=math.nan)
    end = max((record.finished for record in done), default=math.nan)
    wall = end - start
    ttft = [record.chunk_times[0] - record.scheduled for record in done if record.streamed()]
    gaps = [
        later - earlier
        for record in done
        for earlier, later in zip(record.chunk_times, record.chunk_times[1:], strict=False)
    ]
    tpot = [
        (record.finished - record.chunk_times[0]) / (record.completion_tokens - 1)
        for record in done
        if record.streamed() and record.completion_tokens and record.completion_tokens > 1
    ]
    return {
        "requests": len(records),
        "errors": len(failed),
        "first_error": failed[0].error if failed else None,
        "completion_tokens": tokens,
        "seconds": wall,
        "tokens_per_second": tokens / wall if done and wall > 0 else 0.0,
        "ttft_seconds": _p50_p99(ttft),
        "ttft_unobserved": len(done) - len(ttft),
        "itl_seconds": _p50_p99(gaps),
        "tpot_seconds": _p50_p99(tpot),
        "latency_seconds": _p50_p99([record.finished - record.scheduled for record in done]),
        "finish_reasons": {
            reason: sum(1 for record in done if record.finish_reason == reason)
            for reason in sorted({str(record.finish_reason) for record in done})
        },
    }
