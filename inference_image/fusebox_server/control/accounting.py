"""Request accounting: each API request gets exactly one outcome, counted in one place.

Why: the outcome used to be counted where each refusal happened, and a 429
or a 504 passed two such places (counted twice, so the operator's latency
breaker saw calls that never happened). Now a generation request carries a
`RequestRecord` from its first byte to its last; whatever ended it (an
exception class, or nothing) is stored on it, and the HTTP edge settles it
once, when the response is over. The outcome is a function of the error's
class alone (`outcome_of`). Settling also writes the one `request` log line.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import structlog

from fusebox_contract.names import RequestOutcome
from fusebox_server.errors import (
    ClientDisconnected,
    GenerationFailed,
    MemoryExhausted,
    ServerError,
)

log = structlog.get_logger("fusebox_server.requests")


def outcome_of(error: BaseException | None) -> RequestOutcome:
    """429/503 rejected, 504 timed out, other 4xx invalid, 5xx (and any bug) failed.

    A 503 for a failed allocation is failed, not rejected: the server took the request on.
    """
    if error is None:
        return RequestOutcome.SUCCEEDED
    if isinstance(error, ClientDisconnected):
        return RequestOutcome.CANCELLED
    if isinstance(error, GenerationFailed | MemoryExhausted) or not isinstance(error, ServerError):
        return RequestOutcome.FAILED
    if error.status in (429, 503):
        return RequestOutcome.REJECTED
    if error.status == 504:
        return RequestOutcome.TIMED_OUT
    if 400 <= error.status < 500:
        return RequestOutcome.INVALID
    return RequestOutcome.FAILED


def status_of(error: BaseException | None) -> int:
    if error is None:
        return 200
    return error.status if isinstance(error, ServerError) else 500


@dataclass
class RequestRecord:
    """One API request's bookkeeping, filled in as it goes and settled once at the end."""

    request_id: str
    endpoint: str
    arrival_monotonic: float = field(default_factory=time.monotonic)
    error: BaseException | None = None
    fields: dict[str, Any] = field(default_factory=dict)  # extra log fields
    settled: RequestOutcome | None = None

    def fail(self, error: BaseException) -> None:
        """Remember what ended the request (the first cause wins)."""
        if self.error is None:
            self.error = error


class RequestAccounting:
    """Counts per outcome; thread-safe (the stats thread reads the totals)."""

    def __init__(self) -> None:
        self._counts = dict.fromkeys(RequestOutcome, 0)
        self._lock = threading.Lock()

    def settle(self, record: RequestRecord, **log_fields: Any) -> RequestOutcome:
        """Count the record's outcome and log its line; a second call changes nothing."""
        if record.settled is not None:
            return record.settled
        outcome = outcome_of(record.error)
        record.settled = outcome
        with self._lock:
            self._counts[outcome] += 1
        error = record.error
        log.info(
            "request",
            request_id=record.request_id,
            endpoint=record.endpoint,
            status=status_of(error),
            outcome=outcome.value,
            error=(error.code if isinstance(error, ServerError) else repr(error))
            if error
            else None,
            latency_seconds=round(time.monotonic() - record.arrival_monotonic, 6),
            **{**record.fields, **log_fields},
        )
        return outcome

    def totals(self) -> dict[RequestOutcome, int]:
        with self._lock:
            return dict(self._counts)
