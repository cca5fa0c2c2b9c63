"""bench/traffic.py against the real server: what the realistic bench records of each
response (text, finish_reason, usage, chunk times), streamed and not, closed and open loop."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench import server_bench, traffic
from bench.serving_metrics import summarize
from bench.workload import Workload, WorkloadShape, build_workload
from fusebox_server.model.tiny_model import ensure_model


@pytest.fixture(scope="module")
def tiny() -> Path:
    return ensure_model("tiny")


@pytest.fixture(scope="module")
def fusebox(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workdir = tmp_path_factory.mktemp("traffic")
    process, url, _ = server_bench.start_fusebox(tiny, workdir, torch_threads=1)
    yield url
    server_bench.stop(process)


@pytest.fixture(scope="module")
def workload(tiny: Path) -> Workload:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny))
    shape = WorkloadShape().scaled(16)  # prompts 16-128 tokens, answers 4-32
    return build_workload(
        4, lambda text: len(tokenizer.encode(text, add_special_tokens=False)), shape
    )


def test_a_closed_loop_records_each_streamed_answer_with_its_usage(
    fusebox: str, workload: Workload
) -> None:
    records = traffic.closed_loop(fusebox, "bench", workload.requests, clients=2)
    assert [record.index for record in records] == [0, 1, 2, 3]
    for record, request in zip(records, workload.requests, strict=True):
        assert record.error is None
        assert record.finish_reason in ("length", "stop")
        assert record.completion_tokens is not None
        assert 1 <= record.completion_tokens <= request.max_tokens
        assert record.prompt_tokens is not None and record.prompt_tokens >= request.prompt_tokens
        assert record.text and record.chunk_times
        assert record.scheduled <= record.chunk_times[0] <= record.finished
    figures = summarize(records)
    assert figures["errors"] == 0
    assert figures["completion_tokens"] == sum(r.completion_tokens or 0 for r in records)


def test_an_unstreamed_answer_is_the_streamed_one(fusebox: str, workload: Workload) -> None:
    request = workload.requests[0]
    [streamed] = traffic.closed_loop(fusebox, "bench", [request], clients=1)
    whole = traffic.complete_unstreamed(fusebox, "bench", request)
    with httpx.Client() as client:  # kept across requests, as the c=1 phase keeps it
        kept = [traffic.complete_unstreamed(fusebox, "bench", request, client) for _ in range(2)]
    for answer in (whole, *kept):
        assert answer.error is None
        assert answer.text == streamed.text
        assert answer.completion_tokens == streamed.completion_tokens
        assert answer.finish_reason == streamed.finish_reason


def test_an_open_loop_schedules_each_request_at_its_own_time(
    fusebox: str, workload: Workload
) -> None:
    send_times = [0.0, 0.05, 0.1, 0.15]
    records = traffic.open_loop(fusebox, "bench", workload.requests, send_times)
    start = records[0].scheduled
    assert [round(r.scheduled - start, 6) for r in records] == send_times
    assert all(r.sent >= r.scheduled and r.error is None for r in records)


def test_a_refused_request_is_recorded_as_an_error_not_counted(
    fusebox: str, workload: Workload
) -> None:
    [record] = traffic.closed_loop(fusebox, "no-such-model", [workload.requests[0]], 1)
    assert record.error is not None and record.error.startswith("HTTP 4")
    assert summarize([record])["completion_tokens"] == 0
