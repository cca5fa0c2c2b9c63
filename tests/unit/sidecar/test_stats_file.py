"""The stats file's contract (fusebox_contract.stats): what the server's writer
writes, the sidecar's parser reads back whole; nulls are absent; anything
malformed is absent and named, never raised."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fusebox_contract.metrics import LatencyHistogram
from fusebox_contract.names import (
    BreakerState,
    DegradationLevel,
    Dtype,
    HeartbeatThread,
    LatencyMetric,
    Quantization,
    RequestOutcome,
    Variant,
)
from fusebox_contract.stats import (
    SCHEMA_VERSION,
    CudaMemory,
    GpuMemory,
    LatencySummary,
    Quality,
    RuntimeState,
    StatsDocument,
    StatsReading,
    dumps,
    encode,
    parse,
)

# The reader reads numbers as floats: exact up to 2**53 (8 PiB, beyond any memory size).
_sizes = st.none() | st.integers(min_value=0, max_value=2**53)
_ratios = st.none() | st.floats(min_value=0, max_value=1)
_seconds = st.none() | st.floats(min_value=1e-6, max_value=1e10)
_names = st.none() | st.text(max_size=40)
_states = st.builds(
    RuntimeState,
    breaker=st.none() | st.sampled_from(BreakerState),
    admit_percent=st.none() | st.integers(0, 100),
    degradation_level=st.none() | st.sampled_from(DegradationLevel),
    variant=st.none() | st.sampled_from(Variant),
    model_loaded=st.none() | st.booleans(),
    memory_guard_active=st.none() | st.booleans(),
    model_revision=_names,
    dtype=st.none() | st.sampled_from(Dtype),
    quantization=st.none() | st.sampled_from(Quantization),
    fallback_configured=st.none() | st.booleans(),
    fallback_available=st.none() | st.booleans(),
    fallback_unavailable_reason=_names,
    target_variant=st.none() | st.sampled_from(Variant),
    converging=st.none() | st.booleans(),
)
_documents = st.builds(
    StatsDocument,
    written_at=_seconds,
    pid=st.none() | st.integers(1, 4_194_304),
    model_name=_names,
    rss_bytes=_sizes,
    cgroup_memory_usage_bytes=_sizes,
    cgroup_memory_limit_bytes=_sizes,
    cuda=st.builds(CudaMemory, _sizes, _sizes, _sizes, _sizes, _sizes),
    nvml=st.lists(st.builds(GpuMemory, st.integers(0, 15), _sizes, _sizes), max_size=8).map(tuple),
    queue_length=_sizes,
    running=_sizes,
    tokenizer_cache_entries=_sizes,
    tokenizer_cache_hits_total=_sizes,
    tokenizer_template_hits_total=_sizes,
    requests=st.dictionaries(st.sampled_from(RequestOutcome), st.integers(0, 2**53)),
    latency=st.dictionaries(
        st.sampled_from(LatencyMetric),
        st.builds(LatencySummary, _seconds, st.integers(0, 10_000) | st.none()).filter(
            lambda s: s.p99_seconds is not None or s.count is not None
        ),
    ),
    quality=st.builds(Quality, _sizes, _sizes, _ratios),
    heartbeats=st.dictionaries(
        st.sampled_from(HeartbeatThread), st.floats(min_value=0, max_value=1e10)
    ),
    state=_states,
)


@settings(max_examples=300, deadline=None)
@given(_documents)
def test_what_the_writer_writes_the_parser_reads_back_whole(document: StatsDocument) -> None:
    reading = parse(dumps(document))

    assert reading.valid, reading.problems
    assert reading.document == document


def test_the_file_carries_the_schema_version_and_enum_values_as_their_wire_spelling(
    stats_document: StatsDocument,
) -> None:
    written = json.loads(dumps(stats_document))

    assert written["schema"] == SCHEMA_VERSION
    assert written["requests"]["cancelled_total"] == 6
    assert written["latency_seconds"]["ttft"] == {"p99": 0.05, "count": 100}
    assert written["state"]["breaker"] == "open"
    assert written["state"]["degradation_level"] == 2
    assert written["state"]["quantization"] == "int8"


def test_the_writer_refuses_a_non_finite_number() -> None:
    with pytest.raises(ValueError):
        dumps(StatsDocument(rss_bytes=float("nan")))


def _malformed(document: StatsDocument, path: tuple[str, ...], value: object) -> str:
    """The writer's output with one value replaced by what no writer writes."""
    raw: dict[str, Any] = encode(document)
    parent = raw
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return json.dumps(raw)


def test_nulls_mean_absent_and_are_not_problems(stats_document: StatsDocument) -> None:
    document = replace(
        stats_document,
        cuda=CudaMemory(),
        nvml=(),
        latency={LatencyMetric.TTFT: LatencySummary(0.05, 100)},
        quality=replace(stats_document.quality, failure_ratio=None),
    )

    reading = parse(dumps(document))

    assert reading.valid
    assert reading.document == document
    assert reading.document.cuda.allocated_bytes is None
    assert LatencyMetric.ITL not in reading.document.latency


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"", "empty"),
        (b"   \n", "empty"),
        (b'{"schema": 1, "written_at": 17960', "not JSON"),
        (b"\xff\xfe garbage", "not JSON"),
        (b"[1, 2, 3]", "not an object"),
        (b'"a string"', "not an object"),
        (b'{"written_at": 1.0}', "schema None"),
        (b'{"schema": 2}', "schema 2"),
        (b'{"schema": true}', "schema True"),
    ],
)
def test_unusable_files_give_no_document_and_say_why(raw: bytes, why: str) -> None:
    reading = parse(raw)

    assert reading.document is None
    assert not reading.valid
    assert reading.problem is not None and why in reading.problem


@pytest.mark.parametrize(
    ("path", "value", "read_back"),
    [
        (("rss_bytes",), "123", lambda d: d.rss_bytes),
        (("rss_bytes",), True, lambda d: d.rss_bytes),
        (("rss_bytes",), -5, lambda d: d.rss_bytes),
        (("queue_length",), [1], lambda d: d.queue_length),
        (("pid",), 0, lambda d: d.pid),
        (("pid",), 12.5, lambda d: d.pid),
        (("model_name",), 7, lambda d: d.model_name),
        (("model_name",), "x" * 1000, lambda d: d.model_name),
        (("cuda", "allocated_bytes"), {"x": 1}, lambda d: d.cuda.allocated_bytes),
        (("quality", "failure_ratio"), 1.5, lambda d: d.quality.failure_ratio),
        (("state", "breaker"), "ajar", lambda d: d.state.breaker),
        (("state", "variant"), 3, lambda d: d.state.variant),
        (("state", "model_loaded"), "yes", lambda d: d.state.model_loaded),
        (("state", "degradation_level"), 1.5, lambda d: d.state.degradation_level),
        (("state", "admit_percent"), 250, lambda d: d.state.admit_percent),
        (("state", "quantization"), "awq", lambda d: d.state.quantization),
        (("state", "dtype"), "float8", lambda d: d.state.dtype),
        (("state", "target_variant"), "secondary", lambda d: d.state.target_variant),
        (("state", "converging"), 1, lambda d: d.state.converging),
        (("tokens", "prompt_total"), -1, lambda d: d.tokens.prompt_total),
        (("tokens", "generation_total"), "9", lambda d: d.tokens.generation_total),
        (
            ("latency_histograms", "ttft", "buckets"),
            [1, 2, 3],  # not one count per contract bound
            lambda d: d.histograms.get(LatencyHistogram.TTFT),
        ),
        (
            ("latency_histograms", "ttft", "buckets"),
            [5] + [1] * 18,  # counts that fall: not cumulative
            lambda d: d.histograms.get(LatencyHistogram.TTFT),
        ),
        (
            ("latency_histograms", "itl", "buckets"),
            [10**6] * 17,  # more at some bound than the histogram counted at all
            lambda d: d.histograms.get(LatencyHistogram.ITL),
        ),
        (
            ("latency_histograms", "e2e", "count"),
            "100",
            lambda d: d.histograms.get(LatencyHistogram.E2E),
        ),
        (
            ("latency_histograms", "queue", "buckets"),
            [True] * 15,
            lambda d: d.histograms.get(LatencyHistogram.QUEUE),
        ),
    ],
)
def test_a_wrong_typed_field_is_absent_and_named_as_a_problem(
    stats_document: StatsDocument, path: tuple[str, ...], value: object, read_back: Any
) -> None:
    reading = parse(_malformed(stats_document, path, value))

    assert reading.document is not None
    assert read_back(reading.document) is None
    assert not reading.valid
    assert any(".".join(path) in problem for problem in reading.field_problems)
    # The rest of the file is still read.
    assert reading.document.running == 8


def test_non_finite_numbers_are_rejected(stats_document: StatsDocument) -> None:
    raw = dumps(stats_document).replace('"running":8', '"running":NaN')

    reading = parse(raw)

    assert reading.document is not None and reading.document.running is None
    assert not reading.valid


def test_wrong_shapes_of_nested_sections_are_problems(stats_document: StatsDocument) -> None:
    raw = encode(stats_document)
    raw["cuda"] = "none"
    raw["nvml"] = [{"index": "zero", "memory_used_bytes": 1}, 7]
    raw["heartbeats"] = 5

    reading = parse(json.dumps(raw))

    assert reading.document is not None
    assert reading.document.cuda.allocated_bytes is None
    assert reading.document.nvml == ()
    assert reading.document.heartbeats == {}
    problems = " | ".join(reading.field_problems)
    assert "cuda.allocated_bytes" in problems
    assert "nvml[0].index" in problems and "nvml[1]" in problems
    assert "heartbeats.loop" in problems


def test_integers_too_large_for_a_float_are_problems_not_crashes(
    stats_document: StatsDocument,
) -> None:
    raw = dumps(stats_document).replace('"running":8', '"running":1' + "0" * 400)

    reading = parse(raw)

    assert reading.document is not None and reading.document.running is None
    assert any("running" in problem for problem in reading.field_problems)


def test_deeply_nested_json_is_reported_not_raised() -> None:
    reading = parse(b"[" * 100_000)

    assert reading.document is None and reading.problem is not None
    assert "not JSON" in reading.problem


@pytest.mark.parametrize(
    ("path", "value"), [(("pid",), 2**40), (("state", "degradation_level"), 7)]
)
def test_values_beyond_their_domain_are_problems(
    stats_document: StatsDocument, path: tuple[str, ...], value: int
) -> None:
    reading = parse(_malformed(stats_document, path, value))

    assert not reading.valid
    assert any(".".join(path) in problem for problem in reading.field_problems)


def test_a_reading_lists_its_file_problem_and_its_field_problems_together() -> None:
    assert StatsReading(None, "missing").problems == ("missing",)
    assert StatsReading(StatsDocument(), field_problems=("pid: bad",)).problems == ("pid: bad",)


def _paths(node: object, prefix: str = "") -> set[str]:
    if isinstance(node, dict):
        return {p for key, value in node.items() for p in _paths(value, f"{prefix}.{key}")}
    if isinstance(node, list):
        return {p for value in node for p in _paths(value, f"{prefix}[]")}
    return {prefix}


def test_the_documented_example_is_what_the_writer_writes(stats_document: StatsDocument) -> None:
    """docs/stats-file.md shows every field the writer writes, and nothing else."""
    text = (Path(__file__).resolve().parents[3] / "docs" / "stats-file.md").read_text()
    example = text.split("```json\n", 1)[1].split("```", 1)[0]

    reading = parse(example)

    assert reading.valid, reading.problems
    assert _paths(json.loads(example)) == _paths(encode(stats_document))
