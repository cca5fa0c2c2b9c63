"""What GPU memory really does under the leak fault, and what each admin action frees.

The development machine has no GPU, so the sidecar's NVML path and the
server's CUDA figures are only unit-tested against a fake. This script is the
check on real hardware: on any CUDA machine, no Kubernetes needed, it

1. generates the `small` model (or uses --model-dir),
2. starts `python -m fusebox_server --device cuda` with `FUSEBOX_FAULTS=leak:N`
   and an admin token file, and `python -m fusebox_sidecar` next to it in the
   host PID namespace (so NVML's host PIDs match the server's pid),
3. sends requests so the leak grows CUDA memory, while a sampler scrapes the
   sidecar every second: fusebox_gpu_memory_used_bytes, CUDA allocated and
   reserved, NVML per-process memory, RSS,
4. calls gc, empty_cache, unload, load and swap (to the fallback) through the
   admin API and records what each freed, by the server's own before/after
   and as the sidecar saw it,
5. writes samples.csv, memory.png, actions.json and summary.md under --out,
6. (the `quantization` check) for each fallback quantization the device
   serves (int8, int4, fp8; asked of the server's own `--check-config`),
   starts a server with the primary in bfloat16, swaps primary -> fallback
   -> primary under a steady stream of chat requests, and records parameter
   bytes, CUDA allocated/reserved before and after each swap, the greedy
   output of a fixed prompt per variant (and whether it equals the
   primary's) and any answer other than 200/429/503 during the swaps:
   quantization.json and quantization.md.
7. (the `leak-kinds` check) starts one server with every leak kind armed
   (`leak_cycles`, `leak_allocator`, `leak_prompt_cache`, `leak_pinned` on
   CUDA, and the model-held `leak`), grows one kind at a time with a few
   requests, then runs gc, empty_cache and unload+load in ladder order and
   records which step first frees it, by the server's own before/after:
   CUDA reserved for torch's caching allocator, CUDA allocated for the
   model-held blocks, RSS for the host-side kinds (pinned memory is host
   RSS, not GPU memory). Each kind must be freed by its own step:
   leak_kinds.json and leak_kinds.md.

Without CUDA (or with `--dry-run`) it runs the same steps on CPU with the
tiny model (RSS instead of GPU memory, the int8 fallback only), to prove the
script end to end where there is no GPU. `--checks leak|quantization`
picks one. Exit 1 when a check failed. One run takes a few minutes;
--budget-seconds bounds it.

    .venv/bin/python bench/gpu_check.py --out bench/results/gpu
    .venv/bin/python bench/gpu_check.py --dry-run --out /tmp/gpu-check-dry
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from fusebox_contract.admin import (
    ActionRequest,
    ActionResult,
    AdminPath,
    AdminRequest,
    FaultsRequest,
    MemoryFigures,
    ServerState,
)
from fusebox_contract.names import ActionType, Fault, Variant

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import loopback  # noqa: E402  (the repository root is on the path only now)

MiB = 1 << 20
GiB = 1 << 30
COLUMNS = (
    "elapsed_seconds",
    "phase",
    "gpu_memory_used_bytes",
    "gpu_memory_total_bytes",
    "gpu_process_memory_used_bytes",
    "cuda_memory_allocated_bytes",
    "cuda_memory_reserved_bytes",
    "process_resident_memory_bytes",
    "server_stats_age_seconds",
)
ACTIONS = (
    (ActionType.GC, None),
    (ActionType.EMPTY_CACHE, None),
    (ActionType.UNLOAD, None),
    (ActionType.LOAD, Variant.PRIMARY),
)
LADDER_STEPS = ("gc", "empty_cache", "reload")
CURES = {  # leak kind -> the lowest ladder step that frees it (docs/server.md)
    "leak_cycles": "gc",
    "leak_allocator": "empty_cache",
    "leak_prompt_cache": "empty_cache",
    "leak_pinned": "empty_cache",
    "leak": "reload",
}
CUDA_ONLY_KINDS = frozenset({"leak_pinned"})
SWAP = (ActionType.SWAP, Variant.FALLBACK)


class CheckAborted(RuntimeError):
    """The run cannot go on (a process died, the budget ran out)."""


def _python() -> str:
    return sys.executable


def cuda_report() -> dict[str, Any]:
    """Ask torch, in a child process, whether CUDA works here (this script stays torch-free)."""
    probe = (
        "import json, torch\n"
        "ok = torch.cuda.is_available()\n"
        "print(json.dumps({'available': ok, 'torch': torch.__version__,"
        " 'cuda': torch.version.cuda, 'count': torch.cuda.device_count() if ok else 0,"
        " 'name': torch.cuda.get_device_name(0) if ok else None}))\n"
    )
    result = subprocess.run(
        [_python(), "-c", probe], capture_output=True, text=True, timeout=180, check=False
    )
    if result.returncode != 0:
        return {"available": False, "error": result.stderr.strip().splitlines()[-1:]}
    report: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return report


def _http_json(
    url: str,
    method: str = "GET",
    body: object | None = None,
    token: str | None = None,
    timeout: float = 30,
) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        with error:
            raw = error.read()
        try:
            return error.code, json.loads(raw)
        except ValueError:
            return error.code, raw.decode(errors="replace")


@dataclass
class Stack:
    """The server and the sidecar as child processes."""

    workdir: Path
    out: Path
    server: subprocess.Popen[bytes] | None = None
    sidecar: subprocess.Popen[bytes] | None = None
    api_url: str = ""
    admin_url: str = ""
    metrics_url: str = ""
    token: str = field(default_factory=lambda: secrets.token_hex(16))

    @property
    def stats_path(self) -> Path:
        return self.workdir / "run" / "stats.json"

    def start_server(
        self,
        model_dir: Path,
        device: str,
        leak_mib: int,
        extra_flags: tuple[str, ...] = ("--fallback-quantization", "int8"),
        faults: str | None = None,
    ) -> None:
        token_file = loopback.write_token_file(self.workdir / "admin-token", self.token)
        api_port, admin_port = loopback.free_port(), loopback.free_port()
        self.api_url = f"http://{loopback.HOST}:{api_port}"
        self.admin_url = f"http://{loopback.HOST}:{admin_port}"
        log_file = (self.out / "server.log").open("wb")
        self.server = subprocess.Popen(
            loopback.server_command(
                model_dir,
                api_port=api_port,
                admin_port=admin_port,
                token_file=token_file,
                stats_path=self.stats_path,
                device=device,
                extra_flags=("--memory-guard-ratio", "1.0", *extra_flags),
            ),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={
                **os.environ,
                "PYTHONUNBUFFERED": "1",
                **({"FUSEBOX_FAULTS": f"leak:{leak_mib}"} if leak_mib > 0 else {}),
                **({"FUSEBOX_FAULTS": faults} if faults else {}),
            },
        )

    def wait_until_ready(self, deadline: float) -> None:
        assert self.server is not None
        while time.monotonic() < deadline:
            if self.server.poll() is not None:
                raise CheckAborted(
                    f"the server exited with {self.server.returncode}; see {self.out}/server.log"
                )
            try:
                status, _ = _http_json(self.api_url + "/readyz", timeout=5)
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                status = 0
            if status == 200 and self.stats_path.exists():
                return
            time.sleep(0.5)
        raise CheckAborted(f"the server was not ready in time; see {self.out}/server.log")

    def start_sidecar(self, deadline: float) -> None:
        log_path = self.out / "sidecar.log"
        try:
            self.sidecar, port = loopback.start_sidecar(
                self.stats_path, log_path, timeout_seconds=deadline - time.monotonic()
            )
        except loopback.SidecarDidNotStart:
            raise CheckAborted(f"the sidecar did not start; see {log_path}") from None
        self.metrics_url = f"http://{loopback.HOST}:{port}/metrics"

    def stop(self) -> None:
        for process in (self.sidecar, self.server):
            if process is not None:
                loopback.stop(process, grace_seconds=15)


def scrape(metrics_url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def pick_gpu_label(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], hint: str) -> str:
    """The `gpu` label that is the server's device.

    NVML numbers devices ignoring CUDA_VISIBLE_DEVICES, so the server's CUDA
    index is only a hint: prefer the device NVML attributes the server's
    memory to, then the only device, then the hint.
    """
    labels = {
        dict(labels).get("gpu", "")
        for name, labels in samples
        if name == "fusebox_gpu_memory_used_bytes"
    }
    process = [
        dict(labels).get("gpu", "")
        for name, labels in samples
        if name == "fusebox_gpu_process_memory_used_bytes"
    ]
    if len(process) == 1:
        return process[0]
    if len(labels) == 1:
        return labels.pop()
    return hint


def _row(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], gpu: str) -> dict[str, Any]:
    def get(name: str, **labels: str) -> float | None:
        return samples.get((name, tuple(sorted(labels.items()))))

    return {
        "gpu_memory_used_bytes": get("fusebox_gpu_memory_used_bytes", gpu=gpu),
        "gpu_memory_total_bytes": get("fusebox_gpu_memory_total_bytes", gpu=gpu),
        "gpu_process_memory_used_bytes": get("fusebox_gpu_process_memory_used_bytes", gpu=gpu),
        "cuda_memory_allocated_bytes": get("fusebox_cuda_memory_allocated_bytes"),
        "cuda_memory_reserved_bytes": get("fusebox_cuda_memory_reserved_bytes"),
        "process_resident_memory_bytes": get("fusebox_process_resident_memory_bytes"),
        "server_stats_age_seconds": get("fusebox_server_stats_age_seconds"),
        "gpu_visible": get("fusebox_gpu_visible"),
    }


class Sampler(threading.Thread):
    """Scrapes the sidecar every interval, tagging rows with the current phase."""

    def __init__(self, metrics_url: str, gpu: str, interval_seconds: float) -> None:
        super().__init__(name="gpu-check-sampler", daemon=True)
        self.metrics_url = metrics_url
        self.gpu = gpu
        self.interval_seconds = interval_seconds
        self.phase = "baseline"
        self.rows: list[dict[str, Any]] = []
        self.errors = 0
        self.started_at = time.monotonic()
        self._stopping = threading.Event()

    def sample_now(self) -> dict[str, Any]:
        row = _row(scrape(self.metrics_url), self.gpu)
        row["elapsed_seconds"] = round(time.monotonic() - self.started_at, 3)
        row["phase"] = self.phase
        return row

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.rows.append(self.sample_now())
            except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
                self.errors += 1
            self._stopping.wait(self.interval_seconds)

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=10)


def _delta(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else before - after


def _admin(stack: Stack, request: AdminRequest, timeout: float = 30) -> tuple[int, Any]:
    """One admin call in the contract's wire form; the status and the decoded answer."""
    path = request.path
    return _http_json(
        stack.admin_url + path, path.method, request.encode(), stack.token, timeout=timeout
    )


def _action_id(action_type: ActionType) -> str:
    return f"gpu-check-{action_type}-{secrets.token_hex(4)}"


def _freed(before: MemoryFigures, after: MemoryFigures) -> dict[str, float | None]:
    """Each server memory figure, before minus after."""
    return {
        figure.name: _delta(getattr(before, figure.name), getattr(after, figure.name))
        for figure in fields(MemoryFigures)
    }


def run_actions(stack: Stack, sampler: Sampler, settle_seconds: float) -> list[dict[str, Any]]:
    records = []
    for action_type, variant in (*ACTIONS, SWAP):
        sampler.phase = action_type if variant is None else f"{action_type}:{variant}"
        seen_before = sampler.sample_now()
        started = time.monotonic()
        request = ActionRequest(_action_id(action_type), action_type, variant)
        status, answer = _admin(stack, request, timeout=300)
        result = ActionResult.parse(answer) if status == 200 else None
        elapsed = time.monotonic() - started
        time.sleep(settle_seconds)
        seen_after = sampler.sample_now()
        record: dict[str, Any] = {
            "action": action_type,
            "variant": variant,
            "http_status": status,
            "seconds": round(elapsed, 3),
            "server_reported": None if result is None else result.encode(),
            "error": answer if result is None else None,
            "sidecar_before": seen_before,
            "sidecar_after": seen_after,
            "freed_bytes": {
                key: _delta(seen_before[key], seen_after[key])
                for key in (
                    "gpu_memory_used_bytes",
                    "gpu_process_memory_used_bytes",
                    "cuda_memory_allocated_bytes",
                    "cuda_memory_reserved_bytes",
                    "process_resident_memory_bytes",
                )
            },
        }
        if result is not None:
            record["server_freed_bytes"] = _freed(result.memory_before, result.memory_after)
        records.append(record)
        print(f"gpu_check: {sampler.phase}: HTTP {status} in {elapsed:.1f} s", flush=True)
    return records


def drive_leak(stack: Stack, requests: int, deadline: float) -> int:
    sent = 0
    for index in range(requests):
        if time.monotonic() > deadline:
            break
        status, body = _http_json(
            stack.api_url + "/v1/completions",
            "POST",
            {"model": "chat", "prompt": f"leak number {index}", "max_tokens": 2},
            timeout=120,
        )
        if status != 200:
            raise CheckAborted(f"request {index} answered {status}: {body}")
        sent += 1
    return sent


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({key: "" if row.get(key) is None else row[key] for key in COLUMNS})


def plot(path: Path, rows: list[dict[str, Any]], actions: list[dict[str, Any]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (gpu_axis, host_axis) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    times = [row["elapsed_seconds"] for row in rows]
    for key, label in (
        ("gpu_memory_used_bytes", "NVML device used (sidecar)"),
        ("gpu_process_memory_used_bytes", "NVML server process (sidecar)"),
        ("cuda_memory_reserved_bytes", "CUDA reserved (server)"),
        ("cuda_memory_allocated_bytes", "CUDA allocated (server)"),
    ):
        values = [None if row[key] is None else row[key] / GiB for row in rows]
        if any(value is not None for value in values):
            gpu_axis.plot(
                times, [v if v is not None else float("nan") for v in values], label=label
            )
    gpu_axis.set_ylabel("GiB on the GPU")
    gpu_axis.set_title(title)
    host_axis.plot(
        times,
        [
            float("nan")
            if row["process_resident_memory_bytes"] is None
            else row["process_resident_memory_bytes"] / GiB
            for row in rows
        ],
        label="server RSS (sidecar, /proc)",
        color="tab:purple",
    )
    host_axis.set_ylabel("GiB host RSS")
    host_axis.set_xlabel("seconds since the sampler started")
    for action in actions:
        moment = action["sidecar_before"]["elapsed_seconds"]
        for axis in (gpu_axis, host_axis):
            axis.axvline(moment, color="grey", linestyle=":", linewidth=1)
        gpu_axis.annotate(
            action["action"] + (f":{action['variant']}" if action["variant"] else ""),
            (moment, 1.0),
            xycoords=("data", "axes fraction"),
            rotation=90,
            va="top",
            fontsize=8,
        )
    if not gpu_axis.get_legend_handles_labels()[1]:
        gpu_axis.text(
            0.5,
            0.5,
            "no GPU figures (no CUDA / NVML here)",
            ha="center",
            transform=gpu_axis.transAxes,
            color="grey",
        )
    for axis in (gpu_axis, host_axis):
        if axis.get_legend_handles_labels()[1]:
            axis.legend(loc="upper left", fontsize=8)
        axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _gib(value: float | None) -> str:
    return "n/a" if value is None else f"{value / GiB:+.3f}".lstrip("+")


def evaluate(
    rows: list[dict[str, Any]], actions: list[dict[str, Any]], leaked_bytes: int, dry_run: bool
) -> list[tuple[str, bool, str]]:
    """Checks as (what, passed, evidence)."""
    checks: list[tuple[str, bool, str]] = []
    leak_rows = [row for row in rows if row["phase"] in ("baseline", "leak")]
    first, last = leak_rows[0], leak_rows[-1]
    keys = (
        ("process_resident_memory_bytes",)
        if dry_run
        else ("cuda_memory_allocated_bytes", "gpu_memory_used_bytes")
    )
    for key in keys:
        grown = _delta(last[key], first[key])
        checks.append(
            (
                f"the leak shows in {key}",
                grown is not None and grown >= 0.8 * leaked_bytes,
                f"grew {_gib(grown)} GiB for {leaked_bytes / GiB:.3f} GiB leaked",
            )
        )
    unload = next(action for action in actions if action["action"] == "unload")
    key = "process_resident_memory_bytes" if dry_run else "cuda_memory_allocated_bytes"
    freed = unload["freed_bytes"].get(key)
    checks.append(
        (
            f"unload frees the leak ({key})",
            freed is not None and freed >= 0.5 * leaked_bytes,
            f"freed {_gib(freed)} GiB",
        )
    )
    if not dry_run:
        visible = any(row.get("gpu_visible") == 1 for row in rows)
        checks.append(("the sidecar sees the GPU through NVML", visible, f"gpu_visible={visible}"))
    for action in actions:
        checks.append(
            (
                f"admin action {action['action']} answers 200",
                action["http_status"] == 200,
                f"HTTP {action['http_status']}",
            )
        )
    return checks


def write_summary(
    path: Path,
    environment: dict[str, Any],
    rows: list[dict[str, Any]],
    actions: list[dict[str, Any]],
    checks: list[tuple[str, bool, str]],
) -> None:
    lines = [
        "# GPU check" + (" (dry run on CPU)" if environment["dry_run"] else ""),
        "",
        f"- when: {environment['when']}",
        f"- device: {environment['device']}; CUDA: {json.dumps(environment['cuda'])}",
        f"- model: {environment['model_dir']}",
        f"- leak: {environment['leak_mib']} MiB x {environment['requests_sent']} requests",
        f"- samples: {len(rows)} (every {environment['interval_seconds']} s), "
        f"scrape errors: {environment['scrape_errors']}, "
        f"run took {environment['seconds']:.0f} s",
        "",
        "## What each action freed (GiB; before minus after, negative = grew)",
        "",
        "| action | HTTP | s | CUDA allocated (server) | CUDA reserved (server) "
        "| NVML device used (sidecar) | NVML process (sidecar) | RSS (sidecar) | RSS (server) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for action in actions:
        server = action.get("server_freed_bytes") or {}
        seen = action["freed_bytes"]
        name = action["action"] + (f":{action['variant']}" if action["variant"] else "")
        lines.append(
            f"| {name} | {action['http_status']} | {action['seconds']} "
            f"| {_gib(server.get('cuda_allocated_bytes'))} "
            f"| {_gib(server.get('cuda_reserved_bytes'))} "
            f"| {_gib(seen['gpu_memory_used_bytes'])} "
            f"| {_gib(seen['gpu_process_memory_used_bytes'])} "
            f"| {_gib(seen['process_resident_memory_bytes'])} "
            f"| {_gib(server.get('rss_bytes'))} |"
        )
    lines += ["", "## Checks", ""]
    lines += [
        f"- {'PASS' if passed else 'FAIL'}: {what} ({evidence})"
        for what, passed, evidence in checks
    ]
    lines += [
        "",
        "Files: samples.csv (one row per second), memory.png, actions.json (the server's",
        "own before/after per action, with torch.cuda.memory_summary on swap), server.log,",
        "sidecar.log.",
        "",
    ]
    path.write_text("\n".join(lines))


# ----- the quantization check -----
FALLBACK_QUANTIZATIONS = ("int8", "int4", "fp8")
GREEDY_PROMPT = "The capital of France is"
GREEDY_TOKENS = 16
TRAFFIC_CLIENTS = 2
EXPECTED_REFUSALS = (429, 503)  # with Retry-After: what a swap may cost a client


def supported(model_dir: Path, device: str, quantization: str) -> tuple[bool, str]:
    """Ask the server's own `--check-config` whether this device serves the quantization."""
    result = subprocess.run(
        [
            _python(),
            "-m",
            "fusebox_server",
            "--check-config",
            "--model-dir",
            str(model_dir),
            "--device",
            device,
            "--fallback-quantization",
            quantization,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return result.returncode == 0, (result.stdout or result.stderr).strip()


class SteadyTraffic:
    """Chat requests back to back from a few clients; every answer's status is counted."""

    def __init__(self, api_url: str, clients: int = TRAFFIC_CLIENTS) -> None:
        self.api_url = api_url
        self.statuses: dict[int, int] = {}
        self.failures: list[dict[str, Any]] = []
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, args=(index,), daemon=True)
            for index in range(clients)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout=120)

    def _run(self, index: int) -> None:
        sent = 0
        while not self._stopping.is_set():
            body = {
                "model": "chat",
                "messages": [{"role": "user", "content": f"client {index} request {sent}"}],
                "max_tokens": 8,
            }
            try:
                status, answer = _http_json(
                    self.api_url + "/v1/chat/completions", "POST", body, timeout=120
                )
            except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
                status, answer = 0, repr(error)
            sent += 1
            with self._lock:
                self.statuses[status] = self.statuses.get(status, 0) + 1
                if status != 200 and status not in EXPECTED_REFUSALS:
                    self.failures.append({"status": status, "answer": str(answer)[:300]})
            if status in EXPECTED_REFUSALS:
                time.sleep(0.2)


def greedy_text(stack: Stack) -> str | None:
    for _ in range(20):
        status, body = _http_json(
            stack.api_url + "/v1/completions",
            "POST",
            {
                "model": "chat",
                "prompt": GREEDY_PROMPT,
                "max_tokens": GREEDY_TOKENS,
                "temperature": 0,
            },
            timeout=120,
        )
        if status == 200:
            return str(body["choices"][0]["text"])
        time.sleep(0.5)
    return None


def variant_figures(stack: Stack) -> dict[str, Any]:
    _, answer = _http_json(stack.admin_url + AdminPath.STATE, token=stack.token)
    state = ServerState.parse(answer)
    return {
        "variant": state.variant,
        "quantization": state.quantization,
        "dtype": state.dtype,
        "parameter_bytes": state.parameter_bytes,
        "greedy_text": greedy_text(stack),
    }


def swap(stack: Stack, variant: Variant) -> dict[str, Any]:
    request = ActionRequest(f"quant-{variant}-{secrets.token_hex(4)}", ActionType.SWAP, variant)
    started = time.monotonic()
    status, answer = _admin(stack, request, timeout=600)
    record: dict[str, Any] = {
        "http_status": status,
        "seconds": round(time.monotonic() - started, 3),
    }
    if status == 200:
        result = ActionResult.parse(answer)
        record["memory_before"] = result.memory_before.encode()
        record["memory_after"] = result.memory_after.encode()
    else:
        record["error"] = answer
    return record


def quantization_run(
    out: Path, model_dir: Path, device: str, dtype: str, quantization: str, deadline: float
) -> dict[str, Any]:
    """Primary -> fallback(quantization) -> primary under steady traffic, on one server."""
    ok, answer = supported(model_dir, device, quantization)
    if not ok:
        return {"quantization": quantization, "supported": False, "reason": answer}
    run_out = out / f"quantization-{quantization}"
    run_out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"gpu-check-{quantization}-") as scratch:
        stack = Stack(Path(scratch), run_out)
        traffic: SteadyTraffic | None = None
        try:
            stack.start_server(
                model_dir,
                device,
                0,
                ("--dtype", dtype, "--fallback-quantization", quantization),
            )
            stack.wait_until_ready(min(deadline, time.monotonic() + 300))
            primary = variant_figures(stack)
            traffic = SteadyTraffic(stack.api_url)
            traffic.start()
            time.sleep(1)
            to_fallback = swap(stack, Variant.FALLBACK)
            fallback = variant_figures(stack)
            back = swap(stack, Variant.PRIMARY)
            restored = variant_figures(stack)
            time.sleep(1)
        finally:
            if traffic is not None:
                traffic.stop()
            stack.stop()
    print(
        f"gpu_check: quantization {quantization}: swaps HTTP {to_fallback['http_status']}/"
        f"{back['http_status']}, traffic {traffic.statuses if traffic else {}}",
        flush=True,
    )
    return {
        "quantization": quantization,
        "supported": True,
        "check_config": answer,
        "primary": primary,
        "swap_to_fallback": to_fallback,
        "fallback": fallback,
        "swap_to_primary": back,
        "restored": restored,
        "fallback_output_equals_primary": fallback["greedy_text"] == primary["greedy_text"],
        "restored_output_equals_primary": restored["greedy_text"] == primary["greedy_text"],
        "traffic_statuses": traffic.statuses if traffic else {},
        "traffic_failures": traffic.failures if traffic else [],
    }


def evaluate_quantization(runs: list[dict[str, Any]]) -> list[tuple[str, bool, str]]:
    checks: list[tuple[str, bool, str]] = []
    for run in runs:
        name = run["quantization"]
        if not run["supported"]:
            continue
        primary_bytes = run["primary"]["parameter_bytes"] or 0
        fallback_bytes = run["fallback"]["parameter_bytes"] or 0
        checks += [
            (
                f"{name}: both swaps answer 200",
                run["swap_to_fallback"]["http_status"] == 200
                and run["swap_to_primary"]["http_status"] == 200,
                f"{run['swap_to_fallback']['http_status']}/{run['swap_to_primary']['http_status']}",
            ),
            (
                f"{name}: the fallback's parameters are smaller",
                0 < fallback_bytes < primary_bytes,
                f"{fallback_bytes / MiB:.1f} MiB vs {primary_bytes / MiB:.1f} MiB",
            ),
            (
                f"{name}: the primary comes back whole",
                run["restored"]["parameter_bytes"] == primary_bytes
                and run["restored_output_equals_primary"],
                f"{(run['restored']['parameter_bytes'] or 0) / MiB:.1f} MiB, same greedy output: "
                f"{run['restored_output_equals_primary']}",
            ),
            (
                f"{name}: no failure but 429/503 under traffic",
                not run["traffic_failures"],
                f"statuses {run['traffic_statuses']}",
            ),
        ]
    return checks


def write_quantization_summary(path: Path, runs: list[dict[str, Any]]) -> None:
    lines = [
        "# Quantized fallbacks under traffic",
        "",
        f"Greedy output of {GREEDY_PROMPT!r} ({GREEDY_TOKENS} tokens) per variant.",
        "",
        "| fallback | primary MiB | fallback MiB | CUDA alloc after swap (GiB) "
        "| same output | traffic statuses | other failures |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        if not run["supported"]:
            lines.append(f"| {run['quantization']} | refused: {run['reason']} | | | | | |")
            continue
        swapped = run["swap_to_fallback"]
        after = MemoryFigures.parse(swapped["memory_after"]) if "error" not in swapped else None
        lines.append(
            f"| {run['quantization']} "
            f"| {(run['primary']['parameter_bytes'] or 0) / MiB:.1f} "
            f"| {(run['fallback']['parameter_bytes'] or 0) / MiB:.1f} "
            f"| {_gib(after.cuda_allocated_bytes if after else None)} "
            f"| {run['fallback_output_equals_primary']} "
            f"| {run['traffic_statuses']} | {len(run['traffic_failures'])} |"
        )
    path.write_text("\n".join(lines) + "\n")


def run_quantization_check(
    out: Path, model_dir: Path, device: str, deadline: float
) -> list[tuple[str, bool, str]]:
    dtype = "bfloat16" if device == "cuda" else "auto"
    quantizations = FALLBACK_QUANTIZATIONS if device == "cuda" else ("int8",)
    runs = [quantization_run(out, model_dir, device, dtype, q, deadline) for q in quantizations]
    (out / "quantization.json").write_text(
        json.dumps({"device": device, "primary_dtype": dtype, "runs": runs}, indent=2) + "\n"
    )
    write_quantization_summary(out / "quantization.md", runs)
    return evaluate_quantization(runs)


def main() -> int:
    parser = argparse.ArgumentParser(
        description="Record GPU memory under the leak fault and what each admin action frees."
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results/gpu"))
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="CPU and the tiny model: exercise the whole script without a GPU",
    )
    parser.add_argument(
        "--model-dir",
        type=Path,
        default=None,
        help="default: the cache's small model (tiny with --dry-run), generated when missing",
    )
    parser.add_argument(
        "--checks",
        default="leak,quantization,leak-kinds",
        help="comma-separated: leak (the leak fault and what each action frees), "
        "quantization (primary -> each servable fallback -> primary under traffic), "
        "leak-kinds (each leak kind and the lowest ladder step that frees it)",
    )
    parser.add_argument("--leak-mib", type=int, default=64)
    parser.add_argument(
        "--requests",
        type=int,
        default=None,
        help="leaking requests to send (default 48 on GPU, 8 dry)",
    )
    parser.add_argument("--interval-seconds", type=float, default=1.0)
    parser.add_argument("--settle-seconds", type=float, default=3.0)
    parser.add_argument(
        "--budget-seconds",
        type=float,
        default=450.0,
        help="give up after this long (default 7.5 minutes)",
    )
    arguments = parser.parse_args()
    started = time.monotonic()
    deadline = started + arguments.budget_seconds

    if arguments.dry_run:
        cuda: dict[str, Any] = {"available": False, "skipped": "dry run"}
        device, size = "cpu", "tiny"
    else:
        cuda = cuda_report()
        if cuda.get("available"):
            device, size = "cuda", "small"
        else:
            print(
                f"gpu_check: CUDA is not available here ({json.dumps(cuda)}): a dry run on CPU "
                "with the tiny model (RSS instead of GPU memory, int8 only).",
                flush=True,
            )
            arguments.dry_run = True
            device, size = "cpu", "tiny"
    checks_asked = {name.strip() for name in arguments.checks.split(",") if name.strip()}
    unknown = checks_asked - {"leak", "quantization", "leak-kinds"}
    if unknown:
        parser.error(f"unknown checks: {', '.join(sorted(unknown))}")

    out: Path = arguments.out
    out.mkdir(parents=True, exist_ok=True)
    model_dir = loopback.generated_model(size, arguments.model_dir)
    checks: list[tuple[str, bool, str]] = []
    if "leak" in checks_asked:
        leak_checks = run_leak_check(arguments, out, model_dir, device, cuda, started, deadline)
        if leak_checks is None:
            return 1
        checks += leak_checks
    if "quantization" in checks_asked:
        try:
            checks += run_quantization_check(out, model_dir, device, deadline)
        except CheckAborted as error:
            print(f"gpu_check: {error}", file=sys.stderr)
            return 1
    if "leak-kinds" in checks_asked:
        try:
            checks += run_leak_kinds_check(out, model_dir, device, arguments.leak_mib, deadline)
        except CheckAborted as error:
            print(f"gpu_check: {error}", file=sys.stderr)
            return 1
    failed = [what for what, passed, _ in checks if not passed]
    print(
        f"gpu_check: wrote {out}; {len(checks) - len(failed)}/{len(checks)} checks passed",
        flush=True,
    )
    for what in failed:
        print(f"gpu_check: FAILED: {what}", file=sys.stderr)
    return 1 if failed else 0


def run_leak_check(
    arguments: argparse.Namespace,
    out: Path,
    model_dir: Path,
    device: str,
    cuda: dict[str, Any],
    started: float,
    deadline: float,
) -> list[tuple[str, bool, str]] | None:
    """The leak fault and the admin actions; None when the run could not finish."""
    requests = arguments.requests or (8 if arguments.dry_run else 48)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        stack = Stack(Path(scratch), out)
        sampler: Sampler | None = None
        try:
            stack.start_server(model_dir, device, arguments.leak_mib)
            stack.wait_until_ready(min(deadline, time.monotonic() + 240))
            stack.start_sidecar(deadline)
            stats = json.loads(stack.stats_path.read_text())
            gpu = pick_gpu_label(scrape(stack.metrics_url), str(stats.get("gpu_device_id") or 0))
            sampler = Sampler(stack.metrics_url, gpu, arguments.interval_seconds)
            sampler.start()
            time.sleep(3 * arguments.interval_seconds)
            sampler.phase = "leak"
            sent = drive_leak(stack, requests, deadline - 120)
            time.sleep(3 * arguments.interval_seconds)
            actions = run_actions(stack, sampler, arguments.settle_seconds)
            sampler.phase = "end"
            time.sleep(2 * arguments.interval_seconds)
        except CheckAborted as error:
            print(f"gpu_check: {error}", file=sys.stderr)
            return None
        finally:
            if sampler is not None:
                sampler.stop()
            stack.stop()

    rows = sampler.rows
    checks = evaluate(rows, actions, sent * arguments.leak_mib * MiB, arguments.dry_run)
    environment = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "dry_run": arguments.dry_run,
        "device": device,
        "cuda": cuda,
        "model_dir": str(model_dir),
        "leak_mib": arguments.leak_mib,
        "requests_sent": sent,
        "interval_seconds": arguments.interval_seconds,
        "scrape_errors": sampler.errors,
        "seconds": time.monotonic() - started,
    }
    write_csv(out / "samples.csv", rows)
    (out / "actions.json").write_text(
        json.dumps({"environment": environment, "actions": actions}, indent=2) + "\n"
    )
    plot(
        out / "memory.png",
        rows,
        actions,
        f"leak {arguments.leak_mib} MiB x {sent} on {device}, then admin actions",
    )
    write_summary(out / "summary.md", environment, rows, actions, checks)
    return checks


def _kind_figure(kind: str, device: str) -> str:
    """The server-reported memory figure a kind grows."""
    if device == "cuda" and kind == "leak_allocator":
        return "cuda_reserved_bytes"
    if device == "cuda" and kind == "leak":
        return "cuda_allocated_bytes"
    return "rss_bytes"


def _ladder_step(stack: Stack, step: str) -> ActionResult:
    """One ladder step through the admin API; a reload is unload then load, as the operator's."""

    def post(action_type: ActionType, variant: Variant | None = None) -> ActionResult:
        request = ActionRequest(_action_id(action_type), action_type, variant)
        status, answer = _admin(stack, request, timeout=300)
        if status != 200:
            raise CheckAborted(f"{action_type} answered {status}: {answer}")
        return ActionResult.parse(answer)

    if step != "reload":
        return post(ActionType(step))
    unload = post(ActionType.UNLOAD)
    load = post(ActionType.LOAD, Variant.PRIMARY)
    return replace(load, memory_before=unload.memory_before, leaks_before=unload.leaks_before)


def _by_kind(figures: Mapping[Fault, int | None] | None) -> dict[str, int | None] | None:
    return None if figures is None else {kind.value: held for kind, held in figures.items()}


def leak_kind_run(
    stack: Stack, kind: str, device: str, leak_mib: int, requests: int
) -> dict[str, Any]:
    """Grow one kind, then climb the ladder until a step frees most of what it grew."""
    figure = _kind_figure(kind, device)
    _ladder_step(stack, "empty_cache")  # start from emptied caches
    status, body = _admin(stack, FaultsRequest({Fault(kind): leak_mib}))
    if status != 200:
        raise CheckAborted(f"arming {kind} answered {status}: {body}")
    try:
        drive_leak(stack, requests, time.monotonic() + 300)
    finally:
        _admin(stack, FaultsRequest({Fault(kind): 0}))
    leaked = leak_mib * requests * MiB
    steps = []
    cured_by = None
    for step in LADDER_STEPS:
        result = _ladder_step(stack, step)
        freed = _freed(result.memory_before, result.memory_after)[figure]
        steps.append(
            {
                "step": step,
                "figure": figure,
                "freed_bytes": freed,
                "leaks_before": _by_kind(result.leaks_before),
                "leaks_after": _by_kind(result.leaks_after),
                "seconds": result.duration_seconds,
            }
        )
        if freed is not None and freed >= 0.7 * leaked:
            cured_by = step
            break
    return {
        "kind": kind,
        "leaked_bytes": leaked,
        "expected": CURES[kind],
        "cured_by": cured_by,
        "steps": steps,
    }


def run_leak_kinds_check(
    out: Path, model_dir: Path, device: str, leak_mib: int, deadline: float
) -> list[tuple[str, bool, str]]:
    kinds = [k for k in CURES if device == "cuda" or k not in CUDA_ONLY_KINDS]
    requests = 4
    with tempfile.TemporaryDirectory(prefix="gpu-check-kinds-") as scratch:
        stack = Stack(Path(scratch), out)
        try:
            stack.start_server(model_dir, device, 0, faults=",".join(f"{kind}:0" for kind in kinds))
            stack.wait_until_ready(min(deadline, time.monotonic() + 240))
            runs = [leak_kind_run(stack, kind, device, leak_mib, requests) for kind in kinds]
        finally:
            stack.stop()
    skipped = sorted(set(CURES) - set(kinds))
    (out / "leak_kinds.json").write_text(
        json.dumps({"device": device, "runs": runs, "skipped": skipped}, indent=2) + "\n"
    )
    lines = [
        f"# Leak kinds on {device}: the lowest ladder step that frees each",
        "",
        "| kind | leaked | expected | freed first by | freed per step (figure) |",
        "|---|---|---|---|---|",
    ]
    for run in runs:
        per_step = ", ".join(
            f"{s['step']} {_gib(s['freed_bytes'])} GiB ({s['figure']})" for s in run["steps"]
        )
        lines.append(
            f"| {run['kind']} | {_gib(run['leaked_bytes'])} GiB | {run['expected']} "
            f"| {run['cured_by'] or 'none'} | {per_step} |"
        )
    lines += [f"| {kind} | - | {CURES[kind]} | needs CUDA | - |" for kind in skipped]
    (out / "leak_kinds.md").write_text("\n".join(lines) + "\n")
    return [
        (
            f"{run['kind']} is freed first by {run['expected']}",
            run["cured_by"] == run["expected"],
            f"freed first by {run['cured_by'] or 'no step'}",
        )
        for run in runs
    ]


if __name__ == "__main__":
    sys.exit(main())
