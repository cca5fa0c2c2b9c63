"""Mixed rows through the slot batch's CUDA graphs: each row as it decodes alone, and the cost.

No device was lent when penalties, `logit_bias` and log-probabilities were
built (docs/decisions/sampling-surface.md), so their path through the
captured step was checked only eagerly on the CPU. On CUDA this script:

1. loads the `small` model and decodes R rows in one `SlotBatch` with graphs
   on, twice: all rows plain greedy (every row takes the in-graph argmax),
   then mixed (the rows cycle through plain, penalised, biased, scored with
   5 alternatives, and sampled with a seed), S steps each;
2. decodes every row of the mixed run alone (`Decoding.step`, no batch, no
   graph) and counts the rows whose tokens agree with the batch's; greedy
   rows may part on a near tie (batched and single-row kernels round
   differently), so the figure is a count, not a pass/fail;
3. times the steps after the graphs are captured: median ms per step, plain
   vs mixed, the price of the rows that read the logits after the replay.

Writes sampling.json and sampling.md under --out. `--dry-run` (or no CUDA):
the tiny model on the CPU, graphs off, which the unit tests run.

    python3 bench/gpu_sampling.py --out bench/results/gpu-sampling [--rows 32] [--steps 32]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from fusebox_server.model.decode_settings import DecodeSettings, RepeatPenalties  # noqa: E402
from fusebox_server.model.engine import Decoding, load_model, prefill  # noqa: E402
from fusebox_server.model.slot_batch import SlotBatch  # noqa: E402
from fusebox_server.model.tiny_model import ensure_model  # noqa: E402
from fusebox_server.model.tokenization import load_tokenizer  # noqa: E402

PROMPTS = [
    "Explain how a hash table works",
    "Tell me about the river",
    "你好，今天天气很好",
    "Once upon a time there was a",
    "Write a short poem about the sea at night.",
]
PLAIN = DecodeSettings(max_new_tokens=1 << 20, temperature=0.0, top_p=1.0, seed=None, stop=())
MIXED_KINDS = {
    "plain": PLAIN,
    "penalised": replace(PLAIN, repeat_penalties=RepeatPenalties(presence=0.5, frequency=1.0)),
    "biased": replace(PLAIN, token_bias=((11, 3.0), (12, -100.0))),
    "scored": replace(PLAIN, top_alternatives=5),
    "sampled": replace(PLAIN, temperature=1.0, top_p=0.9),
}


def mixed_settings(rows: int) -> list[tuple[str, DecodeSettings]]:
    kinds = list(MIXED_KINDS.items())
    chosen = []
    for index in range(rows):
        name, settings = kinds[index % len(kinds)]
        chosen.append((name, replace(settings, seed=index) if name == "sampled" else settings))
    return chosen


def prompt_ids(tokenizer: Any, rows: int) -> list[tuple[int, ...]]:
    texts = [f"{PROMPTS[index % len(PROMPTS)]} ({index})" for index in range(rows)]
    return [tuple(tokenizer.backend_tokenizer.encode(text).ids) for text in texts]


def batch_run(
    loaded: Any, prompts: list[tuple[int, ...]], settings: list[DecodeSettings], steps: int
) -> dict[str, Any]:
    """Prefill every row together, decode `steps` steps in one slot batch; tokens and times."""
    rows = [Decoding(loaded, prompt, s) for prompt, s in zip(prompts, settings, strict=True)]
    tokens: list[list[int]] = [[token] for token in prefill(loaded, rows)]
    batch = SlotBatch(loaded, graphs=loaded.device.type == "cuda")
    batch.add(*rows)
    seconds: list[float] = []
    for _ in range(steps):
        started = time.perf_counter()
        chosen = batch.step()
        seconds.append(time.perf_counter() - started)
        for index, token in enumerate(chosen):
            if isinstance(token, Exception):
                raise token
            tokens[index].append(token)
    warm = seconds[2:] or seconds  # the first steps capture the graphs
    return {
        "tokens": tokens,
        "median_step_ms": round(1000 * statistics.median(warm), 3),
        "graphs_on": batch.graphs_on,
        "graph_count": batch.graph_count,
    }


def alone(loaded: Any, prompt: tuple[int, ...], settings: DecodeSettings, steps: int) -> list[int]:
    row = Decoding(loaded, prompt, settings)
    return [row.step() for _ in range(steps + 1)]


def run(rows: int, steps: int, out: Path, dry_run: bool) -> dict[str, Any]:
    cuda = torch.cuda.is_available() and not dry_run
    model_dir = ensure_model("small" if cuda else "tiny")
    tokenizer = load_tokenizer(model_dir)
    device = torch.device("cuda" if cuda else "cpu")
    loaded = load_model("primary", model_dir, "none", device, tokenizer)
    prompts = prompt_ids(tokenizer, rows)
    mixed = mixed_settings(rows)
    with torch.inference_mode():
        plain_run = batch_run(loaded, prompts, [PLAIN] * rows, steps)
        mixed_run = batch_run(loaded, prompts, [s for _, s in mixed], steps)
        by_kind: dict[str, list[bool]] = {}
        for index, (name, settings) in enumerate(mixed):
            agreed = alone(loaded, prompts[index], settings, steps) == mixed_run["tokens"][index]
            by_kind.setdefault(name, []).append(agreed)
        plain_agrees = [
            plain_run["tokens"][index] == mixed_run["tokens"][index]
            for index, (name, _) in enumerate(mixed)
            if name == "plain"
        ]
    result = {
        "device": torch.cuda.get_device_name() if cuda else "cpu (dry run)",
        "model": str(model_dir),
        "dtype": loaded.dtype,
        "rows": rows,
        "steps": steps,
        "graphs_on": mixed_run["graphs_on"],
        "graph_count": mixed_run["graph_count"],
        "median_step_ms": {
            "plain": plain_run["median_step_ms"],
            "mixed": mixed_run["median_step_ms"],
        },
        "rows_agreeing_with_alone": {
            name: f"{sum(agreed)}/{len(agreed)}" for name, agreed in by_kind.items()
        },
        "plain_rows_same_in_both_runs": f"{sum(plain_agrees)}/{len(plain_agrees)}",
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "sampling.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "# Mixed rows through the slot batch",
        "",
        f"{result['device']}, {result['model']} ({result['dtype']}), {rows} rows, {steps} steps,"
        f" graphs on: {result['graphs_on']} ({result['graph_count']} captured).",
        "",
        "| run | median ms per step |",
        "|---|---|",
        *(f"| {name} | {ms} |" for name, ms in result["median_step_ms"].items()),
        "",
        "Rows of the mixed run whose tokens equal the row decoded alone, by kind: "
        + ", ".join(f"{k} {v}" for k, v in result["rows_agreeing_with_alone"].items())
        + f"; plain rows identical in the plain and the mixed run:"
        f" {result['plain_rows_same_in_both_runs']}.",
        "",
    ]
    (out / "sampling.md").write_text("\n".join(lines))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--out", type=Path, default=Path("bench/results/gpu-sampling"))
    parser.add_argument("--dry-run", action="store_true", help="the tiny model on the CPU")
    args = parser.parse_args()
    print(json.dumps(run(args.rows, args.steps, args.out, args.dry_run), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
