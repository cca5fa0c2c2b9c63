"""What a finished generation leaves behind: tokens spent, latency, a quality sample.

Why: the HTTP layer knows when a generation ends and what it produced; the
control layer owns the counters that the stats file, the sidecar and the
operator's breakers read. One call hands the outcome over, so a route never
reaches into the runtime's windows and samplers, and what a response counts
toward is decided here, once: every generation that ran spends its tokens,
only a success adds latency and may be sampled for quality.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fusebox_contract.names import LatencyMetric
from fusebox_server.control.live_files import LiveSettings
from fusebox_server.control.quality import QualitySampler, QualityVerdict, check_response
from fusebox_server.control.stats import LatencyWindow, TokenCounter


@dataclass(frozen=True)
class GenerationOutcome:
    """One generation as the route saw it end."""

    prompt_tokens: int
    completion_tokens: int
    succeeded: bool
    e2e_seconds: float
    ttft_seconds: float | None = None  # None: no token was sent
    itl_seconds: Sequence[float] = ()
    text_parts: Sequence[str] = ()  # joined only when the response is sampled
    wants_json: bool = False


class Recorder:
    """Counts each finished generation into the runtime's tokens, latency and quality."""

    def __init__(
        self,
        tokens: TokenCounter,
        latency: Mapping[LatencyMetric, LatencyWindow],
        quality: QualitySampler,
        live: LiveSettings,
    ) -> None:
        self.tokens = tokens
        self.latency = latency
        self.quality = quality
        self.live = live

    def finished(self, outcome: GenerationOutcome) -> QualityVerdict | None:
        """Count one generation; the quality verdict when it was sampled, else None."""
        if outcome.completion_tokens > 0:  # the model read the prompt: its tokens were spent
            self.tokens.add(outcome.prompt_tokens, outcome.completion_tokens)
        if not outcome.succeeded:
            return None
        if outcome.ttft_seconds is not None:
            self.latency[LatencyMetric.TTFT].add(outcome.ttft_seconds)
        self.latency[LatencyMetric.E2E].add(outcome.e2e_seconds)
        self.latency[LatencyMetric.ITL].add_many(list(outcome.itl_seconds))
        return self._sample_quality(outcome)

    def _sample_quality(self, outcome: GenerationOutcome) -> QualityVerdict | None:
        settings = self.live.quality  # one read: the file may be swapped meanwhile
        if not self.quality.should_sample(settings.sample_rate):
            return None
        verdict = check_response(
            "".join(outcome.text_parts),
            outcome.wants_json,
            outcome.prompt_tokens,
            outcome.completion_tokens,
            settings,
        )
        self.quality.record(verdict)
        return verdict
