"""Server cost and capacity, as ratios against baselines measured in the same run.

1. Latency at concurrency 1: p50/p99 of a 32-token completion over HTTP
   (Fusebox, non-streaming) vs in-process `model.generate` on the same small
   model, measured in alternation (one of each in turn). Target: Fusebox p50
   <= 1.05x in-process.
2. Throughput at concurrency 16 (tokens/s): Fusebox vs `transformers serve`
   (offline, default flags) on the same model directory, in alternating
   rounds. Target >= 2x.
3. RSS growth of the server over N unique-prompt requests after warm-up
   (tiny model, 1 new token each, tokenizer cache 1,000 entries so the cache
   is full before measuring). Target < 1 MiB per 1,000 requests.

    .venv/bin/python bench/server_bench.py [--requests 30] [--rounds 3] [--rss-requests 20000]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def start_fusebox(model_dir: Path, workdir: Path, **flags: Any) -> tuple[Any, str, Path]:
    port = free_port()
    args = {
        "model-dir": model_dir,
        "model-name": "bench",
        "host": "127.0.0.1",
        "port": port,
        "admin-port": free_port(),
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
    process = subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/readyz", process, log)
    return process, url, log


def start_transformers_serve(model_dir: Path, workdir: Path) -> tuple[Any, str, Path]:
    port = free_port()
    log = workdir / f"transformers-serve-{port}.log"
    executable = Path(sys.executable).with_name("transformers")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    process = subprocess.Popen(
        [
            str(executable),
            "serve",
            str(model_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--device",
            "cpu",
        ],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/health", process, log)
    return process, url, log


def completion(client: httpx.Client, model: str, prompt: str, max_tokens: int) -> int:
    response = client.post(
        "/v1/completions",
        json={"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0},
        timeout=600,
    )
    response.raise_for_status()
    usage = response.json().get("usage") or {}
    return int(usage.get("completion_tokens") or max_tokens)


def interleaved_latency(model_dir: Path, url: str, requests: int) -> dict[str, list[float]]:
    """Alternate one in-process generate and one HTTP request, so load hits both alike."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True).eval()
    in_process: list[float] = []
    over_http: list[float] = []
    with httpx.Client(base_url=url) as client, torch.inference_mode():
        for index in range(requests + 1):
            prompt = PROMPTS[index % len(PROMPTS)]
            ids = tokenizer(prompt, return_tensors="pt")
            started = time.perf_counter()
            model.generate(
                **ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False
            )
            local = time.perf_counter() - started
            started = time.perf_counter()
            completion(client, "bench", prompt, NEW_TOKENS)
            remote = time.perf_counter() - started
            if index:  # the first pair is warm-up
                in_process.append(local)
                over_http.append(remote)
    del model
    gc.collect()
    return {"in_process": in_process, "http": over_http}


def throughput_over_http(url: str, model: str, per_client: int) -> dict[str, Any]:
    tokens = [0] * CONCURRENCY
    errors: list[str] = []
    barrier = threading.Barrier(CONCURRENCY + 1)

    def client_loop(slot: int) -> None:
        with httpx.Client(base_url=url) as client:
            barrier.wait()
            for index in range(per_client):
                prompt = f"{PROMPTS[(slot + index) % len(PROMPTS)]} ({slot}-{index})"
                try:
                    tokens[slot] += completion(client, model, prompt, NEW_TOKENS)
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
        "first_error": errors[0] if errors else None,
        "seconds": elapsed,
        "tokens_per_second": sum(tokens) / elapsed,
    }


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
                    completion(client, "bench", f"unique prompt {offset + index} for rss", 1)
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
    requests: int, per_client: int, throughput_rounds: int, rss_requests: int, out: Path
) -> dict[str, Any]:
    from fusebox_server.tiny_model import ensure_model

    small = ensure_model("small")
    tiny = ensure_model("tiny")
    result: dict[str, Any] = {
        "model": str(small),
        "new_tokens": NEW_TOKENS,
        "machine": {"cpus": os.cpu_count(), "load_average_1m_at_start": os.getloadavg()[0]},
    }
    with tempfile.TemporaryDirectory(prefix="fusebox-bench-") as raw:
        workdir = Path(raw)
        fusebox, url, _ = start_fusebox(small, workdir)
        peer, peer_url, _ = start_transformers_serve(small, workdir)
        try:
            pairs = interleaved_latency(small, url, requests)
            in_process, over_http = summarize(pairs["in_process"]), summarize(pairs["http"])
            # Alternate rounds of the two servers so a change in load hits both alike.
            rounds: dict[str, list[dict[str, Any]]] = {"fusebox": [], "transformers_serve": []}
            for _ in range(throughput_rounds):
                rounds["fusebox"].append(throughput_over_http(url, "bench", per_client))
                rounds["transformers_serve"].append(
                    throughput_over_http(peer_url, str(small), per_client)
                )
        finally:
            stop(fusebox)
            stop(peer)
        result["latency_c1_seconds"] = {
            "in_process_generate": in_process,
            "fusebox_http": over_http,
        }
        result["latency_c1_p50_ratio"] = over_http["p50"] / in_process["p50"]
        result["latency_c1_p99_ratio"] = over_http["p99"] / in_process["p99"]
        totals = {
            name: {
                "tokens": sum(r["tokens"] for r in runs),
                "errors": sum(r["errors"] for r in runs),
                "seconds": sum(r["seconds"] for r in runs),
            }
            for name, runs in rounds.items()
        }
        for total in totals.values():
            total["tokens_per_second"] = total["tokens"] / total["seconds"]
        result["throughput_c16"] = {**totals, "rounds": rounds}
        result["throughput_c16_ratio"] = (
            totals["fusebox"]["tokens_per_second"]
            / totals["transformers_serve"]["tokens_per_second"]
        )
        if rss_requests:
            result["rss_growth"] = rss_growth(tiny, workdir, rss_requests)
    result["load_average_1m_at_end"] = os.getloadavg()[0]
    result["targets"] = {
        "latency_c1_p50_ratio_at_most": 1.05,
        "throughput_c16_ratio_at_least": 2.0,
        "rss_growth_mib_per_1000_requests_below": 1.0,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=30, help="latency samples per side")
    parser.add_argument("--per-client", type=int, default=1, help="c=16 requests per client")
    parser.add_argument("--rounds", type=int, default=3, help="alternating c=16 rounds per side")
    parser.add_argument("--rss-requests", type=int, default=20000, help="0 skips the RSS run")
    parser.add_argument("--out", type=Path, default=Path("bench/results/server.json"))
    arguments = parser.parse_args()
    result = run(
        arguments.requests,
        arguments.per_client,
        arguments.rounds,
        arguments.rss_requests,
        arguments.out,
    )
    summary = {
        key: result.get(key)
        for key in ("latency_c1_p50_ratio", "latency_c1_p99_ratio", "throughput_c16_ratio")
    }
    if "rss_growth" in result:
        summary["rss_mib_per_1000"] = result["rss_growth"]["growth_mib_per_1000_requests"]
    print(f"server: {json.dumps(summary)}; wrote {arguments.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
