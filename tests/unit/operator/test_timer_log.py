"""kopf's per-wake-up "Timer ... succeeded." line is dropped for every telemetry timer.

Why: the timers wake every service every second or 2.5 s, and a line per wake-up says
nothing; the coarse timer's line (the default interval's) escaped the filter that named
only the first timer. A failure and other handlers' lines stay.
"""

from __future__ import annotations

import logging

import kopf
import pytest

from fusebox_operator import handlers
from fusebox_operator.__main__ import TimerTickFilter


def registered_timers() -> list[str]:
    """The timers kopf runs for each service, as kopf names them in its log lines."""
    # kopf has no public listing of registered timers; its registry's own collection is read.
    registry = kopf.get_default_registry()
    return sorted(str(handler) for handler in registry._spawning.get_all_handlers())


@pytest.fixture
def operator_log() -> tuple[logging.Logger, list[str]]:
    """A logger filtered as `python -m fusebox_operator` filters kopf.objects, recording
    what reaches its handlers."""
    logger = logging.getLogger("test.kopf.objects")
    logger.filters.clear()
    logger.handlers.clear()
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    logger.addFilter(TimerTickFilter(handlers.TELEMETRY_TIMER_IDS))
    written: list[str] = []

    class Recorder(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            written.append(record.getMessage())

    logger.addHandler(Recorder())
    return logger, written


def test_every_registered_timer_is_named_in_the_filter() -> None:
    timers = registered_timers()
    assert timers == sorted(f"Timer {i!r}" for i in handlers.TELEMETRY_TIMER_IDS)
    assert len(timers) == 2


def test_no_timer_success_line_is_written(
    operator_log: tuple[logging.Logger, list[str]],
) -> None:
    logger, written = operator_log
    for timer in registered_timers():
        logger.info(f"{timer} succeeded.")
    assert written == []


def test_failures_and_other_handlers_lines_are_still_written(
    operator_log: tuple[logging.Logger, list[str]],
) -> None:
    logger, written = operator_log
    kept = [
        "Timer 'telemetry-coarse' failed with an exception. Will retry.",
        "Handler 'reconcile' succeeded.",
        "Timer 'telemetry-coarse' succeeded. (and more)",
    ]
    for line in kept:
        logger.info(line)
    assert written == kept
