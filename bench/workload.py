"""The realistic serving workload: one definition, seeded, that every server benchmark sends.

Why: the first benchmarks sent six ~20-token prompts, identical across
rounds and servers, for 32 or 64 new tokens. That shape flatters a server
whose cost is per step and hides what real chat traffic costs: long and
varied prompts (prefill), long answers, and a long system prompt that many
requests share (issue 34). This module says what is sent and when; it does
no I/O beyond reading the bundled corpus, needs no network and no torch, and
the same seed always gives the same requests, so two servers (or two runs)
are measured on identical traffic.

- Prompts: 256-2,048 tokens (uniform), lines drawn with replacement from a
  fixed local corpus: the tiny model's English and Chinese text
  (`fusebox_server/model/corpus`) and a code file (`bench/corpus/code.txt`);
  each request is one kind (English, Chinese or code, weights 2:1:1).
- 30% of requests (exactly round(0.3 n), chosen by the seed) carry one
  shared ~1,000-token system prompt; their user message is drawn so that
  system plus user stays within the prompt range.
- Output lengths 64-512 tokens (uniform), sent as `max_tokens`.
- Arrivals: closed-loop (N clients, each sends its next request when its
  last one ends) needs no schedule; open-loop arrivals are a Poisson process
  at a fixed rate (`poisson_arrivals`), and latency is measured from each
  request's scheduled time, so a slow server cannot slow the arrivals down
  (no coordinated omission).

`WorkloadShape.scaled(factor)` divides every length by `factor`, for a
machine where the full shape would take too long; a result must say the
factor it ran with.

Token counts come from the caller's `count_tokens` (the served model's
tokenizer), so "1,000 tokens" means 1,000 of that model's tokens, before
its chat template adds its few.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODEL_CORPUS = HERE.parent / "inference_image" / "fusebox_server" / "model" / "corpus"
CORPUS_FILES = {
    "english": MODEL_CORPUS / "english.txt",
    "chinese": MODEL_CORPUS / "chinese.txt",
    "code": HERE / "corpus" / "code.txt",
}
KIND_WEIGHTS = {"english": 2.0, "chinese": 1.0, "code": 1.0}
# The shared system prompt is written in the language of instructions.
SYSTEM_PROMPT_KIND = "english"

CountTokens = Callable[[str], int]


@dataclass(frozen=True)
class WorkloadShape:
    """The lengths of a workload, in the served model's tokens (both bounds inclusive)."""

    prompt_tokens: tuple[int, int] = (256, 2048)
    output_tokens: tuple[int, int] = (64, 512)
    system_prompt_tokens: int = 1000
    system_prompt_share: float = 0.3
    scale: int = 1  # every length above is the full shape's divided by this

    def scaled(self, factor: int) -> WorkloadShape:
        """The same shape with every length divided by `factor` (the share is kept)."""
        if factor < 1:
            raise ValueError(f"a scale factor is a positive integer, not {factor}")

        def cut(bounds: tuple[int, int]) -> tuple[int, int]:
            return max(1, bounds[0] // factor), max(1, bounds[1] // factor)

        return WorkloadShape(
            prompt_tokens=cut(self.prompt_tokens),
            output_tokens=cut(self.output_tokens),
            system_prompt_tokens=max(1, self.system_prompt_tokens // factor),
            system_prompt_share=self.system_prompt_share,
            scale=self.scale * factor,
        )


@dataclass(frozen=True)
class WorkloadRequest:
    """One request of a workload: its chat messages and how many tokens it asks for."""

    index: int
    kind: str
    system: str | None
    user: str
    prompt_tokens: int  # system + user, counted by the model's tokenizer, before the template
    max_tokens: int

    def messages(self) -> list[dict[str, str]]:
        turns = [{"role": "system", "content": self.system}] if self.system is not None else []
        return [*turns, {"role": "user", "content": self.user}]


@dataclass(frozen=True)
class Workload:
    shape: WorkloadShape
    seed: int
    system_prompt: str
    requests: tuple[WorkloadRequest, ...] = field(default_factory=tuple)

    def describe(self) -> dict[str, object]:
        """What a result file records about the traffic it measured."""
        shared = sum(1 for request in self.requests if request.system is not None)
        return {
            "requests": len(self.requests),
            "seed": self.seed,
            "scale": self.shape.scale,
            "prompt_tokens_range": list(self.shape.prompt_tokens),
            "output_tokens_range": list(self.shape.output_tokens),
            "system_prompt_tokens": self.shape.system_prompt_tokens,
            "system_prompt_share": shared / len(self.requests) if self.requests else 0.0,
            "prompt_tokens_total": sum(request.prompt_tokens for request in self.requests),
            "max_tokens_total": sum(request.max_tokens for request in self.requests),
            "kinds": {
                kind: sum(1 for request in self.requests if request.kind == kind)
                for kind in KIND_WEIGHTS
            },
        }


def corpus_lines(files: dict[str, Path] | None = None) -> dict[str, list[str]]:
    """The corpus's non-empty lines, by kind."""
    lines = {}
    for kind, path in (files or CORPUS_FILES).items():
        lines[kind] = [line for line in path.read_text(encoding="utf-8").splitlines() if line]
    return lines


class _TextOfLength:
    """Builds texts of a given token count from one kind's lines; counts each line once."""

    def __init__(self, lines: Sequence[str], count_tokens: CountTokens) -> None:
        self._lines = list(lines)
        self._count = count_tokens
        self._counts = [count_tokens(line + "\n") for line in self._lines]

    def make(self, tokens: int, rng: random.Random) -> str:
        """Whole lines while they fit, then the prefix of one more that fills the rest.

        Token counts of joined lines are close to the sum of their counts (the
        tokenizers split at newlines), so the text lands within a token or two.
        """
        parts: list[str] = []
        used = 0
        while used < tokens:
            pick = rng.randrange(len(self._lines))
            if used + self._counts[pick] <= tokens:
                parts.append(self._lines[pick] + "\n")
                used += self._counts[pick]
                continue
            parts.append(self._prefix(self._lines[pick], tokens - used))
            break
        return "".join(parts)

    def _prefix(self, line: str, tokens: int) -> str:
        """The longest prefix of `line` (in characters) of at most `tokens` tokens."""
        low, high = 0, len(line)
        while low < high:
            middle = (low + high + 1) // 2
            if self._count(line[:middle]) <= tokens:
                low = middle
            else:
                high = middle - 1
        return line[:low]


def build_workload(
    count: int,
    count_tokens: CountTokens,
    shape: WorkloadShape | None = None,
    seed: int = 34,
    lines: dict[str, list[str]] | None = None,
) -> Workload:
    """`count` requests of `shape`, the same for the same seed, tokenizer and corpus."""
    shape = shape or WorkloadShape()
    rng = random.Random(seed)
    builders = {
        kind: _TextOfLength(kind_lines, count_tokens)
        for kind, kind_lines in (lines or corpus_lines()).items()
    }
    system_prompt = builders[SYSTEM_PROMPT_KIND].make(shape.system_prompt_tokens, rng)
    system_tokens = count_tokens(system_prompt)
    shared = set(rng.sample(range(count), round(shape.system_prompt_share * count)))
    kinds = list(KIND_WEIGHTS)
    weights = [KIND_WEIGHTS[kind] for kind in kinds]
    low, high = shape.prompt_tokens
    requests = []
    for index in range(count):
        kind = rng.choices(kinds, weights)[0]
        system = system_prompt if index in shared else None
        if system is None:
            user_tokens = rng.randint(low, high)
        else:
            room = max(1, high - system_tokens)  # the user's part when system + user <= high
            user_tokens = rng.randint(min(low, room), room)
        user = builders[kind].make(user_tokens, rng)
        prompt_tokens = count_tokens(user) + (system_tokens if system is not None else 0)
        max_tokens = rng.randint(*shape.output_tokens)
        requests.append(WorkloadRequest(index, kind, system, user, prompt_tokens, max_tokens))
    return Workload(shape, seed, system_prompt, tuple(requests))


def poisson_arrivals(count: int, rate_per_second: float, seed: int = 34) -> list[float]:
    """Send times (seconds from the start) of `count` requests arriving at `rate_per_second`.

    Exponential gaps, so the arrivals are a Poisson process; the first request
    is sent at 0.
    """
    if rate_per_second <= 0:
        raise ValueError(f"an arrival rate is positive, not {rate_per_second}")
    rng = random.Random(seed)
    times = [0.0]
    for _ in range(count - 1):
        times.append(times[-1] + rng.expovariate(rate_per_second))
    return times[:count]
