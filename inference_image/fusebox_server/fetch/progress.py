"""The fetcher's report: live progress in a file, the outcome as the termination message.

Why throttled and atomic: the file is read by another process at any moment
(a rename never shows half a document), and a download of many small files
would otherwise rewrite it thousands of times a second.

Why the redaction is here: everything the fetcher says leaves through this
class (the report file, the termination message, stdout), and what it says of
a failure quotes a client library's error, which may quote a header, token and
all. The termination message becomes ModelReady's message and an event that
anyone who may read the InferenceService reads.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from fusebox_contract.model_fetch import FetchReason, FetchReport

WRITE_INTERVAL_SECONDS = 1.0
REDACTED = "<redacted>"


def secret_forms(values: Iterable[str]) -> list[str]:
    """Each secret as a message may quote it: as it is, and escaped as Python's repr of
    a str or of bytes writes it (an HTTP library refusing a header value quotes it so);
    the longest first, so that no shorter form leaves part of a longer one."""
    forms: set[str] = set()
    for value in values:
        if value:
            forms |= {value, repr(value)[1:-1], repr(value.encode())[2:-1]}
    return sorted((form for form in forms if form), key=len, reverse=True)


def redact(text: str, secrets: Sequence[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return text


class Progress:
    """Counts bytes against a total and writes `FetchReport`s.

    `clock` is injected so tests can drive the rate without sleeping; `secrets`
    (secret_forms) never appear in what it writes.
    """

    def __init__(
        self,
        report_file: Path | None,
        termination_log: Path | None,
        clock: Callable[[], float] = time.monotonic,
        secrets: Sequence[str] = (),
    ) -> None:
        self._report_file = report_file
        self._termination_log = termination_log
        self._clock = clock
        self._secrets = tuple(secrets)
        self._started = clock()
        self._last_write = -float("inf")
        self.bytes_done = 0
        self.bytes_total: int | None = None
        self.files = 0
        self._fresh_bytes = 0  # downloaded by this run (resumed bytes do not count in the rate)

    def start(self, bytes_total: int, files: int, already: int = 0) -> None:
        self.bytes_total = bytes_total
        self.files = files
        self.bytes_done = already
        self._write(self._downloading(), force=True)

    def add(self, count: int) -> None:
        self.bytes_done += count
        self._fresh_bytes += count
        self._write(self._downloading())

    def rate(self) -> float | None:
        """Bytes per second this run downloaded; None before it downloaded any."""
        elapsed = self._clock() - self._started
        return self._fresh_bytes / elapsed if elapsed > 0 and self._fresh_bytes else None

    def _downloading(self) -> FetchReport:
        total = f" of {self.bytes_total}" if self.bytes_total is not None else ""
        return FetchReport(
            FetchReason.DOWNLOADING,
            f"{self.bytes_done}{total} bytes in {self.files} file(s)",
            self.bytes_done,
            self.bytes_total,
            self.rate(),
            files=self.files,
        )

    def waiting(self, message: str) -> None:
        """A Downloading report that waits for another pod's download (the shared
        cache's lock), written at each look so its age says the waiter is alive."""
        report = self._downloading()
        self._write(
            FetchReport(
                report.reason,
                message,
                report.bytes_done,
                report.bytes_total,
                report.rate_bytes_per_second,
                files=report.files,
                waiting=True,
            ),
            force=True,
        )

    def finish(self, report: FetchReport) -> None:
        """The outcome: to the report file and, once, to the termination log."""
        self._write(report, force=True)
        text = self._public(report)
        if self._termination_log is not None:
            try:
                self._termination_log.write_text(text)
            except OSError:
                pass  # no termination log (run by hand): the report file and stdout say it
        print(text, flush=True)

    def trace(self, text: str) -> None:
        """A traceback (a bug, not a named failure) to stderr, credentials redacted."""
        print(redact(text, self._secrets), file=sys.stderr, flush=True)

    def _public(self, report: FetchReport) -> str:
        """The report as it may leave the process: no credential in its message."""
        message = redact(report.message, self._secrets)
        return dataclasses.replace(report, message=message).dumps()

    def _write(self, report: FetchReport, force: bool = False) -> None:
        now = self._clock()
        if self._report_file is None or (
            not force and now - self._last_write < WRITE_INTERVAL_SECONDS
        ):
            return
        self._last_write = now
        temporary = self._report_file.with_name(self._report_file.name + ".tmp")
        try:
            temporary.write_text(self._public(report))
            os.replace(temporary, self._report_file)
        except OSError:
            pass  # a full or missing runtime dir must not fail the download
