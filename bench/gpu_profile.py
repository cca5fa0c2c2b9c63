"""Where a GPU decode step's time goes: Fusebox's DecodeBatch against plain transformers.

Issue 12's GPU figures (docs/decisions/speed.md) show Fusebox at 0.5-0.6x
`transformers serve --cb-use-cuda-graph`. Before choosing a remedy (CUDA
graphs, a static cache, fewer host syncs), this measures one decode step on
the model the bench uses, with no HTTP and no scheduler in the way:

- per batch size (32 and 64 rows, greedy) and with torch's cuDNN attention
  backend on and off: the wall time of a `DecodeBatch.step` over --steps
  steps whose shapes (rows x cached length) the process has not seen yet
  (cold, as under real traffic) and over the same shapes again (warm), and
  of a plain transformers decode step (one token, DynamicCache);
- a torch.profiler trace of a few Fusebox steps: the GPU's busy time per
  step (the sum of kernel times), kernel launches per step, and the ops
  with the most host time. A step whose wall time is far above its GPU
  time is bound by the host (Python and launches), which CUDA graphs cure.

Writes profile.json and profile.md under --out. `--dry-run` runs the small
model on the CPU to prove the script (no GPU figures then).

    python3 bench/gpu_profile.py --out "$OUT"                 # on the H200
    .venv/bin/python bench/gpu_profile.py --dry-run --out /tmp/gpu-profile
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.gpu_bench import ensure_bench_model  # noqa: E402
from bench.server_bench import PROMPTS  # noqa: E402
from fusebox_contract.names import Dtype, Quantization  # noqa: E402
from fusebox_server import engine  # noqa: E402
from fusebox_server.openai_schema import Sampling  # noqa: E402

PREFILL_GROUP = 8
PROFILED_STEPS = 4
TOP_OPS = 15


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def prompt_ids(tokenizer: Any, rows: int) -> list[tuple[int, ...]]:
    texts = [PROMPTS[index % len(PROMPTS)] for index in range(rows)]
    return [tuple(tokenizer(text).input_ids) for text in texts]


def fusebox_batch(loaded: engine.LoadedModel, prompts: list[tuple[int, ...]]) -> Any:
    """A DecodeBatch holding every prompt, prefilled in groups as the worker does."""
    rows = [engine.Decoding(loaded, ids, Sampling(4096, 0.0, 1.0, None, ())) for ids in prompts]
    batch = engine.DecodeBatch(loaded)
    for start in range(0, len(rows), PREFILL_GROUP):
        group = rows[start : start + PREFILL_GROUP]
        engine.prefill(loaded, group)
        batch.add(*group)
    return batch


def timed_steps(step: Any, steps: int, device: torch.device) -> list[float]:
    seconds = []
    for _ in range(steps):
        synchronize(device)
        started = time.perf_counter()
        step()
        synchronize(device)
        seconds.append(time.perf_counter() - started)
    return seconds


def plain_transformers_step(loaded: engine.LoadedModel, rows: int) -> Any:
    """A greedy decode step of the bare model over `rows` equal prompts (no masks, no batch
    bookkeeping): the floor an eager transformers loop reaches on this machine."""
    from transformers import DynamicCache

    model, device = loaded.model, loaded.device
    ids = torch.tensor([list(range(3, 35))] * rows, device=device)
    cache: Any = DynamicCache(config=model.config)
    with torch.inference_mode():
        logits = model(input_ids=ids, cache=cache, use_cache=True).logits
    state = {"next": logits[:, -1:].argmax(-1)}

    def step() -> None:
        with torch.inference_mode():
            out = model(input_ids=state["next"], cache=cache, use_cache=True)
            state["next"] = out.logits[:, -1:].argmax(-1)
            state["next"].tolist()  # the host sync every server step has

    return step


def profile_steps(step: Any, device: torch.device) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as trace:
        for _ in range(PROFILED_STEPS):
            step()
        synchronize(device)
    events = trace.key_averages()
    device_us = sum(getattr(e, "self_device_time_total", 0.0) for e in events)
    launches = sum(e.count for e in events if e.key.startswith(("cudaLaunch", "cuLaunch")))
    top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:TOP_OPS]
    return {
        "gpu_busy_ms_per_step": device_us / 1000 / PROFILED_STEPS,
        "kernel_launches_per_step": launches / PROFILED_STEPS,
        "top_host_ops": [
            {
                "op": e.key,
                "calls_per_step": e.count / PROFILED_STEPS,
                "self_cpu_ms_per_step": e.self_cpu_time_total / 1000 / PROFILED_STEPS,
            }
            for e in top
        ],
    }


def measure(
    loaded: engine.LoadedModel, tokenizer: Any, rows: int, steps: int, cudnn_sdp: bool
) -> dict[str, Any]:
    """Steps over shapes never seen (cold), then the same shapes again (warm)."""
    device = loaded.device
    torch.backends.cuda.enable_cudnn_sdp(cudnn_sdp)
    prompts = prompt_ids(tokenizer, rows)
    cold = timed_steps(fusebox_batch(loaded, prompts).step, steps, device)
    batch = fusebox_batch(loaded, prompts)
    warm = timed_steps(batch.step, steps, device)
    profiled = profile_steps(batch.step, device)  # new shapes again: the cold case
    cold_ms = statistics.median(cold) * 1000
    return {
        "rows": rows,
        "cudnn_sdp": cudnn_sdp,
        "cold_ms_per_step": cold_ms,
        "warm_ms_per_step": statistics.median(warm) * 1000,
        "cold_tokens_per_second": rows / statistics.median(cold),
        **profiled,
        "host_bound_share": (
            1 - profiled["gpu_busy_ms_per_step"] / cold_ms if device.type == "cuda" else None
        ),
    }


def measure_plain(loaded: engine.LoadedModel, rows: int, steps: int) -> float:
    """Median ms per plain transformers decode step (the backends as the server sets them)."""
    plain = plain_transformers_step(loaded, rows)
    return statistics.median(timed_steps(plain, steps, loaded.device)) * 1000


def write_markdown(path: Path, result: dict[str, Any]) -> None:
    lines = [
        f"# One decode step on {result['device']} ({result['model']['parameters'] / 1e9:.2f} B, "
        f"{result['dtype']})",
        "",
        "Cold: every step's shape (rows x cached length) new to the process, as under real",
        "traffic. Warm: the same shapes a second time.",
        "",
        "| rows | cuDNN attention | cold ms/step | warm ms/step | GPU busy ms/step "
        "| kernel launches/step | host-bound share (cold) |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in result["runs"]:
        share = run["host_bound_share"]
        lines.append(
            f"| {run['rows']} | {'on' if run['cudnn_sdp'] else 'off'} "
            f"| {run['cold_ms_per_step']:.2f} | {run['warm_ms_per_step']:.2f} "
            f"| {run['gpu_busy_ms_per_step']:.2f} | {run['kernel_launches_per_step']:.0f} "
            f"| {'-' if share is None else f'{share:.2f}'} |"
        )
    lines += ["", "Plain transformers decode step, cuDNN attention off:", ""]
    lines += [f"- {rows} rows: {ms:.2f} ms" for rows, ms in result["plain_ms_per_step"].items()]
    for run in result["runs"]:
        setting = "on" if run["cudnn_sdp"] else "off"
        lines += ["", f"## Host time per step, {run['rows']} rows, cuDNN attention {setting}", ""]
        lines += ["| op | calls/step | self CPU ms/step |", "|---|---|---|"]
        lines += [
            f"| `{op['op']}` | {op['calls_per_step']:.0f} | {op['self_cpu_ms_per_step']:.3f} |"
            for op in run["top_host_ops"][:8]
        ]
    path.write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/gpu-bench"))
    parser.add_argument("--rows", type=int, action="append", help="batch sizes (32, 64)")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--dry-run", action="store_true", help="CPU, the small model")
    arguments = parser.parse_args()
    device = torch.device("cpu" if arguments.dry_run else "cuda")
    size, dtype = ("small", "float32") if arguments.dry_run else ("1b", "bfloat16")
    rows = arguments.rows or ([4] if arguments.dry_run else [32, 64])
    arguments.out.mkdir(parents=True, exist_ok=True)
    model_dir = ensure_bench_model(arguments.work_dir, size, dtype, device.type)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    loaded = engine.load_model(
        "primary", model_dir, Quantization.NONE, device, tokenizer, Dtype(dtype)
    )
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "dtype": dtype,
        "model": json.loads((model_dir / "bench-model.json").read_text()),
        "steps": arguments.steps,
        "runs": [
            measure(loaded, tokenizer, count, arguments.steps, cudnn_sdp)
            for cudnn_sdp in (True, False)
            for count in rows
        ],
        "plain_ms_per_step": {
            count: measure_plain(loaded, count, arguments.steps) for count in rows
        },
    }
    (arguments.out / "profile.json").write_text(json.dumps(result, indent=2) + "\n")
    write_markdown(arguments.out / "profile.md", result)
    print((arguments.out / "profile.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
