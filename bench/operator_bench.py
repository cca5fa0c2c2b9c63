"""Operator figures: leak reaction time and fan-out at scale.

    .venv/bin/python bench/operator_bench.py reaction [--interval 2] [--leak-mib 16]
    .venv/bin/python bench/operator_bench.py scale --kubeconfig PATH [--count 200]

`reaction` runs the real server (FUSEBOX_FAULTS=leak:N) and sidecar on
loopback and drives the operator's own telemetry -> policy -> actuator path
every interval; it reports the delay from leak onset (the first leaking
request) to the first action, in scrape intervals, and the ladder timeline.
`scale` starts `python -m fusebox_operator` against a cluster, applies COUNT
InferenceServices with replicas 0 at once, and reports the time until every
Deployment exists as a ratio of the time one service takes in the same run,
plus the operator's peak RSS. Then it measures the steady state, once with
the one service and once with all of them, over the same window of several
resync intervals: the requests the apiserver served by verb and resource
(from its own apiserver_request_total), the writes among them, and the CPU
the operator and the apiserver spent, as a ratio to the one-service window.
Results go to bench/results/operator.json.
Not part of `make test`: timings are figures, never assertions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "operator"))

import aiohttp  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from fusebox_operator.actuator import Actuator  # noqa: E402
from fusebox_operator.observations import PodView  # noqa: E402
from fusebox_operator.policy import decide  # noqa: E402
from fusebox_operator.policy_state import PolicyState  # noqa: E402
from fusebox_operator.spec import parse_spec  # noqa: E402
from fusebox_operator.telemetry import scrape_all  # noqa: E402

RESULTS = REPO / "bench" / "results"
TOKEN = "bench-token"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def model_dir() -> Path:
    cache = Path(os.environ.get("FUSEBOX_CACHE", Path.home() / ".cache" / "fusebox"))
    path = cache / "models" / "tiny"
    if not (path / "config.json").exists():
        subprocess.run(
            [sys.executable, "-m", "fusebox_server.model.tiny_model", str(path)], check=True
        )
    return path


def chat(port: int) -> None:
    body = json.dumps(
        {"model": "model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    ).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()


async def reaction(interval: float, leak_mib: int, rounds: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="fusebox-operator-bench-"))
    (work / "token").write_text(TOKEN)
    api, admin, metrics = free_port(), free_port(), free_port()
    model = model_dir()
    logs = [open(work / "server.log", "wb"), open(work / "sidecar.log", "wb")]  # noqa: SIM115
    server = subprocess.Popen(
        [sys.executable, "-m", "fusebox_server", "--model-dir", str(model),
         "--fallback-dir", str(model), "--host", "127.0.0.1", "--port", str(api),
         "--admin-port", str(admin), "--admin-token-file", str(work / "token"),
         "--stats-file", str(work / "stats.json"), "--device", "cpu"],
        env={**os.environ, "FUSEBOX_FAULTS": f"leak:{leak_mib}"},
        stdout=logs[0], stderr=subprocess.STDOUT,
    )  # fmt: skip
    sidecar = subprocess.Popen(
        [sys.executable, "-m", "fusebox_sidecar", "--stats-file", str(work / "stats.json"),
         "--host", "127.0.0.1", "--port", str(metrics)],
        stdout=logs[1], stderr=subprocess.STDOUT,
    )  # fmt: skip
    pod = PodView("bench", "uid", "127.0.0.1", "Running", True, True, True, 0, False, False)
    timeline: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{api}/readyz", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        async with aiohttp.ClientSession() as session:
            (baseline,) = await scrape_all(session, [pod], 2, "ttft", port=metrics)
            assert baseline.rss_bytes is not None
            # No cgroup limit on loopback: pretend the pod's limit puts baseline at 60%.
            limit = baseline.rss_bytes / 0.6
            spec = parse_spec(
                {
                    "model": {"name": "m", "source": "pvc://m/tiny"},
                    "fallback": {},
                    "breaker": {
                        "resource": {
                            "cooldownSeconds": interval * 3,
                            "windowSeconds": interval * 10,
                        }
                    },
                    "telemetry": {
                        "scrapeIntervalSeconds": interval,
                        "wedgeAfterSeconds": interval * 10,
                    },
                }
            )
            state = PolicyState("bench", memory_limit_bytes=limit)
            actuator = Actuator(session, None, admin_port=admin)
            onset: float | None = None
            crossed: float | None = None
            ratio = spec.breaker.resource.rss.ratio
            loop = asyncio.get_running_loop()
            for round_ in range(rounds):
                started = time.time()
                if round_ >= 3:  # three quiet rounds first: the slope has a baseline
                    await loop.run_in_executor(None, chat, api)
                    onset = onset or started
                samples = await scrape_all(session, [pod], 2, "ttft", port=metrics)
                rss = samples[0].rss_bytes
                if crossed is None and rss is not None and rss / limit > ratio:
                    crossed = samples[0].sampled_at
                state, actions = decide(state, samples, time.time(), spec)
                for action in actions:
                    result = await actuator.execute("bench", pod, TOKEN, action)
                    since = action.at - (onset or action.at)
                    timeline.append(
                        {
                            "kind": action.kind.value,
                            "at": action.at,
                            "after_onset_intervals": round(since / interval, 2),
                            "reason": action.reason,
                            "result": result.text,
                        }
                    )
                if any(t["kind"] == "reload" for t in timeline):
                    break
                await asyncio.sleep(max(0.0, interval - (time.time() - started)))
    finally:
        for process in (sidecar, server):
            process.terminate()
            process.wait(timeout=30)
        for log in logs:
            log.close()
    first = timeline[0] if timeline else None
    first_at = first["at"] if first else None
    return {
        "interval_seconds": interval,
        "leak_mib_per_request": leak_mib,
        "requests_per_interval": 1,
        "first_action_after_onset_intervals": first["after_onset_intervals"] if first else None,
        # The policy's own latency: from the first scrape over the ratio to the first action.
        "first_action_after_threshold_intervals": (
            round((first_at - crossed) / interval, 2) if first_at and crossed else None
        ),
        "timeline": timeline,
    }


# Resyncs per steady-state window, and the interval: short, so a window is brief.
RESYNC_SECONDS = 10
STEADY_RESYNCS = 3
WRITE_VERBS = ("POST", "PUT", "PATCH", "APPLY", "DELETE")


def scale(kubeconfig: str, count: int) -> dict[str, Any]:
    kubectl = os.environ.get("KUBECTL", "kubectl")
    env = {**os.environ, "KUBECONFIG": kubeconfig, "PYTHONPATH": str(REPO / "operator"),
           "FUSEBOX_PEERING": "standalone", "FUSEBOX_LIVENESS_PORT": str(free_port()),
           "FUSEBOX_RESYNC_SECONDS": str(RESYNC_SECONDS)}  # fmt: skip
    namespace = f"fusebox-bench-{int(time.time())}"

    def run(*args: str, input_text: str | None = None) -> str:
        return subprocess.run(
            [kubectl, *args], input=input_text, env=env, capture_output=True, text=True, check=True
        ).stdout

    def documents(names: list[str]) -> str:
        docs = []
        for name in names:
            docs.append(json.dumps({
                "apiVersion": "fusebox.dev/v1alpha1", "kind": "InferenceService",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"model": {"name": "m", "source": "pvc://models/tiny"}, "fallback": {},
                         "replicas": 0, "gpu": {"count": 0}},
            }))  # fmt: skip
        return "\n---\n".join(docs)

    def deployments() -> int:
        out = run("get", "deployments", "-n", namespace, "-o", "name")
        return len(out.split())

    run("apply", "-f", str(REPO / "crds" / "inferenceservice.yaml"))
    run("create", "namespace", namespace)
    operator = subprocess.Popen([sys.executable, "-m", "fusebox_operator"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    peak_rss = 0
    steady: dict[str, dict[str, Any]] = {}
    try:
        time.sleep(5)
        timings = {}
        for label, names in (("one", ["single"]), ("all", [f"svc-{i:03d}" for i in range(count)])):
            target = deployments() + len(names)
            started = time.monotonic()
            run("apply", "-f", "-", input_text=documents(names))
            while deployments() < target:
                peak_rss = max(peak_rss, _rss(operator.pid))
                time.sleep(0.5)
            timings[label] = time.monotonic() - started
            time.sleep(RESYNC_SECONDS + 5)  # every service past its first resync
            steady[label] = steady_window(lambda: run("get", "--raw", "/metrics"), operator.pid)
            steady[label]["services"] = target
        peak_rss = max(peak_rss, _rss(operator.pid))
    finally:
        operator.terminate()
        operator.wait(timeout=30)
        subprocess.run(
            [kubectl, "delete", "namespace", namespace, "--wait=false"], env=env, check=False
        )
    return {
        "count": count,
        "seconds_one": round(timings["one"], 2),
        "seconds_all": round(timings["all"], 2),
        "all_vs_one_ratio": round(timings["all"] / timings["one"], 1),
        "operator_peak_rss_mib": round(peak_rss / 1024**2, 1),
        "steady_state": steady_summary(steady),
    }


def steady_window(metrics: Any, pid: int) -> dict[str, Any]:
    """What the apiserver served and what both processes spent over one window."""
    window = RESYNC_SECONDS * STEADY_RESYNCS
    before_requests, before_cpu = _apiserver(metrics())
    before_operator, started = _cpu_seconds(pid), time.monotonic()
    time.sleep(window)
    after_requests, after_cpu = _apiserver(metrics())
    seconds = time.monotonic() - started
    delta = {
        key: value - before_requests.get(key, 0.0)
        for key, value in after_requests.items()
        if value > before_requests.get(key, 0.0)
    }
    return {
        "seconds": round(seconds, 1),
        "requests_per_second": {
            key: round(value / seconds, 2) for key, value in sorted(delta.items())
        },
        "apiserver_cpu_cores": round((after_cpu - before_cpu) / seconds, 3),
        "operator_cpu_cores": round((_cpu_seconds(pid) - before_operator) / seconds, 3),
    }


def steady_summary(steady: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per-window figures, and what the extra services cost against one service."""
    one, every = steady["one"], steady["all"]

    def per_second(window: dict[str, Any], verbs: tuple[str, ...], resource: str = "") -> float:
        return sum(
            rate
            for key, rate in window["requests_per_second"].items()
            if key.split()[0] in verbs and (not resource or key.split()[1] == resource)
        )

    extra = every["services"] - one["services"]
    return {
        "resync_seconds": RESYNC_SECONDS,
        "one": one,
        "all": every,
        "writes_per_second": {
            "one": round(per_second(one, WRITE_VERBS), 2),
            "all": round(per_second(every, WRITE_VERBS), 2),
        },
        # The children's reads are the resync's; the pod lists the telemetry tick's.
        "gets_per_extra_service_per_resync": round(
            (per_second(every, ("GET",)) - per_second(one, ("GET",))) * RESYNC_SECONDS / extra, 2
        ),
        "pod_lists_per_extra_service_per_second": round(
            (per_second(every, ("LIST",), "pods") - per_second(one, ("LIST",), "pods")) / extra, 3
        ),
        "operator_cpu_all_vs_one_ratio": _ratio(
            every["operator_cpu_cores"], one["operator_cpu_cores"]
        ),
        "apiserver_cpu_all_vs_one_ratio": _ratio(
            every["apiserver_cpu_cores"], one["apiserver_cpu_cores"]
        ),
    }


def _ratio(value: float, baseline: float) -> float | None:
    return round(value / baseline, 1) if baseline else None


def _apiserver(text: str) -> tuple[dict[str, float], float]:
    """apiserver_request_total summed by "VERB resource", and its process CPU seconds."""
    wanted = ("apiserver_request_total{", "process_cpu_seconds_total")
    lines = "\n".join(line for line in text.splitlines() if line.startswith(wanted))
    requests: dict[str, float] = {}
    cpu = 0.0
    for family in text_string_to_metric_families(lines + "\n"):
        for sample in family.samples:
            if sample.name == "apiserver_request_total":
                key = f"{sample.labels['verb']} {sample.labels['resource']}"
                requests[key] = requests.get(key, 0.0) + sample.value
            elif sample.name == "process_cpu_seconds_total":
                cpu = sample.value
    return requests, cpu


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    react = sub.add_parser("reaction")
    react.add_argument("--interval", type=float, default=2.0)
    react.add_argument("--leak-mib", type=int, default=16)
    react.add_argument("--rounds", type=int, default=60)
    big = sub.add_parser("scale")
    big.add_argument("--kubeconfig", required=True)
    big.add_argument("--count", type=int, default=200)
    args = parser.parse_args()
    if args.command == "reaction":
        result = asyncio.run(reaction(args.interval, args.leak_mib, args.rounds))
    else:
        result = scale(args.kubeconfig, args.count)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "operator.json"
    existing = json.loads(path.read_text()) if path.exists() else {}
    existing[args.command] = result
    path.write_text(json.dumps(existing, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps(result, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
