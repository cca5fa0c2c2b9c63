"""The sidecar watching the real server (`python -m fusebox_server`, tiny
model, CPU): RSS agrees with the server's own report, the leak fault shows
as RSS growth, a wedged event loop shows as a growing loop heartbeat age,
and a stats file that stops being written shows as a growing stats age."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fusebox_contract.admin import FaultsRequest
from fusebox_contract.metrics import MEASURED_ONLY_WITH_A_GPU, LatencyHistogram, Metric
from fusebox_contract.model_fetch import FetchReason, FetchReport
from fusebox_contract.names import Fault, RequestOutcome
from fusebox_server.fetch.progress import Progress

Sidecar = Any  # conftest's Sidecar (importlib mode cannot import it)
Server = Any  # conftest's Server


def _wait_for(condition: Callable[[], Any], what: str, timeout_seconds: float = 60) -> Any:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def leaky_server(server_factory: Callable[..., Server]) -> Server:
    return server_factory(faults="leak:64")


def test_rss_measured_from_proc_agrees_with_the_server_within_5_percent(
    leaky_server: Server, start_sidecar: Callable[..., Sidecar]
) -> None:
    sidecar = start_sidecar(leaky_server.stats_path)

    # Two stats writes apart, so the server's figure is as fresh as the scrape.
    first = leaky_server.stats()["written_at"]
    _wait_for(lambda: leaky_server.stats()["written_at"] > first, "a fresh stats write")
    samples = sidecar.scrape()
    reported = leaky_server.stats()["rss_bytes"]

    assert samples.value("fusebox_sidecar_measured", quantity="rss") == 1
    assert samples.value("fusebox_process_resident_memory_bytes") == pytest.approx(
        reported, rel=0.05
    )
    assert samples.value("fusebox_model_loaded") == 1
    assert samples.value("fusebox_stats_valid") == 1


def test_the_leak_fault_makes_rss_rise_scrape_over_scrape(
    leaky_server: Server, start_sidecar: Callable[..., Sidecar]
) -> None:
    sidecar = start_sidecar(leaky_server.stats_path)

    rss = [sidecar.scrape().value("fusebox_process_resident_memory_bytes")]
    for _ in range(3):
        leaky_server.complete("leak a little")
        rss.append(sidecar.scrape().value("fusebox_process_resident_memory_bytes"))

    assert all(later > earlier for earlier, later in zip(rss, rss[1:], strict=False)), rss
    # Each request holds 64 MiB; allow for the allocator's own slack.
    assert rss[-1] - rss[0] > 3 * 48 * 1024 * 1024, rss


def test_a_stats_file_that_stops_being_written_ages_while_rss_is_still_measured(
    leaky_server: Server, start_sidecar: Callable[..., Sidecar]
) -> None:
    sidecar = start_sidecar(leaky_server.stats_path)
    sidecar.scrape()

    os.kill(leaky_server.process.pid, signal.SIGSTOP)  # nothing writes the file now
    try:
        leaky_server.stats_path.unlink()
        ages = []
        for _ in range(3):
            time.sleep(0.7)
            samples = sidecar.scrape()
            ages.append(samples.value("fusebox_server_stats_age_seconds"))
        assert ages == sorted(ages) and ages[-1] > ages[0] > 0, ages
        assert samples.value("fusebox_stats_valid") == 0
        assert samples.value("fusebox_sidecar_measured", quantity="rss") == 1
        assert sidecar.get("/healthz") == (200, "ok\n")
    finally:
        os.kill(leaky_server.process.pid, signal.SIGCONT)

    samples = _wait_for(
        lambda: (s := sidecar.scrape()).value("fusebox_stats_valid") == 1 and s,
        "the server to write its stats file again",
    )
    assert samples.value("fusebox_server_stats_age_seconds") < ages[-1]


def test_a_wedged_event_loop_shows_as_a_growing_loop_heartbeat_age(
    server_factory: Callable[..., Server],
    start_sidecar: Callable[..., Sidecar],
    promtool: Callable[[str], Any],
) -> None:
    server = server_factory(faults="wedge")
    sidecar = start_sidecar(server.stats_path)
    assert sidecar.scrape().value("fusebox_heartbeat_age_seconds", thread="loop") < 3

    server.admin(FaultsRequest({Fault.WEDGE: 1}))
    samples = _wait_for(
        lambda: (
            (s := sidecar.scrape()).value("fusebox_heartbeat_age_seconds", thread="loop") > 3 and s
        ),
        "the loop heartbeat to go stale",
    )

    # The stats thread still writes: the file is fresh while the loop is stuck.
    assert samples.value("fusebox_server_stats_age_seconds") < samples.value(
        "fusebox_heartbeat_age_seconds", thread="loop"
    )
    later = sidecar.scrape()
    assert later.value("fusebox_heartbeat_age_seconds", thread="loop") > samples.value(
        "fusebox_heartbeat_age_seconds", thread="loop"
    )
    assert sidecar.get("/healthz") == (200, "ok\n")
    assert promtool(sidecar.scrape_text()).returncode == 0


def test_the_stats_file_the_server_writes_is_fully_understood(leaky_server: Server) -> None:
    """Contract check between the two parts: no field of the server's real
    file is reported as a problem by the sidecar's parser, and the state
    the server knows is there (the loaded variant's quantization and dtype)."""
    from fusebox_contract.stats import SCHEMA_VERSION, parse

    reading = parse(Path(leaky_server.stats_path).read_bytes())

    assert reading.valid, reading.problems
    document = reading.document
    assert document is not None and document.pid == leaky_server.process.pid
    assert document.state.variant is not None and document.state.model_loaded
    assert document.state.quantization is not None and document.state.dtype is not None
    assert set(document.requests) == set(RequestOutcome)
    assert json.loads(Path(leaky_server.stats_path).read_text())["schema"] == SCHEMA_VERSION


# Exported only where they can be measured: no GPU on this machine, so no NVML
# reading and no CUDA allocator; the rest of the contract must be in a live scrape.
ONLY_WITH_A_GPU = MEASURED_ONLY_WITH_A_GPU
# Exported in a pod, not by this test's host process: why each is absent here.
NOT_HERE = {
    Metric.MEMORY_LIMIT_BYTES: "the server runs in no memory-limited cgroup (a pod always does)",
    Metric.QUALITY_FAILURE_RATIO: "no response sampled yet at the server's default sample rate",
    Metric.MODEL_FETCH_RATE_BYTES_PER_SECOND: "exported only while a download moves; "
    "the report here is Verified",
}


def test_a_live_scrape_after_traffic_carries_every_contract_name_but_the_gpu_ones(
    leaky_server: Server,
    start_sidecar: Callable[..., Sidecar],
    tmp_path: Path,
    promtool: Callable[[str], Any],
) -> None:
    """The other half of the dashboard and alert checks (tests/unit/helm): those
    compare each query with the contract; this compares the contract with what a
    real sidecar next to a real server serves, so a queried name has data."""
    # The report the model fetcher leaves in a pod whose model it downloaded, written
    # by the fetcher's own code.
    fetched = tmp_path / "model-fetch.json"
    Progress(fetched, None).finish(
        FetchReport(FetchReason.VERIFIED, "verified", 1 << 20, 1 << 20, 5e6, files=3)
    )
    sidecar = start_sidecar(leaky_server.stats_path, "--fetch-report-file", str(fetched))
    for prompt in ("one", "two", "three"):
        leaky_server.complete(prompt, max_tokens=4)
    first = leaky_server.stats()["written_at"]
    _wait_for(lambda: leaky_server.stats()["written_at"] > first, "a stats write after traffic")

    served = {name for name, _ in sidecar.scrape()}
    missing = {
        sample
        for metric in Metric
        if metric not in ONLY_WITH_A_GPU and metric not in NOT_HERE
        for sample in metric.samples
        if sample not in served
    }
    assert missing == set(), sorted(missing)
    assert sidecar.scrape().value("fusebox_model_fetch_info", reason="Verified") == 1
    assert promtool(sidecar.scrape_text()).returncode == 0


def test_histograms_and_token_counters_count_the_requests_served(
    leaky_server: Server, start_sidecar: Callable[..., Sidecar]
) -> None:
    sidecar = start_sidecar(leaky_server.stats_path)

    def settled() -> Any:
        first = leaky_server.stats()["written_at"]
        _wait_for(lambda: leaky_server.stats()["written_at"] > first, "a fresh stats write")
        return sidecar.scrape()

    def count(samples: Any, name: LatencyHistogram) -> float:
        return samples.value(f"{name.metric.value}_count") or 0.0

    before = settled()
    replies = [leaky_server.complete(f"count me {n}", max_tokens=4) for n in range(3)]
    after = settled()

    assert count(after, LatencyHistogram.TTFT) - count(before, LatencyHistogram.TTFT) == 3
    assert count(after, LatencyHistogram.E2E) - count(before, LatencyHistogram.E2E) == 3
    assert count(after, LatencyHistogram.QUEUE) - count(before, LatencyHistogram.QUEUE) == 3
    prompt = sum(r["usage"]["prompt_tokens"] for r in replies)
    generated = sum(r["usage"]["completion_tokens"] for r in replies)
    # One gap between consecutive pieces; a piece may carry several tokens (text is
    # sent once it decodes), so at most one gap fewer than the tokens per response.
    gaps = count(after, LatencyHistogram.ITL) - count(before, LatencyHistogram.ITL)
    assert 0 < gaps <= generated - len(replies)
    tokens = (Metric.PROMPT_TOKENS.sample, Metric.GENERATION_TOKENS.sample)
    assert [after.value(t) - before.value(t) for t in tokens] == [prompt, generated]
    # Every bucket is cumulative up to the count.
    bucket = Metric.TIME_TO_FIRST_TOKEN_SECONDS.bucket
    bounds = [str(b) for b in LatencyHistogram.TTFT.buckets] + ["+Inf"]
    cumulative = [after.value(bucket, le=le) for le in bounds]
    assert cumulative == sorted(cumulative)
    assert cumulative[-1] == count(after, LatencyHistogram.TTFT)
