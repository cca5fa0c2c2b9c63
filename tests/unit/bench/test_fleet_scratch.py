"""The fleet bench's work directory (etcd's data, certificates, logs: up to 600 MB)
is removed when a run ends, a failed one too; --keep-work keeps it."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.operator_scale_bench import scratch

pytestmark = pytest.mark.unit


def test_a_finished_run_leaves_no_work_directory(tmp_path: Path) -> None:
    with scratch(parent=tmp_path) as work:
        (work / "etcd").mkdir()
        (work / "etcd" / "db").write_bytes(b"x" * 1024)
    assert not work.exists()
    assert list(tmp_path.iterdir()) == []


def test_a_failed_run_leaves_none_and_prints_its_logs_tails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(RuntimeError, match="apiserver never came up"):
        with scratch(parent=tmp_path) as work:
            (work / "apiserver.log").write_text("first\nbind: address already in use\n")
            raise RuntimeError("apiserver never came up")
    assert not work.exists()
    assert "bind: address already in use" in capsys.readouterr().err


def test_keep_work_keeps_it_and_says_where(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with scratch(keep=True, parent=tmp_path) as work:
        (work / "operator.log").write_text("ok\n")
    assert (work / "operator.log").exists()
    assert str(work) in capsys.readouterr().err
