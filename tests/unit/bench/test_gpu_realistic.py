"""bench/gpu_realistic.py, the device script: its run keeps to the budget's shares, Fusebox
starts with flags its own parser reads as meant, and the modules it keeps its decisions in
import no torch. The device run itself is proven by its --dry-run
(bench/results/gpu-dryrun/realistic.json)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import gpu_realistic as realistic
from bench.gpu_budget import Budget
from bench.gpu_realistic_budget import PHASE_WEIGHTS
from bench.gpu_realistic_config import for_dry_run, for_gpu
from bench.gpu_realistic_in_process import server_worker_settings
from bench.gpu_servers import FUSEBOX_MODEL, fusebox_command
from fusebox_server.config import CPU_PREFILL_CHUNK_TOKENS, ServerConfig, parse_config

REPO = Path(__file__).resolve().parents[3]
PURE_MODULES = (
    "bench.gpu_budget",
    "bench.gpu_realistic_budget",
    "bench.gpu_realistic_config",
    "bench.gpu_realistic_traffic",
    "bench.gpu_realistic_verdicts",
)
DEVICE_IMPORTS = {"torch", "transformers", "httpx", "subprocess", "asyncio", "fusebox_server"}


def test_the_run_shares_its_budget_and_a_slow_phase_leaves_less_to_the_next(
    tmp_path: Path,
) -> None:
    now = [0.0]
    budget = Budget(530.0, clock=lambda: now[0])
    run = realistic.Run(for_gpu(), budget, tmp_path, tmp_path / "out")
    weights = PHASE_WEIGHTS
    total = sum(weights.values())

    assert run.share("fusebox") == pytest.approx(515.0 * weights["fusebox"] / total)
    now[0] = 400.0  # the servers took longer than their shares
    rest = weights["engine"] + weights["generate"]
    assert run.share("engine") == pytest.approx(115.0 * weights["engine"] / rest)
    now[0] = 520.0
    assert run.share("generate") == 0.0


def test_phases_not_chosen_take_no_share(tmp_path: Path) -> None:
    budget = Budget(115.0, clock=lambda: 0.0)
    run = realistic.Run(for_gpu(), budget, tmp_path, tmp_path / "out")
    run.result["phases"] = ["peers", "generate"]

    weights = PHASE_WEIGHTS
    share = 100.0 * weights["peers"] / (weights["peers"] + weights["generate"])
    assert run.share("peers") == pytest.approx(share)


def test_fusebox_starts_with_the_flags_the_run_means(tmp_path: Path) -> None:
    config = for_dry_run()
    command = fusebox_command(tmp_path, tmp_path, 8123, realistic.fusebox_flags(config, 8))
    served = parse_config(command[3:], {}, read_files=False)  # after `python -m fusebox_server`

    assert (served.port, served.max_concurrency, served.max_queue) == (8123, 8, 0)
    assert served.model_name == FUSEBOX_MODEL  # the name every request asks for
    assert (served.device, served.torch_threads) == ("cpu", config.threads)
    assert served.request_timeout_seconds == int(config.request_timeout_seconds)
    assert served.stats_file == tmp_path / "stats-8123.json"


def test_the_engine_in_process_prefills_as_the_server_does_on_its_device(tmp_path: Path) -> None:
    cpu = server_worker_settings(tmp_path, "cpu")
    assert cpu["prefill_chunk_tokens"] == CPU_PREFILL_CHUNK_TOKENS  # unset: the CPU chunks
    assert server_worker_settings(tmp_path, "cuda:0")["prefill_chunk_tokens"] == 0  # whole
    assert cpu["prefix_cache_bytes"] == ServerConfig(model_dir=tmp_path).prefix_cache_bytes


@pytest.mark.parametrize("module", PURE_MODULES)
def test_the_modules_that_decide_import_nothing_of_the_device(module: str) -> None:
    """Their own imports name no device library, and importing them loads no torch."""
    path = REPO / (module.replace(".", "/") + ".py")
    named = set()
    for node in ast.parse(path.read_text()).body:  # the module level; a function may import lazily
        if isinstance(node, ast.Import):
            named |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            named.add(node.module.split(".")[0])
    assert not named & DEVICE_IMPORTS, f"{module} imports {sorted(named & DEVICE_IMPORTS)}"

    probe = f"import sys, json, {module}; print(json.dumps(sorted(sys.modules)))"
    loaded = json.loads(
        subprocess.run(
            [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout
    )
    assert not {"torch", "transformers"} & set(loaded)
