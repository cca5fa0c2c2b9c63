"""Server cost and capacity, as ratios against baselines measured in the same run.

1. Latency at concurrency 1: p50/p99 of a 32-token chat completion over HTTP
   (Fusebox, non-streaming) vs in-process `model.generate` on the same small
   model and the same chat-templated prompt, measured in alternation (one of
   each in turn). Target: Fusebox p50 <= 1.05x in-process.
2. Throughput at concurrency 16 (tokens/s, chat endpoint, non-streaming,
   greedy): Fusebox vs `transformers serve --continuous-batching` (plus
   `--peer-flags`, its `--cb-*` settings) on the same model directory. Each
   server first gets a warm-up round at 16 clients (the first round after a
   start is up to 3x off); then rounds alternate A, B, A, B so that a change
   in load (other work on the machine) hits both alike. The figure is the
   median of the per-round-pair ratios; every round's load average is kept.
   Target >= 1.2x.
3. RSS growth of the server over N unique-prompt requests after warm-up
   (tiny model, 1 new token each, tokenizer cache 1,000 entries so the cache
   is full before measuring). Target < 1 MiB per 1,000 requests.

Both servers (and the in-process baseline) run with `--threads` intra-op
threads, 1 by default: on a 2-core machine shared with other work, two
OpenMP threads stall whenever the other core is taken, and rounds of either
server then swing 5x, which no ratio survives.

Writes bench/results/server.json and, when matplotlib is installed, a plot
next to it (server.png).

    .venv/bin/python bench/server_bench.py [--requests 20] [--rounds 5] [--per-client 4]
        [--threads N] [--peer-flags "--cb-block-size 32"] [--rss-requests 20000]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import loopback  # noqa: E402  (the repository root is on the path only now)

TARGETS = {
    "latency_c1_p50_ratio_at_most": 1.05,
    "throughput_c16_ratio_at_least": 1.2,
    "rss_growth_mib_per_1000_requests_below": 1.0,
}

NEW_TOKENS = 32
CONCURRENCY = 16
MIB = 1 << 20
PROMPTS = [
    "Please summarize the following paragraph in one sentence.",
    "Write a short poem about the sea at night.",
    "Explain how a hash table works to a new programmer.",
    "请用一句话总结下面这段话。",
    "How do I reset my password?",
    "Tell me a joke about computers.",
]


def summarize(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50": statistics.median(ordered),
        "p99": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "mean": statistics.fmean(ordered),
        "count": len(ordered),
    }


def rss_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def wait_http(url: str, process: subprocess.Popen[bytes], log: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url} exited:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} not ready:\n{log.read_text()[-3000:]}")


def stop(process: subprocess.Popen[bytes]) -> None:
    loopback.stop(process, grace_seconds=20)


def start_fusebox(
    model_dir: Path, workdir: Path, extra_env: dict[str, str] | None = None, **flags: Any
) -> tuple[Any, str, Path]:
    """The server on loopback with `flags` as its options (and `extra_env` in its
    environment); its process, URL and log, once it is ready."""
    port = loopback.free_port()
    args = {
        "model-dir": model_dir,
        "model-name": "bench",
        "host": "127.0.0.1",
        "port": port,
        "admin-port": loopback.free_port(),
        "stats-file": workdir / f"stats-{port}.json",
        "max-concurrency": CONCURRENCY,
        "max-queue": 256,
        "request-timeout": 3600,
        "log-level": "warning",
    }
    args.update({key.replace("_", "-"): value for key, value in flags.items()})
    command = [sys.executable, "-m", "fusebox_server"]
    for name, value in args.items():
        command += [f"--{name}", str(value)]
    log = workdir / f"fusebox-{port}.log"
    env = {**thread_environment(int(flags.get("torch_threads", 0))), **(extra_env or {})}
    with log.open("wb") as sink:  # the child keeps its own copy of the descriptor
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/readyz", process, log)
    return process, url, log


def thread_environment(threads: int) -> dict[str, str]:
    """The environment for a server process: offline, and `threads` intra-op threads if set."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if threads > 0:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def transformers_serve_command(
    model_dir: Path, port: int, device: str, dtype: str, flags: Sequence[str]
) -> list[str]:
    """`transformers serve --continuous-batching` on loopback at `port` with `flags`."""
    # The CLI's module rather than its console script: the same code, and it runs
    # where transformers comes from PYTHONPATH (the GPU machine's carried wheels).
    return [
        sys.executable,
        "-m",
        "transformers.cli.transformers",
        "serve",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--device",
        device,
        "--dtype",
        dtype,
        "--continuous-batching",
        *flags,
    ]


def start_transformers_serve(
    model_dir: Path,
    workdir: Path,
    peer_flags: list[str],
    threads: int,
    device: str = "cpu",
    dtype: str = "auto",
) -> tuple[Any, str, Path]:
    """The peer: `transformers serve --continuous-batching` with the given `--cb-*` flags."""
    port = loopback.free_port()
    log = workdir / f"transformers-serve-{port}.log"
    sink = log.open("wb")  # the child keeps its own copy of the descriptor
    process = subprocess.Popen(
        transformers_serve_command(model_dir, port, device, dtype, peer_flags),
        stdout=sink,
        stderr=subprocess.STDOUT,
        env=thread_environment(threads),
    )
    sink.close()
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/health", process, log)
    return process, url, log


def chat(client: httpx.Client, model: str, prompt: str, max_tokens: int) -> int:
    """One non-streaming, greedy chat completion; returns the tokens it generated."""
    response = client.post(
        "/v1/chat/completions",
        json={
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
        },
        timeout=600,
    )
    response.raise_for_status()
    usage = response.json().get("usage") or {}
    return int(usage.get("completion_tokens") or max_tokens)


def interleaved_latency(
    model_dir: Path, url: str, requests: int, threads: int, dtype: str = "float32"
) -> dict[str, list[float]]:
    """Alternate one in-process generate and one HTTP request, so load hits both alike."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if threads > 0:
        torch.set_num_threads(threads)  # the same intra-op threads as the servers get

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        str(model_dir), local_files_only=True, dtype=getattr(torch, dtype)
    ).eval()
    in_process: list[float] = []
    over_http: list[float] = []
    with httpx.Client(base_url=url) as client, torch.inference_mode():
        for index in range(requests + 1):
            prompt = PROMPTS[index % len(PROMPTS)]
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}],
                add_generation_prompt=True,
                return_tensors="pt",
                return_dict=True,
            )
            started = time.perf_counter()
            model.generate(**ids, max_new_tokens=NEW_TOKENS, do_sample=False)
            local = time.perf_counter() - started
            started = time.perf_counter()
            chat(client, "bench", prompt, NEW_TOKENS)
            remote = time.perf_counter() - started
            if index:  # the first pair is warm-up
                in_process.append(local)
                over_http.append(remote)
    del model
    gc.collect()
    return {"in_process": in_process, "http": over_http}


def client_prompt(slot: int, index: int) -> str:
    """The prompt client `slot` sends as its `index`-th request of a round (unique per round)."""
    return f"{PROMPTS[(slot + index) % len(PROMPTS)]} ({slot}-{index})"


def throughput_over_http(
    url: str,
    model: str,
    per_client: int,
    concurrency: int = CONCURRENCY,
    new_tokens: int = NEW_TOKENS,
) -> dict[str, Any]:
    """One round: `concurrency` clients, each sending `per_client` requests back to back."""
    tokens = [0] * concurrency
    errors: list[str] = []
    barrier = threading.Barrier(concurrency + 1)

    def client_loop(slot: int) -> None:
        with httpx.Client(base_url=url) as client:
            barrier.wait()
            for index in range(per_client):
                prompt = client_prompt(slot, index)
                try:
                    tokens[slot] += chat(client, model, prompt, new_tokens)
                except httpx.HTTPError as error:
                    errors.append(repr(error))

    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(concurrency)]
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
        "first_error": errors[0] if errors else None,
        "seconds": elapsed,
        "tokens_per_second": sum(tokens) / elapsed,
        "load_average_1m": os.getloadavg()[0],
    }


def interleaved_throughput(
    servers: dict[str, tuple[str, str]], per_client: int, rounds: int
) -> dict[str, Any]:
    """A warm-up round per server, then `rounds` rounds alternating between them.

    `servers` maps a name to (url, model name); the first is the numerator of
    each round pair's ratio, the second the denominator.
    """
    for url, model in servers.values():
        throughput_over_http(url, model, per_client)  # warm-up at the measured concurrency
    measured: dict[str, list[dict[str, Any]]] = {name: [] for name in servers}
    for _ in range(rounds):
        for name, (url, model) in servers.items():
            measured[name].append(throughput_over_http(url, model, per_client))
    first, second = list(servers)
    ratios = [
        a["tokens_per_second"] / b["tokens_per_second"]
        for a, b in zip(measured[first], measured[second], strict=True)
    ]
    return {
        name: {
            "median_tokens_per_second": statistics.median(r["tokens_per_second"] for r in runs),
            "errors": sum(r["errors"] for r in runs),
        }
        for name, runs in measured.items()
    } | {"rounds": measured, "round_ratios": ratios, "median_ratio": statistics.median(ratios)}


def rss_growth(model_dir: Path, workdir: Path, requests: int) -> dict[str, Any]:
    process, url, _ = start_fusebox(
        model_dir, workdir, tokenizer_cache_size=1000, max_concurrency=8, torch_threads=1
    )
    samples: list[tuple[int, int]] = []
    counter = [0]
    lock = threading.Lock()

    def drive(total: int, offset: int) -> None:
        def worker(slot: int) -> None:
            with httpx.Client(base_url=url) as client:
                for index in range(slot, total, 8):
                    chat(client, "bench", f"unique prompt {offset + index} for rss", 1)
                    with lock:
                        counter[0] += 1
                        if counter[0] % 500 == 0:
                            samples.append((counter[0], rss_of(process.pid)))

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    try:
        drive(2000, 10_000_000)  # warm-up: fills the tokenizer cache and allocator arenas
        counter[0] = 0
        samples.clear()
        before = rss_of(process.pid)
        samples.append((0, before))
        drive(requests, 0)
        after = rss_of(process.pid)
    finally:
        stop(process)
    growth = after - before
    return {
        "requests": requests,
        "rss_before_bytes": before,
        "rss_after_bytes": after,
        "growth_bytes": growth,
        "growth_mib_per_1000_requests": growth / MIB / (requests / 1000),
        "samples": samples,
    }


def run(
    requests: int,
    per_client: int,
    throughput_rounds: int,
    rss_requests: int,
    threads: int,
    peer_flags: list[str],
    out: Path,
    dtype: str = "float32",
) -> dict[str, Any]:
    from fusebox_server.model.tiny_model import ensure_model

    small = ensure_model("small")
    tiny = ensure_model("tiny")
    result: dict[str, Any] = {
        "model": str(small),
        "new_tokens": NEW_TOKENS,
        "concurrency": CONCURRENCY,
        "requests_per_client_per_round": per_client,
        "endpoint": "/v1/chat/completions (non-streaming, temperature 0)",
        "threads": threads or "torch default",
        "dtype": dtype,
        "peer": ["transformers", "serve", "--continuous-batching", *peer_flags],
        "machine": {"cpus": os.cpu_count(), "load_average_1m_at_start": os.getloadavg()[0]},
    }
    flags: dict[str, Any] = {"dtype": dtype}
    if threads > 0:
        flags["torch_threads"] = threads
    with tempfile.TemporaryDirectory(prefix="fusebox-bench-") as raw:
        workdir = Path(raw)
        fusebox, url, _ = start_fusebox(small, workdir, **flags)
        peer, peer_url, _ = start_transformers_serve(
            small, workdir, peer_flags, threads, dtype=dtype
        )
        try:
            pairs = interleaved_latency(small, url, requests, threads, dtype)
            throughput = interleaved_throughput(
                {"fusebox": (url, "bench"), "transformers_serve_cb": (peer_url, str(small))},
                per_client,
                throughput_rounds,
            )
        finally:
            stop(fusebox)
            stop(peer)
        in_process, over_http = summarize(pairs["in_process"]), summarize(pairs["http"])
        result["latency_c1_seconds"] = {
            "in_process_generate": in_process,
            "fusebox_http": over_http,
            "samples": pairs,
        }
        result["latency_c1_p50_ratio"] = over_http["p50"] / in_process["p50"]
        result["latency_c1_p99_ratio"] = over_http["p99"] / in_process["p99"]
        result["throughput_c16"] = throughput
        result["throughput_c16_ratio"] = throughput["median_ratio"]
        if rss_requests:
            result["rss_growth"] = rss_growth(tiny, workdir, rss_requests)
    result["load_average_1m_at_end"] = os.getloadavg()[0]
    result["targets"] = TARGETS
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    result["plot"] = plot(result, out.with_suffix(".png"))
    return result


NO_PLOT = "not drawn: matplotlib is not installed"


def pyplot() -> Any | None:
    """matplotlib's pyplot drawing to files (Agg); None where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def draw_latency_c1(axes: Any, samples: dict[str, list[float]], p50_ratio: str) -> None:
    """The c=1 latencies, in-process generate beside Fusebox over HTTP, as two boxes."""
    axes.boxplot([samples["in_process"], samples["http"]])
    axes.set_xticks([1, 2], ["in-process generate", "Fusebox HTTP"])
    axes.set_title(f"c=1 latency: p50 ratio {p50_ratio}")
    axes.set_ylabel("seconds")
    axes.set_ylim(bottom=0)


def save_figure(plt: Any, figure: Any, path: Path) -> str:
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return str(path)


def plot(result: dict[str, Any], path: Path) -> str:
    """Per-round throughput of both servers and the c=1 latencies; says why when it cannot."""
    plt = pyplot()
    if plt is None:
        return NO_PLOT
    rounds = result["throughput_c16"]["rounds"]
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for name, runs in rounds.items():
        left.plot(
            range(1, len(runs) + 1), [r["tokens_per_second"] for r in runs], marker="o", label=name
        )
    left.set_title(
        f"c={CONCURRENCY}, {NEW_TOKENS} tokens: median ratio {result['throughput_c16_ratio']:.2f}x"
    )
    left.set_xlabel("round (interleaved)")
    left.set_ylabel("tokens/s")
    left.set_ylim(bottom=0)
    left.legend()
    samples = result["latency_c1_seconds"]["samples"]
    draw_latency_c1(right, samples, f"{result['latency_c1_p50_ratio']:.2f}x")
    return save_figure(plt, figure, path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20, help="latency samples per side")
    parser.add_argument("--per-client", type=int, default=4, help="requests per client per round")
    parser.add_argument("--rounds", type=int, default=5, help="measured c=16 rounds per server")
    parser.add_argument("--rss-requests", type=int, default=20000, help="0 skips the RSS run")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="intra-op threads for both servers and in-process generate (0: torch's default)",
    )
    parser.add_argument(
        "--peer-flags", default="", help="extra `transformers serve` flags, e.g. --cb-block-size 32"
    )
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="weights' dtype for both servers and in-process generate (the model is saved fp32)",
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results/server.json"))
    arguments = parser.parse_args()
    result = run(
        arguments.requests,
        arguments.per_client,
        arguments.rounds,
        arguments.rss_requests,
        arguments.threads,
        shlex.split(arguments.peer_flags),
        arguments.out,
        arguments.dtype,
    )
    summary = {
        key: result.get(key)
        for key in ("latency_c1_p50_ratio", "latency_c1_p99_ratio", "throughput_c16_ratio")
    }
    if "rss_growth" in result:
        summary["rss_mib_per_1000"] = result["rss_growth"]["growth_mib_per_1000_requests"]
    print(f"server: {json.dumps(summary)}; wrote {arguments.out} ({result['plot']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
