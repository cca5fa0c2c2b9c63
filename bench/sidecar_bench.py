"""Sidecar cost: its own RSS and /metrics latency against a realistic stats file.

The sidecar runs next to every inference server, so its budget is small:
RSS under 60 MB and scrape p99 under 20 ms. This starts the real sidecar
process, rewrites a full stats file ten times a second (by rename, as the
server does) naming a real process holding memory, scrapes /metrics N times
and records p50/p99. The same run times /healthz on the same HTTP stack as
the baseline, so the collection cost shows as a ratio that does not depend
on how busy the machine is.

    .venv/bin/python bench/sidecar_bench.py [--scrapes 1000] [--out bench/results/sidecar.json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from fusebox_contract.metrics import LatencyHistogram
from fusebox_contract.names import (
    BreakerState,
    DegradationLevel,
    Dtype,
    HeartbeatThread,
    LatencyMetric,
    Quantization,
    RequestOutcome,
    Variant,
)
from fusebox_contract.stats import (
    CudaMemory,
    GpuMemory,
    HistogramCounts,
    LatencySummary,
    Quality,
    RuntimeState,
    StatsDocument,
    Tokens,
    dumps,
)

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import loopback  # noqa: E402  (the repository root is on the path only now)

RSS_TARGET_BYTES = 60 * 1000 * 1000
SCRAPE_P99_TARGET_SECONDS = 0.020


def _histogram(name: LatencyHistogram, count: int) -> HistogramCounts:
    """`count` observations spread over the bounds (every bucket line non-zero)."""
    bounds = len(name.buckets)
    cumulative = tuple(float(count * (i + 1) // (bounds + 1)) for i in range(bounds))
    return HistogramCounts(cumulative, count, count * name.buckets[bounds // 2])


def _stats_document(pid: int) -> StatsDocument:
    """A full stats file (8 GPUs, every field), built by the contract as the server builds it."""
    now = time.time()
    return StatsDocument(
        written_at=now,
        started_at=now - 3600,
        pid=pid,
        model_name="chat",
        rss_bytes=1_234_567_890,
        cgroup_memory_usage_bytes=2_345_678_901,
        cgroup_memory_limit_bytes=21_474_836_480,
        cuda=CudaMemory(
            allocated_bytes=14_000_000_000,
            reserved_bytes=16_000_000_000,
            num_alloc_retries=2,
            num_ooms=0,
            contexts=1,
        ),
        nvml=tuple(
            GpuMemory(index, memory_used_bytes=17_000_000_000, memory_total_bytes=85_899_345_920)
            for index in range(8)
        ),
        queue_length=12,
        running=8,
        tokenizer_cache_entries=9_876,
        tokenizer_cache_hits_total=120_000,
        tokenizer_template_hits_total=80_000,
        requests={
            RequestOutcome.SUCCEEDED: 1_000_000,
            RequestOutcome.FAILED: 31,
            RequestOutcome.REJECTED: 4_000,
            RequestOutcome.TIMED_OUT: 12,
            RequestOutcome.CANCELLED: 250,
            RequestOutcome.INVALID: 40,
        },
        latency={
            LatencyMetric.TTFT: LatencySummary(p99_seconds=0.18, count=1000),
            LatencyMetric.ITL: LatencySummary(p99_seconds=0.03, count=64000),
            LatencyMetric.E2E: LatencySummary(p99_seconds=4.5, count=1000),
        },
        histograms={
            name: _histogram(name, 64_000 if name is LatencyHistogram.ITL else 1_000_000)
            for name in LatencyHistogram
        },
        tokens=Tokens(prompt_total=512_000_000, generation_total=256_000_000),
        quality=Quality(sampled_total=100, failed_total=3, failure_ratio=0.03),
        heartbeats={HeartbeatThread.LOOP: now - 0.01, HeartbeatThread.WORKER: now - 0.02},
        state=RuntimeState(
            breaker=BreakerState.CLOSED,
            admit_percent=100,
            degradation_level=DegradationLevel.NONE,
            variant=Variant.PRIMARY,
            model_loaded=True,
            memory_guard_active=False,
            model_revision="main",
            dtype=Dtype.BFLOAT16,
            quantization=Quantization.NONE,
            fallback_configured=True,
            target_variant=Variant.PRIMARY,
            converging=False,
        ),
    )


def _write_stats_forever(path: Path, pid: int, stop: threading.Event) -> None:
    temporary = path.with_suffix(".tmp")
    while not stop.is_set():
        temporary.write_text(dumps(_stats_document(pid)))
        temporary.replace(path)
        stop.wait(0.1)


def _start_sidecar(stats_path: Path, log_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    try:
        return loopback.start_sidecar(stats_path, log_path, timeout_seconds=60)
    except loopback.SidecarDidNotStart as error:
        raise SystemExit(str(error)) from None


def _timed_gets(port: int, path: str, count: int) -> list[float]:
    durations = []
    for _ in range(count):
        started = time.perf_counter()
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.request("GET", path)
        response = connection.getresponse()
        body = response.read()
        connection.close()
        durations.append(time.perf_counter() - started)
        if response.status != 200 or not body:
            raise SystemExit(f"GET {path} answered {response.status}")
    return durations


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def _memory_bytes(pid: int) -> dict[str, int]:
    figures = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            figures[name] = int(rest.split()[0]) * 1024
    return figures


def run(scrapes: int, out: Path) -> dict[str, Any]:
    # A process holding 200 MB stands in for the server whose RSS is read.
    server = subprocess.Popen(
        [sys.executable, "-c", "import time; b = b'x' * 200_000_000; time.sleep(3600)"]
    )
    stop = threading.Event()
    with tempfile.TemporaryDirectory(prefix="sidecar-bench-") as scratch:
        stats_path = Path(scratch) / "stats.json"
        stats_path.write_text(dumps(_stats_document(server.pid)))
        writer = threading.Thread(
            target=_write_stats_forever, args=(stats_path, server.pid, stop), daemon=True
        )
        writer.start()
        sidecar, port = _start_sidecar(stats_path, Path(scratch) / "sidecar.log")
        try:
            _timed_gets(port, "/metrics", 50)  # warm-up
            # Interleave so both see the same machine load.
            metrics: list[float] = []
            health: list[float] = []
            for _ in range(10):
                metrics += _timed_gets(port, "/metrics", scrapes // 10)
                health += _timed_gets(port, "/healthz", scrapes // 10)
            memory = _memory_bytes(sidecar.pid)
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            connection.request("GET", "/metrics")
            exposition = connection.getresponse().read()
            connection.close()
        finally:
            stop.set()
            sidecar.terminate()
            sidecar.wait(timeout=10)
            server.kill()
            server.wait()
            writer.join(timeout=5)

    result: dict[str, Any] = {
        "scrapes": len(metrics),
        "scrape_seconds": {
            "p50": statistics.median(metrics),
            "p99": _percentile(metrics, 0.99),
            "max": max(metrics),
        },
        "healthz_seconds": {"p50": statistics.median(health), "p99": _percentile(health, 0.99)},
        "scrape_over_healthz_p50_ratio": statistics.median(metrics) / statistics.median(health),
        "scrape_bytes": len(exposition),
        "sidecar_rss_bytes": memory["VmRSS"],
        "sidecar_peak_rss_bytes": memory["VmHWM"],
        "targets": {
            "rss_bytes_below": RSS_TARGET_BYTES,
            "scrape_p99_seconds_below": SCRAPE_P99_TARGET_SECONDS,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "load_average_1m": os.getloadavg()[0],
            "python": sys.version.split()[0],
        },
    }
    result["meets_targets"] = (
        result["sidecar_peak_rss_bytes"] < RSS_TARGET_BYTES
        and result["scrape_seconds"]["p99"] < SCRAPE_P99_TARGET_SECONDS
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scrapes", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=Path("bench/results/sidecar.json"))
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    arguments = parser.parse_args()
    if arguments.scrapes < 10:
        parser.error("--scrapes must be at least 10")
    result = run(arguments.scrapes, arguments.out)
    scrape = result["scrape_seconds"]
    print(
        f"sidecar: RSS {result['sidecar_rss_bytes'] / 1e6:.1f} MB "
        f"(peak {result['sidecar_peak_rss_bytes'] / 1e6:.1f} MB, target < 60), "
        f"scrape p50 {scrape['p50'] * 1000:.2f} ms p99 {scrape['p99'] * 1000:.2f} ms "
        f"(target < 20), {result['scrape_over_healthz_p50_ratio']:.2f}x /healthz; "
        f"wrote {arguments.out}"
    )
    return 1 if arguments.strict and not result["meets_targets"] else 0


if __name__ == "__main__":
    sys.exit(main())
