"""The sidecar ships in the server's image but must stay small: importing
and scraping it may not pull in torch, transformers or numpy."""

from __future__ import annotations

import subprocess
import sys

_SCRAPE_AND_LIST_HEAVY_MODULES = """
import sys
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry
import fusebox_sidecar.__main__
from fusebox_sidecar.collectors import SidecarCollector
from fusebox_sidecar.nvml import NvmlReader, load_pynvml
from fusebox_sidecar.observer import ServerObserver
from pathlib import Path
registry = CollectorRegistry()
observer = ServerObserver(Path("/nonexistent"), Path("/proc"), NvmlReader(load_pynvml()))
registry.register(SidecarCollector(observer.observe))
assert b"fusebox_stats_valid 0.0" in generate_latest(registry)
heavy = {"torch", "transformers", "numpy", "tokenizers", "fusebox_server"}
print(sorted(name for name in sys.modules if name.split(".")[0] in heavy))
"""


def test_the_sidecar_imports_and_scrapes_without_torch() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _SCRAPE_AND_LIST_HEAVY_MODULES],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )

    assert result.stdout.strip() == "[]"
