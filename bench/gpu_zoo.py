"""Per zoo family on the GPU: the slot cache with graphs, the eager slot batch, and transformers.

The CPU tests prove in float32 that Fusebox decodes what transformers does
for every family (tests/unit/zoo/test_family_decoding.py). On CUDA the
server decodes through `SlotBatch` with CUDA graphs, in bfloat16, where a
re-implemented cache (GQA, sliding windows, soft-capping, MoE routing) can go
wrong silently. Per family and batch size this runs, on the same prompts:

- `transformers`: the release loaded plain, batched `generate` (left-padded,
  greedy), keeping each step's logits: the reference tokens;
- `slots-eager`: Fusebox's slot batch without graphs;
- `slots-graphs`: the slot batch with CUDA graphs (what the server runs).

Fusebox's batches are teacher-forced on the reference's tokens (each row is
fed the token transformers chose, whatever it chose itself), so every step's
logits are comparable: the report gives, per family and batch size, the max
absolute logit difference of each pair and the greedy agreement (the share of
steps whose argmax is the reference's token). bfloat16 near-ties of a random
model can flip a few argmaxes; the graphs must match the eager slot batch.

Writes zoo.json and zoo.md under --out. `--dry-run` runs on the CPU in
float32 (no graphs) to prove the script; there eager and transformers agree.

    python3 bench/gpu_zoo.py --out "$OUT/zoo"                       # on the H200
    .venv/bin/python bench/gpu_zoo.py --dry-run --out /tmp/gpu-zoo --families llama3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from fusebox_contract.names import Dtype, Quantization  # noqa: E402
from fusebox_server.model import engine, slot_batch  # noqa: E402
from fusebox_server.model.decode_settings import DecodeSettings  # noqa: E402
from fusebox_server.zoo.families import FAMILIES  # noqa: E402
from fusebox_server.zoo.release import ensure_zoo_model  # noqa: E402

TEXTS = (
    "The quick brown fox jumps over the lazy dog",
    "你好，今天天气很好 🚀",
    "Explain how a hash table works to a new programmer.",
    "Hi",
    "Write a short poem about the sea at night.",
    "What is the capital of France?",
)
GREEDY = DecodeSettings(4096, 0.0, 1.0, None, ())
BATCHES = ("slots-eager", "slots-graphs")


def prompts(tokenizer: Any, rows: int) -> list[tuple[int, ...]]:
    """Chat-rendered prompts of different lengths, as the server renders them."""
    chats = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": TEXTS[index % len(TEXTS)]}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for index in range(rows)
    ]
    return [tuple(tokenizer.encode(chat, add_special_tokens=False)) for chat in chats]


def reference(
    model: Any, batch: list[tuple[int, ...]], steps: int
) -> tuple[list[list[int]], torch.Tensor]:
    """transformers' batched greedy generate: tokens (rows x steps), logits (steps x rows x V)."""
    width = max(len(prompt) for prompt in batch)
    device = model.device
    ids = torch.zeros((len(batch), width), dtype=torch.long, device=device)
    mask = torch.zeros((len(batch), width), dtype=torch.long, device=device)
    for index, prompt in enumerate(batch):
        ids[index, width - len(prompt) :] = torch.tensor(prompt, device=device)
        mask[index, width - len(prompt) :] = 1
    with torch.inference_mode():
        output = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=steps,
            min_new_tokens=steps,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    tokens = output.sequences[:, width:].tolist()
    return tokens, torch.stack([step.float() for step in output.logits])


def teacher_forced(
    loaded: engine.LoadedModel, batch: list[tuple[int, ...]], tokens: list[list[int]], graphs: bool
) -> tuple[torch.Tensor, bool]:
    """The slot batch's logits at decode steps 1.., each row fed the reference's tokens.

    Returns (steps - 1) x rows x V logits, and whether graphs stayed on.
    """
    rows = [engine.Decoding(loaded, prompt, GREEDY) for prompt in batch]
    engine.prefill(loaded, rows)
    decoder = slot_batch.SlotBatch(loaded, graphs=graphs)
    decoder.add(*rows)
    captured: list[torch.Tensor] = []
    run = decoder._run

    def recording(count: int, columns: int) -> tuple[torch.Tensor, torch.Tensor]:
        logits, greedy = run(count, columns)
        captured.append(logits[: len(rows)].float().clone())
        return logits, greedy

    setattr(decoder, "_run", recording)  # noqa: B010 (records each step's logits)
    for step in range(len(tokens[0]) - 1):
        for index, row in enumerate(rows):
            row.last_token = tokens[index][step]  # the reference's token, not the batch's own
        decoder.step()
    return torch.stack(captured), decoder.graphs_on


def agreement(logits: torch.Tensor, tokens: list[list[int]]) -> float:
    """The share of (step, row) whose argmax is the reference's next token."""
    chosen = logits.argmax(dim=-1)  # steps x rows
    expected = torch.tensor([row[1:] for row in tokens], device=chosen.device).T
    return float((chosen == expected).float().mean())


def max_difference(left: torch.Tensor, right: torch.Tensor) -> float:
    return float((left - right).abs().max())


def measure_family(
    name: str, device: torch.device, dtype: str, sizes: list[int], steps: int
) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.monotonic()
    directory = ensure_zoo_model(name)
    tokenizer: Any = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    auto: Any = AutoModelForCausalLM
    plain = auto.from_pretrained(str(directory), local_files_only=True, dtype=getattr(torch, dtype))
    plain.to(device).eval()
    loaded = engine.load_model(
        "primary", directory, Quantization.NONE, device, tokenizer, Dtype(dtype)
    )
    kinds = [kind for kind in BATCHES if device.type == "cuda" or kind != "slots-graphs"]
    runs = []
    for size in sizes:
        batch = prompts(tokenizer, size)
        tokens, expected = reference(plain, batch, steps)
        expected = expected[1:]  # step 0 is the prefill's
        logits: dict[str, torch.Tensor] = {}
        graphs_on = None
        for kind in kinds:
            logits[kind], stayed_on = teacher_forced(loaded, batch, tokens, kind == "slots-graphs")
            if kind == "slots-graphs":
                graphs_on = stayed_on
        run: dict[str, Any] = {"rows": size, "graphs_on": graphs_on, "max_abs_diff": {}}
        run["max_abs_diff"]["slots-eager vs transformers"] = max_difference(
            logits["slots-eager"], expected
        )
        run["agreement"] = {kind: agreement(logits[kind], tokens) for kind in kinds}
        if "slots-graphs" in logits:
            run["max_abs_diff"]["slots-graphs vs slots-eager"] = max_difference(
                logits["slots-graphs"], logits["slots-eager"]
            )
            run["max_abs_diff"]["slots-graphs vs transformers"] = max_difference(
                logits["slots-graphs"], expected
            )
        runs.append(run)
        print(f"{name} rows={size}: {json.dumps(run)}", flush=True)
    return {
        "family": name,
        "architecture": type(plain).__name__,
        "kernels": loaded.kernels,
        "runs": runs,
        "seconds": round(time.monotonic() - started, 1),
    }


def write_markdown(path: Path, result: dict[str, Any]) -> None:
    lines = [
        f"# Zoo families on {result['device']} ({result['dtype']}, {result['steps']} steps, "
        "teacher-forced)",
        "",
        "| family | rows | graphs on | eager vs transformers | graphs vs eager "
        "| graphs vs transformers | agreement eager | agreement graphs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for family in result["families"]:
        for run in family["runs"]:
            diff = run["max_abs_diff"]

            def cell(key: str, values: dict[str, Any] = diff) -> str:
                return f"{values[key]:.3g}" if key in values else "-"

            lines.append(
                f"| {family['family']} | {run['rows']} | {run['graphs_on']} "
                f"| {cell('slots-eager vs transformers')} | {cell('slots-graphs vs slots-eager')} "
                f"| {cell('slots-graphs vs transformers')} "
                f"| {cell('slots-eager', run['agreement'])} "
                f"| {cell('slots-graphs', run['agreement'])} |"
            )
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true", help="CPU, float32, no graphs")
    parser.add_argument("--families", nargs="*", default=sorted(FAMILIES))
    parser.add_argument("--rows", type=int, nargs="*", help="batch sizes")
    parser.add_argument("--steps", type=int, default=0, help="decode steps per batch")
    parser.add_argument("--work-dir", type=Path, help="FUSEBOX_CACHE for the zoo's releases")
    arguments = parser.parse_args(argv)
    if arguments.work_dir is not None:
        os.environ["FUSEBOX_CACHE"] = str(arguments.work_dir)
    device = torch.device("cpu" if arguments.dry_run else "cuda")
    dtype = "float32" if arguments.dry_run else "bfloat16"
    sizes = arguments.rows or ([2] if arguments.dry_run else [1, 4, 16])
    steps = arguments.steps or (3 if arguments.dry_run else 16)
    engine.configure_attention(device)
    arguments.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": dtype,
        "steps": steps,
        "families": [],
    }
    for name in arguments.families:
        result["families"].append(measure_family(name, device, dtype, sizes, steps))
        # Written after each family: a run cut short keeps what it measured.
        (arguments.out / "zoo.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
        write_markdown(arguments.out / "zoo.md", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
