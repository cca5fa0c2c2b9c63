"""The metric names a PromQL expression reads, for checking queries against the contract.

Small on purpose: string literals, label matchers, ranges and the label lists
of by/without/on/ignoring/group_* are removed first; what is left that looks
like a name and is not a function, an aggregation or a keyword is a metric.
`promtool check rules` proves each expression parses; this only finds names.
"""

from __future__ import annotations

import re

from fusebox_contract.metrics import Metric

KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}
    | {"and", "or", "unless", "atan2", "inf", "nan"}
)
PROMETHEUS_OWN = frozenset({"up"})  # series Prometheus writes for every target

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_BRACES = re.compile(r"\{[^}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_NAME = re.compile(r"(?<![\w.$])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?")


def metric_names(expression: str) -> set[str]:
    """Every metric (sample) name the expression selects."""
    text = _STRING.sub('""', expression)
    text = _GROUPING.sub(" ", text)
    text = _BRACES.sub(" ", text)
    text = _RANGE.sub(" ", text)
    return {name for name, call in _NAME.findall(text) if not call and name.lower() not in KEYWORDS}


def exported_sample_names() -> set[str]:
    """Every sample name the sidecar may export: each contract metric's samples."""
    return {sample for metric in Metric for sample in metric.samples}
