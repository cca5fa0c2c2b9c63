"""Quality sampling: a share of responses is checked, and the failure ratio exported.

Why: a model can keep answering fast and still answer badly (a corrupted
swap, a wrong variant). The operator's quality breaker needs a failure
ratio; the server computes it on a `sampleRate` share of responses, chosen
by an even spread over the response count. A sampled response fails when
JSON was asked for (`response_format`) and the text is not valid JSON, when
output/input tokens exceed `maxOutputInputRatio`, or when it contains one of
the `blockedTerms` (case-insensitive). The three come from `--quality-file`,
which the running server re-reads (live_files.py): an edit of the spec's
`breaker.quality` reaches it without a restart.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass

from fusebox_server.config import QualitySettings


@dataclass(frozen=True)
class QualityVerdict:
    ok: bool
    reasons: tuple[str, ...]


def check_response(
    text: str,
    wants_json: bool,
    input_tokens: int,
    output_tokens: int,
    settings: QualitySettings,
) -> QualityVerdict:
    reasons: list[str] = []
    if wants_json:
        try:
            json.loads(text)
        except ValueError:
            reasons.append("invalid_json")
    if input_tokens > 0 and output_tokens / input_tokens > settings.max_output_input_ratio:
        reasons.append("output_input_ratio")
    lowered = text.lower()
    if any(term.lower() in lowered for term in settings.blocked_terms if term):
        reasons.append("blocked_term")
    return QualityVerdict(ok=not reasons, reasons=tuple(reasons))


class QualitySampler:
    """Chooses which responses to check and keeps the failure ratio over a window."""

    def __init__(self, window_seconds: float) -> None:
        self.window_seconds = window_seconds
        self.sampled_total = 0
        self.failed_total = 0
        self._responses = 0
        self._window: deque[tuple[float, bool]] = deque(maxlen=100_000)
        self._lock = threading.Lock()

    def should_sample(self, sample_rate: float) -> bool:
        """Whether this response is checked: an even spread at the rate now in force."""
        with self._lock:
            index = self._responses
            self._responses += 1
        return int((index + 1) * sample_rate) > int(index * sample_rate)

    def record(self, verdict: QualityVerdict, now: float | None = None) -> None:
        with self._lock:
            self.sampled_total += 1
            if not verdict.ok:
                self.failed_total += 1
            # The monotonic clock, as LatencyWindow's: a wall-clock step back would
            # keep old verdicts in the window for as long as the step.
            self._window.append((time.monotonic() if now is None else now, verdict.ok))

    def failure_ratio(self, now: float | None = None) -> float | None:
        cutoff = (time.monotonic() if now is None else now) - self.window_seconds
        with self._lock:
            while self._window and self._window[0][0] < cutoff:
                self._window.popleft()
            if not self._window:
                return None
            failed = sum(1 for _, ok in self._window if not ok)
            return failed / len(self._window)
