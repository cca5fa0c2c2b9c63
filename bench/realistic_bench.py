"""The CPU server benchmark on a real shape: the llama3 zoo model under the realistic workload.

Why: the toy-shape bench (server_bench.py: a 2,048-token vocabulary, ~20-token
prompts, 32 new tokens) flatters a server whose cost is per step. This one
sends bench/workload.py's traffic (long, varied prompts with Chinese and
code, a shared system prompt on 30%, long answers) to a Llama-3-shaped
model (128,256-token vocabulary, grouped-query attention; the zoo's
`llama3`, 2 layers of 64 so it runs on 2 cores), streamed, greedy. Every
response's text and finish_reason is saved; a response without `usage`
fails the run (serving_metrics.MissingUsage).

Phases (`--phases`, each writes its part of the JSON, so a phase can be run
alone and the file keeps the others; each records its load average):

- `lever`: the logits lever in process. The engine's prefill over the
  workload's prompts (grouped as the worker groups them), projecting the
  last position only (what the server does) vs every position (what a
  forward without `logits_to_keep` does), alternated in the same process;
  seconds, projected logits bytes, and whether the tokens agree.
- `c1`: one request at a time, Fusebox over HTTP vs in-process `generate`
  (transformers' own kernels, dynamic cache) on the same requests, one of
  each in turn; the figure is the median of the per-request ratios.
  Fusebox runs without its prefix cache (`--prefix-cache-bytes 0`): each
  prompt is sent to it twice (streamed, then unstreamed) and the shared
  system prompt recurs, so with the cache it would skip prefill work that
  `generate` does (the unstreamed figure did, before 2026-12-06).
  The compiled static-cache `generate` the issue names is not run on the
  CPU: compiling on the 2 shared cores takes longer than the phase.
- `sweep`: `transformers serve --continuous-batching` in each peer setting
  (`--peer-variant NAME=FLAGS`), one warm-up and one measured round each at
  `--clients`; the best tokens/s is the peer Fusebox is held against.
- `c16`: Fusebox and the best peer in alternated rounds (A, B, A, B), after a
  warm-up each; medians of the per-round ratios of tokens/s and TTFT p99;
  greedy outputs compared token for token.
- `open`: Poisson arrivals at `--open-rate` requests/s to Fusebox and the
  best peer; latency from each scheduled send time.
- `prefix`: the prefix-cache lever. Fusebox with its prefix cache (the
  default bound) and with `--prefix-cache-bytes 0`, in alternated rounds at
  `--clients` after a warm-up each; time to first token p50/p99 over all
  requests and over those that carry the shared system prompt, the medians
  of the per-round ratios (cached / uncached), the cache's stats, and whether
  the two servers' greedy texts agree request for request.
- `chunk`: the chunked-prefill lever. For each `--chunk-sizes` value (0:
  whole prompts, the server before the lever), one server: `--chunk-clients`
  streams run (short prompts, long answers, a closed loop so some always
  run); after `--chunk-steady-seconds` of steady state, a warm-up joiner and
  `--chunk-joiners` prompts of `--chunk-joiner-tokens` tokens join one at a
  time. The running streams' inter-token gaps are split into those
  overlapping a joiner's prefill (its send to its first token) and those
  clear of every joiner; p50/p99 of each, their ratio, each stream's longest
  gap per prefill (its stall), and the joiners' time to first token;
  `--rounds` rounds, the sizes alternating, medians of the rounds.

    nice -n 19 .venv/bin/python bench/realistic_bench.py [--scale 4] [--phases lever,c1,...]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import server_bench, traffic  # noqa: E402  (the repository root is on the path only now)
from bench.serving_metrics import ResponseRecord, percentile, summarize  # noqa: E402
from bench.workload import (  # noqa: E402
    Workload,
    WorkloadShape,
    build_workload,
    poisson_arrivals,
)

PHASES = ("lever", "c1", "sweep", "c16", "open", "prefix", "chunk")
TARGETS = {
    "c16_tokens_per_second_ratio_at_least": 1.2,
    "c16_ttft_p99_ratio_at_most": 0.8,
    "c1_latency_ratio_at_most": 1.05,
    "prefix_cache_ttft_ratio_at_most": 0.3,
    "chunked_prefill_itl_p99_ratio_at_most": 2.0,
}
# Peer settings the CPU allows: attention (sdpa, or eager, which CB runs as paged|eager),
# the cache's size in blocks (CB's sdpa path attends over the whole cache with a mask, so
# a cache sized to the workload is its best case; a block is 256 tokens, and 16 clients of
# the 1/4 shape need at most 3 blocks each, 48) and the tokens per batch.
DEFAULT_PEER_VARIANTS = {
    "sdpa_default": "",
    "sdpa_blocks64": "--cb-num-blocks 64",
    "sdpa_blocks64_bt1024": "--cb-num-blocks 64 --cb-max-batch-tokens 1024",
    "eager_blocks64": "--attn-implementation eager --cb-num-blocks 64",
}
FUSEBOX_MODEL = "bench"


def host_load() -> dict[str, float]:
    one, five, _ = os.getloadavg()
    return {"load_average_1m": one, "load_average_5m": five}


def token_counter(model_dir: Path) -> tuple[Any, Callable[[str], int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    return tokenizer, lambda text: len(tokenizer.encode(text, add_special_tokens=False))


def agreement(
    tokenizer: Any, ours: Sequence[ResponseRecord], theirs: Sequence[ResponseRecord]
) -> dict[str, Any]:
    """How far two servers' greedy outputs for the same requests agree, in tokens of the text.

    Pairs where one side sent no text at all are counted apart: `transformers
    serve` sends nothing for an answer made only of bytes that form no
    character, where Fusebox sends them as replacement characters.
    """
    by_index = {record.index: record for record in theirs}
    prefixes, identical, compared, one_side_empty = [], 0, 0, 0
    for record in ours:
        other = by_index.get(record.index)
        if other is None or record.error or other.error:
            continue
        if bool(record.text) != bool(other.text):
            one_side_empty += 1  # a server that drops undecodable bytes sends no text
            continue
        a = tokenizer.encode(record.text, add_special_tokens=False)
        b = tokenizer.encode(other.text, add_special_tokens=False)
        common = 0
        while common < min(len(a), len(b)) and a[common] == b[common]:
            common += 1
        compared += 1
        identical += a == b
        prefixes.append(common / max(1, max(len(a), len(b))))
    return {
        "compared": compared,
        "one_side_empty": one_side_empty,
        "identical": identical,
        "identical_share": identical / compared if compared else None,
        "mean_common_prefix_share": statistics.fmean(prefixes) if prefixes else None,
    }


def prompt_ids(tokenizer: Any, workload: Workload) -> list[tuple[int, ...]]:
    ids = []
    for request in workload.requests:
        encoded = tokenizer.apply_chat_template(
            request.messages(), add_generation_prompt=True, tokenize=True, return_dict=True
        )
        ids.append(tuple(encoded["input_ids"]))
    return ids


def logits_lever(model_dir: Path, workload: Workload, rounds: int) -> dict[str, Any]:
    """The engine's prefill, last position vs every position projected, alternated."""
    import torch

    from fusebox_server.model import engine
    from fusebox_server.model.decode_settings import DecodeSettings
    from fusebox_server.model.tokenization import load_tokenizer
    from fusebox_server.model.worker import PREFILL_TOKEN_BUDGET

    tokenizer = load_tokenizer(model_dir)
    loaded = engine.load_model("primary", model_dir, "none", torch.device("cpu"), tokenizer)
    greedy = DecodeSettings(max_new_tokens=1, temperature=0.0, top_p=1.0, seed=None, stop=())
    prompts = prompt_ids(tokenizer, workload)
    groups = engine.prefill_groups([len(p) for p in prompts], PREFILL_TOKEN_BUDGET)
    settings = {"last_position": dict(loaded.prompt_arguments), "every_position": {}}
    projected: list[int] = []
    handle = loaded.model.get_output_embeddings().register_forward_hook(
        lambda module, inputs, output: projected.append(output.numel() * output.element_size())
    )
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in settings}
    try:
        for index in range(rounds + 1):  # the first round of each is warm-up
            order = list(settings) if index % 2 == 0 else list(reversed(settings))
            for name in order:
                loaded.prompt_arguments = settings[name]
                projected.clear()
                started = time.perf_counter()
                tokens: list[Any] = []
                for group in groups:
                    rows = [engine.Decoding(loaded, prompts[i], greedy) for i in group]
                    tokens += engine.prefill(loaded, rows)
                seconds = time.perf_counter() - started
                if index:
                    runs[name].append(
                        {
                            "seconds": seconds,
                            "logits_bytes": sum(projected),
                            "peak_logits_bytes": max(projected),
                            "tokens": [int(t) for t in tokens],
                        }
                    )
                gc.collect()
    finally:
        handle.remove()
    medians = {name: statistics.median(r["seconds"] for r in runs[name]) for name in runs}
    # Both settings ran in every round, back to back: a round's ratio sees one load.
    round_ratios = [
        every["seconds"] / last["seconds"]
        for last, every in zip(runs["last_position"], runs["every_position"], strict=True)
    ]
    return {
        "prompts": len(prompts),
        "prompt_tokens": sum(len(p) for p in prompts),
        "groups": len(groups),
        "rounds": rounds,
        "median_seconds": medians,
        "speedup": medians["every_position"] / medians["last_position"],
        "round_ratios": round_ratios,
        "median_round_ratio": statistics.median(round_ratios),
        "logits_bytes": {name: runs[name][0]["logits_bytes"] for name in runs},
        "peak_logits_bytes": {name: runs[name][0]["peak_logits_bytes"] for name in runs},
        "tokens_agree": all(
            a["tokens"] == b["tokens"]
            for a, b in zip(runs["last_position"], runs["every_position"], strict=True)
        ),
        "seconds_per_round": {name: [r["seconds"] for r in runs[name]] for name in runs},
    } | host_load()


def latency_c1(model_dir: Path, url: str, workload: Workload, threads: int) -> dict[str, Any]:
    """One in-process `generate`, then the same request to Fusebox streamed and unstreamed,
    in turn (the first request is warm-up). The figure is the streamed one."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if threads > 0:
        torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True).eval()
    pairs, texts_agree = [], 0
    records: list[ResponseRecord] = []
    with httpx.Client(timeout=traffic.REQUEST_TIMEOUT_SECONDS) as client:
        for position, request in enumerate(workload.requests):
            ids = tokenizer.apply_chat_template(
                request.messages(),
                add_generation_prompt=True,
                return_tensors="pt",
                return_dict=True,
            )
            started = time.perf_counter()
            with torch.inference_mode():
                output = model.generate(**ids, max_new_tokens=request.max_tokens, do_sample=False)
            local = time.perf_counter() - started
            local_text = tokenizer.decode(
                output[0, ids["input_ids"].shape[1] :], skip_special_tokens=True
            )
            [record] = traffic.closed_loop(url, FUSEBOX_MODEL, [request], clients=1)
            if record.error:
                raise RuntimeError(f"c=1 request {request.index}: {record.error}")
            summarize([record])  # fails the run on a missing usage
            remote = record.finished - record.scheduled
            whole = traffic.complete_unstreamed(url, FUSEBOX_MODEL, request, client)
            if whole.error:
                raise RuntimeError(f"c=1 request {request.index} unstreamed: {whole.error}")
            summarize([whole])
            if position:
                pairs.append(
                    {
                        "index": request.index,
                        "in_process": local,
                        "fusebox": remote,
                        "fusebox_unstreamed": whole.finished - whole.scheduled,
                    }
                )
                records.append(record)
                texts_agree += record.text == local_text
    del model
    gc.collect()
    ratios = [pair["fusebox"] / pair["in_process"] for pair in pairs]
    unstreamed = [pair["fusebox_unstreamed"] / pair["in_process"] for pair in pairs]
    return {
        "pairs": pairs,
        "median_ratio": statistics.median(ratios),
        # The same requests answered in one body: what streaming itself costs at c=1.
        "median_ratio_unstreamed": statistics.median(unstreamed),
        "ratios": ratios,
        "greedy_texts_equal_to_generate": f"{texts_agree}/{len(pairs)}",
        "responses": [record.to_json() for record in records],
    } | host_load()


def one_round(url: str, model: str, workload: Workload, clients: int) -> list[ResponseRecord]:
    return traffic.closed_loop(url, model, workload.requests, clients)


def figures(records: Sequence[ResponseRecord]) -> dict[str, Any]:
    return summarize(records) | host_load()


def sweep_peer(
    model_dir: Path,
    workdir: Path,
    variants: dict[str, str],
    warmup: Workload,
    workload: Workload,
    clients: int,
    threads: int,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A short warm-up and one measured round per peer setting, each server alone while it runs.

    The sweep's rounds are shorter than the alternated ones (`--sweep-requests`): on two
    cores one peer setting's round of the full count takes minutes. Returns the figures
    and every measured response, by setting.
    """
    results: dict[str, Any] = {}
    saved: dict[str, Any] = {}
    for name, flags in variants.items():
        started = time.perf_counter()
        try:
            peer, url, _ = server_bench.start_transformers_serve(
                model_dir, workdir, shlex.split(flags), threads
            )
        except RuntimeError as error:
            results[name] = {"flags": flags, "failed": str(error)[-1500:]}
            continue
        try:
            one_round(url, str(model_dir), warmup, len(warmup.requests))
            records = one_round(url, str(model_dir), workload, clients)
        finally:
            server_bench.stop(peer)
        saved[name] = [record.to_json() for record in records]
        results[name] = {"flags": flags, "seconds": time.perf_counter() - started}
        results[name] |= figures(records)
    ranked = [name for name in results if "tokens_per_second" in results[name]]
    best = max(ranked, key=lambda name: results[name]["tokens_per_second"]) if ranked else None
    return {"variants": results, "best": best}, saved


def alternated(
    servers: dict[str, tuple[str, str]],
    warmup: Workload,
    workload: Workload,
    clients: int,
    rounds: int,
) -> dict[str, list[list[ResponseRecord]]]:
    for url, model in servers.values():
        one_round(url, model, warmup, clients)
    measured: dict[str, list[list[ResponseRecord]]] = {name: [] for name in servers}
    for _ in range(rounds):
        for name, (url, model) in servers.items():
            measured[name].append(one_round(url, model, workload, clients))
    return measured


def load_json(path: Path) -> dict[str, Any]:
    if path.exists():
        loaded: dict[str, Any] = json.loads(path.read_text())
        return loaded
    return {}


def run(arguments: argparse.Namespace) -> dict[str, Any]:
    from fusebox_server.zoo.release import ensure_zoo_model

    model_dir = ensure_zoo_model("llama3")
    tokenizer, count_tokens = token_counter(model_dir)
    shape = WorkloadShape().scaled(arguments.scale)
    workload = build_workload(arguments.requests, count_tokens, shape, seed=arguments.seed)
    warmup = build_workload(arguments.clients, count_tokens, shape, seed=arguments.seed + 1000)
    c1 = build_workload(arguments.c1_requests + 1, count_tokens, shape, seed=arguments.seed + 1)
    variants = dict(DEFAULT_PEER_VARIANTS)
    if arguments.peer_variant:
        variants = dict(item.split("=", 1) for item in arguments.peer_variant)
    result = load_json(arguments.out)
    responses = load_json(arguments.responses)
    result |= {
        "model": {"family": "llama3", "directory": str(model_dir), "vocab_size": 128_256},
        "workload": workload.describe(),
        "clients": arguments.clients,
        "threads": arguments.threads,
        "machine": {"cpus": os.cpu_count()},
        "method": (
            "streamed /v1/chat/completions, temperature 0, stream_options.include_usage; "
            f"workload scaled 1/{arguments.scale} for the 2-core CPU; "
            f"{arguments.threads} intra-op thread(s) per server; peer settings swept one at a time"
        ),
        "targets": TARGETS,
    }
    phases = arguments.phases
    fusebox_flags = {
        "torch_threads": arguments.threads,
        "max_input_tokens": 4096,
        "max_new_tokens": 1024,
        "max_concurrency": arguments.clients,
    }
    with tempfile.TemporaryDirectory(prefix="fusebox-realistic-") as raw:
        workdir = Path(raw)
        if "lever" in phases:
            result["lever"] = logits_lever(model_dir, workload, arguments.lever_rounds)
            write(arguments, result, responses)
        if "c1" in phases:
            fusebox, url, _ = server_bench.start_fusebox(
                model_dir, workdir, **fusebox_flags, prefix_cache_bytes=0
            )
            try:
                part = latency_c1(model_dir, url, c1, arguments.threads)
            finally:
                server_bench.stop(fusebox)
            responses["c1_fusebox"] = part.pop("responses")
            result["c1"] = part
            write(arguments, result, responses)
        if "sweep" in phases:
            result["sweep"], responses["sweep"] = sweep_peer(
                model_dir,
                workdir,
                variants,
                build_workload(4, count_tokens, shape, seed=arguments.seed + 2000),
                build_workload(arguments.sweep_requests, count_tokens, shape, seed=arguments.seed),
                arguments.clients,
                arguments.threads,
            )
            write(arguments, result, responses)
        best = (result.get("sweep") or {}).get("best")
        if best is None and ({"c16", "open"} & set(phases)):
            raise SystemExit("the c16 and open phases need a sweep's best peer setting first")
        peer_flags = shlex.split(result["sweep"]["variants"][best]["flags"]) if best else []
        if {"c16", "open"} & set(phases):
            fusebox, url, _ = server_bench.start_fusebox(model_dir, workdir, **fusebox_flags)
            peer, peer_url, _ = server_bench.start_transformers_serve(
                model_dir, workdir, peer_flags, arguments.threads
            )
            servers = {"fusebox": (url, FUSEBOX_MODEL), "peer": (peer_url, str(model_dir))}
            try:
                if "c16" in phases:
                    rounds = alternated(
                        servers, warmup, workload, arguments.clients, arguments.rounds
                    )
                    result["c16"] = c16_figures(tokenizer, rounds, best)
                    responses["c16"] = {
                        name: [[r.to_json() for r in run] for run in runs]
                        for name, runs in rounds.items()
                    }
                    write(arguments, result, responses)
                if "open" in phases:
                    result["open"], responses["open"] = open_loop(
                        servers, workload, arguments.open_rate, arguments.seed
                    )
                    result["open"]["peer_setting"] = best
                    write(arguments, result, responses)
            finally:
                server_bench.stop(fusebox)
                server_bench.stop(peer)
        if "prefix" in phases:
            result["prefix"], responses["prefix"] = prefix_cache_lever(
                model_dir, workdir, fusebox_flags, count_tokens, workload, arguments
            )
            write(arguments, result, responses)
        if "chunk" in phases:
            result["chunk"], responses["chunk"] = chunked_prefill_lever(
                model_dir, workdir, fusebox_flags, count_tokens, arguments
            )
            write(arguments, result, responses)
    result["verdict"] = verdict(result)
    write(arguments, result, responses)
    return result


def prefix_cache_lever(
    model_dir: Path,
    workdir: Path,
    flags: dict[str, Any],
    count_tokens: Callable[[str], int],
    workload: Workload,
    arguments: argparse.Namespace,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Fusebox with and without its prefix cache, alternated on the same requests.

    Each round (and the warm-up) draws its own prompts, so no prompt repeats
    across rounds and a hit comes from the shared system prompt alone, as
    in a deployment whose system prompt outlives every conversation; all of
    them carry the one system prompt (`with_system_prompt`).
    """
    cached, cached_url, _ = server_bench.start_fusebox(model_dir, workdir, **flags)
    uncached, uncached_url, _ = server_bench.start_fusebox(
        model_dir, workdir, **flags, prefix_cache_bytes=0
    )
    servers = {"cached": (cached_url, FUSEBOX_MODEL), "uncached": (uncached_url, FUSEBOX_MODEL)}

    def drawn(requests: int, seed: int) -> Workload:
        fresh = build_workload(requests, count_tokens, workload.shape, seed=seed)
        return with_system_prompt(fresh, workload.system_prompt)

    warmup = drawn(arguments.clients, arguments.seed + 1000)
    per_round = [drawn(arguments.requests, arguments.seed + 1 + r) for r in range(arguments.rounds)]
    rounds: dict[str, list[list[ResponseRecord]]] = {name: [] for name in servers}
    try:
        for url, model in servers.values():
            one_round(url, model, warmup, arguments.clients)
        for drawn_round in per_round:
            for name, (url, model) in servers.items():
                rounds[name].append(one_round(url, model, drawn_round, arguments.clients))
        stats = {name: prefix_cache_stats(workdir, url) for name, (url, _) in servers.items()}
    finally:
        server_bench.stop(cached)
        server_bench.stop(uncached)
    part: dict[str, Any] = {
        "clients": arguments.clients,
        "rounds_drawn": "each round its own prompts (seeds seed+1..), one shared system prompt",
        "prefix_cache_stats": stats,
        "rounds": {
            name: [
                ttft_figures(run, shared_indexes(drawn_round))
                for run, drawn_round in zip(runs, per_round, strict=True)
            ]
            for name, runs in rounds.items()
        },
    }
    pairs = list(zip(part["rounds"]["cached"], part["rounds"]["uncached"], strict=True))
    for subset in ("all", "system_prompt"):
        for quantile in ("p50", "p99"):
            ratios = [ours[subset][quantile] / theirs[subset][quantile] for ours, theirs in pairs]
            part[f"ttft_{quantile}_ratios_{subset}"] = ratios
            part[f"ttft_{quantile}_ratio_{subset}"] = statistics.median(ratios)
    part["texts_equal"] = [
        f"{sum(a.text == b.text for a, b in zip(ours, theirs, strict=True))}/{len(ours)}"
        for ours, theirs in zip(rounds["cached"], rounds["uncached"], strict=True)
    ]
    saved = {name: [[r.to_json() for r in run] for run in runs] for name, runs in rounds.items()}
    return part, saved


def chunked_prefill_lever(
    model_dir: Path,
    workdir: Path,
    flags: dict[str, Any],
    count_tokens: Callable[[str], int],
    arguments: argparse.Namespace,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Running streams while long prompts join, one server per chunk size, in turn, for
    `--rounds` rounds (the sizes alternate, so the host's load falls on all of them).

    The prefix cache is off (`--prefix-cache-bytes 0`), so every joiner's
    prompt runs in full and the chunk size alone differs between the servers;
    every server gets the same running requests and the same joiners, the
    first of which warms the server up (a new shape's first pass) and is not
    counted.
    """
    running = build_workload(
        256,
        count_tokens,
        WorkloadShape(prompt_tokens=(32, 64), output_tokens=(1024, 1024), system_prompt_share=0),
        seed=arguments.seed + 3000,
    )
    tokens = arguments.chunk_joiner_tokens
    joiners = build_workload(
        arguments.chunk_joiners + 1,
        count_tokens,
        WorkloadShape(
            prompt_tokens=(tokens, tokens), output_tokens=(16, 16), system_prompt_share=0
        ),
        seed=arguments.seed + 4000,
    )
    part: dict[str, Any] = {
        "running_streams": arguments.chunk_clients,
        "running_prompt_tokens": [32, 64],
        "joiner_prompt_tokens": tokens,
        "joiners_per_round": arguments.chunk_joiners,
        "warmup_joiners": 1,
        "steady_seconds": arguments.chunk_steady_seconds,
        "rounds": arguments.rounds,
        "prefix_cache_bytes": 0,
        "settings": {},
    }
    saved: dict[str, Any] = {}
    for _ in range(arguments.rounds):
        for chunk in arguments.chunk_sizes:
            server, url, _ = server_bench.start_fusebox(
                model_dir, workdir, **flags, prefix_cache_bytes=0, prefill_chunk_tokens=chunk
            )
            try:
                streams, joined = asyncio.run(
                    joiners_under_load(
                        url,
                        FUSEBOX_MODEL,
                        running,
                        joiners,
                        arguments.chunk_clients,
                        arguments.chunk_steady_seconds,
                    )
                )
            finally:
                server_bench.stop(server)
            rounds = part["settings"].setdefault(str(chunk), {"rounds": []})["rounds"]
            rounds.append(joiner_figures(streams, joined[1:]) | host_load())
            saved.setdefault(str(chunk), []).append(
                {
                    "running": [record.to_json() for record in streams],
                    "joiners": [record.to_json() for record in joined],
                }
            )
    for figures_of in part["settings"].values():
        rounds = figures_of["rounds"]
        for name in ("itl_p99_ratio", "itl_p50_ratio", "stall_ratio", "joiner_ttft_p50_seconds"):
            figures_of[name] = statistics.median(figures[name] for figures in rounds)
    whole = part["settings"].get("0")
    if whole is not None:
        for figures_of in part["settings"].values():
            figures_of["joiner_ttft_p50_vs_whole"] = (
                figures_of["joiner_ttft_p50_seconds"] / whole["joiner_ttft_p50_seconds"]
            )
    return part, saved


async def joiners_under_load(
    url: str,
    model: str,
    running: Workload,
    joiners: Workload,
    clients: int,
    steady_seconds: float,
) -> tuple[list[ResponseRecord], list[ResponseRecord]]:
    """`clients` streams run (each sends its next request when one ends); after
    `steady_seconds` the joiners are sent one at a time, each after the last one ended
    and a pause as long as its prefill took; the running streams are then cut."""
    streams: list[ResponseRecord] = []
    queue = list(reversed(running.requests))
    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(
        base_url=url, limits=limits, timeout=httpx.Timeout(traffic.REQUEST_TIMEOUT_SECONDS)
    ) as client:

        async def one_client() -> None:
            while queue:
                request = queue.pop()
                record = ResponseRecord(request.index, scheduled=time.perf_counter())
                streams.append(record)
                await traffic.stream_one(client, model, request, record)

        tasks = [asyncio.create_task(one_client()) for _ in range(clients)]
        await asyncio.sleep(steady_seconds)
        joined: list[ResponseRecord] = []
        for request in joiners.requests:
            record = ResponseRecord(request.index, scheduled=time.perf_counter())
            await traffic.stream_one(client, model, request, record)
            joined.append(record)
            first = record.chunk_times[0] if record.chunk_times else record.finished
            await asyncio.sleep(first - record.sent)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return streams, joined


def joiner_figures(
    streams: Sequence[ResponseRecord], joined: Sequence[ResponseRecord]
) -> dict[str, Any]:
    """The running streams' gaps during a joiner's prefill (overlapping its send to its first
    token) and clear of every joiner (from its send to its end), and the joiners' TTFT.

    The longest gap of each running stream in each joiner's prefill (its
    stall) is reported beside the pooled percentiles: a whole prefill makes
    one long gap per stream, which a pooled p99 of few gaps reads as its
    maximum, and a stream whose text is held back (bytes of a partial
    character) makes long gaps in any setting.
    """
    prefills = [
        (record.sent, record.chunk_times[0] if record.chunk_times else record.finished)
        for record in joined
    ]
    joiners_busy = [(record.sent, record.finished) for record in joined]

    def overlaps(earlier: float, later: float, windows: Sequence[tuple[float, float]]) -> bool:
        return any(earlier < end and later > start for start, end in windows)

    during: list[float] = []
    steady: list[float] = []
    stalls: list[float] = []
    chunks_during = [0] * len(prefills)
    for record in streams:
        pairs = list(zip(record.chunk_times, record.chunk_times[1:], strict=False))
        for earlier, later in pairs:
            if overlaps(earlier, later, prefills):
                during.append(later - earlier)
            elif not overlaps(earlier, later, joiners_busy):
                steady.append(later - earlier)
        for index, window in enumerate(prefills):
            gaps = [
                later - earlier for earlier, later in pairs if overlaps(earlier, later, [window])
            ]
            if gaps:
                stalls.append(max(gaps))
            start, end = window
            chunks_during[index] += sum(1 for moment in record.chunk_times if start < moment < end)
    ttft = [record.chunk_times[0] - record.sent for record in joined if record.chunk_times]
    steady_p50, steady_p99 = percentile(steady, 0.5), percentile(steady, 0.99)
    during_p50, during_p99 = percentile(during, 0.5), percentile(during, 0.99)
    stall = statistics.median(stalls) if stalls else math.nan
    return {
        "steady_itl_seconds": {"p50": steady_p50, "p99": steady_p99},
        "steady_gaps": len(steady),
        "during_prefill_itl_seconds": {"p50": during_p50, "p99": during_p99},
        "during_prefill_gaps": len(during),
        "itl_p99_ratio": during_p99 / steady_p99,
        "itl_p50_ratio": during_p50 / steady_p50,
        "stall_median_seconds": stall,
        "stall_ratio": stall / steady_p99,
        "running_text_chunks_during_each_prefill": chunks_during,
        "joiner_ttft_p50_seconds": percentile(ttft, 0.5),
        "joiner_ttft_seconds": ttft,
        "joiner_errors": [record.error for record in joined if record.error],
        "running_errors": sum(1 for record in streams if record.error),
    }


def with_system_prompt(workload: Workload, system_prompt: str) -> Workload:
    """The workload with its shared system prompt replaced (the same length, in tokens)."""
    requests = tuple(
        replace(request, system=system_prompt) if request.system is not None else request
        for request in workload.requests
    )
    return replace(workload, system_prompt=system_prompt, requests=requests)


def prefix_cache_stats(workdir: Path, url: str) -> dict[str, Any]:
    """The server's prefix cache block from its stats file (`server_bench.start_fusebox`
    names the file by the API port)."""
    port = url.rsplit(":", 1)[1]
    stats: dict[str, Any] = json.loads((workdir / f"stats-{port}.json").read_text())
    return dict(stats.get("prefix_cache") or {})


def shared_indexes(workload: Workload) -> set[int]:
    return {request.index for request in workload.requests if request.system is not None}


def ttft_figures(records: Sequence[ResponseRecord], shared: set[int]) -> dict[str, Any]:
    """A round's figures, with time to first token p50/p99 over all its requests and over
    those that carry the shared system prompt."""

    def ttft(subset: Sequence[ResponseRecord]) -> dict[str, float]:
        times = [r.chunk_times[0] - r.scheduled for r in subset if r.streamed()]
        return {"p50": percentile(times, 0.5), "p99": percentile(times, 0.99), "n": len(times)}

    ordered = sorted(records, key=lambda record: record.index)
    return figures(records) | {
        "all": ttft(ordered),
        "system_prompt": ttft([r for r in ordered if r.index in shared]),
    }


def paired_ttft_p99(
    ours: Sequence[ResponseRecord], theirs: Sequence[ResponseRecord]
) -> dict[str, float]:
    """TTFT p99 of each side over the requests whose first token both sides streamed.

    Each side's own p99 leaves out its unobservable responses, and the two
    sides' sets differ; compared on the same requests, neither gains from
    what the other held back.
    """
    both = {r.index for r in ours if r.streamed()} & {r.index for r in theirs if r.streamed()}

    def p99(records: Sequence[ResponseRecord]) -> float:
        return percentile(
            [r.chunk_times[0] - r.scheduled for r in records if r.index in both], 0.99
        )

    return {"requests": len(both), "fusebox": p99(ours), "peer": p99(theirs)}


def c16_figures(
    tokenizer: Any, rounds: dict[str, list[list[ResponseRecord]]], best: str
) -> dict[str, Any]:
    per_round = {name: [figures(run) for run in runs] for name, runs in rounds.items()}
    pairs = list(zip(per_round["fusebox"], per_round["peer"], strict=True))
    throughput = [a["tokens_per_second"] / b["tokens_per_second"] for a, b in pairs]
    paired = [
        paired_ttft_p99(ours, theirs)
        for ours, theirs in zip(rounds["fusebox"], rounds["peer"], strict=True)
    ]
    ttft = [pair["fusebox"] / pair["peer"] for pair in paired]
    return {
        "peer_setting": best,
        "rounds": per_round,
        "tokens_per_second_ratios": throughput,
        "tokens_per_second_ratio": statistics.median(throughput),
        "ttft_p99_paired": paired,
        "ttft_p99_ratios": ttft,
        "ttft_p99_ratio": statistics.median(ttft),
        "greedy_agreement": [
            agreement(tokenizer, ours, theirs)
            for ours, theirs in zip(rounds["fusebox"], rounds["peer"], strict=True)
        ],
    }


def open_loop(
    servers: dict[str, tuple[str, str]], workload: Workload, rate: float, seed: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    send_times = poisson_arrivals(len(workload.requests), rate, seed)
    part: dict[str, Any] = {"rate_per_second": rate}
    saved: dict[str, Any] = {}
    records: dict[str, list[ResponseRecord]] = {}
    for name, (url, model) in servers.items():
        records[name] = traffic.open_loop(url, model, workload.requests, send_times)
        part[name] = figures(records[name])
        saved[name] = [record.to_json() for record in records[name]]
    part["ttft_p99_paired"] = paired_ttft_p99(records["fusebox"], records["peer"])
    return part, saved


def verdict(result: dict[str, Any]) -> dict[str, Any]:
    """Each target with the figure measured against it, where the run measured it."""
    checks: dict[str, Any] = {}
    if "c16" in result:
        ratio = result["c16"]["tokens_per_second_ratio"]
        checks["c16_tokens_per_second_ratio"] = {
            "value": ratio,
            "met": ratio >= TARGETS["c16_tokens_per_second_ratio_at_least"],
        }
        ttft = result["c16"]["ttft_p99_ratio"]
        checks["c16_ttft_p99_ratio"] = {
            "value": ttft,
            "met": ttft <= TARGETS["c16_ttft_p99_ratio_at_most"],
        }
    if "prefix" in result:
        ratio = result["prefix"]["ttft_p99_ratio_system_prompt"]
        checks["prefix_cache_ttft_p99_ratio_system_prompt"] = {
            "value": ratio,
            "met": ratio <= TARGETS["prefix_cache_ttft_ratio_at_most"],
        }
    if "chunk" in result:
        for chunk, figures_of in result["chunk"]["settings"].items():  # medians of rounds
            checks[f"chunked_prefill_itl_p99_ratio_chunk_{chunk}"] = {
                "value": figures_of["itl_p99_ratio"],
                "met": figures_of["itl_p99_ratio"]
                <= TARGETS["chunked_prefill_itl_p99_ratio_at_most"],
            }
    if "c1" in result:
        ratio = result["c1"]["median_ratio"]
        checks["c1_latency_ratio"] = {
            "value": ratio,
            "met": ratio <= TARGETS["c1_latency_ratio_at_most"],
        }
    return checks


def write(arguments: argparse.Namespace, result: dict[str, Any], responses: dict[str, Any]) -> None:
    arguments.out.parent.mkdir(parents=True, exist_ok=True)
    arguments.out.write_text(json.dumps(result, indent=2) + "\n")
    arguments.responses.write_text(json.dumps(responses, ensure_ascii=False) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=int, default=4, help="divide every workload length by")
    parser.add_argument("--requests", type=int, default=32, help="requests per measured round")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--sweep-requests", type=int, default=16, help="per peer setting")
    parser.add_argument("--rounds", type=int, default=2, help="alternated rounds per server")
    parser.add_argument("--c1-requests", type=int, default=24, help="c=1 pairs after a warm-up")
    parser.add_argument("--lever-rounds", type=int, default=3)
    parser.add_argument("--open-rate", type=float, default=0.5, help="open-loop requests/s")
    parser.add_argument("--seed", type=int, default=34)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per server")
    parser.add_argument(
        "--peer-variant",
        action="append",
        default=[],
        metavar="NAME=FLAGS",
        help="a `transformers serve` setting to sweep (repeatable; replaces the default sweep)",
    )
    parser.add_argument(
        "--phases",
        type=lambda text: [phase for phase in text.split(",") if phase],
        default=list(PHASES),
        help=f"comma-separated, of {','.join(PHASES)}",
    )
    parser.add_argument(
        "--chunk-sizes",
        type=lambda text: [int(size) for size in text.split(",") if size],
        default=[0, 32, 64, 128, 256],
        help="the chunk phase's --prefill-chunk-tokens values, comma-separated (0: whole)",
    )
    parser.add_argument("--chunk-clients", type=int, default=4, help="running streams")
    parser.add_argument("--chunk-joiners", type=int, default=5)
    parser.add_argument("--chunk-joiner-tokens", type=int, default=2048)
    parser.add_argument("--chunk-steady-seconds", type=float, default=4.0)
    parser.add_argument("--out", type=Path, default=Path("bench/results/realistic.json"))
    parser.add_argument(
        "--responses", type=Path, default=Path("bench/results/realistic-responses.json")
    )
    arguments = parser.parse_args(argv)
    unknown = [phase for phase in arguments.phases if phase not in PHASES]
    if unknown:
        parser.error(f"unknown phases {unknown}; known: {list(PHASES)}")
    result = run(arguments)
    print(f"realistic: {json.dumps(result['verdict'])}; wrote {arguments.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
