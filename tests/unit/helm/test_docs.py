"""The runbook covers what a user can see: every sidecar metric, every
condition and every event the operator can post."""

from __future__ import annotations

import re

from fusebox_contract.names import ConditionType, EventReason

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
    names = {*ConditionType, *EventReason}
    missing = sorted(name.value for name in names if f"`{name.value}`" not in RUNBOOK)
    assert missing == []
