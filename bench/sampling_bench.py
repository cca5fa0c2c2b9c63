"""What per-row penalties, bias and log-probabilities cost a continuous batch on the CPU.

One Fusebox server on the small model, 16 clients, 32-token chat completions.
Rounds alternate between two loads: `plain` (every client greedy, so every
row takes the batch's shared argmax) and `mixed` (every other client asks
for `logprobs` with 5 `top_logprobs`, a `frequency_penalty` and a
`logit_bias`, so half the rows choose from their own logits and are scored
each step). The figure is the median tokens/s of each and the median of the
round-pair ratios (mixed / plain); docs/decisions/sampling-surface.md quotes it.

    .venv/bin/python bench/sampling_bench.py [--rounds 3] [--per-client 2] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.server_bench import (  # noqa: E402  (the repository root is on the path only now)
    CONCURRENCY,
    NEW_TOKENS,
    client_prompt,
    start_fusebox,
    stop,
)

MIXED_EXTRAS: dict[str, Any] = {
    "logprobs": True,
    "top_logprobs": 5,
    "frequency_penalty": 0.5,
    "logit_bias": {"11": 2.0},
}


def one_round(url: str, per_client: int, mixed: bool) -> dict[str, Any]:
    """`CONCURRENCY` clients, `per_client` requests each; in a mixed round the odd clients
    send `MIXED_EXTRAS`."""
    tokens = [0] * CONCURRENCY
    errors: list[str] = []
    barrier = threading.Barrier(CONCURRENCY + 1)

    def client_loop(slot: int) -> None:
        extras = MIXED_EXTRAS if mixed and slot % 2 else {}
        with httpx.Client(base_url=url, timeout=600) as client:
            barrier.wait()
            for index in range(per_client):
                body = {
                    "model": "bench",
                    "messages": [{"role": "user", "content": client_prompt(slot, index)}],
                    "max_tokens": NEW_TOKENS,
                    "temperature": 0,
                    **extras,
                }
                try:
                    response = client.post("/v1/chat/completions", json=body)
                    response.raise_for_status()
                    tokens[slot] += int(response.json()["usage"]["completion_tokens"])
                except httpx.HTTPError as error:
                    errors.append(repr(error))

    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(CONCURRENCY)]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    return {
        "tokens": sum(tokens),
        "errors": len(errors),
        "seconds": round(elapsed, 3),
        "tokens_per_second": round(sum(tokens) / elapsed, 2),
        "load_average_1m": os.getloadavg()[0],
    }


def run(rounds: int, per_client: int, threads: int, out: Path) -> dict[str, Any]:
    from fusebox_server.model.tiny_model import ensure_model

    model = ensure_model("small")
    with tempfile.TemporaryDirectory(prefix="sampling-bench-") as workdir:
        process, url, _ = start_fusebox(model, Path(workdir), torch_threads=threads)
        try:
            one_round(url, per_client, mixed=True)  # warm-up
            measured: dict[str, list[dict[str, Any]]] = {"plain": [], "mixed": []}
            for _ in range(rounds):
                measured["plain"].append(one_round(url, per_client, mixed=False))
                measured["mixed"].append(one_round(url, per_client, mixed=True))
        finally:
            stop(process)
    ratios = [
        m["tokens_per_second"] / p["tokens_per_second"]
        for p, m in zip(measured["plain"], measured["mixed"], strict=True)
    ]
    result = {
        "model": str(model),
        "concurrency": CONCURRENCY,
        "new_tokens": NEW_TOKENS,
        "threads": threads,
        "mixed_rows": "every other client: " + json.dumps(MIXED_EXTRAS),
        "median_tokens_per_second": {
            name: statistics.median(r["tokens_per_second"] for r in runs)
            for name, runs in measured.items()
        },
        "median_ratio_mixed_over_plain": round(statistics.median(ratios), 3),
        "rounds": measured,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds of each load")
    parser.add_argument("--per-client", type=int, default=2, help="requests per client per round")
    parser.add_argument("--threads", type=int, default=1, help="the server's torch threads")
    parser.add_argument("--out", type=Path, default=Path("bench/results/sampling.json"))
    args = parser.parse_args()
    result = run(args.rounds, args.per_client, args.threads, args.out)
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
