"""The node's memory: /proc/meminfo and /proc/pressure/memory parsed, read from a
proc root (real files in a temporary directory, and this machine's own /proc),
and exported under the contract's names."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from fusebox_contract.metrics import STALL_LABEL, MemoryStall, Metric
from fusebox_contract.stats import StatsReading
from fusebox_sidecar.collectors import Observation, SidecarCollector
from fusebox_sidecar.node_memory import (
    NodeMemory,
    parse_meminfo,
    parse_pressure,
    read_node_memory,
)
from fusebox_sidecar.nvml import GpuAccess, GpuReading
from fusebox_sidecar.readings import ProcOutcome, ProcReading

MEMINFO = """MemTotal:       24684092 kB
MemFree:         1000000 kB
MemAvailable:    2097152 kB
Buffers:           12345 kB
"""
PRESSURE = """some avg10=12.50 avg60=3.00 avg300=1.00 total=1565243
full avg10=4.00 avg60=1.00 avg300=0.20 total=1064577
"""


def test_meminfo_gives_available_and_total_in_bytes() -> None:
    assert parse_meminfo(MEMINFO) == (2097152 * 1024, 24684092 * 1024)


def test_meminfo_without_mem_available_leaves_it_absent() -> None:
    # Kernels before 3.14 have no MemAvailable: never guess it from MemFree.
    assert parse_meminfo("MemTotal: 1000 kB\nMemFree: 900 kB\n") == (None, 1000 * 1024)


def test_meminfo_garbage_is_absent_not_zero() -> None:
    assert parse_meminfo("MemAvailable: lots kB\nMemTotal: 12 MB\n") == (None, None)


def test_pressure_gives_the_avg10_share_of_each_stall_line() -> None:
    assert parse_pressure(PRESSURE) == ((MemoryStall.SOME, 0.125), (MemoryStall.FULL, 0.04))


def test_pressure_ignores_unknown_lines_and_bad_values() -> None:
    text = "some avg10=abc avg60=1\npartial avg10=5.00\nfull avg10=250.00\n"
    assert parse_pressure(text) == ()


def test_pressure_skips_blank_and_malformed_lines() -> None:
    text = "\n" + PRESSURE.replace("\n", "\n\n   \n", 1) + "full\n"
    assert parse_pressure(text) == ((MemoryStall.SOME, 0.125), (MemoryStall.FULL, 0.04))


def test_a_pressure_file_with_a_blank_line_still_reads(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text(MEMINFO)
    (tmp_path / "pressure").mkdir()
    (tmp_path / "pressure" / "memory").write_text(PRESSURE.replace("\n", "\n\n", 1))
    node = read_node_memory(tmp_path)
    assert node.available_bytes == 2097152 * 1024
    assert node.pressure == ((MemoryStall.SOME, 0.125), (MemoryStall.FULL, 0.04))


def test_read_from_a_proc_root(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text(MEMINFO)
    (tmp_path / "pressure").mkdir()
    (tmp_path / "pressure" / "memory").write_text(PRESSURE)
    node = read_node_memory(tmp_path)
    assert node == NodeMemory(
        2097152 * 1024, 24684092 * 1024, ((MemoryStall.SOME, 0.125), (MemoryStall.FULL, 0.04))
    )


def test_a_kernel_without_psi_still_gives_meminfo(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text(MEMINFO)
    node = read_node_memory(tmp_path)
    assert node.available_bytes == 2097152 * 1024
    assert node.pressure == ()


def test_nothing_readable_is_all_absent(tmp_path: Path) -> None:
    assert read_node_memory(tmp_path / "missing") == NodeMemory()


def test_this_machines_proc_reads() -> None:
    node = read_node_memory(Path("/proc"))
    assert node.total_bytes is not None and node.available_bytes is not None
    assert 0 < node.available_bytes <= node.total_bytes


def _scrape(node: NodeMemory) -> dict[str, list[tuple[dict[str, str], float]]]:
    observation = Observation(
        1796000010.0,
        StatsReading(None, "missing"),
        None,
        ProcReading(ProcOutcome.NO_PID),
        GpuReading(GpuAccess.NOT_INSTALLED, detail="not installed"),
        node,
    )
    registry = CollectorRegistry()
    registry.register(SidecarCollector(lambda: observation))
    text = generate_latest(registry).decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return samples


def test_node_memory_is_exported_under_the_contract_names() -> None:
    samples = _scrape(read_node_memory_from_text())
    assert samples[Metric.NODE_MEMORY_AVAILABLE_BYTES.sample] == [({}, 2097152 * 1024)]
    assert samples[Metric.NODE_MEMORY_TOTAL_BYTES.sample] == [({}, 24684092 * 1024)]
    assert sorted(samples[Metric.NODE_MEMORY_PRESSURE_RATIO.sample], key=str) == [
        ({STALL_LABEL: MemoryStall.FULL.value}, 0.04),
        ({STALL_LABEL: MemoryStall.SOME.value}, 0.125),
    ]


def test_unmeasured_node_memory_is_left_out_never_zero() -> None:
    samples = _scrape(NodeMemory())
    node_metrics = (
        Metric.NODE_MEMORY_AVAILABLE_BYTES,
        Metric.NODE_MEMORY_TOTAL_BYTES,
        Metric.NODE_MEMORY_PRESSURE_RATIO,
    )
    assert [m for m in node_metrics if m.sample in samples] == []


def read_node_memory_from_text() -> NodeMemory:
    available, total = parse_meminfo(MEMINFO)
    return NodeMemory(available, total, parse_pressure(PRESSURE))
