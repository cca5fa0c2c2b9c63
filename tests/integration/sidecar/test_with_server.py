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

from fusebox_contract.names import RequestOutcome

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

    server.admin("PUT", "/admin/v1/faults", {"wedge": 1})
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
