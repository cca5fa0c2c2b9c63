"""How much slot cache a draining batch holds, with and without shrinking (issue 34, item 5).

The CUDA decode path (`fusebox_server/model/slot_batch.py`) keeps every
running request's keys and values in a slot cache that grows by doubling.
Until 2026-12-06 it never shrank while a request ran: one long answer kept
the whole burst's cache. Now a step halves a dimension the running rows use
a quarter of. This bench runs the same drain both ways, in process and
alternated round by round: a burst of requests from `bench/workload.py`
joins at once (prefilled in the server's groups), with one more request
that asks for four times the workload's longest answer (the long answer
that outlives a burst); each row leaves when it has its `max_tokens`, no
request replaces it. Per step it records the
running rows and the cache's bytes; the figures are the cache held per
step (the mean weighted by each step's time, and the peak), per running
row, and the tail's (the steps where a quarter of the burst or less still
runs), the shrinks, the tokens (both
ways must decode the same greedy tokens) and the decode time.

On the CPU the batch runs eagerly (no graphs), so the time says what
copying into a smaller cache costs, not what recapturing graphs costs; on
CUDA the same drain runs with graphs on (`GPU_STEPS=slotcache bash
bench/gpu_run.sh device`) and its time includes the recaptures.

    .venv/bin/python bench/slot_cache_bench.py [--requests 32] [--scale 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
for path in (REPO, REPO / "inference_image"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from bench.realistic_bench import prompt_ids, token_counter  # noqa: E402
from bench.workload import WorkloadShape, build_workload  # noqa: E402

# Never reached: a SHRINK_AT this large is the cache as it was, growing only.
NEVER = 1 << 40
# The burst's last request asks for this many times the workload's longest answer.
TAIL_ANSWER = 4


def drain(
    loaded: Any, prompts: Sequence[tuple[int, ...]], lengths: Sequence[int]
) -> dict[str, Any]:
    """One burst through a `SlotBatch`: every row joins, each leaves at its length."""
    import torch

    from fusebox_server.model import engine, slot_batch
    from fusebox_server.model.decode_settings import DecodeSettings
    from fusebox_server.model.worker import PREFILL_TOKEN_BUDGET

    greedy = DecodeSettings(
        max_new_tokens=max(lengths), temperature=0.0, top_p=1.0, seed=None, stop=()
    )
    batch = slot_batch.SlotBatch(loaded, graphs=loaded.device.type == "cuda")
    rows = [engine.Decoding(loaded, prompt, greedy) for prompt in prompts]
    wanted = {id(row): length for row, length in zip(rows, lengths, strict=True)}
    tokens: dict[int, list[int]] = {id(row): [] for row in rows}
    for group in engine.prefill_groups([len(p) for p in prompts], PREFILL_TOKEN_BUDGET):
        members = [rows[index] for index in group]
        for row, token in zip(members, engine.prefill(loaded, members), strict=True):
            tokens[id(row)].append(_token(token))
        batch.add(*members)
    steps: list[tuple[int, int, float]] = []  # (running rows, cache bytes, seconds) a step
    capacities = [batch.capacity]
    started = time.perf_counter()
    with torch.inference_mode():
        while len(batch):
            for row in [row for row in batch.rows if len(tokens[id(row)]) >= wanted[id(row)]]:
                batch.remove(row)
            if not len(batch):
                break
            running = list(batch.rows)
            stepped = time.perf_counter()
            for row, token in zip(running, batch.step(), strict=True):
                tokens[id(row)].append(_token(token))
            steps.append((len(running), batch.cache_bytes(), time.perf_counter() - stepped))
            if batch.capacity != capacities[-1]:
                capacities.append(batch.capacity)
    seconds = time.perf_counter() - started
    burst = len(rows)
    tail = [(held, spent) for running, held, spent in steps if running * 4 <= burst]
    return {
        "seconds": seconds,
        "steps": len(steps),
        "decoded_tokens": sum(running for running, _, _ in steps),
        "mean_cache_bytes": _over_time([(held, spent) for _, held, spent in steps]),
        "peak_cache_bytes": max(held for _, held, _ in steps),
        "mean_cache_bytes_per_running_row": statistics.fmean(h / n for n, h, _ in steps),
        "tail_steps": len(tail),
        "tail_seconds": sum(spent for _, spent in tail),
        "tail_mean_cache_bytes": _over_time(tail) if tail else None,
        "capacities": [list(capacity) for capacity in capacities],
        "tokens": [tokens[id(row)] for row in rows],
    }


def _over_time(held: Sequence[tuple[int, float]]) -> float:
    """The mean of (bytes, seconds) samples, each weighted by its seconds."""
    return sum(size * spent for size, spent in held) / sum(spent for _, spent in held)


def _token(token: int | Exception) -> int:
    if isinstance(token, Exception):
        raise token
    return token


def run(requests: int, scale: int, rounds: int, seed: int, threads: int) -> dict[str, Any]:
    import torch

    from fusebox_server.model import engine, slot_batch
    from fusebox_server.model.tokenization import load_tokenizer
    from fusebox_server.zoo.release import ensure_zoo_model

    torch.set_num_threads(threads)
    model_dir = ensure_zoo_model("llama3")
    chat_tokenizer, count_tokens = token_counter(model_dir)
    workload = build_workload(requests, count_tokens, WorkloadShape().scaled(scale), seed=seed)
    prompts = prompt_ids(chat_tokenizer, workload)
    lengths = [request.max_tokens for request in workload.requests]
    tail_tokens = TAIL_ANSWER * workload.shape.output_tokens[1]
    prompts, lengths = [*prompts, prompts[0]], [*lengths, tail_tokens]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loaded = engine.load_model("primary", model_dir, "none", device, load_tokenizer(model_dir))
    shrink_at = slot_batch.SHRINK_AT
    settings = {"shrinking": shrink_at, "growing_only": NEVER}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in settings}
    try:
        for index in range(rounds):
            order = list(settings) if index % 2 == 0 else list(reversed(settings))
            for name in order:
                slot_batch.SHRINK_AT = settings[name]
                runs[name].append(drain(loaded, prompts, lengths))
    finally:
        slot_batch.SHRINK_AT = shrink_at
    baseline = runs["growing_only"][0]["tokens"]
    same_tokens = all(m["tokens"] == baseline for measured in runs.values() for m in measured)
    memory_keys = (
        "mean_cache_bytes",
        "peak_cache_bytes",
        "mean_cache_bytes_per_running_row",
        "tail_steps",
        "tail_seconds",
        "tail_mean_cache_bytes",
        "steps",
        "decoded_tokens",
        "capacities",
    )
    pairs = list(zip(runs["shrinking"], runs["growing_only"], strict=True))
    # The shrink waits on the clock, so what a round holds moves with the host's speed:
    # each figure is the median of the rounds' ratios, with their range.
    ratios = {
        "mean_cache": [s["mean_cache_bytes"] / g["mean_cache_bytes"] for s, g in pairs],
        "tail_cache": [
            s["tail_mean_cache_bytes"] / g["tail_mean_cache_bytes"]
            for s, g in pairs
            if s["tail_mean_cache_bytes"] and g["tail_mean_cache_bytes"]
        ],
        "decode_time": [s["seconds"] / g["seconds"] for s, g in pairs],
    }
    return {
        "model": "zoo llama3 (128,256-token vocabulary, GQA)",
        "device": str(device),
        "threads": threads,
        "workload": workload.describe(),
        "long_answer": {"prompt": "the workload's first", "max_tokens": tail_tokens},
        "shrink_after_seconds": slot_batch.SHRINK_AFTER_SECONDS,
        "shrink_rule": f"a dimension >= {shrink_at}x what the rows need for "
        f"{slot_batch.SHRINK_AFTER_SECONDS} s is cut to {slot_batch.SHRUNK_MARGIN}x it",
        "same_greedy_tokens": same_tokens,
        "rounds": {
            name: [{key: m[key] for key in (*memory_keys, "seconds")} for m in measured]
            for name, measured in runs.items()
        },
        "shrinking_over_growing_only": {
            name: {"median": statistics.median(values), "range": [min(values), max(values)]}
            for name, values in ratios.items()
            if values
        },
        "load_average_1m": os.getloadavg()[0],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32, help="the burst's requests")
    parser.add_argument("--scale", type=int, default=4, help="the workload's lengths divided by")
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds of each way")
    parser.add_argument("--seed", type=int, default=34)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/slot-cache.json")
    arguments = parser.parse_args(argv)
    result = run(
        arguments.requests, arguments.scale, arguments.rounds, arguments.seed, arguments.threads
    )
    if not result["same_greedy_tokens"]:
        print("the shrinking cache decoded other tokens than the growing one", file=sys.stderr)
        return 1
    arguments.out.parent.mkdir(parents=True, exist_ok=True)
    arguments.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
