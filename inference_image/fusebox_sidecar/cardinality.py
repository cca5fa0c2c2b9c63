"""Bounds on the label values the server's stats file can put into the sidecar's series.

Every distinct label value is a Prometheus series, which Prometheus keeps for
hours after the last scrape that carried it. The server writes the stats file,
so a bug there or a corrupted file could otherwise mint any number of series
from one pod: a list of ten thousand GPU indices, or a model name that changes
at every write. The contract's parser checks types and lengths; which values
may become labels is the sidecar's to bound, here:

- GPU indices the sidecar relays from the file (only when its own NVML cannot
  vouch for the devices) must be NVML indices of one node, 0 to
  `MAX_RELAYED_GPUS - 1`. That bounds the `gpu` label to `MAX_RELAYED_GPUS`
  values for the pod's whole life, not only per scrape. Pure: the collectors
  drop the others and the observer logs them.
- The free-text labels (the model's name and revision, the reason the fallback
  is unavailable) take at most `MAX_TEXT_LABEL_VALUES` distinct values within
  any `TEXT_LABEL_WINDOW_SECONDS`; a new value beyond that is withheld (absent)
  until an older one has gone unseen that long. The server writes one value of
  each per run, so only a file gone wrong meets the bound. Stateful, so the
  observer keeps one `TextLabelBudget`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from fusebox_contract.stats import GpuMemory, StatsDocument

MAX_RELAYED_GPUS: Final = 16
"""GPU indices relayed from the stats file run from 0 to this minus 1: NVML numbers a
node's devices from 0, and no node Fusebox runs on has more than 16."""

MAX_TEXT_LABEL_VALUES: Final = 4
"""Distinct values a free-text label may take within `TEXT_LABEL_WINDOW_SECONDS`."""

TEXT_LABEL_WINDOW_SECONDS: Final = 3600.0
"""An hour: a value unseen for this long no longer counts against the bound (Prometheus
has marked its series stale long before)."""

_REFUSED_EXAMPLES: Final = 5  # indices a log line names; the count says how many more


@dataclass(frozen=True)
class RelayedGpus:
    """The stats file's GPU entries split into those that may become `gpu` labels and
    those that may not (`refused` of them, the first few in `refused_examples`)."""

    accepted: tuple[GpuMemory, ...]
    refused: int = 0
    refused_examples: tuple[int, ...] = ()


def relayable_gpus(entries: Sequence[GpuMemory]) -> RelayedGpus:
    """The entries whose index one node's NVML can have (0 to `MAX_RELAYED_GPUS - 1`)."""
    accepted = tuple(entry for entry in entries if 0 <= entry.index < MAX_RELAYED_GPUS)
    if len(accepted) == len(entries):
        return RelayedGpus(accepted)
    refused = [entry.index for entry in entries if not 0 <= entry.index < MAX_RELAYED_GPUS]
    return RelayedGpus(accepted, len(refused), tuple(refused[:_REFUSED_EXAMPLES]))


class TextField(StrEnum):
    """The stats file's free-text fields that become label values, by their path."""

    MODEL_NAME = "model_name"  # fusebox_model_info{model}
    MODEL_REVISION = "state.model_revision"  # fusebox_model_info{revision}
    FALLBACK_UNAVAILABLE_REASON = "state.fallback_unavailable_reason"  # ..._info{reason}


def _text(document: StatsDocument, field: TextField) -> str | None:
    if field is TextField.MODEL_NAME:
        return document.model_name
    if field is TextField.MODEL_REVISION:
        return document.state.model_revision
    return document.state.fallback_unavailable_reason


def _without(document: StatsDocument, field: TextField) -> StatsDocument:
    if field is TextField.MODEL_NAME:
        return dataclasses.replace(document, model_name=None)
    if field is TextField.MODEL_REVISION:
        state = dataclasses.replace(document.state, model_revision=None)
    else:
        state = dataclasses.replace(document.state, fallback_unavailable_reason=None)
    return dataclasses.replace(document, state=state)


class TextLabelBudget:
    """Which free-text values may be exported now: every value seen within the window,
    up to `max_values` of them per field; a new one past that is withheld."""

    def __init__(
        self,
        max_values: int = MAX_TEXT_LABEL_VALUES,
        window_seconds: float = TEXT_LABEL_WINDOW_SECONDS,
    ) -> None:
        self._max_values = max_values
        self._window_seconds = window_seconds
        # field -> value -> when it was last seen (monotonic seconds)
        self._seen: dict[TextField, dict[str, float]] = {field: {} for field in TextField}

    def admit(self, field: TextField, value: str, monotonic_now: float) -> bool:
        seen = self._seen[field]
        for old, last_seen in list(seen.items()):
            if monotonic_now - last_seen >= self._window_seconds:
                del seen[old]
        if value not in seen and len(seen) >= self._max_values:
            return False
        seen[value] = monotonic_now
        return True

    def bounded(
        self, document: StatsDocument, monotonic_now: float
    ) -> tuple[StatsDocument, tuple[TextField, ...]]:
        """The document with each value over its field's budget withheld (None), and
        the fields withheld."""
        withheld: list[TextField] = []
        for field in TextField:
            value = _text(document, field)
            if value is not None and not self.admit(field, value, monotonic_now):
                document = _without(document, field)
                withheld.append(field)
        return document, tuple(withheld)
