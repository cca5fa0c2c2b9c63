"""The server's NVML reader (`fusebox_server.model.memory.Nvml`) against a fake pynvml
(NVML is the hardware edge): one device NVML cannot read is left out alone, and every
failure is logged, once per device and message in a while, never swallowed."""

from __future__ import annotations

from types import ModuleType, SimpleNamespace

import structlog

from fusebox_server.model.memory import NVML_ERROR_LOG_SECONDS, Nvml

GiB = 1024**3


class NVMLError(Exception):
    pass


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fake_pynvml(
    used_bytes: list[int], unreadable: frozenset[int] = frozenset(), init_error: str = ""
) -> ModuleType:
    module = ModuleType("pynvml")
    module.count_error = ""  # type: ignore[attr-defined]

    def init() -> None:
        if init_error:
            raise NVMLError(init_error)

    def count() -> int:
        if module.count_error:  # type: ignore[attr-defined]
            raise NVMLError(module.count_error)  # type: ignore[attr-defined]
        return len(used_bytes)

    def memory_info(index: int) -> SimpleNamespace:
        if index in unreadable:
            raise NVMLError("Unknown Error")
        return SimpleNamespace(used=used_bytes[index], total=80 * GiB)

    module.nvmlInit = init  # type: ignore[attr-defined]
    module.nvmlDeviceGetCount = count  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByIndex = lambda index: index  # type: ignore[attr-defined]
    module.nvmlDeviceGetMemoryInfo = memory_info  # type: ignore[attr-defined]
    module.nvmlDeviceGetUUID = lambda index: f"GPU-{index}".encode()  # type: ignore[attr-defined]
    return module


def test_every_readable_gpu_is_reported() -> None:
    nvml = Nvml(lambda: fake_pynvml([1 * GiB, 2 * GiB]))

    assert [(d["index"], d["uuid"], d["memory_used_bytes"]) for d in nvml.devices()] == [
        (0, "GPU-0", 1 * GiB),
        (1, "GPU-1", 2 * GiB),
    ]


def test_a_gpu_nvml_cannot_read_is_left_out_alone_and_logged_once_in_a_while() -> None:
    clock = Clock()
    nvml = Nvml(lambda: fake_pynvml([1 * GiB, 2 * GiB], unreadable=frozenset({0})), clock)

    with structlog.testing.capture_logs() as logs:
        seen = [nvml.devices() for _ in range(5)]
        clock.now += NVML_ERROR_LOG_SECONDS
        nvml.devices()

    assert all([d["index"] for d in devices] == [1] for devices in seen)
    failures = [e for e in logs if e["event"] == "nvml_device_read_failed"]
    assert [(e["log_level"], e["gpu"], e["error"]) for e in failures] == [
        ("warning", 0, "Unknown Error"),
        ("warning", 0, "Unknown Error"),  # again after NVML_ERROR_LOG_SECONDS
    ]


def test_nvml_that_cannot_count_its_gpus_says_so() -> None:
    module = fake_pynvml([1 * GiB])
    nvml = Nvml(lambda: module)
    module.count_error = "GPU is lost"  # type: ignore[attr-defined]

    with structlog.testing.capture_logs() as logs:
        assert nvml.devices() == []
        assert nvml.devices() == []

    failures = [e for e in logs if e["event"] == "nvml_device_count_failed"]
    assert [(e["log_level"], e["error"]) for e in failures] == [("warning", "GPU is lost")]


def test_nvml_that_does_not_initialise_is_logged_and_reports_no_gpu() -> None:
    with structlog.testing.capture_logs() as logs:
        nvml = Nvml(lambda: fake_pynvml([1 * GiB], init_error="Driver Not Loaded"))

    assert nvml.devices() == []
    assert [(e["event"], e["log_level"], e["error"]) for e in logs] == [
        ("nvml_unavailable", "info", "Driver Not Loaded")
    ]


def test_no_nvidia_ml_py_is_no_gpu_and_nothing_to_log() -> None:
    with structlog.testing.capture_logs() as logs:
        assert Nvml(lambda: None).devices() == []
    assert logs == []
