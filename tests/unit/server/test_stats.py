"""The stats file's helpers: atomic writes and sliding-window percentiles."""

from __future__ import annotations

import json
from pathlib import Path

from fusebox_server.stats import LatencyWindow, percentile, write_atomically


def test_write_atomically_replaces_the_file_and_leaves_no_temporaries(tmp_path: Path) -> None:
    target = tmp_path / "run" / "stats.json"
    write_atomically(target, {"schema": 1, "n": 1})
    write_atomically(target, {"schema": 1, "n": 2})
    assert json.loads(target.read_text()) == {"schema": 1, "n": 2}
    assert [p.name for p in target.parent.iterdir()] == ["stats.json"]


def test_percentiles_use_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile([3.0], 0.99) == 3.0


def test_the_window_forgets_old_samples() -> None:
    window = LatencyWindow(window_seconds=60)
    assert window.summary(now=100) is None
    window.add(0.5, now=100)
    window.add_many([0.1, 0.2], now=130)
    assert window.summary(now=140) == {"p50": 0.2, "p99": 0.5, "count": 3}
    assert window.summary(now=175) == {"p50": 0.1, "p99": 0.2, "count": 2}
    assert window.summary(now=200) is None
