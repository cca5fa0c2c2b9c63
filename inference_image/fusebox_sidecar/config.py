"""Command-line flags and their environment variables.

Every flag has an env var `FUSEBOX_SIDECAR_<NAME>` so the operator can set
it in the pod spec; a flag given on the command line wins over the env var.
A bad value stops the sidecar at start with a message naming the flag,
rather than serving wrong numbers later.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fusebox_contract.model_fetch import FETCH_REPORT_FILE

ENV_PREFIX = "FUSEBOX_SIDECAR_"
LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True)
class SidecarConfig:
    stats_file: Path
    fetch_report_file: Path | None
    host: str
    port: int
    proc_root: Path
    log_level: str


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not in 0..65535")
    return port


def _parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    def env(name: str, default: str) -> str:
        return environ.get(ENV_PREFIX + name, default)

    parser = argparse.ArgumentParser(
        prog="python -m fusebox_sidecar",
        description="Fusebox metrics sidecar: Prometheus metrics for one inference server. "
        f"Each flag can also be set with the env var {ENV_PREFIX}<FLAG> "
        "(e.g. FUSEBOX_SIDECAR_STATS_FILE).",
    )
    parser.add_argument(
        "--stats-file",
        "--stats",
        dest="stats_file",
        type=Path,
        default=env("STATS_FILE", "/run/fusebox/stats.json"),
        help="the server's stats file (env FUSEBOX_SIDECAR_STATS_FILE; default %(default)s)",
    )
    parser.add_argument(
        "--fetch-report-file",
        default=env("FETCH_REPORT_FILE", FETCH_REPORT_FILE),
        help="the model fetcher's report, exported while it downloads; empty: none "
        "(env FUSEBOX_SIDECAR_FETCH_REPORT_FILE; default %(default)s)",
    )
    parser.add_argument(
        "--host",
        default=env("HOST", "0.0.0.0"),
        help="address to listen on (env FUSEBOX_SIDECAR_HOST; default %(default)s)",
    )
    parser.add_argument(
        "--port",
        type=_port,
        default=env("PORT", "9400"),
        help="port for /metrics and /healthz; 0 picks a free one "
        "(env FUSEBOX_SIDECAR_PORT; default %(default)s)",
    )
    parser.add_argument(
        "--proc-root",
        type=Path,
        default=env("PROC_ROOT", "/proc"),
        help="where the server's /proc is mounted (env FUSEBOX_SIDECAR_PROC_ROOT; "
        "default %(default)s)",
    )
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default=env("LOG_LEVEL", "info").lower(),
        help="env FUSEBOX_SIDECAR_LOG_LEVEL; default %(default)s",
    )
    return parser


def parse_config(argv: Sequence[str], environ: Mapping[str, str]) -> SidecarConfig:
    """Flags over env vars over defaults; exits with status 2 on a bad value."""
    arguments = _parser(environ).parse_args(list(argv))
    if arguments.log_level not in LOG_LEVELS:
        _parser(environ).error(f"--log-level: {arguments.log_level!r} is not one of {LOG_LEVELS}")
    return SidecarConfig(
        stats_file=arguments.stats_file,
        fetch_report_file=Path(report) if (report := arguments.fetch_report_file) else None,
        host=arguments.host,
        port=arguments.port,
        proc_root=arguments.proc_root,
        log_level=arguments.log_level,
    )
