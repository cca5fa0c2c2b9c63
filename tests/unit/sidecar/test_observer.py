"""The observer's I/O against real files and real processes: a missing,
deleted or broken stats file, a pid that is gone, an unreadable /proc entry.
Every case must still give a valid scrape, and say what is wrong."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import pytest
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from fusebox_contract.model_fetch import FetchReason, FetchReport
from fusebox_contract.names import HeartbeatThread
from fusebox_contract.stats import CudaMemory, StatsDocument, dumps
from fusebox_server.fetch.progress import Progress
from fusebox_sidecar.collectors import SidecarCollector
from fusebox_sidecar.nvml import NvmlReader
from fusebox_sidecar.observer import MAX_STATS_BYTES, ServerObserver


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def sleeper() -> Iterator[int]:
    """A real process standing in for the server, holding ~40 MiB, yielded
    once every page of it is written (it says so on stdout): a buffer still
    being filled on a busy machine is a moving target for two readings."""
    process = subprocess.Popen(
        # b"x" * n writes every page, so the memory is resident (calloc'd zeros are not).
        [
            sys.executable,
            "-c",
            "import sys, time; b = b'x' * (40 << 20); print('filled', flush=True); time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "filled\n", "the child never filled its buffer"
        yield process.pid
    finally:
        process.kill()
        process.communicate()


def _missing_pid() -> int:
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    for pid in range(pid_max - 1, 1, -1):
        if not psutil.pid_exists(pid):
            return pid
    raise AssertionError("no free pid")


def _write(path: Path, document: StatsDocument) -> None:
    path.write_text(dumps(document))


def _registry(observer: ServerObserver) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(SidecarCollector(observer.observe))
    return registry


def test_rss_is_measured_from_proc_for_the_pid_in_the_stats_file(
    tmp_path: Path, stats_document: StatsDocument, sleeper: int
) -> None:
    document = replace(stats_document, pid=sleeper)
    _write(tmp_path / "stats.json", document)
    registry = _registry(
        ServerObserver(tmp_path / "stats.json", Path("/proc"), NvmlReader(None), Clock(2e9))
    )

    # The child's buffer is whole (the fixture waited for it): compare with psutil.
    psutil_rss = psutil.Process(sleeper).memory_info().rss
    rss = registry.get_sample_value("fusebox_process_resident_memory_bytes")

    assert rss is not None and rss == pytest.approx(psutil_rss, rel=0.05)
    assert rss != document.rss_bytes
    assert registry.get_sample_value("fusebox_sidecar_measured", {"quantity": "rss"}) == 1


def test_stats_age_keeps_growing_after_the_file_is_deleted(
    tmp_path: Path, stats_document: StatsDocument, sleeper: int
) -> None:
    stats_path = tmp_path / "stats.json"
    document = replace(stats_document, pid=sleeper)
    assert document.written_at is not None
    clock = Clock(document.written_at + 1)
    registry = _registry(ServerObserver(stats_path, Path("/proc"), NvmlReader(None), clock))

    assert registry.get_sample_value("fusebox_server_stats_age_seconds") is None
    _write(stats_path, document)
    assert registry.get_sample_value("fusebox_server_stats_age_seconds") == pytest.approx(1)

    stats_path.unlink()
    clock.now += 10
    assert registry.get_sample_value("fusebox_server_stats_age_seconds") == pytest.approx(11)
    clock.now += 10
    assert registry.get_sample_value("fusebox_server_stats_age_seconds") == pytest.approx(21)
    assert registry.get_sample_value("fusebox_stats_valid") == 0
    # The server process is still watched through the last pid it reported.
    assert registry.get_sample_value("fusebox_sidecar_measured", {"quantity": "rss"}) == 1


@pytest.mark.parametrize(
    "content",
    [b"", b'{"schema": 1, "written_at": 17', b"not json at all", b'"just a string"', b"\x00\xff"],
)
def test_a_broken_stats_file_gives_a_valid_scrape_with_stats_valid_0(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    stats_path = tmp_path / "stats.json"
    stats_path.write_bytes(content)
    registry = _registry(ServerObserver(stats_path, Path("/proc"), NvmlReader(None)))

    with caplog.at_level(logging.WARNING):
        exposition = generate_latest(registry).decode()

    assert "fusebox_stats_valid 0.0" in exposition
    assert "fusebox_gpu_visible 0.0" in exposition
    assert any(record.getMessage() == "stats file unusable" for record in caplog.records)


def test_a_stats_path_that_is_a_directory_fifo_or_too_large_is_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "dir.json").mkdir()
    (tmp_path / "big.json").write_bytes(b" " * (MAX_STATS_BYTES + 1))
    os.mkfifo(tmp_path / "fifo.json")  # opening it for reading would block a naive reader
    with caplog.at_level(logging.WARNING):
        for name in ("dir.json", "big.json", "fifo.json"):
            registry = _registry(ServerObserver(tmp_path / name, Path("/proc"), NvmlReader(None)))
            assert registry.get_sample_value("fusebox_stats_valid") == 0

    problems = [getattr(record, "problem", "") for record in caplog.records]
    assert any("not a regular file" in problem for problem in problems)
    assert any("larger than" in problem for problem in problems)


def test_a_pid_that_does_not_exist_relays_the_server_rss_and_warns(
    tmp_path: Path, stats_document: StatsDocument, caplog: pytest.LogCaptureFixture
) -> None:
    document = replace(stats_document, pid=_missing_pid())
    _write(tmp_path / "stats.json", document)
    registry = _registry(ServerObserver(tmp_path / "stats.json", Path("/proc"), NvmlReader(None)))

    with caplog.at_level(logging.WARNING):
        rss = registry.get_sample_value("fusebox_process_resident_memory_bytes")

    assert rss == document.rss_bytes
    assert registry.get_sample_value("fusebox_sidecar_measured", {"quantity": "rss"}) == 0
    assert any(f"no process {document.pid}" in getattr(r, "problem", "") for r in caplog.records)


@pytest.mark.parametrize("entry", ["directory", "garbage"])
def test_an_unreadable_proc_entry_relays_the_server_rss_and_warns(
    tmp_path: Path, stats_document: StatsDocument, caplog: pytest.LogCaptureFixture, entry: str
) -> None:
    document = stats_document
    _write(tmp_path / "stats.json", document)
    proc_root = tmp_path / "proc"
    status = proc_root / str(document.pid) / "status"
    if entry == "directory":
        status.mkdir(parents=True)
    else:
        status.parent.mkdir(parents=True)
        status.write_bytes(b"\xff\xfe\x00 not a status file")
    registry = _registry(ServerObserver(tmp_path / "stats.json", proc_root, NvmlReader(None)))

    with caplog.at_level(logging.WARNING):
        exposition = generate_latest(registry).decode()

    assert "fusebox_process_resident_memory_bytes 1.23456789e+09" in exposition
    assert 'fusebox_sidecar_measured{quantity="rss"} 0.0' in exposition
    assert any("unreadable" in getattr(r, "problem", "") for r in caplog.records)


def test_the_sidecar_never_reports_its_own_rss_as_the_server_s(
    tmp_path: Path, stats_document: StatsDocument
) -> None:
    # What an unshared process namespace looks like: the server's pid is the sidecar's.
    document = replace(stats_document, pid=os.getpid())
    _write(tmp_path / "stats.json", document)
    registry = _registry(ServerObserver(tmp_path / "stats.json", Path("/proc"), NvmlReader(None)))

    assert registry.get_sample_value("fusebox_process_resident_memory_bytes") == 1_234_567_890
    assert registry.get_sample_value("fusebox_sidecar_measured", {"quantity": "rss"}) == 0


def test_a_problem_is_logged_once_and_its_end_once(
    tmp_path: Path, stats_document: StatsDocument, caplog: pytest.LogCaptureFixture
) -> None:
    stats_path = tmp_path / "stats.json"
    stats_path.write_text("{")
    observer = ServerObserver(stats_path, Path("/proc"), NvmlReader(None))

    with caplog.at_level(logging.INFO):
        for _ in range(5):
            observer.observe()
        _write(stats_path, stats_document)
        observer.observe()
        observer.observe()

    messages = [record.getMessage() for record in caplog.records]
    assert messages.count("stats file unusable") == 1
    assert messages.count("stats file valid again") == 1


def test_a_lost_gpu_is_flagged_and_logged_as_a_warning(
    tmp_path: Path,
    stats_document: StatsDocument,
    fake_pynvml: Callable[..., Any],
    device_class: type[Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    _write(tmp_path / "stats.json", stats_document)
    nvml = NvmlReader(fake_pynvml([device_class(lost=True)]))
    registry = _registry(ServerObserver(tmp_path / "stats.json", Path("/proc"), nvml))

    with caplog.at_level(logging.WARNING):
        lost = registry.get_sample_value("fusebox_gpu_lost")
        registry.get_sample_value("fusebox_gpu_lost")

    assert lost == 1
    warnings = [r for r in caplog.records if r.getMessage() == "NVML reports a GPU as lost"]
    assert len(warnings) == 1 and getattr(warnings[0], "problem", "") == "GPU 0 lost"


def test_a_stats_file_stamped_in_the_future_still_ages_while_it_does_not_change(
    tmp_path: Path, stats_document: StatsDocument, caplog: pytest.LogCaptureFixture
) -> None:
    # The clock stepped back an hour after the server's last write, and the
    # server is stuck: wall-clock now - written_at stays negative for an hour.
    wall = Clock(2e9)
    monotonic = Clock(1000.0)
    stamp = wall.now + 3600
    stats_path = tmp_path / "stats.json"
    _write(
        stats_path,
        replace(
            stats_document,
            written_at=stamp,
            heartbeats={HeartbeatThread.LOOP: stamp, HeartbeatThread.WORKER: stamp},
        ),
    )
    registry = _registry(
        ServerObserver(stats_path, Path("/proc"), NvmlReader(None), wall, monotonic)
    )

    with caplog.at_level(logging.WARNING):
        assert registry.get_sample_value("fusebox_server_stats_age_seconds") == 0
        wall.now += 45
        monotonic.now += 45
        assert registry.get_sample_value("fusebox_server_stats_age_seconds") == 45
        assert registry.get_sample_value("fusebox_heartbeat_age_seconds", {"thread": "loop"}) == 45
        # The file disappears too: the age keeps counting from the same stamp.
        stats_path.unlink()
        monotonic.now += 15
        assert registry.get_sample_value("fusebox_server_stats_age_seconds") == 60

    warnings = [r for r in caplog.records if r.getMessage().startswith("stats file stamped in the")]
    assert len(warnings) == 1


def test_a_server_writing_again_after_a_clock_step_shows_a_fresh_file(
    tmp_path: Path, stats_document: StatsDocument
) -> None:
    wall = Clock(2e9)
    monotonic = Clock(1000.0)
    stats_path = tmp_path / "stats.json"
    _write(stats_path, replace(stats_document, written_at=wall.now + 3600))
    registry = _registry(
        ServerObserver(stats_path, Path("/proc"), NvmlReader(None), wall, monotonic)
    )
    registry.get_sample_value("fusebox_server_stats_age_seconds")

    wall.now += 30
    monotonic.now += 30
    _write(stats_path, replace(stats_document, written_at=wall.now - 0.5))

    assert registry.get_sample_value("fusebox_server_stats_age_seconds") == pytest.approx(0.5)


def test_a_forward_clock_step_does_not_age_a_file_the_sidecar_saw_change_since_its_last_read(
    tmp_path: Path, stats_document: StatsDocument
) -> None:
    wall = Clock(2e9)
    monotonic = Clock(1000.0)
    stats_path = tmp_path / "stats.json"

    def write() -> None:
        stamp = wall.now
        heartbeats = {HeartbeatThread.LOOP: stamp, HeartbeatThread.WORKER: stamp - 0.3}
        _write(stats_path, replace(stats_document, written_at=stamp, heartbeats=heartbeats))

    registry = _registry(
        ServerObserver(stats_path, Path("/proc"), NvmlReader(None), wall, monotonic)
    )
    for _ in range(3):
        write()
        wall.now += 5
        monotonic.now += 5
        registry.get_sample_value("fusebox_server_stats_age_seconds")
    write()
    # NTP steps the node's clock 120 s forward; the server wrote 0.4 s ago.
    wall.now += 120.4
    monotonic.now += 0.4

    value = registry.get_sample_value
    assert value("fusebox_server_stats_age_seconds") == pytest.approx(0.4)
    assert value("fusebox_heartbeat_age_seconds", {"thread": "loop"}) == pytest.approx(0.4)
    # Stamped 0.3 s before the write that carried it, by the server's own clock.
    assert value("fusebox_heartbeat_age_seconds", {"thread": "worker"}) == pytest.approx(0.7)
    # A server that then stops writing ages again by the sidecar's own clock.
    monotonic.now += 30
    wall.now += 30
    assert value("fusebox_server_stats_age_seconds") == pytest.approx(30.4)


def test_a_gpu_whose_memory_nvml_cannot_read_is_relayed_and_logged_once(
    tmp_path: Path,
    stats_document: StatsDocument,
    fake_pynvml: Callable[..., Any],
    device_class: type[Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    _write(tmp_path / "stats.json", stats_document)
    nvml = NvmlReader(fake_pynvml([device_class(memory_error=3)]))  # NVML_ERROR_NOT_SUPPORTED
    registry = _registry(ServerObserver(tmp_path / "stats.json", Path("/proc"), nvml))

    with caplog.at_level(logging.WARNING):
        used = registry.get_sample_value("fusebox_gpu_memory_used_bytes", {"gpu": "0"})
        registry.get_sample_value("fusebox_gpu_memory_used_bytes", {"gpu": "0"})

    assert used == stats_document.nvml[0].memory_used_bytes
    warnings = [r for r in caplog.records if r.getMessage().startswith("NVML cannot read")]
    assert len(warnings) == 1 and getattr(warnings[0], "problem", "") == "GPU 0: Not Supported"


@pytest.mark.parametrize(
    ("cpu_pod", "level"), [(False, logging.WARNING), (True, logging.INFO)], ids=["gpu", "cpu"]
)
def test_nvml_the_sidecar_cannot_open_warns_once_on_a_pod_whose_server_uses_a_gpu(
    tmp_path: Path,
    stats_document: StatsDocument,
    fake_pynvml: Callable[..., Any],
    device_class: type[Any],
    caplog: pytest.LogCaptureFixture,
    cpu_pod: bool,
    level: int,
) -> None:
    document = replace(stats_document, cuda=CudaMemory(), nvml=()) if cpu_pod else stats_document
    _write(tmp_path / "stats.json", document)
    fake = fake_pynvml([device_class()], init_error=9)  # Driver Not Loaded
    nvml = NvmlReader(fake, retry_every_reads=3)
    observer = ServerObserver(tmp_path / "stats.json", Path("/proc"), nvml)

    with caplog.at_level(logging.INFO):
        for _ in range(4):
            observer.observe()
        fake.init_error = None  # the driver is up: the next retry opens NVML
        for _ in range(3):
            observer.observe()

    told = [r for r in caplog.records if "GPU metrics come from the server only" in r.getMessage()]
    assert [r.levelno for r in told] == [level]
    detail = getattr(told[0], "problem", None) or getattr(told[0], "reason", "")
    assert "Driver Not Loaded" in detail
    back = [
        r for r in caplog.records if r.getMessage() == "GPU metrics measured by the sidecar again"
    ]
    assert len(back) == 1


def test_the_model_fetcher_s_report_file_is_exported_with_how_long_it_has_not_moved(
    tmp_path: Path,
) -> None:
    report_path = tmp_path / "model-fetch.json"
    wall, monotonic = Clock(2e9), Clock(1000.0)
    observer = ServerObserver(
        tmp_path / "stats.json",
        Path("/proc"),
        NvmlReader(None),
        wall,
        monotonic,
        fetch_report_path=report_path,
    )
    registry = _registry(observer)
    # A local model (or a fetcher not started): no fetch figure, not a fake zero.
    assert registry.get_sample_value("fusebox_model_fetch_downloaded_bytes") is None

    # The fetcher's own writer, as the init container runs it.
    fetcher_clock = Clock(0.0)
    progress = Progress(report_path, None, clock=fetcher_clock)
    progress.start(4 << 30, files=3, already=1 << 30)
    written_at = report_path.stat().st_mtime
    wall.now = written_at + 2
    assert registry.get_sample_value("fusebox_model_fetch_info", {"reason": "Downloading"}) == 1
    assert registry.get_sample_value("fusebox_model_fetch_downloaded_bytes") == 1 << 30
    assert registry.get_sample_value("fusebox_model_fetch_total_bytes") == 4 << 30
    assert registry.get_sample_value("fusebox_model_fetch_rate_bytes_per_second") is None
    assert registry.get_sample_value("fusebox_model_fetch_report_age_seconds") == 2
    assert registry.get_sample_value("fusebox_model_fetch_waiting") == 0

    fetcher_clock.now = 4.0
    progress.add(1 << 30)  # a second after the last write: written
    assert registry.get_sample_value("fusebox_model_fetch_downloaded_bytes") == 2 << 30
    assert registry.get_sample_value("fusebox_model_fetch_rate_bytes_per_second") == (1 << 30) / 4

    # Nothing written for 90 s of the sidecar's clock while the wall clock stepped back:
    # the download has not moved for that long whatever the file's stamp says.
    wall.now = report_path.stat().st_mtime - 600
    assert registry.get_sample_value("fusebox_model_fetch_report_age_seconds") == 0
    monotonic.now += 90
    assert registry.get_sample_value("fusebox_model_fetch_report_age_seconds") == 90

    progress.waiting("waiting for another pod's download of this model (shared cache)")
    assert registry.get_sample_value("fusebox_model_fetch_waiting") == 1

    report_path.write_text("not a report")
    assert registry.get_sample_value("fusebox_model_fetch_downloaded_bytes") is None
    assert registry.get_sample_value("fusebox_process_resident_memory_bytes") is None  # no pid


def test_a_report_file_no_fetcher_wrote_never_breaks_a_scrape(tmp_path: Path) -> None:
    report_path = tmp_path / "model-fetch.json"
    observer = ServerObserver(
        tmp_path / "stats.json", Path("/proc"), NvmlReader(None), fetch_report_path=report_path
    )
    registry = _registry(observer)
    for text in (
        "[" * 100_000,
        '{"reason": "Downloading", "message": "", "bytes_done": ' + "9" * 400 + "}",
    ):
        report_path.write_text(text)
        generate_latest(registry)  # a scrape answers
    assert registry.get_sample_value("fusebox_model_fetch_downloaded_bytes") == 0


def test_a_download_rate_is_not_exported_once_the_download_stops_moving_or_ends(
    tmp_path: Path,
) -> None:
    report_path = tmp_path / "model-fetch.json"
    wall, monotonic = Clock(2e9), Clock(1000.0)
    observer = ServerObserver(
        tmp_path / "stats.json",
        Path("/proc"),
        NvmlReader(None),
        wall,
        monotonic,
        fetch_report_path=report_path,
    )
    value = _registry(observer).get_sample_value
    fetcher_clock = Clock(0.0)
    progress = Progress(report_path, None, clock=fetcher_clock)
    progress.start(4 << 30, files=1)
    fetcher_clock.now = 4.0
    progress.add(1 << 30)
    wall.now = report_path.stat().st_mtime + 1
    assert value("fusebox_model_fetch_rate_bytes_per_second") == (1 << 30) / 4

    # The fetcher stalls (or is killed): no write for 31 s. The bytes it has stay true;
    # the rate it last wrote is no longer what arrives.
    wall.now += 30
    monotonic.now += 30
    assert value("fusebox_model_fetch_downloaded_bytes") == 1 << 30
    assert value("fusebox_model_fetch_rate_bytes_per_second") is None

    # The download ends: a verified copy has no rate of its own.
    progress.finish(
        FetchReport(FetchReason.VERIFIED, "verified", 4 << 30, 4 << 30, (4 << 30) / 9.0, files=1)
    )
    wall.now = report_path.stat().st_mtime + 1
    assert value("fusebox_model_fetch_info", {"reason": "Verified"}) == 1
    assert value("fusebox_model_fetch_rate_bytes_per_second") is None


def test_a_server_process_seen_to_exit_has_no_rss_until_a_new_one_writes(
    tmp_path: Path, stats_document: StatsDocument
) -> None:
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        _write(tmp_path / "stats.json", replace(stats_document, pid=server.pid))
        registry = _registry(
            ServerObserver(tmp_path / "stats.json", Path("/proc"), NvmlReader(None), Clock(2e9))
        )
        assert registry.get_sample_value("fusebox_sidecar_measured", {"quantity": "rss"}) == 1
    finally:
        server.kill()
        server.wait()

    # Its last stats file still names it: the RSS written there is a dead process's.
    assert registry.get_sample_value("fusebox_process_resident_memory_bytes") is None
    assert registry.get_sample_value("fusebox_sidecar_measured", {"quantity": "rss"}) == 0

    # A new server whose pid the sidecar cannot see (never measured): its own figure again.
    _write(tmp_path / "stats.json", replace(stats_document, pid=_missing_pid()))
    rss = registry.get_sample_value("fusebox_process_resident_memory_bytes")
    assert rss == stats_document.rss_bytes
