"""A stats file gone wrong cannot mint Prometheus series without bound: each label
value taken from the file is bounded (cardinality.py). Driven through the real
observer and real stats files, scraped as Prometheus would; the log is read to
show that a dropped value is warned about once, not at every scrape."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client.registry import CollectorRegistry

from fusebox_contract.metrics import Metric
from fusebox_contract.stats import GpuMemory, StatsDocument, dumps
from fusebox_sidecar.cardinality import (
    MAX_RELAYED_GPUS,
    MAX_TEXT_LABEL_VALUES,
    TEXT_LABEL_WINDOW_SECONDS,
    TextField,
)
from fusebox_sidecar.collectors import SidecarCollector
from fusebox_sidecar.nvml import NvmlReader
from fusebox_sidecar.observer import ServerObserver

SCRAPE_INTERVAL_SECONDS = 15.0
GPU_WARNING = "the stats file names GPU indices no node has; their figures are dropped"
TEXT_WARNING = "a stats file text changes too often to be a label; new values are withheld"

# Where each text field shows: the family and its label.
EXPORTED_AS = {
    TextField.MODEL_NAME: (Metric.MODEL_INFO, "model"),
    TextField.MODEL_REVISION: (Metric.MODEL_INFO, "revision"),
    TextField.FALLBACK_UNAVAILABLE_REASON: (Metric.FALLBACK_UNAVAILABLE_INFO, "reason"),
}


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Sidecar:
    """A real observer over a stats file written here, on a monotonic clock the test
    moves one scrape interval per scrape."""

    def __init__(self, tmp_path: Path) -> None:
        self.path = tmp_path / "stats.json"
        self.monotonic = Clock(1000.0)
        self._observer = ServerObserver(
            self.path, tmp_path / "proc", NvmlReader(None), Clock(2e9), self.monotonic
        )

    def scrape(self, document: StatsDocument) -> CollectorRegistry:
        self.path.write_text(dumps(document))
        self.monotonic.now += SCRAPE_INTERVAL_SECONDS
        observation = self._observer.observe()
        registry = CollectorRegistry()
        registry.register(SidecarCollector(lambda: observation))
        return registry


def _labels(registry: CollectorRegistry, metric: Metric, label: str) -> list[str]:
    return [
        sample.labels[label]
        for family in registry.collect()
        if family.name == metric.value
        for sample in family.samples
    ]


def _with_text(document: StatsDocument, field: TextField, value: str) -> StatsDocument:
    if field is TextField.MODEL_NAME:
        return replace(document, model_name=value)
    if field is TextField.MODEL_REVISION:
        return replace(document, state=replace(document.state, model_revision=value))
    return replace(document, state=replace(document.state, fallback_unavailable_reason=value))


def _warnings(caplog: pytest.LogCaptureFixture, message: str) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.getMessage() == message]


def test_gpu_indices_no_node_has_are_dropped_and_warned_about_once_not_per_scrape(
    tmp_path: Path, stats_document: StatsDocument, caplog: pytest.LogCaptureFixture
) -> None:
    sidecar = Sidecar(tmp_path)
    seen: set[str] = set()

    with caplog.at_level(logging.WARNING):
        for write in range(6):
            # A broken server names new indices at every write, around the real GPU 0.
            named = (0, *range(100 + 50 * write, 150 + 50 * write))
            document = replace(
                stats_document,
                nvml=tuple(GpuMemory(index, 1.0 + index, 80.0) for index in named),
            )
            seen.update(_labels(sidecar.scrape(document), Metric.GPU_MEMORY_USED_BYTES, "gpu"))

    assert seen == {"0"}
    warned = _warnings(caplog, GPU_WARNING)
    assert len(warned) == 1
    assert getattr(warned[0], "problem", "") == (
        f"50 nvml entries with an index outside 0..{MAX_RELAYED_GPUS - 1}, "
        "such as 100, 101, 102, 103, 104"
    )


def test_a_gpu_index_problem_that_comes_back_after_an_hour_is_warned_about_again(
    tmp_path: Path, stats_document: StatsDocument, caplog: pytest.LogCaptureFixture
) -> None:
    sidecar = Sidecar(tmp_path)
    broken = replace(stats_document, nvml=(GpuMemory(MAX_RELAYED_GPUS, 1.0, 2.0),))

    with caplog.at_level(logging.WARNING):
        sidecar.scrape(broken)
        sidecar.scrape(stats_document)  # flapping between good and bad: still one warning
        sidecar.scrape(broken)
        assert len(_warnings(caplog, GPU_WARNING)) == 1
        sidecar.monotonic.now += TEXT_LABEL_WINDOW_SECONDS
        sidecar.scrape(broken)

    assert len(_warnings(caplog, GPU_WARNING)) == 2


@pytest.mark.parametrize("field", list(TextField), ids=lambda field: field.value)
def test_a_text_that_changes_at_every_write_takes_a_bounded_number_of_label_values(
    tmp_path: Path,
    stats_document: StatsDocument,
    caplog: pytest.LogCaptureFixture,
    field: TextField,
) -> None:
    sidecar = Sidecar(tmp_path)
    metric, label = EXPORTED_AS[field]
    exported: list[list[str]] = []

    with caplog.at_level(logging.WARNING):
        for write in range(3 * MAX_TEXT_LABEL_VALUES):
            registry = sidecar.scrape(_with_text(stats_document, field, f"value-{write}"))
            exported.append(_labels(registry, metric, label))
        # The first value (the real one, before the file went wrong) is still exported.
        again = sidecar.scrape(_with_text(stats_document, field, "value-0"))
        first_again = _labels(again, metric, label)

    admitted = [[f"value-{write}"] for write in range(MAX_TEXT_LABEL_VALUES)]
    # Withheld: an unknown fact in fusebox_model_info (""), no reason series at all.
    withheld = [""] if metric is Metric.MODEL_INFO else []
    assert exported == admitted + [withheld] * (2 * MAX_TEXT_LABEL_VALUES)
    assert first_again == ["value-0"]
    warned = _warnings(caplog, TEXT_WARNING)
    assert [getattr(record, "field", "") for record in warned] == [field.value]


def test_a_new_text_is_exported_again_once_the_old_ones_went_unseen_for_an_hour(
    tmp_path: Path, stats_document: StatsDocument
) -> None:
    sidecar = Sidecar(tmp_path)
    for write in range(MAX_TEXT_LABEL_VALUES + 1):
        registry = sidecar.scrape(replace(stats_document, model_name=f"model-{write}"))
    assert _labels(registry, Metric.MODEL_INFO, "model") == [""]

    sidecar.monotonic.now += TEXT_LABEL_WINDOW_SECONDS
    registry = sidecar.scrape(replace(stats_document, model_name="chat"))

    assert _labels(registry, Metric.MODEL_INFO, "model") == ["chat"]
