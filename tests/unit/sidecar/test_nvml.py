"""NVML readings and the classification of its failures, against the fake
pynvml module (the only fake in the suite) and, through the collector, the
metrics a user sees."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
from prometheus_client.registry import CollectorRegistry

from fusebox_contract.stats import GpuMemory, StatsDocument, StatsReading
from fusebox_sidecar.collectors import Observation, SidecarCollector
from fusebox_sidecar.nvml import GpuAccess, GpuReading, NvmlReader
from fusebox_sidecar.readings import ProcOutcome, ProcReading

FakeNvml = Callable[..., ModuleType]
SERVER_PID = 4242
GiB = 1024**3


def _scrape(reading: GpuReading, stats: StatsReading | None = None) -> CollectorRegistry:
    observation = Observation(
        0.0,
        stats or StatsReading(None, "missing"),
        None,
        ProcReading(ProcOutcome.NO_PID),
        reading,
    )
    registry = CollectorRegistry()
    registry.register(SidecarCollector(lambda: observation))
    return registry


def test_normal_device_memory_and_the_server_process_share(
    fake_pynvml: FakeNvml, device_class: type[Any]
) -> None:
    nvml = fake_pynvml(
        [
            device_class(
                used_bytes=20 * GiB,
                total_bytes=80 * GiB,
                processes=[(SERVER_PID, 18 * GiB), (999, 1 * GiB)],
            )
        ]
    )

    reading = NvmlReader(nvml).read(SERVER_PID)
    registry = _scrape(reading)

    assert reading.access is GpuAccess.OK
    assert registry.get_sample_value("fusebox_gpu_visible") == 1
    assert registry.get_sample_value("fusebox_gpu_lost") == 0
    assert registry.get_sample_value("fusebox_gpu_memory_used_bytes", {"gpu": "0"}) == 20 * GiB
    assert registry.get_sample_value("fusebox_gpu_memory_total_bytes", {"gpu": "0"}) == 80 * GiB
    assert (
        registry.get_sample_value("fusebox_gpu_process_memory_used_bytes", {"gpu": "0"}) == 18 * GiB
    )


@pytest.mark.parametrize(
    "processes",
    [
        [(SERVER_PID, None)],  # NVML withholds the figure
        None,  # per-process queries not supported
        [(31337, 5 * GiB)],  # another pid namespace: the server's host pid is not ours
    ],
)
def test_per_process_unavailable_falls_back_to_device_level(
    fake_pynvml: FakeNvml,
    device_class: type[Any],
    processes: list[tuple[int, int | None]] | None,
) -> None:
    nvml = fake_pynvml([device_class(used_bytes=7 * GiB, processes=processes)])

    registry = _scrape(NvmlReader(nvml).read(SERVER_PID))

    assert registry.get_sample_value("fusebox_gpu_memory_used_bytes", {"gpu": "0"}) == 7 * GiB
    assert registry.get_sample_value("fusebox_gpu_process_memory_used_bytes", {"gpu": "0"}) is None
    assert registry.get_sample_value("fusebox_gpu_lost") == 0


def test_a_lost_gpu_sets_gpu_lost_and_drops_only_its_numbers(
    fake_pynvml: FakeNvml, device_class: type[Any]
) -> None:
    nvml = fake_pynvml([device_class(lost=True), device_class(used_bytes=2 * GiB)])

    registry = _scrape(NvmlReader(nvml).read(SERVER_PID))

    assert registry.get_sample_value("fusebox_gpu_lost") == 1
    assert registry.get_sample_value("fusebox_gpu_visible") == 1
    assert registry.get_sample_value("fusebox_gpu_memory_used_bytes", {"gpu": "0"}) is None
    assert registry.get_sample_value("fusebox_gpu_memory_used_bytes", {"gpu": "1"}) == 2 * GiB


def test_a_gpu_lost_on_the_process_list_call_drops_its_memory_figures(
    fake_pynvml: FakeNvml, device_class: type[Any]
) -> None:
    # Memory info answered a moment before the loss; those figures describe a gone device.
    nvml = fake_pynvml([device_class(used_bytes=9 * GiB, processes_error=15)])

    registry = _scrape(NvmlReader(nvml).read(SERVER_PID))

    assert registry.get_sample_value("fusebox_gpu_lost") == 1
    assert registry.get_sample_value("fusebox_gpu_memory_used_bytes", {"gpu": "0"}) is None
    assert registry.get_sample_value("fusebox_gpu_memory_total_bytes", {"gpu": "0"}) is None


@pytest.mark.parametrize(("code", "why"), [(3, "Not Supported"), (999, "Unknown Error")])
def test_a_device_whose_memory_nvml_cannot_read_takes_the_server_figure(
    fake_pynvml: FakeNvml, device_class: type[Any], code: int, why: str
) -> None:
    nvml = fake_pynvml([device_class(memory_error=code), device_class(used_bytes=2 * GiB)])
    server_saw = StatsDocument(
        written_at=1.0,
        nvml=(
            GpuMemory(index=0, memory_used_bytes=17 * GiB, memory_total_bytes=80 * GiB),
            GpuMemory(index=1, memory_used_bytes=5 * GiB, memory_total_bytes=80 * GiB),
        ),
    )

    reading = NvmlReader(nvml).read(SERVER_PID)
    registry = _scrape(reading, StatsReading(server_saw))

    assert reading.devices[0].read_error == why
    assert registry.get_sample_value("fusebox_gpu_lost") == 0
    assert registry.get_sample_value("fusebox_gpu_memory_used_bytes", {"gpu": "0"}) == 17 * GiB
    assert registry.get_sample_value("fusebox_gpu_memory_total_bytes", {"gpu": "0"}) == 80 * GiB
    # The device the sidecar could read keeps its own measurement.
    assert registry.get_sample_value("fusebox_gpu_memory_used_bytes", {"gpu": "1"}) == 2 * GiB


@pytest.mark.parametrize(("code", "why"), [(12, "Library Not Found"), (9, "Driver Not Loaded")])
def test_nvml_that_cannot_initialise_means_no_gpu_metrics(
    fake_pynvml: FakeNvml, code: int, why: str
) -> None:
    reading = NvmlReader(fake_pynvml([], init_error=code)).read(SERVER_PID)
    registry = _scrape(reading)

    assert reading.access is GpuAccess.UNAVAILABLE and why in reading.detail
    assert registry.get_sample_value("fusebox_gpu_visible") == 0
    assert registry.get_sample_value("fusebox_gpu_lost") is None
    assert registry.get_sample_value("fusebox_gpu_memory_used_bytes", {"gpu": "0"}) is None


def test_nvml_that_failed_to_initialise_is_tried_again_every_few_scrapes(
    fake_pynvml: FakeNvml, device_class: type[Any]
) -> None:
    nvml = fake_pynvml([device_class(used_bytes=5 * GiB)], init_error=9)  # Driver Not Loaded
    reader = NvmlReader(nvml, retry_every_reads=3)

    assert reader.read(SERVER_PID).access is GpuAccess.UNAVAILABLE
    nvml.init_error = None  # type: ignore[attr-defined]  # the driver came up after the sidecar
    assert reader.read(SERVER_PID).access is GpuAccess.UNAVAILABLE  # not tried yet
    registry = _scrape(reader.read(SERVER_PID))  # the third read tries again

    assert registry.get_sample_value("fusebox_gpu_visible") == 1
    assert registry.get_sample_value("fusebox_gpu_memory_used_bytes", {"gpu": "0"}) == 5 * GiB
    assert nvml.calls["init"] == 2  # type: ignore[attr-defined]
    for _ in range(5):
        reader.read(SERVER_PID)
    reader.close()
    assert nvml.calls == {"init": 2, "shutdown": 1}  # type: ignore[attr-defined]


def test_nvml_that_never_initialises_is_retried_and_stays_unavailable(
    fake_pynvml: FakeNvml,
) -> None:
    nvml = fake_pynvml([], init_error=12)
    reader = NvmlReader(nvml, retry_every_reads=2)

    readings = [reader.read(SERVER_PID) for _ in range(6)]

    assert {reading.access for reading in readings} == {GpuAccess.UNAVAILABLE}
    assert nvml.calls["init"] == 4  # type: ignore[attr-defined]  # at start, then every 2 reads


def test_nvidia_ml_py_not_installed_means_no_gpu_metrics() -> None:
    reading = NvmlReader(None).read(SERVER_PID)

    assert reading.access is GpuAccess.NOT_INSTALLED
    assert _scrape(reading).get_sample_value("fusebox_gpu_visible") == 0


def test_zero_devices_is_no_gpu(fake_pynvml: FakeNvml) -> None:
    reading = NvmlReader(fake_pynvml([])).read(SERVER_PID)

    assert reading.access is GpuAccess.NO_GPU
    assert _scrape(reading).get_sample_value("fusebox_gpu_visible") == 0


def test_nvml_initialises_once_and_shuts_down_on_close(
    fake_pynvml: FakeNvml, device_class: type[Any]
) -> None:
    nvml = fake_pynvml([device_class()])
    reader = NvmlReader(nvml)

    for _ in range(3):
        reader.read(SERVER_PID)
    reader.close()

    assert nvml.calls == {"init": 1, "shutdown": 1}  # type: ignore[attr-defined]
