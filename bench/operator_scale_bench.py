"""Fusebox's operator over a simulated fleet: kwok GPU nodes, every pod played by one
simulator process (bench/fleet/), the real operator on the host.

    nice -n 19 .venv/bin/python bench/operator_scale_bench.py [--quick]
        [--services 2000] [--replicas 2] [--nodes 200] [--status-services 500]
        [--status-only]

Runs etcd, kube-apiserver, kube-scheduler, kube-controller-manager and kwok on
loopback (the cluster binaries of `make setup-binaries`; kwok is built on
first use by localcluster/build-kwok.sh), the simulator on the sidecar and
admin ports, then three phases in one run:

1. status, baseline: a plain kopf operator that server-side-applies the same
   children (bench/fleet/baseline_operator.py); STATUS_SERVICES services with
   replicas 0 applied at once; seconds until every one has a status, and the
   operator's CPU-seconds.
2. status, Fusebox: the same with `python -m fusebox_operator`.
3. fleet: SERVICES x REPLICAS pods on NODES fake GPU nodes, 5% of pods leaking.
   Seconds until every pod runs and is scraped; then a steady window in
   which leaks cross their threshold: per leaking pod, the delay from the
   crossing to the first ladder action, in scrape intervals; the operator's
   peak RSS and CPU; then the same window with the operator stopped, so the
   difference in apiserver_request_total is the operator's own requests,
   per service per minute, by verb and resource (and whether any LIST of a
   child kind happens, which a watch-based operator never makes per service).

Results go to bench/results/operator.json under "fleet" (other keys kept);
`--status-only` runs phases 1 and 2 alone, under "status": the CPU per new
service in minutes rather than the ten a 500 x 2 fleet takes.
Figures, never assertions: not part of `make test`.

Memory: `--memory-probe DIR` runs the fleet's operator under tracemalloc
(bench/fleet/memory_probe, a `sitecustomize` on its path only) and writes a
snapshot and the RSS, glibc and mapping figures into DIR at the end of the
steady window; two sizes' snapshots compared give bytes per service by line.
`--operator-env NAME=VALUE` sets a variable in that operator alone
(MALLOC_ARENA_MAX=2, say). docs/decisions/operator-memory.md has the findings.

CPU: `--cpu-probe DIR` runs both status phases' operators under a sampler
weighted by CPU time (bench/fleet/cpu_probe, a `sitecustomize` on their path
only) and writes, per phase, the stacks and the top functions and packages of
the CPU counted in the figure (DIR/<namespace>/2.*; 1.* is the startup).
docs/decisions/operator-api-cost.md ("Sixth pass") has the findings.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.fleet.cluster import apply_objects, control_plane, kubectl  # noqa: E402
from bench.fleet.plan import fake_node, inference_service, node_blocks  # noqa: E402
from bench.operator_bench import _apiserver, _cpu_seconds, _rss, free_port  # noqa: E402

RESULTS = REPO / "bench" / "results" / "operator.json"
MEMORY_PROBE = REPO / "bench" / "fleet" / "memory_probe"  # a sitecustomize: tracemalloc
CPU_PROBE = REPO / "bench" / "fleet" / "cpu_probe"  # a sitecustomize: CPU-weighted sampler
SCRAPE_INTERVAL_SECONDS = 5.0  # the CRD's default telemetry.scrapeIntervalSeconds
CHILD_RESOURCES = (
    "secrets",
    "configmaps",
    "services",
    "poddisruptionbudgets",
    "networkpolicies",
    "deployments",
)
STATUS_NAMESPACE, BASELINE_NAMESPACE, FLEET_NAMESPACE = "bench-status", "bench-baseline", "fleet"


def percentile(values: list[float], share: float) -> float | None:
    """Nearest-rank percentile (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def reaction_delays(
    report: dict[str, Any], interval: float, settle_seconds: float
) -> dict[str, Any]:
    """Per leaking pod that crossed its threshold at least `settle_seconds` before the
    report: the delay to its first action, in scrape intervals; pods not acted on are
    counted, never dropped."""
    at = float(report["at"])
    delays, unanswered, early = [], 0, 0
    for pod in report["pods"]:
        crossed = pod["crossed_at"]
        if pod.get("hung"):
            continue  # a leak nobody can see is not the policy's delay
        if pod["shape"] != "leak" or crossed is None or crossed > at - settle_seconds:
            continue
        if pod["first_action_at"] is None:
            unanswered += 1
            continue
        delays.append((pod["first_action_at"] - crossed) / interval)
    acted_on_healthy = sum(1 for p in report["pods"] if p["shape"] != "leak" and p["actions"])
    early = sum(
        1
        for p in report["pods"]
        if p["shape"] == "leak" and p["crossed_at"] is None and not p.get("hung")
    )
    p50, p99 = percentile(delays, 0.5), percentile(delays, 0.99)
    return {
        "leaking_pods_crossed": len(delays) + unanswered,
        "acted_on": len(delays),
        "not_acted_on": unanswered,
        "first_action_p50_intervals": None if p50 is None else round(p50, 2),
        "first_action_p99_intervals": None if p99 is None else round(p99, 2),
        "first_action_max_intervals": round(max(delays), 2) if delays else None,
        "non_leaking_pods_acted_on": acted_on_healthy,
        "leaking_pods_not_crossed_yet": early,
    }


def scrape_rate(before: dict[str, int], report: dict[str, Any], intervals: float) -> float:
    """Scrapes each pod got per scrape interval over a window (1.0: none missed; an
    action's follow-up scrape adds a little)."""
    counts = [
        int(p["scrapes"]) - before.get(p["address"], 0)
        for p in report["pods"]
        if not p.get("hung")  # a hung pod's count says nothing of the others'
    ]
    return round(sum(counts) / max(1, len(counts)) / intervals, 2)


def operator_requests(
    with_operator: dict[str, float], without: dict[str, float], services: int
) -> dict[str, Any]:
    """Requests per service per minute that the operator made (the two windows' rates
    differ only by it), by "VERB resource", and the LISTs of child kinds among them."""
    keys = set(with_operator) | set(without)
    diff = {k: with_operator.get(k, 0.0) - without.get(k, 0.0) for k in keys}
    # Below 0.01 a minute per service is the other components' noise between windows.
    per_service = {
        k: round(v * 60 / services, 3)
        for k, v in sorted(diff.items())
        if abs(v) * 60 / services >= 0.01
    }
    child_lists = {
        k: v
        for k, v in per_service.items()
        if k.split()[0] == "LIST" and k.split()[-1] in CHILD_RESOURCES
    }
    return {
        "per_service_per_minute": round(sum(diff.values()) * 60 / services, 3),
        "by_verb_resource": per_service,
        "child_lists_per_service_per_minute": child_lists,
        "periodic_child_list_per_service": any(v >= 0.5 for v in child_lists.values()),
    }


# ----- I/O ---------------------------------------------------------------------------------


def open_connections(pid: int) -> dict[str, int]:
    """The process's established TCP connections by peer: sidecars (9400), admin APIs
    (8001), and the apiserver (every other peer: kopf's session and the client's pool).
    kopf's pool held one 256 KiB TLS buffer per connection (operator-memory.md)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    counts = {"sidecars": 0, "admin": 0, "apiserver": 0}
    for table in ("tcp", "tcp6"):
        lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        for fields in (line.split() for line in lines):
            if fields[3] != "01" or fields[9] not in inodes:  # 01: ESTABLISHED
                continue
            port = int(fields[2].rsplit(":", 1)[1], 16)
            counts[{9400: "sidecars", 8001: "admin"}.get(port, "apiserver")] += 1
    return counts


@contextlib.contextmanager
def scratch(keep: bool = False, parent: Path | None = None) -> Iterator[Path]:
    """The run's work directory, removed when the run ends, failed or not.

    It holds etcd's data, the certificates and every component's log: up to 600 MB
    at 2,000 services, and runs left them in /tmp. A failed run prints the tail of
    each log first (what the logs were kept for); `keep` (--keep-work) keeps it all.
    """
    work = Path(tempfile.mkdtemp(prefix="fusebox-fleet-", dir=parent))
    failed = True
    try:
        yield work
        failed = False
    finally:
        if failed:
            for log in sorted(work.glob("*.log")):
                lines = log.read_text(errors="replace").splitlines()[-15:]
                print(f"--- {log.name} (last lines)", *lines, sep="\n", file=sys.stderr)
        if keep:
            print(f"work directory (logs): {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


class Run:
    def __init__(self, work: Path, kubeconfig: Path, simulator_port: int) -> None:
        self.work = work
        self.kubeconfig = kubeconfig
        self.simulator_port = simulator_port
        self.peak_rss = 0
        self.peak_connections: dict[str, int] = {}

    def kubectl(self, *args: str, input_text: str | None = None) -> str:
        return kubectl(self.kubeconfig, *args, input_text=input_text)

    def rates(self, seconds: float) -> dict[str, float]:
        """apiserver_request_total per second over a window of `seconds`."""
        before, _ = _apiserver(self.kubectl("get", "--raw", "/metrics"))
        started = time.monotonic()
        time.sleep(seconds)
        after, _ = _apiserver(self.kubectl("get", "--raw", "/metrics"))
        took = time.monotonic() - started
        return {k: (v - before.get(k, 0.0)) / took for k, v in after.items()}

    def with_status(self, namespace: str) -> int:
        out = self.kubectl(
            "get", "inferenceservices", "-n", namespace, "--chunk-size=0",
            "-o", "jsonpath={range .items[*]}{.status.observedGeneration}{\"\\n\"}{end}",
        )  # fmt: skip
        return sum(1 for line in out.splitlines() if line.strip())

    def running_pods(self, namespace: str) -> int:
        out = self.kubectl(
            "get", "pods", "-n", namespace, "--field-selector=status.phase=Running",
            "--chunk-size=0", "-o", "name",
        )  # fmt: skip
        return len(out.split())

    def report(self) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.simulator_port}/fleet/report"
        with urllib.request.urlopen(url, timeout=60) as response:
            return dict(json.loads(response.read()))

    def watch(self, pid: int) -> None:
        self.peak_rss = max(self.peak_rss, _rss(pid))
        with contextlib.suppress(OSError):
            for peer, count in open_connections(pid).items():
                self.peak_connections[peer] = max(count, self.peak_connections.get(peer, 0))

    def services(self, namespace: str, count: int, replicas: int) -> None:
        self.kubectl("create", "namespace", namespace)
        names = [f"svc-{i:04d}" for i in range(count)]
        apply_objects(
            self.kubeconfig, [inference_service(name, namespace, replicas) for name in names]
        )

    def until(self, what: Any, target: int, pid: int, limit_seconds: float) -> float | None:
        started = time.monotonic()
        while time.monotonic() - started < limit_seconds:
            self.watch(pid)
            if what() >= target:
                return time.monotonic() - started
            time.sleep(1.0)
        return None


def committed_crd() -> str:
    """The CRD as committed: a checkout where someone is editing crds/ still benches."""
    return subprocess.run(
        ["git", "-C", str(REPO), "show", "HEAD:crds/inferenceservice.yaml"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip


def results_key(quick: bool, status_only: bool, hung_share: float, label: str) -> str:
    """Where a run's figures go in operator.json: a status-only run never overwrites a
    fleet run's key (it has no fleet figures)."""
    key = ("status" if status_only else "fleet") + ("_quick" if quick else "")
    return key + ("_hung" if hung_share else "") + label


def operator_env(pairs: list[str]) -> dict[str, str]:
    """--operator-env NAME=VALUE pairs as a mapping (a pair without "=" is refused)."""
    env = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise SystemExit(f"--operator-env wants NAME=VALUE, not {pair!r}")
        env[name] = value
    return env


def start(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def status_phase(
    run: Run,
    namespace: str,
    command: list[str],
    env: dict[str, str],
    count: int,
    cpu_probe: Path | None = None,
) -> dict[str, Any]:
    """Seconds until `count` services applied at once all have a status, and CPU; with
    `cpu_probe`, the operator's profile of that CPU (bench/fleet/cpu_probe)."""
    probe_folder = None if cpu_probe is None else cpu_probe / namespace
    if probe_folder is not None:
        probe_folder.mkdir(parents=True, exist_ok=True)
        env = {
            **env,
            "PYTHONPATH": f"{CPU_PROBE}:{env['PYTHONPATH']}",
            "FUSEBOX_CPU_PROBE_DIR": str(probe_folder.resolve()),
        }
    process = start(command, env, run.work / f"{namespace}.log")
    profile = None
    try:
        time.sleep(8)  # the operator's startup (kopf's first LISTs) is not the figure
        if probe_folder is not None:
            probe_cpu(process.pid, probe_folder)  # 1.*: the startup, left out
        cpu_before = _cpu_seconds(process.pid)
        started = time.monotonic()
        run.services(namespace, count, replicas=0)
        seconds = run.until(lambda: run.with_status(namespace), count, process.pid, 900)
        took = time.monotonic() - started
        cpu = _cpu_seconds(process.pid) - cpu_before
        if probe_folder is not None:
            profile = probe_cpu(process.pid, probe_folder)
    finally:
        stop(process)
    result: dict[str, Any] = {
        "services": count,
        "seconds_to_status": None if seconds is None else round(took, 1),
        "reached": run.with_status(namespace),
        "cpu_seconds": round(cpu, 1),
        "cpu_ms_per_service": round(cpu * 1000 / count, 1),
    }
    if profile is not None:
        result["cpu_probe"] = cpu_probe_digest(profile)
    return result


def _signal_and_read(
    pid: int, folder: Path, sig: signal.Signals, limit_seconds: float, what: str
) -> dict[str, Any]:
    """Signal a probe in the operator and read the JSON file it writes next into `folder`
    (given a moment once it appears: a probe writes it last, whole only once closed)."""
    done = {p.name for p in folder.glob("*.json")}
    os.kill(pid, sig)
    started = time.monotonic()
    while time.monotonic() - started < limit_seconds:
        fresh = [p for p in folder.glob("*.json") if p.name not in done]
        if fresh:
            time.sleep(0.5)
            return dict(json.loads(fresh[0].read_text()), file=str(fresh[0]))
        time.sleep(0.5)
    return {"error": f"no {what} within {limit_seconds:.0f} s"}


def probe_cpu(pid: int, folder: Path, limit_seconds: float = 60.0) -> dict[str, Any]:
    """Ask the operator's CPU probe (bench/fleet/cpu_probe) for the profile since its
    last one; the folded stacks stay in `folder`."""
    return _signal_and_read(pid, folder, signal.SIGUSR2, limit_seconds, "profile")


def cpu_probe_digest(profile: dict[str, Any], top: int = 15) -> dict[str, Any]:
    """The head of a CPU profile for operator.json (the whole one stays in its folder)."""
    if "error" in profile:
        return profile
    return {
        "file": profile["file"],
        "sampled_cpu_seconds": profile["sampled_cpu_seconds"],
        "own_by_package": profile["own_by_package"][:top],
        "own_by_function": profile["own_by_function"][:top],
        "cumulative_by_function": profile["cumulative_by_function"][:top],
    }


def probe_memory(pid: int, folder: Path, limit_seconds: float = 300.0) -> dict[str, Any]:
    """Ask the operator's memory probe (bench/fleet/memory_probe) for a snapshot and
    return its facts; the snapshot itself stays in `folder` for `compare_to`."""
    return _signal_and_read(pid, folder, signal.SIGUSR1, limit_seconds, "snapshot")


def fleet_phase(
    run: Run,
    env: dict[str, str],
    services: int,
    replicas: int,
    window: float,
    memory_probe: Path | None = None,
) -> dict[str, Any]:
    pods = services * replicas
    operator = start(
        [sys.executable, "-m", "fusebox_operator"], env, run.work / "fusebox-fleet.log"
    )
    result: dict[str, Any] = {}
    try:
        time.sleep(8)
        started = time.monotonic()
        cpu_before = _cpu_seconds(operator.pid)
        run.services(FLEET_NAMESPACE, services, replicas)
        running = run.until(lambda: run.running_pods(FLEET_NAMESPACE), pods, operator.pid, 1200)
        scraped = run.until(
            lambda: sum(1 for p in run.report()["pods"] if p["scrapes"]), pods, operator.pid, 600
        )
        result["seconds_to_pods_running"] = None if running is None else round(running, 1)
        result["seconds_to_all_scraped"] = round(time.monotonic() - started, 1)
        result["all_scraped"] = scraped is not None
        result["ramp_cpu_seconds"] = round(_cpu_seconds(operator.pid) - cpu_before, 1)
        # The steady window: every pod scraped, leaks crossing their threshold.
        cpu_before = _cpu_seconds(operator.pid)
        started = time.monotonic()
        scrapes_before = {p["address"]: p["scrapes"] for p in run.report()["pods"]}
        with_operator: dict[str, float] = {}
        samples = max(1, int(window // 30))
        for _ in range(samples):  # in slices, so the RSS is sampled through the window
            for key, rate in run.rates(window / samples).items():
                with_operator[key] = with_operator.get(key, 0.0) + rate / samples
            run.watch(operator.pid)
        steady_seconds = time.monotonic() - started
        steady_cpu = _cpu_seconds(operator.pid) - cpu_before
        result["steady_window_seconds"] = round(steady_seconds, 1)
        result["steady_operator_cpu_cores"] = round(steady_cpu / steady_seconds, 3)
        result["steady_cpu_ms_per_service_per_second"] = round(
            steady_cpu * 1000 / steady_seconds / services, 2
        )
        report = run.report()
        result["scrapes_per_pod_per_interval"] = scrape_rate(
            scrapes_before, report, steady_seconds / SCRAPE_INTERVAL_SECONDS
        )
        result["leak_reaction"] = reaction_delays(
            report, SCRAPE_INTERVAL_SECONDS, 3 * SCRAPE_INTERVAL_SECONDS
        )
        result["operator_peak_rss_mib"] = round(run.peak_rss / 1024**2, 1)
        result["operator_rss_at_end_mib"] = round(_rss(operator.pid) / 1024**2, 1)
        result["operator_peak_connections"] = dict(run.peak_connections)
        if memory_probe is not None:  # after the peak is read: a snapshot allocates
            result["memory_probe"] = probe_memory(operator.pid, memory_probe)
    finally:
        stop(operator)
    without = run.rates(min(window, 60.0))
    result["api_requests"] = operator_requests(with_operator, without, services)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--services", type=int, default=2000)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--status-services", type=int, default=500)
    parser.add_argument("--window", type=float, default=180.0, help="steady seconds")
    parser.add_argument("--quick", action="store_true", help="20 services on 4 nodes")
    parser.add_argument(
        "--hung-share", type=float, default=0.0, help="pods whose sidecar never answers"
    )
    parser.add_argument(
        "--operator-path",
        type=Path,
        default=REPO / "operator",
        help="the fusebox_operator to run (another checkout's, for a before/after)",
    )
    parser.add_argument("--label", default="", help="suffix of the results key")
    parser.add_argument(
        "--status-only",
        action="store_true",
        help="the two status phases without the fleet (key status_*, not fleet_*)",
    )
    parser.add_argument(
        "--keep-work", action="store_true", help="keep the work directory (etcd, logs)"
    )
    parser.add_argument(
        "--memory-probe",
        type=Path,
        help="run the fleet's operator under tracemalloc (bench/fleet/memory_probe) and "
        "write a snapshot into this folder at the end of the steady window",
    )
    parser.add_argument(
        "--probe-frames",
        type=int,
        default=1,
        help="frames kept per allocation by the probe (0: no tracemalloc, the figures alone)",
    )
    parser.add_argument(
        "--cpu-probe",
        type=Path,
        help="profile both status phases' operators (bench/fleet/cpu_probe) into this folder",
    )
    parser.add_argument(
        "--operator-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set in the fleet's operator only, e.g. MALLOC_ARENA_MAX=2 (repeatable)",
    )
    args = parser.parse_args()
    # A SIGTERM unwinds like Ctrl-C: every process stopped, the work directory removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with scratch(args.keep_work) as work:
        run_bench(args, work)


def run_bench(args: argparse.Namespace, work: Path) -> None:
    if args.quick:
        args.services, args.nodes, args.status_services, args.window = 20, 4, 50, 90.0
    pods = args.services * args.replicas
    gpus_per_node = max(8, math.ceil(1.25 * pods / args.nodes))
    metrics_port, admin_port = 9400, 8001  # the contract's: the operator scrapes pod:9400
    simulator = start(
        [sys.executable, "-m", "bench.fleet.simulator",
         f"--metrics-port={metrics_port}", f"--admin-port={admin_port}",
         f"--hung-share={args.hung_share}"],
        {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'operator'}"}, work / "simulator.log",
    )  # fmt: skip
    started, load_at_start = time.time(), list(os.getloadavg())
    try:
        with control_plane(work) as (kubeconfig, _):
            run = Run(work, kubeconfig, metrics_port)
            run.kubectl("apply", "--server-side", "-f", "-", input_text=committed_crd())
            run.kubectl("wait", "--for=condition=Established", "crd/inferenceservices.fusebox.dev")
            blocks = node_blocks(args.nodes)
            nodes = [fake_node(i, block, gpus_per_node) for i, block in enumerate(blocks)]
            apply_objects(kubeconfig, nodes)
            run.kubectl("wait", "--for=condition=Ready", "nodes", "--all", "--timeout=300s")
            # The API server taints every new node not-ready; the node lifecycle
            # controller that lifts it is not run (kwok's leases keep nodes alive).
            run.kubectl("taint", "nodes", "--all", "node.kubernetes.io/not-ready:NoSchedule-")
            env = {
                **os.environ,
                "KUBECONFIG": str(kubeconfig),
                "PYTHONPATH": f"{args.operator_path}:{REPO / 'operator'}",
                "FUSEBOX_PEERING": "standalone",
                "FUSEBOX_LIVENESS_PORT": str(free_port()),
                "FUSEBOX_METRICS_PORT": "0",
            }
            baseline_operator = REPO / "bench" / "fleet" / "baseline_operator.py"
            baseline = status_phase(
                run, BASELINE_NAMESPACE,
                [sys.executable, "-m", "kopf", "run", "--standalone",
                 f"--namespace={BASELINE_NAMESPACE}", str(baseline_operator)],
                env, args.status_services, args.cpu_probe,
            )  # fmt: skip
            fusebox_env = {**env, "FUSEBOX_WATCH_NAMESPACES": STATUS_NAMESPACE}
            fusebox = status_phase(
                run, STATUS_NAMESPACE, [sys.executable, "-m", "fusebox_operator"],
                fusebox_env, args.status_services, args.cpu_probe,
            )  # fmt: skip
            fleet_env = {**env, "FUSEBOX_WATCH_NAMESPACES": FLEET_NAMESPACE}
            fleet_env.update(operator_env(args.operator_env))
            if args.memory_probe is not None:
                args.memory_probe.mkdir(parents=True, exist_ok=True)
                fleet_env.update(
                    PYTHONPATH=f"{MEMORY_PROBE}:{fleet_env['PYTHONPATH']}",
                    FUSEBOX_MEMORY_PROBE_DIR=str(args.memory_probe.resolve()),
                    FUSEBOX_MEMORY_PROBE_FRAMES=str(args.probe_frames),
                )
            fleet = (
                None
                if args.status_only
                else fleet_phase(
                    run, fleet_env, args.services, args.replicas, args.window, args.memory_probe
                )
            )
    finally:
        stop(simulator)
    ratio = (
        round(fusebox["seconds_to_status"] / baseline["seconds_to_status"], 2)
        if fusebox["seconds_to_status"] and baseline["seconds_to_status"]
        else None
    )
    result = {
        "size": {
            "services": args.services,
            "replicas": args.replicas,
            "pods": pods,
            "nodes": args.nodes,
            "gpus_per_node": gpus_per_node,
            "status_services": args.status_services,
            "hung_share": args.hung_share,
            "scrape_interval_seconds": SCRAPE_INTERVAL_SECONDS,
        },
        "host": {
            "cpus": os.cpu_count(),
            "load_average_at_start": load_at_start,
            "load_average_at_end": list(os.getloadavg()),
            "wall_seconds": round(time.time() - started, 1),
        },
        "operator_env": operator_env(args.operator_env),
        "status_baseline": baseline,
        "status_fusebox": fusebox,
        "status_seconds_vs_baseline": ratio,
        "fleet": fleet,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    existing = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    existing[results_key(args.quick, args.status_only, args.hung_share, args.label)] = result
    RESULTS.write_text(json.dumps(existing, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps(result, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
