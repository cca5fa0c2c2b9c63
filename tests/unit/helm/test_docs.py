"""The runbook covers what a user can see: every sidecar metric, every
condition and every event the operator can post."""

from __future__ import annotations

import re

from fusebox_operator import status

from .conftest import REPO

RUNBOOK = (REPO / "docs" / "runbook.md").read_text()


def test_runbook_explains_every_documented_sidecar_metric() -> None:
    metrics_doc = (REPO / "docs" / "metrics.md").read_text()
    # Metric names as they appear in the metric tables (first column).
    documented = set(re.findall(r"^\| `(fusebox_[a-z0-9_]+)", metrics_doc, flags=re.MULTILINE))
    assert len(documented) > 20
    missing = sorted(name for name in documented if name not in RUNBOOK)
    assert missing == []


def test_runbook_explains_every_condition_and_event() -> None:
    conditions = {*status.CONDITION_TYPES, "InvalidSpec"}
    events = {reason for reasons in status.ACTION_EVENT_REASONS.values() for reason in reasons}
    events |= {
        "BreakerOpened",
        "BreakerHalfOpen",
        "BreakerClosed",
        "Degraded",
        "Recovered",
        "TelemetryStale",
        "MemorySized",
        "InvalidSpec",
    }
    missing = sorted(name for name in conditions | events if f"`{name}`" not in RUNBOOK)
    assert missing == []
