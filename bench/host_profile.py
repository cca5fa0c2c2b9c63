"""Where the server's host time per streamed token goes (issue 34, item 5).

On the H200, at 64 clients, a captured decode step replays in 4.5 ms but the
server made one every 12.5 ms (docs/decisions/speed.md). The lever the issue
names, launching step t+1 before handling step t's tokens, pays only if that
host work runs while the GPU would otherwise idle, not if it holds the
interpreter the next step needs. This measures the host work itself: the
Fusebox server under N streaming clients (closed loop, every request
`max_tokens` long: the generated models never end early; tokens counted from
the usage chunks), run with the CPU
probe of the fleet bench (bench/fleet/cpu_probe: a sampler weighted by CPU
time, on the server's path only), and one window of CPU per streamed token,
split by what spent it:

- `worker_model`: the inference worker thread inside a decode step or a
  prefill (the forward, sampling, the graph replay and its wait);
- `worker_host`: the same thread outside them (detokenising, stop
  sequences, handing each piece to the event loop, admitting joiners);
- `loop`: the event loop thread (HTTP, SSE, the OpenAI bodies);
- `other`: every other thread (the stats writer).

    .venv/bin/python bench/host_profile.py [--out DIR] [--device cpu|cuda]
        [--clients 64] [--seconds 20] [--max-tokens 64]

(`make bench`'s entry `host-profile`, on the CPU; on the H200
`GPU_STEPS=hostprofile bash bench/gpu_run.sh device`, about a minute.)

On CUDA the model is gpu_bench's 1 B Llama in bfloat16 (its figures are the
4.5 and 12.5 ms above); on the CPU the tiny model, whose step is the model's
own time, so there the host figures count, not the split. Writes
DIR/host-profile.json and DIR/host-profile.md (DIR: bench/results/host-profile).
Figures, never assertions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.server_bench import start_fusebox, stop  # noqa: E402  (the root is on the path now)

PROBE = REPO / "bench" / "fleet" / "cpu_probe"
PARTS = ("worker_model", "worker_host", "loop", "other")
# A stack that passes through one of these is the model's time (engine.py, slot_batch.py).
MODEL_FRAMES = (
    "engine.py:step",
    "slot_batch.py:step",
    "engine.py:prefill",
    "engine.py:prefill_chunk",
    "engine.py:prefilled_groups",
)
WORKER_FRAME = "worker.py:run"
LOOP_FRAME = "base_events.py:run_forever"


def part_of(stack: Iterable[str]) -> str:
    """Which part a sampled stack (root first, `path:function` frames) is charged to."""
    frames = list(stack)
    if any(frame.endswith(WORKER_FRAME) for frame in frames):
        in_model = any(frame.endswith(name) for frame in frames for name in MODEL_FRAMES)
        return "worker_model" if in_model else "worker_host"
    if any(frame.endswith(LOOP_FRAME) for frame in frames):
        return "loop"
    return "other"


def read_folded(text: str) -> Counter[tuple[str, ...]]:
    """The probe's `.folded` lines (`frame;frame;... microseconds`) as stack -> microseconds."""
    stacks: Counter[tuple[str, ...]] = Counter()
    for line in text.splitlines():
        stack, _, micros = line.rpartition(" ")
        if stack:
            stacks[tuple(stack.split(";"))] += int(micros)
    return stacks


def split(stacks: Counter[tuple[str, ...]], tokens: int, top: int = 12) -> dict[str, Any]:
    """Microseconds of CPU per streamed token by part, with each part's costliest leaves."""
    totals: Counter[str] = Counter()
    leaves: dict[str, Counter[str]] = {part: Counter() for part in PARTS}
    callers: dict[str, Counter[str]] = {part: Counter() for part in PARTS}
    for stack, micros in stacks.items():
        part = part_of(stack)
        totals[part] += micros
        leaves[part][_short(stack[-1])] += micros
        callers[part][_short(_deepest_own_frame(stack))] += micros
    count = max(tokens, 1)
    per_token = {part: round(totals[part] / count, 1) for part in PARTS}
    return {
        "tokens": tokens,
        "cpu_seconds": {part: round(totals[part] / 1e6, 3) for part in PARTS},
        "cpu_us_per_token": per_token,
        "host_us_per_token": round(per_token["worker_host"] + per_token["loop"], 1),
        "top_leaves_us_per_token": _top(leaves, count, top),
        # The probe samples a thread other than the main one when it gives up the
        # interpreter (a socket write, a torch kernel), so those threads' leaves lean
        # towards such calls; their callers in Fusebox's own code are the reliable part.
        "top_fusebox_frames_us_per_token": _top(callers, count, top),
    }


def _top(by_part: dict[str, Counter[str]], tokens: int, top: int) -> dict[str, list[list[Any]]]:
    return {
        part: [[name, round(us / tokens, 2)] for name, us in by_part[part].most_common(top)]
        for part in PARTS
    }


def _deepest_own_frame(stack: tuple[str, ...]) -> str:
    """The innermost frame in Fusebox's server code (the leaf when there is none)."""
    return next((frame for frame in reversed(stack) if "fusebox_server/" in frame), stack[-1])


def _short(frame: str) -> str:
    """A frame without the checkout's path: `fusebox_server/model/worker.py:_append`."""
    at = frame.rfind("fusebox_server/")
    return frame[at:] if at >= 0 else frame


async def _client(url: str, stop_at: float, max_tokens: int, seen: Counter[str]) -> None:
    body = {
        "model": "bench",
        "messages": [{"role": "user", "content": "Tell me a story about a cat."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        while time.monotonic() < stop_at:
            async with http.stream("POST", "/v1/chat/completions", json=body) as response:
                async for line in response.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    chunk = json.loads(line[len("data: ") :])
                    if chunk["choices"]:
                        seen["chunks"] += 1
                    if chunk.get("usage"):
                        seen["tokens"] += chunk["usage"]["completion_tokens"]
                        seen["requests"] += 1


def drive(url: str, clients: int, seconds: float, max_tokens: int) -> Counter[str]:
    """`clients` streaming clients for `seconds`, each finishing its last request: the
    tokens generated (by the usage chunks), the chunks and the requests."""
    seen: Counter[str] = Counter()

    async def run() -> None:
        stop_at = time.monotonic() + seconds
        await asyncio.gather(*(_client(url, stop_at, max_tokens, seen) for _ in range(clients)))

    asyncio.run(run())
    return seen


def model_for(device: str, work_dir: Path) -> Path:
    if device.startswith("cuda"):
        from bench.gpu_bench import ensure_bench_model

        return ensure_bench_model(work_dir, "1b", "bfloat16", device)
    from fusebox_server.model.tiny_model import ensure_model

    return ensure_model("tiny")


def probe_window(pid: int, folder: Path, number: int, timeout: float = 30.0) -> str:
    """Ask the probe for the CPU since its last dump; the text of dump `number`."""
    os.kill(pid, signal.SIGUSR2)
    path = folder / f"{number}.json"
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the CPU probe wrote no {path.name} in {timeout:.0f} s")
        time.sleep(0.1)
    return (folder / f"{number}.folded").read_text()


def measure(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="fusebox-host-profile-") as raw:
        work = Path(raw)
        probe_out = work / "probe"
        probe_out.mkdir()
        model = model_for(args.device, args.work_dir or work)
        flags: dict[str, Any] = {"device": args.device, "max_concurrency": args.clients}
        if args.device == "cpu":
            flags.update(dtype="float32", torch_threads=1)
        else:
            flags["dtype"] = "bfloat16"
        extra_env = {
            "PYTHONPATH": os.pathsep.join([str(PROBE), os.environ.get("PYTHONPATH", "")]),
            "FUSEBOX_CPU_PROBE_DIR": str(probe_out),
        }
        process, url, _ = start_fusebox(model, work, extra_env=extra_env, **flags)
        try:
            drive(url, args.clients, args.warmup_seconds, args.max_tokens)  # graphs, caches
            probe_window(process.pid, probe_out, 1)
            started = time.monotonic()
            seen = drive(url, args.clients, args.seconds, args.max_tokens)
            wall = time.monotonic() - started
            folded = probe_window(process.pid, probe_out, 2)
        finally:
            stop(process)
    tokens = seen["tokens"]
    result = split(read_folded(folded), tokens)
    result.update(
        requests=seen["requests"],
        # A chunk carries every whole character decoded so far: a model whose tokens
        # are bytes of longer characters sends fewer chunks than tokens.
        chunks_per_token=round(seen["chunks"] / max(tokens, 1), 2),
        device=args.device,
        model=str(model.name),
        clients=args.clients,
        max_tokens=args.max_tokens,
        window_seconds=round(wall, 1),
        tokens_per_second=round(tokens / wall, 1),
        host={"cpus": os.cpu_count(), "load_average_1m_at_end": os.getloadavg()[0]},
    )
    return result


def report(result: dict[str, Any]) -> str:
    per = result["cpu_us_per_token"]
    lines = [
        f"# Host CPU per streamed token ({result['device']}, {result['model']})",
        "",
        f"{result['clients']} streaming clients, {result['max_tokens']} tokens a request, "
        f"{result['tokens']} tokens ({result['requests']} requests) in "
        f"{result['window_seconds']} s ({result['tokens_per_second']} tok/s), "
        f"{result['chunks_per_token']} SSE chunks per token.",
        "",
        "| part | CPU us per token |",
        "|---|---|",
        *(f"| {part} | {per[part]} |" for part in PARTS),
        f"| host (worker_host + loop) | {result['host_us_per_token']} |",
    ]
    for part in PARTS:
        lines += ["", f"## {part}: costliest Fusebox frames (us per token)", ""]
        lines += [f"- `{n}`: {us}" for n, us in result["top_fusebox_frames_us_per_token"][part]]
        lines += ["", f"## {part}: costliest leaves (us per token)", ""]
        lines += [f"- `{name}`: {us}" for name, us in result["top_leaves_us_per_token"][part]]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "host-profile")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup-seconds", type=float, default=5.0)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--work-dir", type=Path, help="where a CUDA bench model is kept")
    args = parser.parse_args()
    result = measure(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "host-profile.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "host-profile.md").write_text(report(result))
    print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
