"""What each CPU fast path buys: the decode step with and without them, in one run.

The engine's 16-row decode step, 16-prompt prefill and 1-row decode step
(what a lone request costs) on the `small` model,
in process (no HTTP), under seven settings loaded side by side: transformers'
own kernels, oneDNN-packed linear layers only, the same without padding
one- to three-row products to four, packed layers with sibling projections
fused into one product, the same with a lone row through the plain weight
where that timed faster at load, layer by layer and then the whole forward
(`SingleRowChoice`), the single-query
attention only, and all of them (`pack_for_cpu`, what `load_model` does
on CPU). Rounds visit the settings in
turn, so a change in the machine's load hits all alike; the figure is each
setting's median step time and its ratio to transformers' kernels. Every
setting's greedy tokens are checked against transformers' own: a fast path
that changed the output would be a defect, not a speed-up. Figures from
`fusebox_server.model.cpu_kernels` (docs/decisions/speed.md).

Writes bench/results/kernels.json.

    .venv/bin/python bench/kernels_bench.py [--rounds 7] [--steps 24] [--threads 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
for path in (REPO, REPO / "inference_image", REPO / "contract"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from bench.server_bench import PROMPTS  # noqa: E402  (the repository root is on the path only now)

ROWS = 16
Setting = Callable[[Any], None]


def without_row_padding(model: Any) -> None:
    """Packed layers as oneDNN takes them for one to three rows (not padded to four)."""
    from fusebox_server.model.cpu_kernels import PackedLinear, ProjectionSlice

    for module in model.modules():
        packed = module.shared.product if isinstance(module, ProjectionSlice) else module
        if isinstance(packed, PackedLinear):
            packed.min_rows = 1


def settings() -> dict[str, Setting]:
    import torch

    from fusebox_server.model import cpu_kernels

    def packed_without_row_padding(model: Any) -> None:
        cpu_kernels.pack_linear_layers(model)
        without_row_padding(model)

    def packed_and_fused(model: Any) -> None:
        cpu_kernels.fuse_sibling_projections(model)
        cpu_kernels.pack_linear_layers(model)

    def packed_fused_one_row_plain(model: Any) -> None:
        single_rows = cpu_kernels.SingleRowChoice()
        cpu_kernels.fuse_sibling_projections(model, single_rows)
        cpu_kernels.pack_linear_layers(model, single_rows)
        single_rows.confirm(model)

    def all_of_them(model: Any) -> None:
        cpu_kernels.pack_for_cpu(model, torch.device("cpu"))

    return {
        "transformers_kernels": lambda model: None,
        "packed_linear_only": cpu_kernels.pack_linear_layers,
        "packed_without_row_padding": packed_without_row_padding,
        "packed_and_fused_projections": packed_and_fused,
        "packed_fused_one_row_plain": packed_fused_one_row_plain,
        "single_query_attention_only": cpu_kernels.use_single_query_attention,
        "all": all_of_them,
    }


def load(model_dir: Path, tokenizer: Any, setting: Setting) -> Any:
    """The engine's LoadedModel of `model_dir` with only `setting`'s fast paths."""
    import torch
    from transformers import AutoModelForCausalLM

    from fusebox_contract.names import Quantization
    from fusebox_server.model.engine import LoadedModel, load_model

    template: LoadedModel = load_model(
        "primary", model_dir, Quantization.NONE, torch.device("cpu"), tokenizer
    )
    model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True)
    model.eval()
    setting(model)
    return dataclasses.replace(template, model=model)


def prompt_ids(tokenizer: Any) -> list[tuple[int, ...]]:
    rows = []
    for index in range(ROWS):
        message = [{"role": "user", "content": PROMPTS[index % len(PROMPTS)]}]
        encoded = tokenizer.apply_chat_template(
            message, add_generation_prompt=True, return_dict=True
        )
        rows.append(tuple(int(i) for i in encoded["input_ids"]))
    return rows


def measure(loaded: Any, prompts: list[tuple[int, ...]], steps: int) -> dict[str, Any]:
    """One round: prefill the 16 prompts together, then `steps` decode steps of all 16."""
    import torch

    from fusebox_server.model.decode_settings import DecodeSettings
    from fusebox_server.model.engine import DecodeBatch, Decoding, prefill

    greedy = DecodeSettings(
        max_new_tokens=steps + 1, temperature=0.0, top_p=1.0, seed=None, stop=()
    )
    with torch.inference_mode():
        rows = [Decoding(loaded, prompt, greedy) for prompt in prompts]
        started = time.perf_counter()
        tokens = [[token] for token in prefill(loaded, rows)]
        prefilled = time.perf_counter()
        batch = DecodeBatch(loaded)
        batch.add(*rows)
        for _ in range(steps):
            for row_tokens, token in zip(tokens, batch.step(), strict=True):
                row_tokens.append(token)
        ended = time.perf_counter()
    return {
        "prefill_seconds": prefilled - started,
        "decode_step_seconds": (ended - prefilled) / steps,
        "tokens": tokens,
    }


def run(rounds: int, steps: int, threads: int, out: Path) -> dict[str, Any]:
    import torch

    from fusebox_server.model.tiny_model import ensure_model
    from fusebox_server.model.tokenization import load_tokenizer

    torch.set_num_threads(threads)
    model_dir = ensure_model("small")
    tokenizer = load_tokenizer(model_dir)
    prompts = prompt_ids(tokenizer)
    loaded = {name: load(model_dir, tokenizer, setting) for name, setting in settings().items()}
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in loaded}
    alone: dict[str, list[dict[str, Any]]] = {name: [] for name in loaded}  # one row: c=1
    for model in loaded.values():
        measure(model, prompts, 4)  # warm-up: first-call allocations and oneDNN's primitives
    for _ in range(rounds):
        for name, model in loaded.items():
            samples[name].append(measure(model, prompts, steps))
            alone[name].append(measure(model, prompts[:1], steps))
    reference = samples["transformers_kernels"][0]["tokens"]
    result: dict[str, Any] = {
        "model": str(model_dir),
        "rows": ROWS,
        "decode_steps_per_round": steps,
        "rounds": rounds,
        "threads": threads,
        "machine": {"cpus": os.cpu_count(), "load_average_1m": os.getloadavg()[0]},
        "settings": {},
    }
    base = statistics.median(s["decode_step_seconds"] for s in samples["transformers_kernels"])
    base_prefill = statistics.median(s["prefill_seconds"] for s in samples["transformers_kernels"])
    base_alone = statistics.median(s["decode_step_seconds"] for s in alone["transformers_kernels"])
    for name, runs in samples.items():
        step = statistics.median(s["decode_step_seconds"] for s in runs)
        prefill_seconds = statistics.median(s["prefill_seconds"] for s in runs)
        step_alone = statistics.median(s["decode_step_seconds"] for s in alone[name])
        result["settings"][name] = {
            "decode_step_ms_median": step * 1e3,
            "decode_step_ms_per_round": [s["decode_step_seconds"] * 1e3 for s in runs],
            "decode_tokens_per_second": ROWS / step,
            "decode_speedup_vs_transformers_kernels": base / step,
            "one_row_decode_step_ms_median": step_alone * 1e3,
            "one_row_decode_speedup_vs_transformers_kernels": base_alone / step_alone,
            "prefill_ms_median": prefill_seconds * 1e3,
            "prefill_speedup_vs_transformers_kernels": base_prefill / prefill_seconds,
            "greedy_tokens_match_transformers_kernels": all(s["tokens"] == reference for s in runs),
        }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="rounds over all seven settings")
    parser.add_argument("--steps", type=int, default=24, help="decode steps per round")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--out", type=Path, default=Path("bench/results/kernels.json"))
    args = parser.parse_args(argv)
    result = run(args.rounds, args.steps, args.threads, args.out)
    summary = {
        name: (
            round(figures["decode_speedup_vs_transformers_kernels"], 2),
            round(figures["one_row_decode_speedup_vs_transformers_kernels"], 2),
            figures["greedy_tokens_match_transformers_kernels"],
        )
        for name, figures in result["settings"].items()
    }
    print(f"kernels: speed-up at 16 rows, 1 row, same greedy: {json.dumps(summary)}; {args.out}")
    if not all(match for *_, match in summary.values()):
        raise SystemExit("a fast path changed the greedy output")


if __name__ == "__main__":
    main()
