"""Fixtures of the operator's e2e tests: the CRD, the operator as a host
process against the cluster, the tiny model behind a PVC, and polling helpers.

The operator runs on the host (not as a pod) so a test can kill and restart
it; localcluster routes pod IPs to the host, so it scrapes and calls the
admin API exactly as it would in-cluster. Every wait polls with a generous
deadline and fails with what it last saw.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
CRD = REPO / "crds" / "inferenceservice.yaml"
T = TypeVar("T")


def wait_for(
    what: str,
    probe: Callable[[], T | None],
    timeout: float = 240,
    every: float = 2,
    diagnose: Callable[[], str] | None = None,
) -> T:
    """Poll until probe() returns something truthy; fail naming `what`, the last value
    and, when given, what `diagnose()` says about why (pod phases, conditions, events)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(every)
    why = f"\n{diagnose()}" if diagnose is not None else ""
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}; last seen: {last!r}{why}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class OperatorProcess:
    """`python -m fusebox_operator` on the host, restartable by tests."""

    kubeconfig: Path
    log_dir: Path
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def start(self) -> None:
        self.starts += 1
        log = open(self.log_dir / f"operator-{self.starts}.log", "wb")  # noqa: SIM115
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "FUSEBOX_LIVENESS_PORT": str(free_port()),
            "FUSEBOX_PEERING": "standalone",
            "FUSEBOX_WATCH_NAMESPACES": "",
            "PYTHONPATH": str(REPO / "operator"),
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "fusebox_operator"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
        log.close()

    def kill(self) -> None:
        """SIGKILL: no cleanup, exactly like a crashed or evicted operator."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)
        self.process = None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def log_tail(self) -> str:
        path = self.log_dir / f"operator-{self.starts}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""


@pytest.fixture(scope="session")
def crd(cluster: Any) -> None:
    cluster.kubectl("apply", "-f", str(CRD))
    cluster.kubectl(
        "wait", "--for=condition=Established", "crd/inferenceservices.fusebox.dev", "--timeout=60s"
    )


@pytest.fixture(scope="session")
def operator(
    cluster: Any, crd: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    process = OperatorProcess(cluster.kubeconfig, tmp_path_factory.mktemp("operator-logs"))
    process.start()
    try:
        yield process
    finally:
        process.stop()


@dataclass
class Service:
    """One InferenceService under test, with its namespace and helpers."""

    cluster: Any
    namespace: str
    name: str

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> Any:
        return self.cluster.kubectl("-n", self.namespace, *args, input=input, check=check)

    def get(self) -> dict[str, Any]:
        out = self.kubectl("get", "inferenceservice", self.name, "-o", "json").stdout
        return dict(json.loads(out))

    def status(self) -> dict[str, Any]:
        return dict(self.get().get("status") or {})

    def condition(self, type_: str) -> dict[str, Any]:
        for condition in self.status().get("conditions") or []:
            if condition.get("type") == type_:
                return dict(condition)
        return {}

    def events(self) -> list[dict[str, Any]]:
        out = self.kubectl(
            "get",
            "events",
            "--field-selector",
            f"involvedObject.kind=InferenceService,involvedObject.name={self.name}",
            "-o",
            "json",
        ).stdout
        items = json.loads(out)["items"]
        # Timestamps have one-second resolution; the resourceVersion orders creation
        # (kopf posts in order and never updates an event).
        items.sort(key=lambda e: int(e["metadata"]["resourceVersion"]))
        return list(items)

    def event_reasons(self) -> list[str]:
        return [e["reason"] for e in self.events()]

    def pods(self) -> list[dict[str, Any]]:
        out = self.kubectl(
            "get", "pods", "-l", f"fusebox.dev/service={self.name}", "-o", "json"
        ).stdout
        return list(json.loads(out)["items"])

    def ready_pods(self) -> list[dict[str, Any]]:
        ready = []
        for pod in self.pods():
            conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions") or []}
            if conditions.get("Ready") == "True" and not pod["metadata"].get("deletionTimestamp"):
                ready.append(pod)
        return ready

    def diagnose_pods(self) -> str:
        """Why pods are not ready, as `kubectl describe` would tell: each pod's phase, its
        conditions that are not True (reason and message), waiting containers, and the
        pod's recent Warning events (scheduling failures included)."""
        lines = []
        pods = self.pods()
        if not pods:
            lines.append(
                f"no pods of {self.name}; service conditions: {self.status().get('conditions')}"
            )
        for pod in pods:
            name, status = pod["metadata"]["name"], pod.get("status") or {}
            lines.append(f"pod {name}: phase {status.get('phase')}")
            for condition in status.get("conditions") or []:
                if condition.get("status") != "True":
                    lines.append(
                        f"  {condition['type']}={condition.get('status')} "
                        f"{condition.get('reason', '')}: {condition.get('message', '')}"
                    )
            for container in status.get("containerStatuses") or []:
                waiting = (container.get("state") or {}).get("waiting")
                if waiting:
                    lines.append(
                        f"  container {container['name']} waiting: {waiting.get('reason')} "
                        f"{waiting.get('message', '')}"
                    )
            events = self.kubectl(
                "get",
                "events",
                "--field-selector",
                f"involvedObject.kind=Pod,involvedObject.name={name},type=Warning",
                "-o",
                "json",
                check=False,
            ).stdout
            for event in (json.loads(events or "{}").get("items") or [])[-3:]:
                lines.append(f"  event {event.get('reason')}: {event.get('message')}")
        return "\n".join(lines)

    def admin_token(self) -> str:
        out = self.kubectl(
            "get", "secret", f"{self.name}-admin", "-o", "jsonpath={.data.token}"
        ).stdout
        import base64

        return base64.b64decode(out).decode()

    def service_url(self) -> str:
        ip = self.kubectl("get", "service", self.name, "-o", "jsonpath={.spec.clusterIP}").stdout
        return f"http://{ip.strip()}:8000"


def http(
    method: str,
    url: str,
    body: dict[str, Any] | None = None,
    token: str | None = None,
    timeout: float = 30,
) -> tuple[int, dict[str, Any] | str]:
    """One HTTP call; returns (status, parsed JSON or text); connection errors are status 0."""
    reply = http_reply(method, url, body, token, timeout)
    return reply.status, reply.body


def chat(url: str, content: str = "Hello", max_tokens: int = 8, timeout: float = 60) -> int:
    status, _ = http(
        "POST",
        f"{url}/v1/chat/completions",
        {
            "model": "chat",
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
        },
        timeout=timeout,
    )
    return status


ServiceFactory = Callable[..., Service]


@pytest.fixture
def inference_service(
    cluster: Any, namespace: str, operator: OperatorProcess, model_claim: str
) -> ServiceFactory:
    """Apply InferenceServices in the test namespace, next to the model PVC."""

    def make(name: str, spec: dict[str, Any]) -> Service:
        document = {
            "apiVersion": "fusebox.dev/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec,
        }
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(document, allow_unicode=True))
        return Service(cluster, namespace, name)

    return make


def base_spec(**overrides: Any) -> dict[str, Any]:
    """A small, fast service: CPU only, one replica, shrunk timings."""
    spec: dict[str, Any] = {
        "model": {"name": "chat", "source": "pvc://models/tiny"},
        "fallback": {"quantization": "int8"},
        "replicas": 1,
        "gpu": {"count": 0},
        "memory": {"limit": "2Gi"},
        "server": {
            "cpu": "500m",
            "maxNewTokens": 16,
            "requestTimeoutSeconds": 20,
            # FUSEBOX_LATENCY_WINDOW is reserved now (fusebox_contract.settings).
            "env": [],
        },
        "degradation": {"coolOffSeconds": 15, "cannedAnswers": {"你好": "你好！"}},
        "telemetry": {
            "scrapeIntervalSeconds": 2,
            "scrapeTimeoutSeconds": 1.5,
            "wedgeAfterSeconds": 8,
        },
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key] = {**spec[key], **value}
        else:
            spec[key] = value
    return spec


def pod_url(pod: dict[str, Any], port: int) -> str:
    return f"http://{pod['status']['podIP']}:{port}"


# --- helpers of the seams tests (issue 10) ----------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """One HTTP answer with its headers (names lower-cased); status 0 is a connection error."""

    status: int
    headers: dict[str, str]
    body: dict[str, Any] | str


def http_reply(
    method: str,
    url: str,
    body: dict[str, Any] | None = None,
    token: str | None = None,
    timeout: float = 30,
) -> Reply:
    """One HTTP call with its response headers; connection errors are status 0."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            text = response.read().decode()
            status = response.status
            headers = {k.lower(): v for k, v in response.headers.items()}
    except urllib.error.HTTPError as error:
        with error:
            text = error.read().decode()
            status = error.code
            headers = {k.lower(): v for k, v in error.headers.items()}
    except (OSError, TimeoutError) as error:
        return Reply(0, {}, str(error))
    try:
        return Reply(status, headers, json.loads(text))
    except ValueError:
        return Reply(status, headers, text)


def chat_reply(url: str, content: str = "Hello", max_tokens: int = 8, timeout: float = 60) -> Reply:
    return http_reply(
        "POST",
        f"{url}/v1/chat/completions",
        {
            "model": "chat",
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
        },
        timeout=timeout,
    )


def answer_text(reply: Reply) -> str | None:
    """The assistant's text of a chat completion, or None when the reply is not one."""
    if not isinstance(reply.body, dict):
        return None
    try:
        return str(reply.body["choices"][0]["message"]["content"])
    except (KeyError, IndexError, TypeError):
        return None


def ready_endpoints(service: Service) -> int:
    """Ready addresses behind the Service, from its EndpointSlices (-1 if kubectl failed)."""
    result = service.kubectl(
        "get",
        "endpointslices",
        "-l",
        f"kubernetes.io/service-name={service.name}",
        "-o",
        "json",
        check=False,
    )
    if result.returncode != 0:
        return -1
    return sum(
        1
        for item in json.loads(result.stdout)["items"]
        for endpoint in item.get("endpoints") or []
        if (endpoint.get("conditions") or {}).get("ready") is True
    )


@pytest.fixture(scope="session")
def two_gpus(cluster: Any) -> None:
    """At least two simulated GPUs on the node (localcluster: `up --gpus 2` re-applies them)."""

    def allocatable() -> int:
        out = cluster.kubectl(
            "get", "nodes", "-o", "jsonpath={.items[0].status.allocatable.nvidia\\.com/gpu}"
        ).stdout.strip()
        return int(out or 0)

    if allocatable() >= 2:
        return
    if not cluster.local:
        pytest.fail("the cluster's node offers fewer than 2 nvidia.com/gpu")
    result = subprocess.run(
        [sys.executable, "-m", "localcluster", "up", "--gpus", "2"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    wait_for("2 allocatable GPUs", lambda: allocatable() >= 2, timeout=60)
