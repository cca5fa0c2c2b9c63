"""The stats file and /proc status parsers: contract fields, nulls, and bad input."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from fusebox_sidecar.readings import GpuMemory, parse_proc_status, parse_stats

Document = Callable[[], dict[str, Any]]


def _parse(document: object) -> Any:
    return parse_stats(json.dumps(document).encode())


def test_the_documented_example_parses_into_every_field(stats_document: Document) -> None:
    reading = _parse(stats_document())

    assert reading.valid
    snapshot = reading.snapshot
    assert snapshot.pid == 4242
    assert snapshot.written_at == 1796000000.12
    assert snapshot.rss_bytes == 1_234_567_890
    assert snapshot.cgroup_memory_limit_bytes == 107_374_182_400
    assert snapshot.cuda_reserved_bytes == 16_000_000_000
    assert snapshot.cuda_alloc_retries_total == 2
    assert snapshot.nvml == (GpuMemory(0, 17 * 1024**3, 80 * 1024**3),)
    assert snapshot.requests_total == {
        "succeeded": 1000,
        "failed": 3,
        "rejected": 40,
        "timed_out": 2,
    }
    assert snapshot.latency_p99_seconds == {"ttft": 0.05, "itl": 0.02, "e2e": 0.90}
    assert snapshot.heartbeats == {"loop": 1796000000.10, "worker": 1796000000.05}
    assert (snapshot.breaker, snapshot.degradation_level, snapshot.variant) == (
        "open",
        2,
        "fallback",
    )
    assert snapshot.model_loaded is True and snapshot.memory_guard_active is False


def test_nulls_mean_absent_and_are_not_problems(stats_document: Document) -> None:
    document = stats_document()
    document["cuda"] = {key: None for key in document["cuda"]}
    document["nvml"] = []
    document["latency_seconds"]["itl"] = None
    document["quality"]["failure_ratio"] = None

    reading = _parse(document)

    assert reading.valid
    assert reading.snapshot.cuda_allocated_bytes is None
    assert reading.snapshot.nvml == ()
    assert reading.snapshot.latency_p99_seconds == {"ttft": 0.05, "e2e": 0.90}
    assert reading.snapshot.quality_failure_ratio is None


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
def test_unusable_files_give_no_snapshot_and_say_why(raw: bytes, why: str) -> None:
    reading = parse_stats(raw)

    assert reading.snapshot is None
    assert not reading.valid
    assert reading.problem is not None and why in reading.problem


@pytest.mark.parametrize(
    ("path", "value", "attribute"),
    [
        (("rss_bytes",), "123", "rss_bytes"),
        (("rss_bytes",), True, "rss_bytes"),
        (("rss_bytes",), -5, "rss_bytes"),
        (("queue_length",), [1], "queue_length"),
        (("pid",), 0, "pid"),
        (("pid",), 12.5, "pid"),
        (("cuda", "allocated_bytes"), {"x": 1}, "cuda_allocated_bytes"),
        (("quality", "failure_ratio"), 1.5, "quality_failure_ratio"),
        (("state", "breaker"), "ajar", "breaker"),
        (("state", "variant"), 3, "variant"),
        (("state", "model_loaded"), "yes", "model_loaded"),
        (("state", "degradation_level"), 1.5, "degradation_level"),
    ],
)
def test_a_wrong_typed_field_is_absent_and_named_as_a_problem(
    stats_document: Document, path: tuple[str, ...], value: object, attribute: str
) -> None:
    document = stats_document()
    parent = document
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value

    reading = _parse(document)

    assert reading.snapshot is not None
    assert getattr(reading.snapshot, attribute) is None
    assert not reading.valid
    assert any(".".join(path) in problem for problem in reading.snapshot.problems)
    # The rest of the file is still read.
    assert reading.snapshot.running == 8


def test_non_finite_numbers_are_rejected(stats_document: Document) -> None:
    raw = json.dumps(stats_document()).replace('"running": 8', '"running": NaN').encode()

    reading = parse_stats(raw)

    assert reading.snapshot is not None and reading.snapshot.running is None
    assert not reading.valid


def test_wrong_shapes_of_nested_sections_are_problems(stats_document: Document) -> None:
    document = stats_document()
    document["cuda"] = "none"
    document["nvml"] = [{"index": "zero", "memory_used_bytes": 1}, 7]
    document["heartbeats"] = 5

    reading = _parse(document)

    assert reading.snapshot is not None
    assert reading.snapshot.cuda_allocated_bytes is None
    assert reading.snapshot.nvml == ()
    assert reading.snapshot.heartbeats == {}
    problems = " | ".join(reading.snapshot.problems)
    assert "cuda.allocated_bytes" in problems
    assert "nvml[0].index" in problems and "nvml[1]" in problems
    assert "heartbeats.loop" in problems


def test_proc_status_rss_is_read_in_bytes() -> None:
    text = "Name:\tpython\nVmPeak:\t  900 kB\nVmRSS:\t  123456 kB\nThreads:\t4\n"

    assert parse_proc_status(text).rss_bytes == 123456 * 1024


@pytest.mark.parametrize(
    "text",
    ["Name:\tkthreadd\nState:\tS (sleeping)\n", "VmRSS:\tlots\n", "VmRSS:\t12 MB\n", ""],
)
def test_proc_status_without_a_usable_vmrss_has_no_rss(text: str) -> None:
    assert parse_proc_status(text).rss_bytes is None


def test_integers_too_large_for_a_float_are_problems_not_crashes(
    stats_document: Document,
) -> None:
    raw = json.dumps(stats_document()).replace('"running": 8', '"running": 1' + "0" * 400)

    reading = parse_stats(raw.encode())

    assert reading.snapshot is not None and reading.snapshot.running is None
    assert any("running" in problem for problem in reading.snapshot.problems)


def test_deeply_nested_json_is_reported_not_raised() -> None:
    reading = parse_stats(b"[" * 100_000)

    assert reading.snapshot is None and reading.problem is not None
    assert "not JSON" in reading.problem


@pytest.mark.parametrize(
    ("path", "value"), [(("pid",), 2**40), (("state", "degradation_level"), 7)]
)
def test_values_beyond_their_domain_are_problems(
    stats_document: Document, path: tuple[str, ...], value: int
) -> None:
    document = stats_document()
    parent = document
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value

    reading = _parse(document)

    assert not reading.valid
    assert any(".".join(path) in problem for problem in reading.snapshot.problems)
