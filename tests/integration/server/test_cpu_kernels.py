"""The server process on CPU: packed and fused layers, the single-query attention, bounded caches.

`python -m fusebox_server` must bound oneDNN's per-shape kernel caches
before torch loads (kernel_caches.py); the load's log line says what torch
loaded with and what `cpu_kernels.pack_for_cpu` switched on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from fusebox_server_harness import ServerProcess

from fusebox_server.model.kernel_caches import KERNEL_CACHE_ENTRIES, KERNEL_CACHE_ENVS


def test_the_server_process_loads_with_packed_layers_and_bounded_kernel_caches(
    server: ServerProcess,
) -> None:
    loads = [
        json.loads(line)
        for line in server.log_text().splitlines()
        if '"event": "model_loaded"' in line
    ]
    assert loads, "no model_loaded line in the server's log"
    first = loads[0]
    assert first["packed_linear_layers"] > 0
    assert first["fused_projection_groups"] > 0
    assert first["single_query_attention"] is True
    # Which layers keep a plain weight for one row is timed on the host: only consistent.
    kept_layers, kept_bytes = first["single_row_plain_layers"], first["single_row_plain_bytes"]
    assert 0 <= kept_layers <= first["packed_linear_layers"] + first["fused_projection_groups"]
    assert (kept_layers == 0) == (kept_bytes == 0)
    assert first["kernel_cache_entries"] == {
        name: str(KERNEL_CACHE_ENTRIES) for name in KERNEL_CACHE_ENVS
    }


def test_a_kernel_cache_bound_that_is_not_a_number_stops_the_server_with_its_name(
    tiny_model_dir: Path,
) -> None:
    # Left to oneDNN, the process would die of SIGSEGV at the first packed product.
    environment = {k: v for k, v in os.environ.items() if not k.startswith("FUSEBOX_")}
    environment["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = "lots"
    flags = ["--model-dir", str(tiny_model_dir), "--device", "cpu"]
    for extra in (["--check-config"], []):
        result = subprocess.run(
            [sys.executable, "-m", "fusebox_server", *extra, *flags],
            capture_output=True,
            text=True,
            env=environment,
            timeout=120,
            check=False,
        )
        assert result.returncode == 2, result.stderr
        assert "ONEDNN_PRIMITIVE_CACHE_CAPACITY='lots'" in result.stderr
        assert "Traceback" not in result.stderr
