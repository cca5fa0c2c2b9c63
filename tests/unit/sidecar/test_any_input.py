"""Whatever the stats file holds, parsing never raises and a scrape is valid
exposition text: properties over arbitrary bytes and arbitrary JSON."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from fusebox_contract.stats import parse
from fusebox_sidecar.collectors import Observation, SidecarCollector
from fusebox_sidecar.nvml import GpuAccess, GpuReading
from fusebox_sidecar.readings import ProcOutcome, ProcReading

_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=10**300, max_value=10**400)
    | st.floats()
    | st.text(max_size=8)
)
_json = st.recursive(
    _scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
_keys = st.sampled_from(
    [
        "written_at", "pid", "rss_bytes", "cuda", "nvml", "queue_length", "requests", "model_name",
        "latency_seconds", "quality", "heartbeats", "state", "cgroup_memory_limit_bytes",
        "tokenizer_cache_hits_total", "tokenizer_template_hits_total",
    ]
)  # fmt: skip
_documents = st.dictionaries(_keys, _json, max_size=12).map(lambda d: {"schema": 1, **d})


def _exposition(raw: bytes) -> str:
    observation = Observation(
        1.8e9,
        parse(raw),
        1.8e9 - 5,
        ProcReading(ProcOutcome.NO_PID),
        GpuReading(GpuAccess.NOT_INSTALLED),
    )
    registry = CollectorRegistry()
    registry.register(SidecarCollector(lambda: observation))
    return generate_latest(registry).decode()


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_raise(raw: bytes) -> None:
    reading = parse(raw)

    assert reading.document is not None or reading.problem


@settings(max_examples=300, deadline=None)
@given(_documents)
def test_arbitrary_schema_1_documents_give_parseable_exposition(document: dict[str, Any]) -> None:
    text = _exposition(json.dumps(document).encode())

    names = {family.name for family in text_string_to_metric_families(text)}
    assert {"fusebox_stats_valid", "fusebox_gpu_visible"} <= names


def test_a_lone_surrogate_in_a_stats_string_is_a_field_problem_not_a_failed_scrape() -> None:
    raw = (
        b'{"schema":1,"written_at":1800000000,"model_name":"chat\\ud800",'
        b'"state":{"variant":"primary","fallback_unavailable_reason":"no /models/\\udcff"}}'
    )

    reading = parse(raw)
    text = _exposition(raw)

    assert [problem.split(":")[0] for problem in reading.field_problems] == [
        "model_name",
        "state.fallback_unavailable_reason",
    ]
    samples = {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    assert samples["fusebox_stats_valid"] == 0
