"""`make demo`: Fusebox end to end on localcluster, narrated as it happens.

Why a script and not a README walk-through: the point of the demo is to show
what the operator does on its own (breaker, resource ladder, events), and
that only convinces when nothing is staged. Every line printed here comes
from the cluster: `kubectl` output, the InferenceService's status and events,
the tokens the real `openai` client receives. If the operator does not act,
the demo says so instead of pretending.

Stages (each prints its time): cluster, model, operator (Helm), service,
chat, leak, summary. The cluster is left running; a second run reuses it.
The decisions behind the demo's spec overrides are printed with it.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fusebox_contract.admin import AdminRequest, FaultsRequest
from fusebox_contract.names import Fault
from fusebox_contract.wiring import Port

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "helm" / "fusebox"
EXAMPLE = REPO / "crds" / "examples" / "tiny-chat.yaml"
CACHE = Path(os.environ.get("FUSEBOX_CACHE", Path.home() / ".cache" / "fusebox"))
PYTHON = sys.executable

NAMESPACE = "fusebox-demo"
OPERATOR_NAMESPACE = "fusebox-system"
RELEASE = "fusebox"
OPERATOR_IMAGE = "localhost/fusebox/operator:dev"
PV_NAME = "fusebox-demo-models"
GPUS = 2  # the example asks for 2 replicas with one GPU each
LEAK_MIB_PER_REQUEST = 16
RSS_RATIO_OF_LIMIT = 0.3  # the demo's ladder threshold (default 0.75)
MIB = 1024 * 1024
LADDER_REASONS = (
    "GarbageCollected",
    "CacheEmptied",
    "ModelUnloaded",
    "ModelReloaded",
    "SwappedToFallback",
    "PodRestarted",
)
RECOVERED_REASONS = ("ModelReloaded", "SwappedToFallback", "PodRestarted")
ADMIN_PORT = Port.ADMIN
METRICS_PORT = Port.METRICS


class DemoError(RuntimeError):
    """A stage cannot go on; the message says what to do."""


# --- pure: what the demo applies and how it reads status -------------------------------


def demo_service(example: dict[str, Any], node_cpu_millis: int) -> tuple[dict[str, Any], list[str]]:
    """The example InferenceService with the demo's overrides, and why each was made.

    The overrides keep the example's shape (2 replicas, the tiny model, an
    int8 fallback) and only shrink what a 2-core laptop and a 3-minute demo
    cannot afford.
    """
    service = copy.deepcopy(example)
    spec = service.setdefault("spec", {})
    notes: list[str] = []
    server = spec.setdefault("server", {})
    replicas = int(spec.get("replicas", 1))
    cpu_millis = max(250, min(1000, (node_cpu_millis - 600) // max(replicas, 1) // 50 * 50))
    server["cpu"] = f"{cpu_millis}m"
    notes.append(
        f"server.cpu={cpu_millis}m: {replicas} pods' CPU requests must fit the node's "
        f"{node_cpu_millis}m allocatable CPU next to the operator and CoreDNS"
    )
    env = [item for item in server.get("env", []) if item.get("name") != "FUSEBOX_FAULTS"]
    env.append({"name": "FUSEBOX_FAULTS", "value": "leak:0"})
    server["env"] = env
    notes.append(
        "server.env FUSEBOX_FAULTS=leak:0: arms the leak fault (off) at start; faults "
        "cannot be switched on in a process that was not started armed"
    )
    breaker = spec.setdefault("breaker", {})
    resource = breaker.setdefault("resource", {})
    resource["rss"] = {"ratioOfLimit": RSS_RATIO_OF_LIMIT, "growthMiBPerMinute": 200}
    resource["cooldownSeconds"] = 8
    resource["windowSeconds"] = 20
    notes.append(
        f"breaker.resource: rss.ratioOfLimit={RSS_RATIO_OF_LIMIT}, cooldownSeconds=8,"
        " windowSeconds=20 "
        "(defaults 0.75 / 30 / 60) so the ladder climbs within a minute"
    )
    spec.setdefault("memory", {})["allowSwap"] = True
    notes.append(
        "memory.allowSwap=true: Burstable QoS without a CPU limit, so loading torch and"
        " the model is not throttled on a small machine (keep the default, Guaranteed, in"
        " production)"
    )
    spec["telemetry"] = {"scrapeIntervalSeconds": 2, "scrapeTimeoutSeconds": 1.5}
    notes.append("telemetry: scrapeIntervalSeconds=2 (default 5) so the narration is live")
    return service, notes


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    for item in status.get("conditions") or []:
        if item.get("type") == type_:
            return dict(item)
    return {}


def progress_line(status: dict[str, Any], ready_pods: int, desired: int) -> str:
    """One line of the wait display: pods, Ready condition, breaker, tier."""
    ready = condition(status, "Ready")
    breaker = (status.get("breaker") or {}).get("state", "-")
    tier = (status.get("degradation") or {}).get("tier", "-")
    return (
        f"pods ready {ready_pods}/{desired}  Ready={ready.get('status', '-')}"
        f" ({ready.get('reason', '-')})  breaker={breaker}  tier={tier}"
    )


def mib(value: Any) -> str:
    return f"{int(value) / MIB:,.0f} MiB" if isinstance(value, int | float) else "-"


def event_line(event: dict[str, Any]) -> str:
    reason = event.get("reason", "?")
    message = event.get("message", "").strip()
    return f"event {reason:<17} {message}"


FORWARDING = re.compile(r"Forwarding from 127\.0\.0\.1:(\d+) ->")


def forwarded_port(line: str) -> int | None:
    """The local port `kubectl port-forward` announced on this line of its output, if any."""
    match = FORWARDING.search(line)
    return int(match.group(1)) if match else None


def event_key(event: dict[str, Any]) -> str:
    """Events are deduplicated by the API server (count++); key on uid and count."""
    count = event.get("count") or (event.get("series") or {}).get("count", 1)
    return f"{event['metadata']['uid']}/{count}"


# --- I/O: the cluster, through kubectl and helm ------------------------------------------


@dataclass
class Cluster:
    kubeconfig: str
    bin_dir: Path
    env_lines: list[str] = field(default_factory=list)

    def run(
        self,
        tool: str,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.bin_dir / tool), *args],
            input=input,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
            env={**os.environ, "KUBECONFIG": self.kubeconfig},
        )
        if check and result.returncode != 0:
            raise DemoError(f"{tool} {' '.join(args)} failed:\n{result.stderr.strip()}")
        return result

    def kubectl(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return self.run("kubectl", *args, **kwargs)

    def get_json(self, *args: str) -> dict[str, Any]:
        return dict(json.loads(self.kubectl("get", *args, "-o", "json").stdout))

    def apply(self, document: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump(document, allow_unicode=True))

    @contextlib.contextmanager
    def port_forward(self, namespace: str, pod: str, port: int) -> Iterator[str]:
        """`kubectl port-forward pod/POD :PORT`, as a user reaches a port that the pod's
        NetworkPolicy closes to everyone but the operator (8001) or monitoring (9400).
        Yields http://127.0.0.1:LOCAL; kubectl picks the local port and prints it."""
        process = subprocess.Popen(
            [str(self.bin_dir / "kubectl"), "-n", namespace, "port-forward"]
            + ["--address=127.0.0.1", f"pod/{pod}", f":{port}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "KUBECONFIG": self.kubeconfig},
        )
        try:
            assert process.stdout is not None
            first = process.stdout.readline()  # kubectl prints it once it listens
            local = forwarded_port(first)
            if local is None:
                raise DemoError(f"kubectl port-forward {pod}:{port} failed: {first.strip()}")
            threading.Thread(target=process.stdout.read, daemon=True).start()  # keep it drained
            yield f"http://127.0.0.1:{local}"
        finally:
            process.terminate()
            process.wait(timeout=10)


def localcluster(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "localcluster", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )


class Stages:
    """Prints each stage's title and, when it ends, how long it took."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.times: list[tuple[str, float]] = []

    @contextlib.contextmanager
    def stage(self, title: str) -> Iterator[None]:
        print(f"\n=== {title}", flush=True)
        start = time.monotonic()
        yield
        took = time.monotonic() - start
        self.times.append((title, took))
        print(f"--- {title}: {took:.1f} s", flush=True)

    def summary(self) -> None:
        print("\nStage times:")
        for title, took in self.times:
            print(f"  {took:6.1f} s  {title}")
        print(f"  {time.monotonic() - self.started:6.1f} s  total")


def say(text: str) -> None:
    print(f"  {text}", flush=True)


def start_cluster() -> Cluster:
    """Start localcluster with 2 simulated GPUs, or reuse the one that runs."""
    if localcluster("status", timeout=120).returncode == 0:
        say("localcluster is already up: reusing it")
    else:
        say("starting localcluster (1 node, simulated GPUs, 1 GiB of VRAM each) ...")
    # `up` is idempotent: on a running cluster it only re-applies the GPU count.
    # Its progress goes straight to the terminal: a cold start takes a while.
    started = subprocess.run(
        [PYTHON, "-m", "localcluster", "up", "--gpus", str(GPUS)],
        cwd=REPO,
        check=False,
        timeout=900,
    )
    if started.returncode != 0:
        raise DemoError("`python -m localcluster up` failed (its output is above)")
    env_lines = [
        line for line in localcluster("env").stdout.splitlines() if line.startswith("export ")
    ]
    values = dict(line.removeprefix("export ").split("=", 1) for line in env_lines)
    cluster = Cluster(values["KUBECONFIG"], Path(values["PATH"].split(":", 1)[0]), env_lines)
    node = cluster.get_json("nodes")["items"][0]
    gpus = node["status"]["allocatable"].get("nvidia.com/gpu", "0")
    labels = node["metadata"]["labels"]
    say(
        f"node {node['metadata']['name']}: nvidia.com/gpu={gpus}, "
        f"gpu.product={labels.get('nvidia.com/gpu.product')}, "
        f"gpu.memory={labels.get('nvidia.com/gpu.memory')} MiB"
    )
    return cluster


def node_cpu_millis(cluster: Cluster) -> int:
    text = cluster.get_json("nodes")["items"][0]["status"]["allocatable"]["cpu"]
    return int(text[:-1]) if text.endswith("m") else int(float(text) * 1000)


def ensure_namespace(cluster: Cluster, name: str) -> None:
    if cluster.kubectl("get", "namespace", name, check=False).returncode != 0:
        cluster.kubectl("create", "namespace", name)
    cluster.kubectl(
        "label",
        "--overwrite",
        "namespace",
        name,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/warn=restricted",
    )


def prepare_model(cluster: Cluster) -> None:
    """The tiny model in the cache, as a `local` PV and the PVC `models` the example names."""
    root = CACHE / "models" / "demo"
    target = root / "tiny"
    if (target / "config.json").exists():
        say(f"tiny model already in {target}")
    elif (CACHE / "models" / "tiny" / "config.json").exists():
        shutil.copytree(CACHE / "models" / "tiny", target, dirs_exist_ok=True)
        say(f"copied the tiny model from {CACHE / 'models' / 'tiny'} to {target}")
    else:
        say(f"generating the tiny model into {target} ...")
        subprocess.run(
            [PYTHON, "-m", "fusebox_server.model.tiny_model", str(target), "--size", "tiny"],
            cwd=REPO,
            check=True,
            timeout=600,
        )
    # Pods run as uid 65532: the files must be world-readable.
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)

    ensure_namespace(cluster, NAMESPACE)
    pv = cluster.kubectl("get", "pv", PV_NAME, "-o", "json", check=False)
    if pv.returncode != 0:
        made = localcluster("pv", PV_NAME, "--path", str(root), "--size", "1Gi", timeout=120)
        if made.returncode != 0:
            raise DemoError(f"`localcluster pv` failed: {made.stderr.strip()}")
        say(f"PersistentVolume {PV_NAME} -> {root}")
    elif json.loads(pv.stdout)["status"].get("phase") == "Released":
        # A previous demo namespace was deleted: free the Retain volume for a new claim.
        cluster.kubectl(
            "patch",
            "pv",
            PV_NAME,
            "--type",
            "json",
            "-p",
            '[{"op":"remove","path":"/spec/claimRef"}]',
        )
        say(f"PersistentVolume {PV_NAME} released by an old claim: made available again")
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "models", "namespace": NAMESPACE},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "local",
                "volumeName": PV_NAME,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        }
    )
    say(f"PersistentVolumeClaim {NAMESPACE}/models (the example's source pvc://models/tiny)")


def check_images(pods: list[dict[str, Any]]) -> None:
    """Fail at once, saying what to run, when an image was never loaded into the cluster."""
    for pod in pods:
        for container in pod["status"].get("containerStatuses") or []:
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull"):
                raise DemoError(
                    f"image {container.get('image')} is not in the cluster"
                    f" ({waiting['reason']}): run `make images`"
                )


PUSHED = re.compile(r"^registry: pushed (\S+)@(sha256:[0-9a-f]{64})$", re.M)


def registry_install(cluster: Cluster) -> list[str]:
    """helm's chart reference and values for installing from the cluster's registry, as
    a platform team installs (docs/day-one.md): the operator's image and the chart
    pushed there, the image pinned by its digest and pulled with a Secret. The
    checkout's chart and the imported image when the cluster runs no registry
    (FUSEBOX_LOCALCLUSTER_REGISTRY=off)."""
    env = dict(line.removeprefix("export ").split("=", 1) for line in cluster.env_lines)
    address = env.get("FUSEBOX_REGISTRY")
    if not address:
        say("the cluster runs no registry: the chart from the checkout, the imported image")
        return [str(CHART)]
    pushed = localcluster("registry", "push", OPERATOR_IMAGE, timeout=1800)
    if pushed.returncode != 0:
        raise DemoError(f"`python -m localcluster registry push` failed:\n{pushed.stderr}")
    digests = dict(PUSHED.findall(pushed.stdout))
    chart = next(ref for ref in digests if ref.startswith(f"oci://{address}/charts/fusebox:"))
    secret = localcluster(
        "registry", "pull-secret", "--name", "regcred", "--namespace", OPERATOR_NAMESPACE
    )
    if secret.returncode != 0:
        raise DemoError(f"the registry's pull Secret: {secret.stderr}")
    cluster.kubectl("apply", "-f", "-", input=secret.stdout)
    reference, version = chart.rsplit(":", 1)
    say(f"operator image and chart from the registry: {reference} {version}")
    return [
        reference,
        *("--version", version),
        *("--ca-file", env["FUSEBOX_REGISTRY_CA"]),
        *("--registry-config", env["FUSEBOX_REGISTRY_AUTH"]),
        *("--set", f"image.repository={address}/fusebox/operator"),
        *("--set", f"image.digest={digests[f'{address}/fusebox/operator:dev']}"),
        *("--set", "imagePullSecrets[0]=regcred"),
    ]


def install_operator(cluster: Cluster) -> None:
    ensure_namespace(cluster, OPERATOR_NAMESPACE)
    result = cluster.run(
        "helm",
        "upgrade",
        "--install",
        RELEASE,
        *registry_install(cluster),
        "--namespace",
        OPERATOR_NAMESPACE,
        # Only the demo's namespace: a demo operator left running must never
        # act on services of other namespaces (or of tests reusing the cluster).
        "--set",
        f"watchNamespaces={{{NAMESPACE}}}",
        # A rerun is an upgrade: the chart's pre-upgrade hook Job applies crds/ first,
        # as for any user (docs/releases.md).
        timeout=300,
    )
    summary = [
        line.strip()
        for line in result.stdout.splitlines()
        if line.startswith(("NAME:", "NAMESPACE:", "STATUS:", "REVISION:"))
    ]
    say("helm: " + ", ".join(summary))
    say(f"the operator watches namespace {NAMESPACE} only (chart value watchNamespaces)")
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        pods = cluster.get_json(
            "pods", "-n", OPERATOR_NAMESPACE, "-l", "app.kubernetes.io/name=fusebox-operator"
        )
        check_images(pods["items"])
        rollout = cluster.kubectl(
            "-n",
            OPERATOR_NAMESPACE,
            "rollout",
            "status",
            f"deployment/{RELEASE}-operator",
            "--timeout=5s",
            check=False,
        )
        if rollout.returncode == 0:
            name = pods["items"][0]["metadata"]["name"] if pods["items"] else "?"
            say(f"operator pod {name} is Ready")
            return
    raise DemoError(
        "the operator did not become Ready in 180 s: `kubectl -n fusebox-system describe pods`"
    )


def apply_service(cluster: Cluster) -> dict[str, Any]:
    example = yaml.safe_load(EXAMPLE.read_text())
    service, notes = demo_service(example, node_cpu_millis(cluster))
    service.setdefault("metadata", {})["namespace"] = NAMESPACE
    say(f"applying {EXAMPLE.relative_to(REPO)} with the demo's overrides:")
    for note in notes:
        say(f"  - {note}")
    cluster.apply(service)
    return service


def service_status(cluster: Cluster, name: str) -> dict[str, Any]:
    found = cluster.kubectl("-n", NAMESPACE, "get", "fis", name, "-o", "json", check=False)
    return dict(json.loads(found.stdout).get("status") or {}) if found.returncode == 0 else {}


def ready_pods(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    pods = cluster.get_json("pods", "-n", NAMESPACE, "-l", f"fusebox.dev/service={name}")["items"]
    check_images(pods)
    ready = []
    for pod in pods:
        conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions") or []}
        if conditions.get("Ready") == "True" and not pod["metadata"].get("deletionTimestamp"):
            ready.append(pod)
    return ready


def wait_ready(cluster: Cluster, name: str, desired: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        status = service_status(cluster, name)
        pods = ready_pods(cluster, name)
        line = progress_line(status, len(pods), desired)
        if line != last:
            say(line)
            last = line
        if len(pods) >= desired and condition(status, "Ready").get("status") == "True":
            return
        time.sleep(1)
    raise DemoError(f"{name} was not Ready after {timeout:.0f} s; last: {last}")


def stream_chat(base_url: str) -> None:
    import openai  # the real client, as a user of the service would use it

    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="not-needed", max_retries=2)
    prompt = "Hello, how are you?"
    say(f"user: {prompt}")
    print("  chat: ", end="", flush=True)
    started = time.monotonic()
    first: float | None = None
    pieces = 0
    stream = client.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": prompt}],
        max_tokens=48,
        stream=True,
    )
    for chunk in stream:
        if not chunk.choices:
            continue
        text = chunk.choices[0].delta.content or ""
        if text:
            first = first if first is not None else time.monotonic() - started
            pieces += 1
            print(text, end="", flush=True)
    print()
    ttft = f"{first * 1000:.0f} ms" if first is not None else "-"
    say(f"{pieces} streamed chunks, first after {ttft}, all in {time.monotonic() - started:.2f} s")
    say("(the tiny model is random-weighted: the words are noise, the streaming is real)")


def admin_call(admin_url: str, token: str, body: AdminRequest) -> tuple[int, str]:
    """One admin request, to its path, in the contract's wire form; the status and answer."""
    request = urllib.request.Request(
        f"{admin_url}{body.path}",
        data=json.dumps(body.encode()).encode(),
        method=body.path.method,
    )
    request.add_header("Content-Type", "application/json")
    request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read().decode()
    except OSError as error:
        return 0, str(error)


def metric_value(text: str, name: str) -> float | None:
    """The first sample of an unlabelled metric in Prometheus text, or None."""
    for line in text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    return None


def sidecar_rss(metrics_url: str) -> float | None:
    """The pod's RSS as its sidecar reports it now (the operator's status lags up to 30 s)."""
    try:
        with urllib.request.urlopen(f"{metrics_url}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    return metric_value(text, "fusebox_process_resident_memory_bytes")


def chat_once(url: str) -> int:
    body = {"model": "chat", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}
    request = urllib.request.Request(f"{url}/v1/chat/completions", data=json.dumps(body).encode())
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as error:
        with error:
            return int(error.code)
    except OSError:
        return 0


class Traffic:
    """Requests to one pod, one at a time, each growing the armed leak."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.statuses: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            status = chat_once(self.url)
            self.statuses[status] = self.statuses.get(status, 0) + 1
            self._stop.wait(0.5)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=40)


def service_events(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    events = cluster.get_json(
        "events",
        "-n",
        NAMESPACE,
        "--field-selector",
        f"involvedObject.kind=InferenceService,involvedObject.name={name}",
    )["items"]
    events.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    return list(events)


def leak_and_watch(cluster: Cluster, name: str, timeout: float = 150) -> None:
    pods = ready_pods(cluster, name)
    if not pods:
        raise DemoError("no ready pod to inject the leak into")
    pod = pods[0]
    pod_name, pod_ip = pod["metadata"]["name"], pod["status"]["podIP"]
    token = base64.b64decode(
        cluster.kubectl(
            "-n", NAMESPACE, "get", "secret", f"{name}-admin", "-o", "jsonpath={.data.token}"
        ).stdout
    ).decode()
    say(f"admin token read from Secret {name}-admin (not printed)")
    with contextlib.ExitStack() as forwards:
        admin_url = forwards.enter_context(cluster.port_forward(NAMESPACE, pod_name, ADMIN_PORT))
        metrics_url = forwards.enter_context(
            cluster.port_forward(NAMESPACE, pod_name, METRICS_PORT)
        )
        say(
            f"admin port {ADMIN_PORT} and sidecar port {METRICS_PORT} of {pod_name} reached"
            " through `kubectl port-forward` (its NetworkPolicy admits only the operator"
            " and the monitoring namespace there)"
        )
        leak_with(cluster, name, pod_name, pod_ip, token, admin_url, metrics_url, timeout)


def leak_with(
    cluster: Cluster,
    name: str,
    pod_name: str,
    pod_ip: str,
    token: str,
    admin_url: str,
    metrics_url: str,
    timeout: float,
) -> None:
    seen = {event_key(e) for e in service_events(cluster, name)}
    leak = FaultsRequest({Fault.LEAK: LEAK_MIB_PER_REQUEST})
    code, body = admin_call(admin_url, token, leak)
    call = f"{leak.path.method} {leak.path} {json.dumps(leak.encode())}"
    if code != 200:
        raise DemoError(f"{call} on {pod_name} answered {code}: {body}")
    say(f"{call} on {pod_name} -> {code} {body.strip()}")
    say(
        f"now every request to {pod_name} holds {LEAK_MIB_PER_REQUEST} MiB more;"
        " driving requests ..."
    )
    status = service_status(cluster, name)
    limit = (status.get("memory") or {}).get("limitBytes")
    ratio = RSS_RATIO_OF_LIMIT
    if isinstance(limit, int):
        say(
            f"memory limit {mib(limit)}: the ladder starts above"
            f" {mib(limit * ratio)} RSS while growing"
        )
    recovered = False
    last_rss = ""
    deadline = time.monotonic() + timeout
    with Traffic(f"http://{pod_ip}:{Port.API}") as traffic:
        while time.monotonic() < deadline and not recovered:
            time.sleep(1)
            status = service_status(cluster, name)
            rss = f"{pod_name} rss={mib(sidecar_rss(metrics_url))}"
            if rss != last_rss:
                breaker = (status.get("breaker") or {}).get("state", "-")
                pressure = condition(status, "MemoryPressure").get("status", "-")
                say(
                    f"{rss}  MemoryPressure={pressure}  breaker={breaker}"
                    f"  requests={traffic.statuses}"
                )
                last_rss = rss
            for event in service_events(cluster, name):
                key = event_key(event)
                if key in seen:
                    continue
                seen.add(key)
                say(event_line(event))
                # A reload, swap or restart drops the leaked blocks with the model.
                if event.get("reason") in RECOVERED_REASONS:
                    recovered = True
    if not recovered:
        say(f"the operator took no recovering step within {timeout:.0f} s (see the events above)")
    refused = traffic.statuses.get(503, 0)
    if refused:
        say(f"{refused} request(s) got 503 + Retry-After while the model was out")
    # Stop the fault whatever happened (a restarted pod starts with leak:0 anyway).
    code, _ = admin_call(admin_url, token, FaultsRequest({Fault.LEAK: 0}))
    say(f"leak switched off on {pod_name}: {code or 'pod gone (restarted)'}")
    time.sleep(6)
    status = service_status(cluster, name)
    last = status.get("lastAction") or {}
    if last:
        say(
            f"status.lastAction: {last.get('type')} on {last.get('pod')} "
            f"because {last.get('reason')} -> {last.get('result')}"
        )
    say(f"{pod_name} rss now {mib(sidecar_rss(metrics_url))} (sidecar)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-leak", action="store_true", help="stop after the chat")
    args = parser.parse_args(argv)
    stages = Stages()
    try:
        with stages.stage("1. cluster: localcluster with simulated GPUs"):
            cluster = start_cluster()
        with stages.stage("2. model: the tiny model behind PV + PVC `models`"):
            prepare_model(cluster)
        with stages.stage("3. operator: helm upgrade --install fusebox"):
            install_operator(cluster)
        with stages.stage("4. service: crds/examples/tiny-chat.yaml, 2 replicas"):
            service = apply_service(cluster)
            name = service["metadata"]["name"]
            wait_ready(cluster, name, int(service["spec"].get("replicas", 1)))
        with stages.stage("5. chat: streamed through the Service ClusterIP with the openai client"):
            ip = cluster.kubectl(
                "-n", NAMESPACE, "get", "service", name, "-o", "jsonpath={.spec.clusterIP}"
            ).stdout.strip()
            say(f"Service {name} ClusterIP {ip} (routed from this host by localcluster)")
            stream_chat(f"http://{ip}:{Port.API}")
        if not args.skip_leak:
            with stages.stage("6. leak: inject a memory leak and watch the operator"):
                leak_and_watch(cluster, name)
        with stages.stage("7. what kubectl shows"):
            print(cluster.kubectl("-n", NAMESPACE, "get", "fis").stdout)
            print(cluster.kubectl("-n", NAMESPACE, "describe", "fis", name).stdout)
    except DemoError as error:
        print(f"\ndemo stopped: {error}", file=sys.stderr)
        return 1
    stages.summary()
    print("\nThe cluster keeps running. To use it from this shell:")
    for line in cluster.env_lines:
        print(f"  {line}")
    print(f"  kubectl -n {NAMESPACE} get fis")
    print("Stop it with: make demo-down")
    print("The demo's pods hold most of the node's CPU: run make demo-down before make test.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
