"""Fixtures of the operator's e2e tests: the CRD, the operator as users install it
(the Helm chart, the operator image built from this tree, its ServiceAccount, RBAC
and NetworkPolicies), the tiny model behind a PVC, and polling helpers.

Every operator release of the suite is installed as a platform team installs it
(docs/day-one.md): on localcluster, the chart from its authenticated registry
(`oci://`), the operator's image from there too, pinned by the digest pushed at
the session's first install, pulled with a pull Secret in the release's namespace.
On an external cluster, the checkout's chart and the imported image.

The suite's operator is a Helm release of its own, in a namespace of its own,
watching only the test namespaces (`e2e-*`, see the `namespace` fixture): it
never acts on another release's services (the demo's) and no other release acts
on ours. Both run one replica, so kopf runs standalone and never peers: two
releases cannot pause each other. A test that crashes the operator deletes its
pod with --grace-period=0 --force and waits for the Deployment's new pod; the
operator's log comes from `kubectl logs` and is attached to every failed test
that used it. A host-process operator exists only in tests/integration/operator/.
Every wait polls with a generous deadline and fails with what it last saw.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from fusebox_contract.admin import FaultsRequest
from fusebox_contract.names import EventReason, Fault
from fusebox_contract.wiring import Port
from localcluster.config import default_name, load_saved

from ..conftest import (
    Cluster,
    helm,
    localcluster,
    pod_port_forwards,
    wait_established,
    wait_for,
)
from ..monitoring import monitoring_installed, prometheus  # noqa: F401 (fixtures)

REPO = Path(__file__).resolve().parents[3]
CRD = REPO / "crds" / "inferenceservice.yaml"
CHART = REPO / "helm" / "fusebox"
CRD_NAME = "inferenceservices.fusebox.dev"
# kopf's peering CRDs, which `helm install` would create from the chart's crds/: the
# suite installs with --skip-crds, and every release watching named namespaces peers.
PEERING_CRDS = CHART / "crds" / "kopf-peerings.yaml"
PEERING_CRD_NAMES = ("kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev")
# The `namespace` fixture names every test namespace e2e-<test>-<hex>.
TEST_NAMESPACES = "e2e-*"
OPERATOR_LOG_LINES = 80
# The kubelet's liveness probe and kopf's probe activity: 2 lines per probe, 3 a minute.
PROBE_NOISE = ("aiohttp.access", "Activity 'scrapedAt' succeeded")
PROBE_LINES_PER_MINUTE = 6
# The suite's operator puts back children edited by hand this often (chart value
# resyncSeconds, 60 by default): every service of the suite is resynced, so a
# resync that wrongly sees drift shows as ChildRestored events anywhere.
RESYNC_SECONDS = 10
OPERATOR_IMAGE = "localhost/fusebox/operator:dev"
PULL_SECRET = "regcred"
_PUSHED = re.compile(r"^registry: pushed (?P<ref>\S+)@(?P<digest>sha256:[0-9a-f]{64})$", re.M)


@dataclass(frozen=True)
class LabRegistry:
    """localcluster's authenticated registry holding this tree's operator image and
    chart, as `python -m localcluster registry push` left them."""

    address: str  # HOST:PORT
    ca: str  # the CA file helm trusts it by
    auth: str  # helm's registry config with the credentials
    operator_digest: str
    chart_version: str

    def chart(self) -> tuple[str, ...]:
        """The chart's reference and the flags helm needs to pull it."""
        return (
            f"oci://{self.address}/charts/fusebox",
            *("--version", self.chart_version),
            *("--ca-file", self.ca),
            *("--registry-config", self.auth),
        )

    def values(self) -> tuple[str, ...]:
        """The operator's image from the registry, by digest, with the pull Secret."""
        return (
            *("--set", f"image.repository={self.address}/fusebox/operator"),
            *("--set", f"image.digest={self.operator_digest}"),
            *("--set", f"imagePullSecrets[0]={PULL_SECRET}"),
        )

    def grant(self, cluster: Cluster, namespace: str) -> None:
        """The pull Secret in `namespace` (applied: a second release there reuses it)."""
        secret = localcluster(
            "registry", "pull-secret", "--name", PULL_SECRET, "--namespace", namespace
        )
        assert secret.returncode == 0, secret.stderr
        cluster.kubectl("apply", "-f", "-", input=secret.stdout)


def pushed_digests(output: str) -> dict[str, str]:
    """`registry push`'s lines as reference -> digest (the chart's reference ends in
    :VERSION, as `oci://HOST:PORT/charts/fusebox:0.1.0`)."""
    return {m["ref"]: m["digest"] for m in _PUSHED.finditer(output)}


@functools.cache
def lab_registry() -> LabRegistry:
    """Push this tree's operator image and chart once per session (unchanged layers are
    not sent again) and say where they are."""
    exported = dict(
        line.removeprefix("export ").split("=", 1)
        for line in localcluster("env").stdout.splitlines()
        if line.startswith("export FUSEBOX_REGISTRY")
    )
    pushed = localcluster("registry", "push", OPERATOR_IMAGE)
    assert pushed.returncode == 0, f"registry push failed:\n{pushed.stdout}\n{pushed.stderr}"
    digests = pushed_digests(pushed.stdout)
    address = exported["FUSEBOX_REGISTRY"]
    charts = [ref for ref in digests if ref.startswith(f"oci://{address}/charts/fusebox:")]
    assert len(charts) == 1, pushed.stdout
    return LabRegistry(
        address=address,
        ca=exported["FUSEBOX_REGISTRY_CA"],
        auth=exported["FUSEBOX_REGISTRY_AUTH"],
        operator_digest=digests[f"{address}/fusebox/operator:dev"],
        chart_version=charts[0].rsplit(":", 1)[1],
    )


def pod_is_ready(pod: dict[str, Any]) -> bool:
    conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions") or []}
    return conditions.get("Ready") == "True" and not pod["metadata"].get("deletionTimestamp")


def describe_pods(cluster: Cluster, namespace: str, pods: list[dict[str, Any]]) -> list[str]:
    """Why pods are not ready, as `kubectl describe` would tell: each pod's phase, its
    conditions that are not True (reason and message), waiting containers, and the
    pod's recent Warning events (scheduling failures included)."""
    lines = []
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
        events = cluster.kubectl(
            "-n",
            namespace,
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
    return lines


@dataclass
class OperatorRelease:
    """The operator as a Helm release: its pods, its log, and a crash on demand."""

    cluster: Cluster
    namespace: str
    release: str

    @property
    def selector(self) -> str:
        return f"app.kubernetes.io/name=fusebox-operator,app.kubernetes.io/instance={self.release}"

    def pods(self) -> list[dict[str, Any]]:
        out = self.cluster.kubectl(
            "-n", self.namespace, "get", "pods", "-l", self.selector, "-o", "json"
        ).stdout
        return list(json.loads(out)["items"])

    def ready_pod(self) -> dict[str, Any] | None:
        ready = [p for p in self.pods() if pod_is_ready(p)]
        return ready[0] if len(ready) == 1 else None

    def crash(self, then: Callable[[], None] | None = None) -> str:
        """Delete the operator pod with no grace (a crash or an eviction: no cleanup),
        run `then` (another fault at the same moment), then wait for the Deployment's
        replacement to be Ready; returns its name."""
        pod = wait_for("the operator pod Ready", self.ready_pod, timeout=120)
        old = pod["metadata"]["name"]
        self.cluster.kubectl(
            "-n", self.namespace, "delete", "pod", old, "--grace-period=0", "--force"
        )
        if then is not None:
            then()
        new = wait_for(
            "a new operator pod Ready",
            lambda: (p := self.ready_pod()) and p["metadata"]["name"] != old and p,
            timeout=180,
            diagnose=self.describe,
        )
        return str(new["metadata"]["name"])

    def logs(self, lines: int = OPERATOR_LOG_LINES) -> str:
        """`kubectl logs` of the operator's current pod(s): the last `lines` of each
        that are not the kubelet's probes (one pair every 20 s would bury the rest)."""
        result = self.cluster.kubectl(
            "-n",
            self.namespace,
            "logs",
            "-l",
            self.selector,
            f"--tail={lines + PROBE_LINES_PER_MINUTE * 30}",
            "--prefix",
            check=False,
        )
        kept = [
            line
            for line in (result.stdout + result.stderr).splitlines()
            if not any(noise in line for noise in PROBE_NOISE)
        ]
        return "\n".join(kept[-lines:])

    def describe(self) -> str:
        lines = describe_pods(self.cluster, self.namespace, self.pods())
        return "\n".join(lines) or f"no pods match {self.selector}"

    def install(
        self, *values: str, timeout: str = "4m", chart: Sequence[str] | None = None
    ) -> None:
        """`helm upgrade --install` of the chart as this release, waiting for it; when
        helm gives up, the failure says why: its error, then each operator pod's phase,
        unmet conditions and Warning events (a node without room, a refused image).
        `chart`: the chart's reference and the flags that reach it (an oci:// one
        with --version, --ca-file, --registry-config). By default the lab registry's
        chart and image (LabRegistry) on localcluster, else the checkout's chart."""
        if chart is None and self.cluster.local:
            registry = lab_registry()
            registry.grant(self.cluster, self.namespace)
            chart, values = registry.chart(), (*registry.values(), *values)
        elif chart is None:
            chart = (str(CHART),)
        try:
            helm(
                self.cluster,
                *("upgrade", "--install", self.release, *chart, "--namespace", self.namespace),
                "--skip-crds",  # the `crd` fixture owns the CRD
                # The chart's hooks off, as before they existed: the `crd` fixture owns
                # the CRD (an upgrade hook would re-apply crds/, and fail on the kopf
                # peering CRDs --skip-crds never installed), and teardown deletes the
                # services itself (uninstall_with_services), so no guard may stop it.
                *("--set", "crds.upgradeOnHelmUpgrade=false", "--set", "uninstall.guard=false"),
                *values,
                *("--wait", "--timeout", timeout),
                timeout=600,
            )
        except AssertionError as helm_failed:
            pytest.fail(f"{helm_failed}\n{self.describe()}")

    def uninstall_with_services(self) -> None:
        """Delete the release's InferenceServices while its operator still runs (it
        releases their finalizers), then uninstall it; a best effort, for teardown."""
        self.cluster.kubectl(
            "-n",
            self.namespace,
            "delete",
            "inferenceservices.fusebox.dev",
            "--all",
            "--timeout=120s",
            check=False,
            timeout=150,
        )
        subprocess.run(
            [str(self.cluster.bin_dir / "helm"), f"--kubeconfig={self.cluster.kubeconfig}"]
            + ["uninstall", self.release, "--namespace", self.namespace, "--wait"],
            capture_output=True,
            check=False,
            timeout=180,
        )


@pytest.fixture(scope="session")
def crd(cluster: Cluster) -> Iterator[None]:
    """The CRD from crds/ and kopf's peering CRDs; each removed at the end only when
    this session created it (a CRD someone else installed, the demo's, keeps their
    InferenceServices and peerings)."""
    names = (CRD_NAME, *PEERING_CRD_NAMES)
    existed = {n for n in names if cluster.kubectl("get", "crd", n, check=False).returncode == 0}
    cluster.kubectl("apply", "-f", str(CRD), "-f", str(PEERING_CRDS))
    wait_established(cluster, *names)
    try:
        yield
    finally:
        for name in names:
            if name not in existed:
                cluster.kubectl("delete", "crd", name, "--wait=false", check=False)


@pytest.fixture(scope="session")
def operator(cluster: Cluster, crd: None) -> Iterator[OperatorRelease]:
    """The chart installed as a release of this session's own, in its own namespace,
    watching the test namespaces; uninstalled (and its namespace deleted) at the end."""
    suffix = uuid.uuid4().hex[:6]
    release = OperatorRelease(cluster, f"fusebox-e2e-{suffix}", f"e2e-{suffix}")
    cluster.kubectl("create", "namespace", release.namespace)
    cluster.kubectl(
        "label",
        "namespace",
        release.namespace,
        "pod-security.kubernetes.io/enforce=restricted",
    )
    try:
        release.install(
            "--set-json",
            f"watchNamespaces={json.dumps([TEST_NAMESPACES])}",
            "--set",
            f"resyncSeconds={RESYNC_SECONDS}",
        )
        wait_for(
            "the operator pod Ready", release.ready_pod, timeout=120, diagnose=release.describe
        )
        yield release
    finally:
        subprocess.run(
            [
                str(cluster.bin_dir / "helm"),
                f"--kubeconfig={cluster.kubeconfig}",
                "uninstall",
                release.release,
                "--namespace",
                release.namespace,
                "--wait",
                "--timeout",
                "2m",
            ],
            capture_output=True,
            check=False,
            timeout=180,
        )
        cluster.kubectl("delete", "namespace", release.namespace, "--wait=false", check=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Iterator[pytest.TestReport]:
    """A failed test that used the operator shows the operator's own log (kubectl logs)."""
    report: pytest.TestReport = yield
    release = getattr(item, "funcargs", {}).get("operator")
    if report.failed and call.when == "call" and isinstance(release, OperatorRelease):
        report.sections.append(("operator log (kubectl logs)", release.logs()))
    return report


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

    def deployment_replicas(self) -> int:
        """The replicas the operator set on the service's Deployment."""
        out = self.kubectl("get", "deployment", self.name, "-o", "jsonpath={.spec.replicas}")
        return int(out.stdout.strip() or 0)

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
        """Why pods are not ready (describe_pods), or that there are none."""
        pods = self.pods()
        lines = describe_pods(self.cluster, self.namespace, pods)
        if not pods:
            lines.append(
                f"no pods of {self.name}; service conditions: {self.status().get('conditions')}"
            )
        return "\n".join(lines)

    def diagnose(self) -> str:
        """Where the service stands: breaker, tier, variant, conditions that are not as
        wished, the last events, then each pod (diagnose_pods)."""
        status = self.status()
        lines = [
            f"{self.name}: breaker {(status.get('breaker') or {}).get('state')}, "
            f"tier {(status.get('degradation') or {}).get('tier')}, "
            f"variant {status.get('activeVariant')}"
        ]
        for condition in status.get("conditions") or []:
            lines.append(
                f"  condition {condition.get('type')}={condition.get('status')} "
                f"{condition.get('reason', '')}: {condition.get('message', '')}"
            )
        for event in self.events()[-8:]:
            lines.append(f"  event {event.get('reason')}: {event.get('message', '')[:200]}")
        return "\n".join([*lines, self.diagnose_pods()])

    def admin_token(self) -> str:
        out = self.kubectl(
            "get", "secret", f"{self.name}-admin", "-o", "jsonpath={.data.token}"
        ).stdout
        import base64

        return base64.b64decode(out).decode()

    def set_faults(self, pod: dict[str, Any], faults: dict[str, int]) -> None:
        """Set faults on one pod through its admin API, as an operator with the token would."""
        request = FaultsRequest({Fault(name): value for name, value in faults.items()})
        url = f"{pod_url(pod, Port.ADMIN)}{request.path}"
        reply = http_reply(request.path.method, url, request.encode(), token=self.admin_token())
        assert reply.status == 200, reply

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


@contextmanager
def traffic(url: str, every_seconds: float) -> Iterator[None]:
    """Chat requests in the background, one at a time, `every_seconds` apart."""
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            chat(url, max_tokens=2)
            stop.wait(every_seconds)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=90)


ServiceFactory = Callable[..., Service]


def apply_service(cluster: Any, namespace: str, name: str, spec: dict[str, Any]) -> Service:
    """`kubectl apply` an InferenceService with this spec."""
    document = {
        "apiVersion": "fusebox.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(document, allow_unicode=True))
    return Service(cluster, namespace, name)


@pytest.fixture
def inference_service(
    cluster: Any, namespace: str, operator: OperatorRelease, model_claim: str
) -> Iterator[ServiceFactory]:
    """Apply InferenceServices in the test namespace, next to the model PVC.

    Afterwards, no service the test did not edit by hand (`edited_children`) may have
    a ChildRestored event: the suite's operator resyncs every RESYNC_SECONDS, so a
    resync that sees drift where there is none fails whichever test it happens in.
    """
    checked: list[Service] = []

    def make(name: str, spec: dict[str, Any], edited_children: bool = False) -> Service:
        service = apply_service(cluster, namespace, name, spec)
        if not edited_children:
            checked.append(service)
        return service

    yield make
    restored = [
        f"{service.name}: {event['message']}"
        for service in checked
        for event in service.events()
        if event["reason"] == EventReason.CHILD_RESTORED
    ]
    assert not restored, f"a resync restored children nobody edited: {restored}"


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
    """Where a test reaches this pod's `port`: the API port (8000) at the pod IP, as
    clients inside the cluster do; the admin (8001) and sidecar (9400) ports through
    `kubectl port-forward`, as a user does (NetworkPolicies refuse anyone else)."""
    if port == Port.API:
        return f"http://{pod['status']['podIP']}:{port}"
    metadata = pod["metadata"]
    return pod_port_forwards.url(metadata["namespace"], metadata["name"], port)


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


def node_gpus(cluster: Any, field: str = "allocatable") -> int:
    """The node's nvidia.com/gpu in status.allocatable (healthy devices) or status.capacity."""
    out = cluster.kubectl(
        "get", "nodes", "-o", f"jsonpath={{.items[0].status.{field}.nvidia\\.com/gpu}}"
    ).stdout.strip()
    return int(out or 0)


def _set_gpu_count(count: int) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "localcluster", "up", "--gpus", str(count)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]


@contextmanager
def gpus_at_least(cluster: Any, count: int) -> Iterator[None]:
    """At least `count` allocatable simulated GPUs for the block. A count raised for it
    (localcluster: `up --gpus N`) is put back afterwards to what the cluster's saved
    config had: the suite leaves a cluster it shares (the demo's) as it found it."""
    if node_gpus(cluster) >= count:
        yield
        return
    if not cluster.local:
        pytest.fail(f"the cluster's node offers fewer than {count} nvidia.com/gpu")
    saved = load_saved(default_name(os.environ), os.environ)
    assert saved is not None, "localcluster is up but saved no config"
    _set_gpu_count(count)
    wait_for(f"{count} allocatable GPUs", lambda: node_gpus(cluster) >= count, timeout=60)
    try:
        yield
    finally:
        _set_gpu_count(saved.gpus)
        wait_for(
            f"the node's {saved.gpus} GPUs again",
            lambda: node_gpus(cluster, "capacity") == saved.gpus,
            timeout=60,
        )


@pytest.fixture(scope="session")
def two_gpus(cluster: Any) -> Iterator[None]:
    """At least two simulated GPUs on the node for the session; put back afterwards."""
    with gpus_at_least(cluster, 2):
        yield
