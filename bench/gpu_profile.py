"""Where a GPU decode step's time goes, for each way Fusebox can batch it.

Issue 12's GPU figures (docs/decisions/speed.md) showed Fusebox at 0.5-0.6x
`transformers serve --cb-use-cuda-graph`, and the first profile of this
script found a step 56-62% host time (959 kernel launches for 20 layers).
This measures one decode step on the model the bench uses, with no HTTP and
no scheduler in the way, for three batches (cuDNN attention off, as the
server runs):

- `decode-batch`: `engine.DecodeBatch`, the left-padded cache the CPU uses;
- `slots-eager`: `slot_batch.SlotBatch` without graphs;
- `slots-graphs`: `SlotBatch` with CUDA graphs, what the server runs on CUDA.

Per batch size: the wall time of a step over --steps steps of a new batch
(cold: the graphs are captured then), and over the same steps again on the
same batch with new rows (warm: the server keeps its graphs between bursts;
a new `DecodeBatch` for the others). A torch.profiler trace of a few warm
steps gives the GPU's busy time per step, kernel launches per step and the
ops with the most host time. The greedy tokens of each batch are compared
with `decode-batch`'s (bfloat16 near-ties of a random model can flip a few;
the graph batch is also held to `slots-eager`, which it must match).

Writes profile.json and profile.md under --out. `--dry-run` runs the small
model on the CPU to prove the script (no graphs and no GPU figures then).

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
from fusebox_server.model import engine, slot_batch  # noqa: E402
from fusebox_server.model.decode_settings import DecodeSettings  # noqa: E402

PREFILL_GROUP = 8
PROFILED_STEPS = 4
TOP_OPS = 15


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def prompt_ids(tokenizer: Any, rows: int) -> list[tuple[int, ...]]:
    texts = [PROMPTS[index % len(PROMPTS)] for index in range(rows)]
    return [tuple(tokenizer(text).input_ids) for text in texts]


BATCHES = ("decode-batch", "slots-eager", "slots-graphs")
GREEDY = DecodeSettings(4096, 0.0, 1.0, None, ())


def new_batch(loaded: engine.LoadedModel, kind: str) -> Any:
    if kind == "decode-batch":
        return engine.DecodeBatch(loaded)
    return slot_batch.SlotBatch(loaded, graphs=kind == "slots-graphs")


def fill(batch: Any, prompts: list[tuple[int, ...]]) -> None:
    """Empty the batch, then add every prompt, prefilled in groups as the worker does."""
    for row in list(batch.rows):
        batch.remove(row)
    loaded = batch.loaded
    rows = [engine.Decoding(loaded, ids, GREEDY) for ids in prompts]
    for start in range(0, len(rows), PREFILL_GROUP):
        group = rows[start : start + PREFILL_GROUP]
        engine.prefill(loaded, group)
        batch.add(*group)


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
    loaded: engine.LoadedModel, tokenizer: Any, kind: str, rows: int, steps: int
) -> dict[str, Any]:
    """Steps of a new batch (cold), then of the same batch refilled (warm), then a profile."""
    device = loaded.device
    prompts = prompt_ids(tokenizer, rows)
    batch = new_batch(loaded, kind)
    fill(batch, prompts)
    tokens: list[list[Any]] = []
    cold = timed_steps(lambda: tokens.append(batch.step()), steps, device)
    if kind == "decode-batch":
        batch = new_batch(loaded, kind)
    fill(batch, prompts)
    warm = timed_steps(batch.step, steps, device)
    profiled = profile_steps(batch.step, device)
    warm_ms = statistics.median(warm) * 1000
    graphs = isinstance(batch, slot_batch.SlotBatch) and batch.graphs_on
    return {
        "batch": kind,
        "rows": rows,
        "cold_ms_per_step": statistics.median(cold) * 1000,
        "cold_first_step_ms": cold[0] * 1000,
        "warm_ms_per_step": warm_ms,
        "warm_tokens_per_second": rows / statistics.median(warm),
        "graphs_on": graphs,
        "graph_count": batch.graph_count if isinstance(batch, slot_batch.SlotBatch) else 0,
        "tokens": tokens,
        **profiled,
        "host_bound_share": (
            1 - profiled["gpu_busy_ms_per_step"] / warm_ms if device.type == "cuda" else None
        ),
    }


def agreement(tokens: list[list[Any]], reference: list[list[Any]]) -> float:
    """The share of (step, row) greedy tokens equal to the reference's."""
    pairs = [
        (mine, theirs)
        for step, other in zip(tokens, reference, strict=True)
        for mine, theirs in zip(step, other, strict=True)
    ]
    return sum(mine == theirs for mine, theirs in pairs) / max(len(pairs), 1)


def measure_plain(loaded: engine.LoadedModel, rows: int, steps: int) -> float:
    """Median ms per plain transformers decode step (the backends as the server sets them)."""
    plain = plain_transformers_step(loaded, rows)
    return statistics.median(timed_steps(plain, steps, loaded.device)) * 1000


def write_markdown(path: Path, result: dict[str, Any]) -> None:
    lines = [
        f"# One decode step on {result['device']} ({result['model']['parameters'] / 1e9:.2f} B, "
        f"{result['dtype']})",
        "",
        "Cold: the first steps of a new batch (graphs captured then). Warm: the same",
        "steps again, the batch refilled with new rows (graphs reused). Tokens: the share",
        "of greedy tokens equal to `decode-batch`'s, and for graphs to `slots-eager`'s.",
        "",
        "| batch | rows | cold ms/step | first step ms | warm ms/step | warm tok/s "
        "| GPU busy ms/step | launches/step | host-bound share | graphs | tokens agree |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in result["runs"]:
        share = run["host_bound_share"]
        agree = run.get("agreement", {})
        lines.append(
            f"| {run['batch']} | {run['rows']} | {run['cold_ms_per_step']:.2f} "
            f"| {run['cold_first_step_ms']:.1f} | {run['warm_ms_per_step']:.2f} "
            f"| {run['warm_tokens_per_second']:.0f} | {run['gpu_busy_ms_per_step']:.2f} "
            f"| {run['kernel_launches_per_step']:.0f} "
            f"| {'-' if share is None else f'{share:.2f}'} "
            f"| {run['graph_count'] if run['graphs_on'] else 'off'} "
            f"| {', '.join(f'{k} {v:.3f}' for k, v in agree.items()) or '-'} |"
        )
    lines += ["", "Plain transformers decode step (DynamicCache, eager):", ""]
    lines += [f"- {rows} rows: {ms:.2f} ms" for rows, ms in result["plain_ms_per_step"].items()]
    for run in result["runs"]:
        lines += ["", f"## Host time per warm step: {run['batch']}, {run['rows']} rows", ""]
        lines += ["| op | calls/step | self CPU ms/step |", "|---|---|---|"]
        lines += [
            f"| `{op['op']}` | {op['calls_per_step']:.0f} | {op['self_cpu_ms_per_step']:.3f} |"
            for op in run["top_host_ops"][:6]
        ]
    path.write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/gpu-bench"))
    parser.add_argument("--rows", type=int, action="append", help="batch sizes (1, 32, 64)")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--dry-run", action="store_true", help="CPU, the small model")
    arguments = parser.parse_args()
    device = torch.device("cpu" if arguments.dry_run else "cuda")
    size, dtype = ("small", "float32") if arguments.dry_run else ("1b", "bfloat16")
    rows = arguments.rows or ([1, 4] if arguments.dry_run else [1, 32, 64])
    arguments.out.mkdir(parents=True, exist_ok=True)
    model_dir = ensure_bench_model(arguments.work_dir, size, dtype, device.type)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    loaded = engine.load_model(
        "primary", model_dir, Quantization.NONE, device, tokenizer, Dtype(dtype)
    )
    kinds = [kind for kind in BATCHES if device.type == "cuda" or kind != "slots-graphs"]
    runs = []
    for count in rows:
        by_kind = {kind: measure(loaded, tokenizer, kind, count, arguments.steps) for kind in kinds}
        for kind, run in by_kind.items():
            references = ["decode-batch"] + (["slots-eager"] if kind == "slots-graphs" else [])
            run["agreement"] = {
                other: agreement(run["tokens"], by_kind[other]["tokens"])
                for other in references
                if other != kind
            }
        runs += by_kind.values()
    for run in runs:
        del run["tokens"]
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "dtype": dtype,
        "model": json.loads((model_dir / "bench-model.json").read_text()),
        "steps": arguments.steps,
        "runs": runs,
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
