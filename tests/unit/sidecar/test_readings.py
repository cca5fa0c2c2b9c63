"""The /proc status parser: VmRSS in bytes, and files without a usable one."""

from __future__ import annotations

import pytest

from fusebox_sidecar.readings import parse_proc_status


def test_proc_status_rss_is_read_in_bytes() -> None:
    text = "Name:\tpython\nVmPeak:\t  900 kB\nVmRSS:\t  123456 kB\nThreads:\t4\n"

    assert parse_proc_status(text).rss_bytes == 123456 * 1024


@pytest.mark.parametrize(
    "text",
    ["Name:\tkthreadd\nState:\tS (sleeping)\n", "VmRSS:\tlots\n", "VmRSS:\t12 MB\n", ""],
)
def test_proc_status_without_a_usable_vmrss_has_no_rss(text: str) -> None:
    assert parse_proc_status(text).rss_bytes is None
