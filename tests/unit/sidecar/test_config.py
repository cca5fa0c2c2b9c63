"""Flags, their env vars, and clear failures for bad values."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fusebox_sidecar.config import ENV_PREFIX, _parser, parse_config

METRICS_DOC = Path(__file__).resolve().parents[3] / "docs" / "metrics.md"


def test_defaults_match_the_pod_layout() -> None:
    config = parse_config([], {})

    assert config.stats_file == Path("/run/fusebox/stats.json")
    assert config.fetch_report_file == Path("/run/fusebox/model-fetch.json")  # FETCH_REPORT_FILE
    assert (config.host, config.port) == ("0.0.0.0", 9400)
    assert config.proc_root == Path("/proc")


def test_env_vars_set_every_flag() -> None:
    config = parse_config(
        [],
        {
            "FUSEBOX_SIDECAR_STATS_FILE": "/tmp/s.json",
            "FUSEBOX_SIDECAR_HOST": "127.0.0.1",
            "FUSEBOX_SIDECAR_PORT": "9500",
            "FUSEBOX_SIDECAR_PROC_ROOT": "/host/proc",
            "FUSEBOX_SIDECAR_LOG_LEVEL": "WARNING",
            "FUSEBOX_SIDECAR_FETCH_REPORT_FILE": "/tmp/fetch.json",
        },
    )
    assert config.fetch_report_file == Path("/tmp/fetch.json")

    assert config.stats_file == Path("/tmp/s.json")
    assert (config.host, config.port) == ("127.0.0.1", 9500)
    assert config.proc_root == Path("/host/proc")
    assert config.log_level == "warning"


def test_flags_win_over_env_and_stats_is_an_alias() -> None:
    config = parse_config(
        ["--stats", "/a.json", "--port", "1234"],
        {"FUSEBOX_SIDECAR_STATS_FILE": "/b.json", "FUSEBOX_SIDECAR_PORT": "9"},
    )

    assert config.stats_file == Path("/a.json")
    assert config.port == 1234


@pytest.mark.parametrize(
    ("argv", "environ", "message"),
    [
        (["--port", "http"], {}, "'http' is not a port number"),
        (["--port", "70000"], {}, "70000 is not in 0..65535"),
        ([], {"FUSEBOX_SIDECAR_PORT": "-1"}, "-1 is not in 0..65535"),
        (["--log-level", "loud"], {}, "invalid choice"),
    ],
)
def test_a_bad_value_stops_with_a_message_naming_the_flag(
    argv: list[str], environ: dict[str, str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_config(argv, environ)

    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert message in error and "--" in error


def test_an_empty_fetch_report_file_turns_the_fetch_figures_off() -> None:
    assert parse_config(["--fetch-report-file", ""], {}).fetch_report_file is None


def test_the_metrics_docs_flag_table_lists_every_flag_with_its_env_var() -> None:
    flags = {
        action.option_strings[0]
        for action in _parser({})._actions
        if action.option_strings and action.dest != "help"
    }
    rows = re.findall(r"^\| `(--[a-z-]+)`[^|]*\| `([A-Z_]+)` \|", METRICS_DOC.read_text(), re.M)

    assert {flag for flag, _ in rows} == flags
    for flag, env in rows:
        assert env == ENV_PREFIX + flag.removeprefix("--").replace("-", "_").upper()
