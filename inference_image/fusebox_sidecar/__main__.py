"""`python -m fusebox_sidecar`: wire config, NVML, observer and collector, then serve."""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType

from prometheus_client.registry import CollectorRegistry

from fusebox_sidecar import jsonlog
from fusebox_sidecar.collectors import SidecarCollector
from fusebox_sidecar.config import parse_config
from fusebox_sidecar.nvml import NvmlReader, load_pynvml
from fusebox_sidecar.observer import ServerObserver
from fusebox_sidecar.server import make_app, make_http_server

log = logging.getLogger("fusebox_sidecar")


def _stop(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def main(argv: Sequence[str]) -> int:
    config = parse_config(argv, os.environ)
    jsonlog.configure(config.log_level)
    nvml = NvmlReader(load_pynvml())
    observer = ServerObserver(
        config.stats_file, config.proc_root, nvml, fetch_report_path=config.fetch_report_file
    )
    registry = CollectorRegistry()
    registry.register(SidecarCollector(observer.observe))
    httpd = make_http_server(config.host, config.port, make_app(registry))
    signal.signal(signal.SIGTERM, _stop)
    host, port = httpd.server_address[:2]
    log.info(
        "listening",
        extra={"host": host, "port": port, "stats_file": str(config.stats_file)},
    )
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
        nvml.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
