"""The GPU benchmark on a real shape: Llama-3.1-8B's configuration under the realistic workload.

Why: the H200 figures so far (gpu_bench.py) came from a 1 B model with a
2,048-token vocabulary, ~20-token prompts and 64 new tokens, a shape where a
decode step is mostly launch overhead and CUDA graphs win by default (issue
34). This script measures the shape a deployment serves: Llama-3.1-8B's full
configuration (hidden 4096, 32 layers, 32 query heads over 8 KV heads of
128, a 128,256-token vocabulary, llama3 RoPE scaling, three end ids) with
random bfloat16 weights made on the device (no download), and
bench/workload.py's traffic at full length (prompts 256-2,048 tokens, a
shared 1,000-token system prompt on 30%, answers 64-512), streamed and greedy.

Phases, in the order they run, each alone on the card, each writing its part
of realistic.json as soon as it has it:

1. `model`: the model directory, built in a child process: weights
   initialised on the device in bfloat16, saved as sharded safetensors on
   local disk with the zoo's llama3 tokenizer (the same special ids), the
   output rows of unused ids zeroed so greedy text never ends early;
   seconds to initialise and to save are recorded.
2. `fusebox`: the Fusebox server, closed loop at each client count (64
   first), then open loop at each Poisson rate.
3. `admission`: on the same server (started with a high --max-concurrency
   and no queue), rising numbers of concurrent 2,048-token requests until
   one is refused or fails, against the KV-cache bytes per token the model
   needs and what the device's memory could hold.
4. `peers`: `transformers serve --continuous-batching` per setting of the
   sweep (attention, CUDA graphs, compile, batch and memory sizing), each
   started alone: the same closed and open rounds; the best setting per
   client count is the one Fusebox is held against.
5. `engine`: Fusebox's own worker called in process (no HTTP, prompts
   tokenised beforehand) at each client count: the ceiling the server
   should approach.
6. `generate`: transformers' `generate` with a static cache, compiled
   (`torch.compile(mode="reduce-overhead")`, as generate compiles a static
   cache's decode step): c=1 on a few requests, then one static batch.

Every figure comes from bench/serving_metrics.py (tok/s, TTFT, ITL, TPOT,
request latency p50/p99); every response's text and finish_reason goes to
realistic-responses.json; a response without usage fails the run.

The budget (--budget-seconds, or GPU_REALISTIC_SECONDS) is shared among the
phases by weight, what a phase leaves passing on to the next; a round stops
sending when its share is spent, every server start and request has a
timeout, and the in-process phases run in child processes killed at their
share. What was cut, and why, is in `trimmed`.

This script is the I/O: it starts the servers and the child processes and
writes the files. What it decides is pure and tested on its own: the shape
and presets (gpu_realistic_config.py), the budget's shares
(gpu_realistic_budget.py), the requests and a round's figures
(gpu_realistic_traffic.py), the comparisons and verdicts
(gpu_realistic_verdicts.py). The loops are gpu_realistic_loops.py, the
child phases gpu_realistic_in_process.py, and the servers start as
gpu_bench.py's do, through gpu_servers.py.

`--dry-run` runs every phase on the CPU with a narrow model (2 layers of
128, the 128k vocabulary kept), the workload scaled down and a few clients.

    nice -n 19 .venv/bin/python bench/gpu_realistic.py --dry-run --out bench/results/gpu-dryrun
    python3 bench/gpu_realistic.py --work-dir /tmp/gpu-realistic --out "$OUT"   # on the device
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import loopback  # noqa: E402  (the repository root is on the path only now)
from bench.gpu_budget import Budget  # noqa: E402
from bench.gpu_realistic_budget import (  # noqa: E402
    MIN_REQUEST_TIMEOUT_SECONDS,
    PHASE_WEIGHTS,
    PHASES,
    SEND_SHARE,
    SETTLE_RESERVE_SECONDS,
    next_level_fits,
    phase_share,
    request_timeout,
    setting_seconds,
)
from bench.gpu_realistic_config import (  # noqa: E402
    RealisticConfig,
    admission_limit,
    build_estimate,
    for_dry_run,
    for_gpu,
)
from bench.gpu_realistic_in_process import child_phase, write_atomically  # noqa: E402
from bench.gpu_realistic_loops import closed_loop, open_loop  # noqa: E402
from bench.gpu_realistic_traffic import (  # noqa: E402
    TIMEOUT,
    Traffic,
    make_traffic,
    rate_key,
    request_to_json,
    round_figures,
)
from bench.gpu_realistic_verdicts import TARGETS, best_peers, comparisons, texts_equal, verdicts  # noqa: E402
from bench.gpu_servers import (  # noqa: E402
    FUSEBOX_MODEL,
    environment_report,
    fusebox_command,
    fusebox_stats_file,
    launch,
    log_tail,
)
from bench.realistic_bench import agreement, paired_ttft_p99  # noqa: E402
from bench.server_bench import transformers_serve_command  # noqa: E402
from bench.serving_metrics import ResponseRecord, summarize  # noqa: E402
from bench.workload import poisson_arrivals  # noqa: E402

FUSEBOX = "fusebox"


class Run:
    """One run: the budget, the result as it grows, the saved responses, what was cut."""

    def __init__(self, config: RealisticConfig, budget: Budget, work_dir: Path, out: Path) -> None:
        self.config = config
        self.budget = budget
        self.work_dir = work_dir
        self.out = out
        self.trimmed: list[str] = []
        self.failed: dict[str, str] = {}
        self.result: dict[str, Any] = {}
        self.responses: dict[str, Any] = {}
        self.records: dict[str, dict[str, list[ResponseRecord]]] = {}
        self.logs: dict[str, str] = {}
        self.tokenizer: Any = None  # the served model's, for greedy agreement

    def write(self) -> None:
        """realistic.json with the verdicts of what is measured so far, and the responses."""
        compared = comparisons(self.result, self.config.clients)
        self.result["comparisons"] = compared
        self.result["verdicts"] = verdicts(compared, self.config.clients[0])
        self.result["trimmed"] = self.trimmed
        self.result["failed"] = self.failed
        self.result["elapsed_seconds"] = self.budget.elapsed()
        self.out.mkdir(parents=True, exist_ok=True)
        write_atomically(self.out / "realistic.json", json.dumps(self.result, indent=2) + "\n")
        write_atomically(
            self.out / "realistic-responses.json",
            json.dumps(self.responses, ensure_ascii=False) + "\n",
        )

    def share(self, phase: str) -> float:
        """`phase`'s seconds of what is left (phases not chosen take no share)."""
        return phase_share(self.budget.left(), phase, self.result.get("phases", PHASES))

    def progress(self, message: str) -> None:
        print(f"[{self.budget.elapsed():5.0f} s] {message}", flush=True)


def serve_rounds(
    run: Run, name: str, url: str, model: str, traffic_of: Traffic, seconds: float
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A warm-up, the closed rounds (the headline client count first), then the open
    rates, within `seconds`; each round's share is an equal part of what is left."""
    config = run.config
    started = time.perf_counter()
    part: dict[str, Any] = {"closed": {}, "open": {}}
    saved: dict[str, Any] = {"closed": {}, "open": {}}
    run.records[name] = {}

    def left() -> float:
        return seconds - (time.perf_counter() - started)

    warmup = traffic_of.warmup.requests
    # The warm-up also pays for what a server does lazily (CUDA graphs, compiling).
    warmup_seconds = left() / 3
    closed_loop(
        url,
        model,
        warmup,
        len(warmup),
        warmup_seconds * SEND_SHARE,
        request_timeout(config, warmup_seconds),
    )
    rounds = [("closed", count) for count in config.clients] + [
        ("open", rate) for rate in config.open_rates
    ]
    for position, (kind, value) in enumerate(rounds):
        round_seconds = left() / (len(rounds) - position)
        timeout = request_timeout(config, round_seconds)
        if round_seconds < 1.0:
            run.trimmed.append(f"{name}: {kind} {value} not run, its share was spent")
            continue
        if kind == "closed":
            count = int(value)
            requests = traffic_of.closed[count].requests
            records = closed_loop(url, model, requests, count, round_seconds * SEND_SHARE, timeout)
            key = str(count)
        else:
            requests = traffic_of.open[rate_key(value)].requests
            send_times = poisson_arrivals(len(requests), float(value), seed=35)
            records = open_loop(
                url,
                model,
                requests,
                send_times,
                round_seconds * SEND_SHARE,
                timeout,
            )
            key = rate_key(value)
        figures = round_figures(records, len(requests))
        if figures["not_sent"]:
            run.trimmed.append(
                f"{name}: {kind} {key}: {figures['not_sent']} of {len(requests)} requests "
                f"not sent (the round's share, {round_seconds:.0f} s, was spent)"
            )
        part[kind][key] = figures
        saved[kind][key] = [record.to_json() for record in records]
        run.records[name][f"{kind}:{key}"] = records
        run.progress(
            f"{name} {kind} {key}: {figures['tokens_per_second']:.0f} tok/s, "
            f"TTFT p99 {figures['ttft_seconds']['p99']:.2f} s, errors {figures['errors']}"
        )
    return part | {"seconds": time.perf_counter() - started}, saved


def fusebox_c1(run: Run, url: str, traffic_of: Traffic) -> dict[str, Any]:
    """One request at a time, the first a warm-up: the latency compiled `generate` is held to."""
    latencies, saved = [], []
    for position, request in enumerate(traffic_of.c1.requests):
        [record] = closed_loop(
            url, FUSEBOX_MODEL, [request], 1, 1.0, run.config.request_timeout_seconds
        )
        summarize([record])
        if position:
            latencies.append(record.finished - record.scheduled)
            saved.append(record.to_json())
    return {
        "latency_seconds": latencies,
        "median_latency_seconds": statistics.median(latencies) if latencies else None,
        "responses": saved,
    }


def admission_probe(
    run: Run, url: str, stats_file: Path, traffic_of: Traffic, seconds: float
) -> dict[str, Any]:
    """Rising numbers of 2,048-token requests sent at once, until one is refused or fails."""
    started = time.perf_counter()
    levels: list[dict[str, Any]] = []
    last_cost: float | None = None
    previous = 0
    for level in run.config.admission_levels:
        left = seconds - (time.perf_counter() - started)
        growth = level / previous if previous else 1.0
        if not next_level_fits(last_cost, left, growth):
            took = "none ran" if last_cost is None else f"the last level took {last_cost:.0f} s"
            run.trimmed.append(
                f"admission: {level} concurrent requests not tried ({took}; {left:.0f} s left)"
            )
            break
        began = time.perf_counter()
        requests = traffic_of.admission.requests[:level]
        # Every request is sent at once; none may outlive what is left of the probe's share.
        timeout = min(run.config.request_timeout_seconds, max(MIN_REQUEST_TIMEOUT_SECONDS, left))
        records = closed_loop(url, FUSEBOX_MODEL, requests, level, 1e9, timeout)
        last_cost, previous = time.perf_counter() - began, level
        refused = [record for record in records if record.error]
        statuses: dict[str, int] = {}
        for record in refused:
            status = (record.error or "").split(":")[0]
            statuses[status] = statuses.get(status, 0) + 1
        levels.append(
            {
                "concurrent": level,
                "served": len(records) - len(refused),
                "refused_or_failed": statuses,
                "first_refusal": refused[0].error if refused else None,
                "seconds": last_cost,
                "cuda_after": _stats_cuda(stats_file),
            }
        )
        run.progress(f"admission {level}: served {len(records) - len(refused)}, {statuses}")
        if statuses.get(TIMEOUT.rstrip(":")):
            run.trimmed.append(
                f"admission: at {level}, {statuses[TIMEOUT.rstrip(':')]} requests were cut at "
                f"{timeout:.0f} s (the probe's share), not refused: the level is inconclusive"
            )
        if refused:
            break
    served_all = [entry["concurrent"] for entry in levels if not entry["refused_or_failed"]]
    return {"levels": levels, "admitted_all_of": max(served_all, default=0)}


def _stats_cuda(stats_file: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads(stats_file.read_text()).get("cuda") or {})
    except (OSError, ValueError):
        return None


def fusebox_flags(config: RealisticConfig, max_concurrency: int) -> dict[str, Any]:
    """Fusebox's flags for the run: no queue (a request over the cap is refused, which the
    admission probe reads), prompts and answers as long as the workload's."""
    flags: dict[str, Any] = {
        "device": config.device,
        "dtype": config.dtype,
        "max-concurrency": max_concurrency,
        "max-queue": 0,
        "max-input-tokens": 4096,
        "max-new-tokens": 1024,
        "request-timeout": int(config.request_timeout_seconds),
    }
    if config.threads > 0:
        flags["torch-threads"] = config.threads
    return flags


def run_fusebox(run: Run, model_dir: Path, workdir: Path, traffic_of: Traffic) -> None:
    config = run.config
    port = loopback.free_port()
    cap = max(max(config.admission_levels), max(config.clients))
    if not config.device.startswith("cuda"):
        cap = max(config.clients)  # on the CPU the probe shows admission's own refusal
    try:
        process, url, log = launch(
            FUSEBOX,
            fusebox_command(model_dir, workdir, port, fusebox_flags(config, cap)),
            "/readyz",
            port,
            workdir,
            config.threads,
            min(config.start_timeout_seconds, run.share("fusebox")),
        )
    except RuntimeError as error:
        run.failed[FUSEBOX] = str(error)[-3000:]
        return
    try:
        part, saved = serve_rounds(
            run, FUSEBOX, url, FUSEBOX_MODEL, traffic_of, run.share("fusebox")
        )
        c1 = fusebox_c1(run, url, traffic_of)
        saved["c1"] = c1.pop("responses")
        part["c1"] = c1
        part["max_concurrency"] = cap
        run.result["fusebox"] = part
        run.responses["fusebox"] = saved
        run.write()
        if "admission" in run.result.get("phases", PHASES):
            probe = admission_probe(
                run, url, fusebox_stats_file(workdir, port), traffic_of, run.share("admission")
            )
            first = traffic_of.admission.requests[0]
            probe |= admission_limit(
                run.result["model"], first.prompt_tokens, config.admission_new_tokens
            )
            probe["max_concurrency"] = cap
            run.result["admission"] = probe
            run.write()
    finally:
        loopback.stop(process, grace_seconds=20)
        run.logs[FUSEBOX] = log_tail(log, 20000)


def run_peers(run: Run, model_dir: Path, workdir: Path, traffic_of: Traffic) -> None:
    config = run.config
    peers: dict[str, Any] = {}
    run.result["peers"] = peers
    run.responses["peers"] = {}
    phase = run.share("peers")
    started = time.perf_counter()
    names = list(config.peer_variants)
    for position, name in enumerate(names):
        left = phase - (time.perf_counter() - started)
        share = setting_seconds(left, len(names) - position, config.min_peer_seconds)
        flags = config.peer_variants[name]
        if share < 5.0:
            run.trimmed.append(f"peer {name}: not started, the peers' share was spent")
            continue
        port = loopback.free_port()
        began = time.perf_counter()
        try:
            process, url, log = launch(
                f"peer-{name}",
                transformers_serve_command(
                    model_dir,
                    port,
                    config.device,
                    config.dtype,
                    [*shlex.split(config.peer_common_flags), *shlex.split(flags)],
                ),
                "/health",
                port,
                workdir,
                config.threads,
                min(config.start_timeout_seconds, share),
            )
        except RuntimeError as error:
            run.failed[f"peer {name}"] = str(error)[-3000:]
            peers[name] = {"flags": flags, "failed": str(error)[-1500:]}
            continue
        start_seconds = time.perf_counter() - began
        try:
            part, saved = serve_rounds(
                run, f"peer {name}", url, str(model_dir), traffic_of, share - start_seconds
            )
        finally:
            loopback.stop(process, grace_seconds=20)
            run.logs[f"peer {name}"] = log_tail(log, 20000)
        peers[name] = {"flags": flags, "start_seconds": start_seconds} | part
        run.responses["peers"][name] = saved
        pair_with_fusebox(run, name)
        run.write()
    run.result["best_peer_by_clients"] = best_peers(peers, config.clients)


def pair_with_fusebox(run: Run, peer: str) -> None:
    """TTFT p99 over the requests both streamed, and greedy agreement, per closed round."""
    ours = run.records.get(FUSEBOX) or {}
    theirs = run.records.get(f"peer {peer}") or {}
    closed = (run.result.get("fusebox") or {}).get("closed") or {}
    for key, figures in closed.items():
        a, b = ours.get(f"closed:{key}"), theirs.get(f"closed:{key}")
        if a and b:
            figures.setdefault("ttft_p99_paired_with", {})[peer] = paired_ttft_p99(a, b)
            figures.setdefault("greedy_agreement_with", {})[peer] = agreement(run.tokenizer, a, b)


def run_child(run: Run, phase: str, spec: dict[str, Any], seconds: float) -> dict[str, Any]:
    """`phase` in a child process (its own CUDA context, freed when it ends), at most
    `seconds`; its part file, written as it goes, is read even when it was cut."""
    spec_file = run.work_dir / f"{phase}-spec.json"
    part_file = run.work_dir / f"{phase}-part.json"
    part_file.unlink(missing_ok=True)
    spec_file.write_text(json.dumps(spec))
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        phase,
        "--spec",
        str(spec_file),
        "--part",
        str(part_file),
    ]
    log = run.work_dir / f"{phase}.log"
    try:
        with log.open("wb") as sink:
            subprocess.run(
                command,
                stdout=sink,
                stderr=subprocess.STDOUT,
                timeout=max(1.0, seconds),
                check=True,
            )
    except subprocess.TimeoutExpired:
        run.trimmed.append(f"{phase}: cut at its share of {seconds:.0f} s")
    except subprocess.CalledProcessError as error:
        run.failed[phase] = f"exit {error.returncode}: {log_tail(log)}"
    run.logs[phase] = log_tail(log, 20000)
    try:
        part: dict[str, Any] = json.loads(part_file.read_text())
    except (OSError, ValueError):
        return {}
    return part


def child_spec(run: Run, model_dir: Path, traffic_of: Traffic) -> dict[str, Any]:
    return {
        "config": asdict(run.config),
        "model_dir": str(model_dir),
        "closed": {
            str(count): [request_to_json(r) for r in workload.requests]
            for count, workload in traffic_of.closed.items()
        },
        "c1": [request_to_json(r) for r in traffic_of.c1.requests],
        "warmup": [request_to_json(r) for r in traffic_of.warmup.requests],
    }


def run_all(
    config: RealisticConfig, budget: Budget, work_dir: Path, out: Path, phases: Sequence[str]
) -> Run:
    run = Run(config, budget, work_dir, out)
    run.result = {
        "config": asdict(config),
        "method": (
            "streamed /v1/chat/completions, temperature 0, stream_options.include_usage; "
            "every server alone on the device; closed loop at each client count, then "
            "Poisson arrivals at each rate (latency from each scheduled send)"
        ),
        "environment": environment_report(config.device),
        "budget_seconds": budget.total_seconds,
        "phase_weights": PHASE_WEIGHTS,
        "phases": list(phases),
        "targets": TARGETS,
        "skipped": dict(config.skipped),
        "complete": False,
    }
    run.progress("building the model")
    model = run_child(
        run,
        "build",
        {"config": asdict(config), "work_dir": str(work_dir)},
        budget.left() - SETTLE_RESERVE_SECONDS,
    )
    if not model:
        run.write()
        return run
    model_dir = Path(model["dir"])
    model |= build_estimate(model)
    run.result["model"] = model
    run.progress(
        f"model: {model['parameters']} parameters, init {model['init_seconds']:.1f} s, "
        f"save {model['save_seconds']:.1f} s"
    )
    from bench.realistic_bench import token_counter

    tokenizer, count_tokens = token_counter(model_dir)
    run.tokenizer = tokenizer
    traffic_of = make_traffic(config, count_tokens)
    run.result["workload"] = {
        "closed": {str(count): w.describe() for count, w in traffic_of.closed.items()},
        "open": {rate: w.describe() for rate, w in traffic_of.open.items()},
        "admission": traffic_of.admission.describe(),
    }
    run.write()
    with tempfile.TemporaryDirectory(prefix="fusebox-gpu-realistic-") as raw:
        workdir = Path(raw)
        try:
            if "fusebox" in phases:
                run_fusebox(run, model_dir, workdir, traffic_of)
            if "peers" in phases:
                run_peers(run, model_dir, workdir, traffic_of)
            spec = child_spec(run, model_dir, traffic_of)
            for phase in ("engine", "generate"):
                if phase in phases:
                    part = run_child(run, phase, spec, run.share(phase))
                    if phase == "generate" and "c1" in part:
                        run.responses["generate_c1"] = part["c1"].pop("responses", [])
                        part["c1"]["greedy_texts_equal_to_fusebox"] = texts_equal(
                            run.responses.get("fusebox", {}).get("c1") or [],
                            run.responses["generate_c1"],
                        )
                    run.result[phase] = part
                    run.write()
            run.result["complete"] = True
            run.result["plot"] = plot(run.result, out / "realistic.png")
        except Exception as error:  # noqa: BLE001  (recorded; what was measured is kept)
            run.failed["run"] = "".join(traceback.format_exception(error))[-3000:]
        finally:
            (out / "realistic-servers.log").write_text(
                "".join(f"===== {name}\n{log}\n" for name, log in run.logs.items())
            )
            run.write()
    return run


def plot(result: dict[str, Any], path: Path) -> str:
    """Tokens/s per client count (Fusebox, the best peer there, the engine in process) and
    time to first token p99 per open-loop rate (Fusebox, the headline's best peer)."""
    from bench.server_bench import NO_PLOT, pyplot, save_figure

    plt = pyplot()
    if plt is None:
        return NO_PLOT
    clients = [str(count) for count in result["config"]["clients"]]
    peers = result.get("peers") or {}
    best = result.get("best_peer_by_clients") or {}

    def closed_of(part: dict[str, Any] | None, key: str) -> float:
        return float(((part or {}).get("closed") or {}).get(key, {}).get("tokens_per_second", 0))

    series = {
        "Fusebox (HTTP)": [closed_of(result.get("fusebox"), key) for key in clients],
        "best transformers serve": [
            closed_of(peers.get(best.get(key) or ""), key) for key in clients
        ],
        "Fusebox engine in process": [closed_of(result.get("engine"), key) for key in clients],
    }
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / len(series)
    for offset, (name, values) in enumerate(series.items()):
        bars = left.bar(
            [i + offset * width for i in range(len(clients))], values, width, label=name
        )
        left.bar_label(bars, fmt="%.0f", fontsize=7)
    left.set_xticks([i + 0.4 - width / 2 for i in range(len(clients))], [f"c={c}" for c in clients])
    model = result.get("model") or {}
    left.set_title(f"{model.get('parameters', 0) / 1e9:.2f} B params, {model.get('dtype')}: tok/s")
    left.legend(fontsize=7)
    headline = best.get(clients[0]) if clients else None
    rates = [f"{rate:g}" for rate in result["config"]["open_rates"]]
    for name, part in (
        ("Fusebox", result.get("fusebox")),
        (f"peer {headline}", peers.get(headline or "")),
    ):
        opened = (part or {}).get("open") or {}
        ttft = [opened.get(rate, {}).get("ttft_seconds", {}).get("p99", math.nan) for rate in rates]
        right.plot(rates, ttft, marker="o", label=name)
    right.set_xlabel("open loop, requests/s")
    right.set_ylabel("TTFT p99 (s)")
    right.legend(fontsize=7)
    return save_figure(plt, figure, path)


def child_main(phase: str, spec_path: Path, part_path: Path) -> int:
    child_phase(phase, json.loads(spec_path.read_text()), part_path)
    return 0


def configure(arguments: argparse.Namespace) -> RealisticConfig:
    config = for_dry_run() if arguments.dry_run else for_gpu()
    if arguments.clients:
        config = replace(config, clients=tuple(arguments.clients))
    if arguments.peer_variant:
        variants = {}
        for spec in arguments.peer_variant:
            name, separator, flags = spec.partition("=")
            if not separator or not name.strip():
                raise SystemExit(f"--peer-variant wants NAME=FLAGS, got {spec!r}")
            variants[name.strip()] = flags
        config = replace(config, peer_variants=variants)
    return config


def default_budget_seconds() -> float:
    """GPU_REALISTIC_SECONDS, else what a 600 s device call leaves after installing the
    wheels and checking imports (about 60 s)."""
    return float(os.environ.get("GPU_REALISTIC_SECONDS", "540"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "gpu")
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "gpu-realistic",
        help="where the model directory is made (once)",
    )
    parser.add_argument("--budget-seconds", type=float, default=None)
    parser.add_argument("--clients", type=int, action="append", help="client counts (repeatable)")
    parser.add_argument(
        "--peer-variant",
        action="append",
        metavar="NAME=FLAGS",
        help="replaces the peer sweep (repeatable)",
    )
    parser.add_argument(
        "--phases",
        type=lambda text: [phase for phase in text.split(",") if phase],
        default=list(PHASES),
        help=f"comma-separated, of {','.join(PHASES)} (the model is always built)",
    )
    parser.add_argument("--dry-run", action="store_true", help="CPU proof: a narrow model")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--spec", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--part", type=Path, help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    if arguments.child:
        return child_main(arguments.child, arguments.spec, arguments.part)
    unknown = [phase for phase in arguments.phases if phase not in PHASES]
    if unknown:
        parser.error(f"unknown phases {unknown}; known: {list(PHASES)}")
    budget = Budget(arguments.budget_seconds or default_budget_seconds())
    config = configure(arguments)
    arguments.work_dir.mkdir(parents=True, exist_ok=True)
    run = run_all(config, budget, arguments.work_dir, arguments.out, arguments.phases)
    print(f"gpu realistic: {budget.elapsed():.0f} s, wrote {arguments.out}/realistic.json")
    for line in run.result.get("verdicts", []):
        print(
            f"  {line['target']}: {line['value']} (bound {line['bound']}) "
            f"{'pass' if line['pass'] else 'FAIL'}"
        )
    for note in run.trimmed:
        print(f"  trimmed: {note}")
    for name, reason in run.failed.items():
        print(f"  failed: {name}: {reason.splitlines()[-1] if reason else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
