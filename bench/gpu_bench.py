"""Generation speed on the GPU: Fusebox against its baselines and peers, in one run.

Issue 12's GPU half, prepared to run on the lent H200 in at most 8 minutes
(bench/gpu_run.sh is the exact device command). One run:

1. generates the ≈1 B-parameter Llama (random weights, the project's
   tokenizer and chat template, saved in bfloat16) into --work-dir, unless
   it is there already (`--model-size small` for a dry run);
2. starts, side by side on the same model directory: Fusebox (the real
   server process, `--device cuda --dtype bfloat16`), `transformers serve
   --continuous-batching` once per peer variant (plain, and with
   `--cb-use-cuda-graph`), and loads the model in this process for the two
   baselines: in-process `generate` at c=1 (latency) and static-batch
   `generate` (throughput: each client's prompts as one left-padded batch);
3. c=1 latency: pairs of one in-process `generate` and one Fusebox request,
   alternated, the first pair a warm-up;
4. at each concurrency (32 and 64 clients; 64 new tokens, greedy, chat
   endpoint, non-streaming): a warm-up round of every setting, then rounds
   in which every setting runs once, the order rotating from round to round
   so that no setting always runs first or after the same one;
5. writes gpu.json (every round, medians, the per-round-pair ratios of
   Fusebox against each other setting and their medians, the targets and
   pass/fail per target, what was trimmed or skipped and why) and gpu.png
   under --out.

The budget (--budget-seconds, 480 by default) bounds the run: latency pairs
and rounds stop when the time left cannot pay for one more (each
concurrency gets an equal share of what is left when it starts), and the
JSON says what was trimmed. A setting that fails to start or to answer is
recorded with its log tail and the run goes on without it.

`--dry-run` proves the script on a CPU: the `small` model in float32, 4
clients, 16 new tokens, fewer requests and rounds, one intra-op thread per
server, no CUDA-graph variant (recorded as skipped, with the reason).

    .venv/bin/python bench/gpu_bench.py --dry-run --out bench/results/gpu-dryrun
    python3 bench/gpu_bench.py --work-dir /tmp/gpu-bench --out "$OUT"    # on the H200
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import gpu_servers, loopback  # noqa: E402
from bench.gpu_budget import Budget  # noqa: E402
from bench.gpu_servers import (  # noqa: E402
    FUSEBOX_MODEL,
    fusebox_command,
    launch,
    log_tail,
)
from bench.server_bench import (  # noqa: E402  (the repository root is on the path only now)
    NO_PLOT,
    PROMPTS,
    chat,
    client_prompt,
    draw_latency_c1,
    pyplot,
    save_figure,
    stop,
    summarize,
    throughput_over_http,
    transformers_serve_command,
)
from fusebox_server.model.tiny_model import SIZES, ModelSize  # noqa: E402

FUSEBOX = "fusebox"
STATIC_BATCH = "static_batch_generate"
CB_PREFIX = "transformers_serve_cb"
TARGETS = {
    "vs_best_continuous_batching_at_least": 1.2,
    "vs_static_batch_generate_at_least": 0.6,
    "latency_c1_p50_ratio_at_most": 1.05,
}
START_TIMEOUT_SECONDS = 300.0  # a server that is not ready by then is recorded as failed
SETTLE_RESERVE_SECONDS = 20.0  # stopping the servers, writing the JSON and the plot
FILES = ("gpu.json", "gpu.png", "servers.log")


MODEL_SHAPES = {
    # 20 layers of 2048 wide (MHA, SwiGLU 5632): 1.03 B parameters with the
    # project's 2,048-token vocabulary, about 2 GB in bfloat16.
    "1b": ModelSize(
        hidden_size=2048, intermediate_size=5632, num_hidden_layers=20, num_attention_heads=16
    ),
    # tiny_model's `small` shape (26 M parameters): the dry run's model.
    "small": SIZES["small"],
}


@dataclass(frozen=True)
class Config:
    """Everything a run is parameterised by; `for_gpu` and `for_dry_run` are the two presets."""

    device: str
    dtype: str
    model_size: str
    concurrencies: tuple[int, ...]
    new_tokens: int
    per_client: int
    rounds: int
    latency_pairs: int
    threads: int  # intra-op CPU threads per server and here (0: torch's default)
    peer_variants: dict[str, list[str]]
    skipped_variants: dict[str, str] = field(default_factory=dict)
    peer_common_flags: list[str] = field(default_factory=list)


def for_gpu() -> Config:
    # Two peer servers share the card; each sizes its paged KV cache from the
    # memory *it* sees free, 0.9 of it by default, so the second would find
    # none. 0.2 of the card is still ~28 GB of cache each: ~170k tokens here.
    return Config(
        device="cuda",
        dtype="bfloat16",
        model_size="1b",
        concurrencies=(32, 64),
        new_tokens=64,
        per_client=2,
        rounds=4,
        latency_pairs=8,
        threads=0,
        peer_variants={
            f"{CB_PREFIX}": [],
            f"{CB_PREFIX}_cuda_graph": ["--cb-use-cuda-graph"],
        },
        peer_common_flags=["--dtype", "bfloat16", "--cb-max-memory-percent", "0.2"],
    )


def for_dry_run() -> Config:
    return Config(
        device="cpu",
        dtype="float32",
        model_size="small",
        concurrencies=(4,),
        new_tokens=16,
        per_client=2,
        rounds=3,
        latency_pairs=5,
        threads=1,
        peer_variants={f"{CB_PREFIX}": []},
        skipped_variants={
            f"{CB_PREFIX}_cuda_graph": "dry run on CPU: --cb-use-cuda-graph needs CUDA"
        },
        peer_common_flags=["--dtype", "float32"],
    )


# --- pure parts: the order of rounds, the budget, the ratios and the verdicts ---


def round_order(settings: Sequence[str], round_index: int) -> list[str]:
    """The settings of round `round_index`, rotated by one per round.

    Rotating (A B C, B C A, C A B, ...) puts every setting first and after
    every other one equally often, so a slow drift in the machine's state
    (clocks, other work) does not always favour the same setting.
    """
    if not settings:
        return []
    shift = round_index % len(settings)
    return [*settings[shift:], *settings[:shift]]


def phase_share(seconds_left: float, phases_left: int, reserve: float) -> float:
    """Seconds a phase may spend: an equal share of what is left after the reserve."""
    return max(0.0, seconds_left - reserve) / max(1, phases_left)


def fits(estimate: float, spent_in_phase: float, share: float) -> bool:
    """Whether one more step of `estimate` seconds stays inside the phase's share."""
    return spent_in_phase + estimate <= share


def next_round_fits(
    index: int, estimate: float, spent_in_phase: float, share: float, seconds_left: float
) -> bool:
    """Whether measured round `index` of a phase may run.

    The first needs only to fit in what is left of the whole budget (after the
    reserve): a warm-up that was slow once (CUDA-graph capture) must not leave a
    concurrency with no figure at all. Later rounds must fit the phase's share.
    """
    if index == 0:
        return estimate <= seconds_left - SETTLE_RESERVE_SECONDS
    return fits(estimate, spent_in_phase, share)


def paired_ratios(
    numerator: Sequence[float | None], denominator: Sequence[float | None]
) -> list[float]:
    """Per-round ratios of two settings' figures, for the rounds both completed."""
    return [
        a / b
        for a, b in zip(numerator, denominator, strict=False)
        if a is not None and b is not None and b > 0
    ]


def best_setting(medians: dict[str, float], prefix: str) -> str | None:
    """The setting named `prefix...` with the highest median (the peer at its best)."""
    candidates = {name: value for name, value in medians.items() if name.startswith(prefix)}
    return max(candidates, key=lambda name: candidates[name]) if candidates else None


def compare(per_setting: dict[str, list[float | None]]) -> dict[str, Any]:
    """Medians per setting and Fusebox's median per-round ratio against each other setting.

    `per_setting` maps a setting to its tokens/s per measured round (None
    where that round failed); rounds are paired by index.
    """
    medians = {
        name: statistics.median(done)
        for name, values in per_setting.items()
        if (done := [v for v in values if v is not None])
    }
    ratios: dict[str, dict[str, Any]] = {}
    for name, values in per_setting.items():
        if name == FUSEBOX or FUSEBOX not in per_setting:
            continue
        pairs = paired_ratios(per_setting[FUSEBOX], values)
        ratios[name] = {
            "round_ratios": pairs,
            "median_ratio": statistics.median(pairs) if pairs else None,
        }
    best = best_setting(medians, CB_PREFIX)
    return {
        "median_tokens_per_second": medians,
        "fusebox_ratio_vs": ratios,
        "best_continuous_batching": best,
        "vs_best_continuous_batching": ratios[best]["median_ratio"] if best in ratios else None,
        "vs_static_batch_generate": (ratios.get(STATIC_BATCH) or {}).get("median_ratio"),
    }


def verdicts(
    comparisons: dict[int, dict[str, Any]],
    latency_ratio: float | None,
    targets: dict[str, float] = TARGETS,
) -> list[dict[str, Any]]:
    """One line per target and concurrency: the measured value, the bound, pass/fail.

    A value that was not measured fails (a trimmed run does not meet a target).
    """

    def line(name: str, value: float | None, bound: float, at_least: bool) -> dict[str, Any]:
        passed = value is not None and (value >= bound if at_least else value <= bound)
        return {"target": name, "value": value, "bound": bound, "pass": passed}

    lines = []
    for concurrency, comparison in sorted(comparisons.items()):
        for key in ("vs_best_continuous_batching", "vs_static_batch_generate"):
            name = f"{key}_at_least"
            lines.append(
                line(f"c{concurrency}_{name}", comparison.get(key), targets[name], at_least=True)
            )
    name = "latency_c1_p50_ratio_at_most"
    lines.append(line(name, latency_ratio, targets[name], at_least=False))
    return lines


# --- the model ---


def ensure_bench_model(work_dir: Path, size: str, dtype: str, device: str) -> Path:
    """The generated Llama of `size`, saved in `dtype`, under work_dir; made once.

    The tokenizer, chat template and special-token ids are the project's
    (fusebox_server.model.tiny_model), taken from its tiny model; only the shape
    changes. As there, the special tokens' output rows are zeroed so greedy
    decoding never stops early. Weights are initialised on `device` (a 1 B
    model initialises in seconds on a GPU, minutes on a CPU).
    """
    import torch
    import transformers

    from fusebox_server.model.tiny_model import (
        SEED,
        ensure_model,
        generator_fingerprint,
        make_greedy_text,
    )

    target = work_dir / f"llama-{size}-{dtype}-{generator_fingerprint()}"
    marker = target / "bench-model.json"
    if marker.exists():
        return target
    template = ensure_model("tiny", cache_dir=work_dir / "cache")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(template), local_files_only=True)
    config = transformers.AutoConfig.from_pretrained(str(template), local_files_only=True)
    shape = MODEL_SHAPES[size]
    for name, value in asdict(shape).items():
        setattr(config, name, value)
    config.num_key_value_heads = shape.num_attention_heads
    # The template's config names its own head_dim (32): without this the 1 B shape's
    # attention was 512 wide, 0.78 B parameters (the H200 run of 2026-12-04).
    config.head_dim = shape.hidden_size // shape.num_attention_heads
    torch.manual_seed(SEED)
    with torch.device(device):
        model = transformers.LlamaForCausalLM(config)
    make_greedy_text(model, tokenizer)
    model = model.to(getattr(torch, dtype))
    model.config.dtype = dtype
    parameters = sum(p.numel() for p in model.parameters())
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=work_dir))
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    (staging / "bench-model.json").write_text(
        json.dumps({"size": size, "dtype": dtype, "parameters": parameters, **asdict(shape)})
    )
    del model
    gc.collect()
    if target.exists():
        import shutil

        shutil.rmtree(target)
    os.replace(staging, target)
    return target


# --- the measurements ---


class InProcess:
    """The model loaded here: in-process `generate` at c=1 and static-batch `generate`."""

    def __init__(self, model_dir: Path, config: Config) -> None:
        import torch
        import transformers

        if config.threads > 0:
            torch.set_num_threads(config.threads)
        self.torch = torch
        self.device = config.device
        self.new_tokens = config.new_tokens
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(
            str(model_dir), local_files_only=True
        )
        self.tokenizer.padding_side = "left"
        loaded: Any = transformers.AutoModelForCausalLM.from_pretrained(
            str(model_dir), local_files_only=True, dtype=getattr(torch, config.dtype)
        )
        self.model = loaded.to(config.device).eval()
        eos = self.model.generation_config.eos_token_id
        self.stop_ids = set(eos if isinstance(eos, list) else [eos])

    def _encode(self, prompts: list[str]) -> Any:
        texts = [
            self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
            )
            for prompt in prompts
        ]
        return self.tokenizer(texts, return_tensors="pt", padding=True).to(self.device)

    def _sync(self) -> None:
        if self.device.startswith("cuda"):
            self.torch.cuda.synchronize()

    def generate(self, prompts: list[str]) -> int:
        """Greedy `generate` of one batch; returns the tokens generated before each row's stop."""
        batch = self._encode(prompts)
        with self.torch.inference_mode():
            output = self.model.generate(**batch, max_new_tokens=self.new_tokens, do_sample=False)
        self._sync()
        generated = output[:, batch["input_ids"].shape[1] :].tolist()
        tokens = 0
        for row in generated:
            for token in row:
                if token in self.stop_ids:
                    break
                tokens += 1
        return tokens

    def static_batch_round(self, concurrency: int, per_client: int) -> dict[str, Any]:
        """The throughput baseline: the same prompts the clients send, `concurrency` at a time."""
        started = time.perf_counter()
        tokens = sum(
            self.generate([client_prompt(slot, index) for slot in range(concurrency)])
            for index in range(per_client)
        )
        elapsed = time.perf_counter() - started
        return {
            "tokens": tokens,
            "errors": 0,
            "seconds": elapsed,
            "tokens_per_second": tokens / elapsed,
            "load_average_1m": os.getloadavg()[0],
        }

    def close(self) -> None:
        del self.model
        gc.collect()
        if self.device.startswith("cuda"):
            self.torch.cuda.empty_cache()


@dataclass
class Setting:
    name: str
    run_round: Callable[[int], dict[str, Any]]  # concurrency -> one round's figures


def http_setting(name: str, url: str, model: str, config: Config) -> Setting:
    return Setting(
        name,
        lambda concurrency: throughput_over_http(
            url, model, config.per_client, concurrency, config.new_tokens
        ),
    )


class Run:
    """One benchmark run: servers, in-process model, the phases, and what was trimmed."""

    def __init__(self, config: Config, budget: Budget, model_dir: Path, workdir: Path) -> None:
        self.config = config
        self.budget = budget
        self.model_dir = model_dir
        self.workdir = workdir
        self.processes: list[Any] = []
        self.logs: dict[str, Path] = {}
        self.settings: list[Setting] = []
        self.failed: dict[str, str] = {}
        self.trimmed: list[str] = []
        self.in_process: InProcess | None = None
        self.fusebox_url = ""

    def start(self) -> None:
        """Start every server at once (each loads the model; starting in turn costs minutes)."""
        config = self.config
        starters: dict[str, Callable[[], tuple[Any, str, Path]]] = {FUSEBOX: self._start_fusebox}
        for name, variant_flags in config.peer_variants.items():
            starters[name] = partial(
                self._start_peer, name, [*config.peer_common_flags, *variant_flags]
            )
        with ThreadPoolExecutor(len(starters)) as pool:
            futures = {name: pool.submit(starter) for name, starter in starters.items()}
            try:
                self.in_process = InProcess(self.model_dir, config)
            except Exception as error:  # noqa: BLE001  (recorded; the servers still run)
                self.failed[STATIC_BATCH] = "".join(traceback.format_exception(error))[-3000:]
            for name, future in futures.items():
                try:
                    process, url, log = future.result()
                except RuntimeError as error:
                    self.failed[name] = str(error)[-3000:]
                    continue
                self.processes.append(process)
                self.logs[name] = log
                if name == FUSEBOX:
                    self.fusebox_url = url
                model = FUSEBOX_MODEL if name == FUSEBOX else str(self.model_dir)
                self.settings.append(http_setting(name, url, model, config))
        in_process = self.in_process
        if in_process is not None:
            self.settings.append(
                Setting(
                    STATIC_BATCH,
                    partial(in_process.static_batch_round, per_client=config.per_client),
                )
            )

    def _start_fusebox(self) -> tuple[Any, str, Path]:
        config = self.config
        flags: dict[str, Any] = {
            "device": config.device,
            "dtype": config.dtype,
            "max-concurrency": max(config.concurrencies),
            "max-queue": 256,
            "request-timeout": 3600,
        }
        if config.threads > 0:
            flags["torch-threads"] = config.threads
        port = loopback.free_port()
        command = fusebox_command(self.model_dir, self.workdir, port, flags)
        return launch(
            FUSEBOX, command, "/readyz", port, self.workdir, config.threads, START_TIMEOUT_SECONDS
        )

    def _start_peer(self, name: str, flags: list[str]) -> tuple[Any, str, Path]:
        """`transformers serve` in the dtype its loader picks from the model (the saved one)."""
        port = loopback.free_port()
        command = transformers_serve_command(
            self.model_dir, port, self.config.device, "auto", flags
        )
        return launch(
            name, command, "/health", port, self.workdir, self.config.threads, START_TIMEOUT_SECONDS
        )

    def latency(self) -> dict[str, Any]:
        """c=1: in-process generate and one Fusebox request, alternated; the first pair warms up."""
        import httpx

        if not self.fusebox_url or self.in_process is None:
            return {"skipped": "Fusebox or the in-process model did not start (see failed)"}
        share = phase_share(
            self.budget.left(), 1 + len(self.config.concurrencies), SETTLE_RESERVE_SECONDS
        )
        in_process: list[float] = []
        over_http: list[float] = []
        spent = 0.0
        pair_cost = 0.0
        with httpx.Client(base_url=self.fusebox_url) as client:
            for index in range(self.config.latency_pairs + 1):
                if index > 1 and not fits(pair_cost, spent, share):
                    self.trimmed.append(
                        f"latency: {index - 1} of {self.config.latency_pairs} pairs "
                        f"(a pair takes {pair_cost:.1f} s; the phase's share was {share:.0f} s)"
                    )
                    break
                began = time.perf_counter()
                prompt = PROMPTS[index % len(PROMPTS)]
                started = time.perf_counter()
                self.in_process.generate([prompt])
                local = time.perf_counter() - started
                started = time.perf_counter()
                chat(client, FUSEBOX_MODEL, prompt, self.config.new_tokens)
                remote = time.perf_counter() - started
                pair_cost = time.perf_counter() - began
                spent += pair_cost
                if index:
                    in_process.append(local)
                    over_http.append(remote)
        if not in_process:
            return {"skipped": "no time for one measured pair"}
        local_summary, http_summary = summarize(in_process), summarize(over_http)
        return {
            "in_process_generate": local_summary,
            "fusebox_http": http_summary,
            "samples": {"in_process": in_process, "http": over_http},
            "p50_ratio": http_summary["p50"] / local_summary["p50"],
            "p99_ratio": http_summary["p99"] / local_summary["p99"],
        }

    def _measure(self, setting: Setting, concurrency: int) -> dict[str, Any] | None:
        try:
            figures = setting.run_round(concurrency)
        except Exception as error:  # noqa: BLE001  (a setting that breaks is recorded, the run goes on)
            self.failed.setdefault(
                f"{setting.name}@c{concurrency}", "".join(traceback.format_exception(error))[-2000:]
            )
            return None
        if figures.get("errors"):
            self.failed.setdefault(
                f"{setting.name}@c{concurrency}",
                f"{figures['errors']} failed requests, first: {figures.get('first_error')}",
            )
        return figures

    def throughput(self, concurrency: int, phases_left: int) -> dict[str, Any]:
        """A warm-up round per setting, then rotated rounds while the phase's share lasts."""
        share = phase_share(self.budget.left(), phases_left, SETTLE_RESERVE_SECONDS)
        names = [setting.name for setting in self.settings]
        by_name = {setting.name: setting for setting in self.settings}
        started = time.perf_counter()
        warmup = {name: self._measure(by_name[name], concurrency) for name in names}
        warmup_cost = time.perf_counter() - started
        rounds: dict[str, list[dict[str, Any] | None]] = {name: [] for name in names}
        orders: list[list[str]] = []
        round_cost = warmup_cost  # the first estimate: a warm-up round is a round
        for index in range(self.config.rounds):
            spent = time.perf_counter() - started
            if not next_round_fits(index, round_cost, spent, share, self.budget.left()):
                self.trimmed.append(
                    f"c={concurrency}: {index} of {self.config.rounds} rounds (a round takes "
                    f"{round_cost:.1f} s; the phase's share was {share:.0f} s)"
                )
                break
            began = time.perf_counter()
            order = round_order(names, index)
            orders.append(order)
            for name in order:
                rounds[name].append(self._measure(by_name[name], concurrency))
            round_cost = max(round_cost if index else 0.0, time.perf_counter() - began)
        per_setting = {
            name: [r["tokens_per_second"] if r else None for r in runs]
            for name, runs in rounds.items()
        }
        return {
            "clients": concurrency,
            "warmup": warmup,
            "round_orders": orders,
            "rounds": rounds,
            "tokens_per_second": per_setting,
            **compare(per_setting),
        }

    def stop(self) -> None:
        for process in self.processes:
            stop(process)
        if self.in_process is not None:
            self.in_process.close()


def environment_report(config: Config) -> dict[str, Any]:
    """gpu_servers' report, with the device's memory on CUDA."""
    report = gpu_servers.environment_report(config.device)
    if "gpu" in report:
        import torch

        report["gpu_memory_bytes"] = torch.cuda.get_device_properties(0).total_memory
    return report


def finish(result: dict[str, Any], budget: Budget, out: Path) -> None:
    """Verdicts from what is measured so far, and gpu.json written: after every phase, so a
    run cut short (the device's time limit, a hung server) still leaves its figures."""
    comparisons = {int(c): figures for c, figures in result.get("throughput", {}).items()}
    result["verdicts"] = verdicts(comparisons, result.get("latency_c1", {}).get("p50_ratio"))
    result["all_targets_met"] = all(line["pass"] for line in result["verdicts"])
    result["elapsed_seconds"] = budget.elapsed()
    (out / "gpu.json").write_text(json.dumps(result, indent=2) + "\n")


def progress(budget: Budget, message: str) -> None:
    print(f"[{budget.elapsed():5.0f} s] {message}", flush=True)


def run(config: Config, budget: Budget, work_dir: Path, out: Path) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "config": asdict(config),
        "endpoint": "/v1/chat/completions (non-streaming, temperature 0)",
        "environment": environment_report(config),
        "budget_seconds": budget.total_seconds,
        "targets": TARGETS,
        "peer_commands": {
            name: ["transformers", "serve", "--continuous-batching", *config.peer_common_flags, *f]
            for name, f in config.peer_variants.items()
        },
        "skipped": dict(config.skipped_variants),
        "complete": False,
    }
    began = time.perf_counter()
    model_dir = ensure_bench_model(work_dir, config.model_size, config.dtype, config.device)
    result["model"] = {
        "dir": str(model_dir),
        **json.loads((model_dir / "bench-model.json").read_text()),
        "ready_seconds": time.perf_counter() - began,
    }
    progress(budget, f"model ready: {result['model']}")
    with tempfile.TemporaryDirectory(prefix="fusebox-gpu-bench-") as raw:
        bench = Run(config, budget, model_dir, Path(raw))
        result["failed"], result["trimmed"] = bench.failed, bench.trimmed
        throughput: dict[str, Any] = {}
        try:
            began = time.perf_counter()
            bench.start()
            result["start_seconds"] = time.perf_counter() - began
            progress(
                budget, f"started {[s.name for s in bench.settings]}; failed {list(bench.failed)}"
            )
            result["latency_c1"] = bench.latency()
            progress(budget, f"latency c=1: p50 ratio {result['latency_c1'].get('p50_ratio')}")
            finish(result, budget, out)
            result["throughput"] = throughput
            for position, concurrency in enumerate(config.concurrencies):
                phases_left = len(config.concurrencies) - position
                if budget.left() < SETTLE_RESERVE_SECONDS:
                    bench.trimmed.append(f"c={concurrency}: not measured, the budget was spent")
                    continue
                throughput[str(concurrency)] = figures = bench.throughput(concurrency, phases_left)
                progress(
                    budget,
                    f"c={concurrency}: {figures['median_tokens_per_second']}, vs best CB "
                    f"{_x(figures['vs_best_continuous_batching'])}, vs static "
                    f"{_x(figures['vs_static_batch_generate'])}",
                )
                finish(result, budget, out)
            result["complete"] = True
        finally:
            bench.stop()
            (out / "servers.log").write_text(
                "".join(
                    f"===== {name}\n{log_tail(log, 20000)}\n" for name, log in bench.logs.items()
                )
            )
            finish(result, budget, out)
    result["plot"] = plot(result, out / "gpu.png")
    return result


def plot(result: dict[str, Any], path: Path) -> str:
    """Median tok/s per setting at each concurrency, and the c=1 latencies."""
    plt = pyplot()
    if plt is None:
        return NO_PLOT
    throughput = result.get("throughput", {})
    names = sorted({name for t in throughput.values() for name in t["median_tokens_per_second"]})
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / max(1, len(names))
    for offset, name in enumerate(names):
        xs = [index + offset * width for index in range(len(throughput))]
        ys = [t["median_tokens_per_second"].get(name, 0) for t in throughput.values()]
        bars = left.bar(xs, ys, width, label=name)
        for x, figures in zip(xs, throughput.values(), strict=True):
            done = [v for v in figures["tokens_per_second"].get(name, []) if v is not None]
            left.scatter([x] * len(done), done, s=9, color="black", zorder=3)
        left.bar_label(bars, fmt="%.0f", fontsize=7)
    left.set_xticks(
        [index + 0.4 - width / 2 for index in range(len(throughput))],
        [
            f"c={c}\nvs best CB {_x(t['vs_best_continuous_batching'])}, "
            f"vs static {_x(t['vs_static_batch_generate'])}"
            for c, t in throughput.items()
        ],
    )
    model = result["model"]
    left.set_title(
        f"{_count(model['parameters'])} params, {model['dtype']}, "
        f"{result['config']['new_tokens']} new tokens: median tok/s (dots: rounds)"
    )
    left.set_ylabel("tokens/s")
    if names:
        left.legend(fontsize=7)
    latency = result.get("latency_c1", {})
    if "samples" in latency:
        draw_latency_c1(right, latency["samples"], _x(latency["p50_ratio"]))
    return save_figure(plt, figure, path)


def _count(parameters: int) -> str:
    return f"{parameters / 1e9:.2f} B" if parameters >= 1e9 else f"{parameters / 1e6:.0f} M"


def _x(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}x"


def configure(arguments: argparse.Namespace) -> Config:
    config = for_dry_run() if arguments.dry_run else for_gpu()
    changes: dict[str, Any] = {}
    if arguments.model_size:
        changes["model_size"] = arguments.model_size
    if arguments.dtype:
        changes["dtype"] = arguments.dtype
    if arguments.rounds is not None:
        changes["rounds"] = arguments.rounds
    if arguments.concurrency:
        changes["concurrencies"] = tuple(arguments.concurrency)
    if arguments.peer_flags:
        changes["peer_common_flags"] = [
            *config.peer_common_flags,
            *shlex.split(arguments.peer_flags),
        ]
    if arguments.peer_variant:
        changes["peer_variants"] = {**config.peer_variants, **peer_variants(arguments.peer_variant)}
    return Config(**{**asdict(config), **changes})


def peer_variants(specs: Sequence[str]) -> dict[str, list[str]]:
    """`NAME=FLAGS` specs as peer variants, each named `transformers_serve_cb_NAME`."""
    variants: dict[str, list[str]] = {}
    for spec in specs:
        name, separator, flags = spec.partition("=")
        if not separator or not name.strip():
            raise ValueError(f"--peer-variant wants NAME=FLAGS, got {spec!r}")
        variants[f"{CB_PREFIX}_{name.strip()}"] = shlex.split(flags)
    return variants


def summary_lines(result: dict[str, Any]) -> Iterable[str]:
    for line in result["verdicts"]:
        verdict = "pass" if line["pass"] else "FAIL"
        yield f"  {line['target']}: {_x(line['value'])} (bound {line['bound']}) {verdict}"
    for name, reason in {**result["skipped"], **result["failed"]}.items():
        yield f"  {name}: {reason.splitlines()[-1] if reason else ''}"
    for note in result["trimmed"]:
        yield f"  trimmed: {note}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, default=REPO / "bench" / "results" / "gpu", help="gpu.json, gpu.png"
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "gpu-bench",
        help="where the generated model is kept (made once)",
    )
    parser.add_argument("--model-size", choices=sorted(MODEL_SHAPES), help="default: 1b")
    parser.add_argument(
        "--dtype", choices=("bfloat16", "float16", "float32"), help="saved and served in"
    )
    parser.add_argument(
        "--budget-seconds", type=float, default=480.0, help="rounds are trimmed to fit it"
    )
    parser.add_argument("--rounds", type=int, help="measured rounds per concurrency (at most)")
    parser.add_argument("--concurrency", type=int, action="append", help="clients (repeatable)")
    parser.add_argument(
        "--peer-flags", default="", help="more `transformers serve` flags for every variant"
    )
    parser.add_argument(
        "--peer-variant",
        action="append",
        metavar="NAME=FLAGS",
        help="one more peer server, e.g. graph_bt16k='--cb-use-cuda-graph "
        "--cb-max-batch-tokens 16384' (repeatable)",
    )
    parser.add_argument("--dry-run", action="store_true", help="CPU proof: small model, 4 clients")
    arguments = parser.parse_args()
    budget = Budget(arguments.budget_seconds)
    config = configure(arguments)
    arguments.work_dir.mkdir(parents=True, exist_ok=True)
    result = run(config, budget, arguments.work_dir, arguments.out)
    print(f"gpu bench: {result['elapsed_seconds']:.0f} s, wrote {arguments.out}/gpu.json")
    print(f"  plot: {result['plot']}")
    print("\n".join(summary_lines(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
