"""Suite-wide rules: every test is marked with its tier from the folder it
lives in (so `pytest -m unit` and the Makefile's tier targets select by
directory), and no test may skip silently.

A skipped test proves nothing, and a green run that skipped it hides that.
So a skip fails the run unless ALLOWED_SKIPS lists the test with the reason
it may skip; the run then still prints every skip with its reason.
"""

from __future__ import annotations

from fnmatch import fnmatch
from pathlib import Path

import pytest

_TIERS = ("unit", "integration", "e2e")

ALLOWED_SKIPS: dict[str, str] = {
    # "tests/tier/test_file.py::test_name": "why it may skip, and where it runs instead",
    "tests/e2e/operator/test_operator_replicas.py::test_the_acting_replica_gone_*[[]crash]": (
        "the crash is a SIGKILL of the operator's process from the node, which only a "
        "localcluster (its containers are this host's processes) allows; on another "
        "cluster the helm-upgrade variant of the same handover runs"
    ),
}
"""Node id patterns (fnmatch) of tests that may skip, each with its reason (a file
skipped while collected has the file's node id, `tests/tier/test_file.py`)."""

_skipped: list[tuple[str, str]] = []


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tests_root = Path(__file__).parent
    for item in items:
        relative = Path(str(item.path)).relative_to(tests_root)
        tier = relative.parts[0]
        if tier in _TIERS:
            item.add_marker(getattr(pytest.mark, tier))


def _record_skip(report: pytest.TestReport | pytest.CollectReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else ""
        _skipped.append((report.nodeid, reason))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _record_skip(report)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    """A file skipped while collected (`importorskip`, a module-level skip) runs none of
    its tests: it counts as a skip of its own, under the file's node id."""
    _record_skip(report)


def unlisted_skips(skipped: list[tuple[str, str]], allowed: dict[str, str]) -> list[str]:
    """The skipped node ids that no allowed pattern covers."""
    return [
        f"{nodeid}: {reason}"
        for nodeid, reason in skipped
        if not any(fnmatch(nodeid, pattern) for pattern in allowed)
    ]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    unlisted = unlisted_skips(_skipped, ALLOWED_SKIPS)
    if unlisted and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    unlisted = unlisted_skips(_skipped, ALLOWED_SKIPS)
    if unlisted:
        terminalreporter.section("skips not allowed (tests/conftest.py ALLOWED_SKIPS)", red=True)
        for line in unlisted:
            terminalreporter.write_line(line)
