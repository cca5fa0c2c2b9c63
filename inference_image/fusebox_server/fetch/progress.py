"""The fetcher's report: live progress in a file, the outcome as the termination message.

Why throttled and atomic: the file is read by another process at any moment
(a rename never shows half a document), and a download of many small files
would otherwise rewrite it thousands of times a second.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from fusebox_contract.model_fetch import FetchReason, FetchReport

WRITE_INTERVAL_SECONDS = 1.0


class Progress:
    """Counts bytes against a total and writes `FetchReport`s.

    `clock` is injected so tests can drive the rate without sleeping.
    """

    def __init__(
        self,
        report_file: Path | None,
        termination_log: Path | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._report_file = report_file
        self._termination_log = termination_log
        self._clock = clock
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
        if self._termination_log is not None:
            try:
                self._termination_log.write_text(report.dumps())
            except OSError:
                pass  # no termination log (run by hand): the report file and stdout say it
        print(report.dumps(), flush=True)

    def _write(self, report: FetchReport, force: bool = False) -> None:
        now = self._clock()
        if self._report_file is None or (
            not force and now - self._last_write < WRITE_INTERVAL_SECONDS
        ):
            return
        self._last_write = now
        temporary = self._report_file.with_name(self._report_file.name + ".tmp")
        try:
            temporary.write_text(report.dumps())
            os.replace(temporary, self._report_file)
        except OSError:
            pass  # a full or missing runtime dir must not fail the download
