"""The server's memory-cgroup reader on both layouts the kernel offers.

The memory guard, the stats file and the ladder's before/after figures read
`cgroup_memory()`. This host mounts cgroup v1 only, so the integration tests
(tests/integration/server/test_memory_guard.py) run its v1 branch; here each
layout is laid out as the kernel shows it (a process's /proc/self/cgroup, and
the files of its cgroup directory), so the v2 branch is read too.
"""

from __future__ import annotations

from pathlib import Path

from fusebox_server.model.memory import CgroupMemory, cgroup_memory

GIB = 1 << 30
V1_NO_LIMIT = "9223372036854771712"  # what v1 shows for an unlimited cgroup


def layout(tmp_path: Path, self_cgroup: str, files: dict[str, str]) -> tuple[Path, Path]:
    """A /proc/self/cgroup and a cgroup mount with `files` (paths under the mount)."""
    root = tmp_path / "sys-fs-cgroup"
    for relative, content in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text(self_cgroup)
    return proc, root


def test_v2_reads_memory_current_less_inactive_file_and_memory_max(tmp_path: Path) -> None:
    proc, root = layout(
        tmp_path,
        "0::/kubepods/burstable/pod1/server\n",
        {
            "cgroup.controllers": "cpu memory pids\n",
            "kubepods/burstable/pod1/server/memory.current": f"{3 * GIB}\n",
            "kubepods/burstable/pod1/server/memory.max": f"{4 * GIB}\n",
            "kubepods/burstable/pod1/server/memory.stat": (
                f"anon {2 * GIB}\nfile {GIB}\nactive_file 0\ninactive_file {GIB}\n"
            ),
        },
    )
    assert cgroup_memory(proc, root) == CgroupMemory(2 * GIB, 4 * GIB)


def test_v2_without_a_limit_reports_none_not_a_number(tmp_path: Path) -> None:
    proc, root = layout(
        tmp_path,
        "0::/guarded\n",
        {
            "guarded/memory.current": f"{GIB}\n",
            "guarded/memory.max": "max\n",
            "guarded/memory.stat": "inactive_file 0\n",
        },
    )
    assert cgroup_memory(proc, root) == CgroupMemory(GIB, None)


def test_v1_reads_usage_less_total_inactive_file_and_its_limit(tmp_path: Path) -> None:
    proc, root = layout(
        tmp_path,
        "12:memory:/guarded\n4:cpu,cpuacct:/\n1:name=systemd:/\n",
        {
            "memory/cgroup.procs": "",
            "memory/guarded/memory.usage_in_bytes": f"{3 * GIB}\n",
            "memory/guarded/memory.limit_in_bytes": f"{4 * GIB}\n",
            "memory/guarded/memory.stat": f"inactive_file 7\ntotal_inactive_file {GIB}\n",
        },
    )
    assert cgroup_memory(proc, root) == CgroupMemory(2 * GIB, 4 * GIB)


def test_v1_unlimited_is_none(tmp_path: Path) -> None:
    proc, root = layout(
        tmp_path,
        "12:memory:/\n",
        {
            "memory/memory.usage_in_bytes": f"{GIB}\n",
            "memory/memory.limit_in_bytes": f"{V1_NO_LIMIT}\n",
            "memory/memory.stat": "total_inactive_file 0\n",
        },
    )
    assert cgroup_memory(proc, root) == CgroupMemory(GIB, None)


def test_a_hybrid_host_reads_the_v1_memory_controller(tmp_path: Path) -> None:
    """systemd's hybrid layout has a v2 line too, but memory is bound to v1 there."""
    proc, root = layout(
        tmp_path,
        "12:memory:/guarded\n0::/guarded\n",
        {
            "memory/guarded/memory.usage_in_bytes": f"{GIB}\n",
            "memory/guarded/memory.limit_in_bytes": f"{2 * GIB}\n",
            "memory/guarded/memory.stat": "total_inactive_file 0\n",
            "guarded/memory.current": f"{3 * GIB}\n",
            "guarded/memory.max": "max\n",
        },
    )
    assert cgroup_memory(proc, root) == CgroupMemory(GIB, 2 * GIB)


def test_no_memory_cgroup_is_none_not_zero(tmp_path: Path) -> None:
    proc, root = layout(tmp_path, "4:cpu,cpuacct:/\n", {})
    assert cgroup_memory(proc, root) == CgroupMemory(None, None)
