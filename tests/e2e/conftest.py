"""Fixtures every e2e test shares: a real cluster and a fresh namespace per test.

`cluster` (session): the cluster FUSEBOX_KUBECONFIG names, if set (kind, k3d,
a real one); otherwise localcluster, started with `python -m localcluster up`
if it is not already up, and stopped at the end of the session only if this
session started it. One session per machine holds the cluster (leftovers.py): a
second waits for the first. Each removes what a killed session left in the
suite's namespaces before its first install. If the cluster cannot come up,
every test using it fails with the start log's tail: nothing is skipped silently.

`namespace` (function): a new namespace enforcing the `restricted` Pod
Security Standard. Afterwards its InferenceServices are deleted while the
operator still runs (kopf's finalizer needs it), then the namespace (without
waiting): nothing the test made stays behind.

`PortForward` / `pod_port_forwards`: a pod's admin (8001) and sidecar (9400)
ports are reached as a user reaches them, through `kubectl port-forward`;
NetworkPolicies admit only the operator and the monitoring namespace there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from . import capacity, leftovers

REPO_ROOT = Path(__file__).resolve().parents[2]
LOCALCLUSTER = [sys.executable, "-m", "localcluster"]
UP_TIMEOUT_SECONDS = 600
_PROXY_VARIABLES = frozenset({"http_proxy", "https_proxy", "all_proxy", "no_proxy"})
T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Cluster:
    kubeconfig: Path
    bin_dir: Path
    node_ip: str
    # True when localcluster runs it here: pod IPs and ClusterIPs are routed from the host.
    local: bool

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster; on failure the assertion shows stderr."""
        env = dict(os.environ)
        if self.local:
            # localcluster is reached directly; a machine-wide proxy would intercept it.
            env = {k: v for k, v in env.items() if k.lower() not in _PROXY_VARIABLES}
        result = subprocess.run(
            [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            pytest.fail(f"kubectl {' '.join(args)} exited {result.returncode}: {result.stderr}")
        return result


def wait_established(cluster: Cluster, *crds: str, timeout: float = 60) -> None:
    """Wait until each CRD (`crd/NAME` or NAME) is Established.

    Not `kubectl wait --for=condition=Established`: a CRD the apiserver has just
    created can read `status.conditions: null` until its controller writes them,
    and kubectl wait then fails at once (".status.conditions accessor error: <nil>")
    instead of waiting; that happened on a loaded host."""

    def established(name: str) -> bool:
        path = '{.status.conditions[?(@.type=="Established")].status}'
        answer = cluster.kubectl("get", "crd", name, "-o", f"jsonpath={path}", check=False)
        return answer.stdout.strip() == "True"

    for crd in crds:
        name = crd.removeprefix("crd/")
        wait_for(
            f"CRD {name} Established",
            functools.partial(established, name),
            timeout=timeout,
            every=0.5,
        )


def helm(cluster: Cluster, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run the cluster's helm against it; on failure the assertion shows stderr."""
    result = subprocess.run(
        [str(cluster.bin_dir / "helm"), f"--kubeconfig={cluster.kubeconfig}", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )
    assert result.returncode == 0, f"helm {' '.join(args)}: {result.stderr}"
    return result


def localcluster(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m localcluster ARGS` (restart a component, mark a GPU...); fails loudly."""
    result = subprocess.run(
        [sys.executable, "-m", "localcluster", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert result.returncode == 0, f"localcluster {' '.join(args)}: {result.stderr[-3000:]}"
    return result


def wait_for(
    what: str,
    probe: Callable[[], T | None],
    timeout: float = 240,
    every: float = 2,
    diagnose: Callable[[], str] | None = None,
) -> T:
    """Poll until probe() returns something truthy; fail naming `what`, the last value
    and, when given, what `diagnose()` says about why (pod phases, conditions, events)."""
    started = time.monotonic()
    deadline = started + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            _trace_wait(what, started)
            return last
        time.sleep(every)
    _trace_wait(what, started)
    why = f"\n{diagnose()}" if diagnose is not None else ""
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}; last seen: {last!r}{why}")


def _trace_wait(what: str, started: float) -> None:
    """With FUSEBOX_E2E_TRACE_WAITS=FILE, each wait's length and test are appended to FILE:
    where a slow e2e test spends its time, for keeping the suite inside its budget."""
    trace = os.environ.get("FUSEBOX_E2E_TRACE_WAITS")
    if trace:
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
        with open(trace, "a", encoding="utf-8") as file:
            file.write(f"{time.monotonic() - started:7.1f} s  {test}  {what}\n")


PORT_FORWARD_READY_SECONDS = 30
_FORWARDING = re.compile(r"Forwarding from 127\.0\.0\.1:(\d+) ->")


def _answers(url: str) -> bool:
    """True once an HTTP server answers at url, whatever the status (401, 404 included)."""
    try:
        with urllib.request.urlopen(url, timeout=5):
            return True
    except urllib.error.HTTPError as error:
        error.close()
        return True
    except (OSError, TimeoutError):
        return False


class PortForward:
    """`kubectl port-forward pod/POD :PORT` as a context manager: on entry it waits until
    the pod's server answers through it; `url` is http://127.0.0.1:LOCAL (kubectl picks
    the free local port and prints it)."""

    def __init__(self, cluster: Cluster, namespace: str, pod: str, port: int) -> None:
        self.cluster, self.namespace, self.pod, self.port = cluster, namespace, pod, port
        self.url = ""
        self._process: subprocess.Popen[str] | None = None

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def __enter__(self) -> PortForward:
        command = [
            str(self.cluster.bin_dir / "kubectl"),
            f"--kubeconfig={self.cluster.kubeconfig}",
            "-n",
            self.namespace,
            "port-forward",
            "--address=127.0.0.1",
            f"pod/{self.pod}",
            f":{self.port}",
        ]
        env = {k: v for k, v in os.environ.items() if k.lower() not in _PROXY_VARIABLES}
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        self._process = process
        lines: queue.Queue[str] = queue.Queue()

        def read() -> None:  # drained for the forward's whole life, or kubectl would block
            assert process.stdout is not None
            for line in process.stdout:
                lines.put(line)

        threading.Thread(target=read, daemon=True).start()
        seen: list[str] = []
        deadline = time.monotonic() + PORT_FORWARD_READY_SECONDS
        while not self.url and time.monotonic() < deadline and process.poll() is None:
            with contextlib.suppress(queue.Empty):
                seen.append(lines.get(timeout=1))
                if match := _FORWARDING.search(seen[-1]):
                    self.url = f"http://127.0.0.1:{match.group(1)}"
        while self.url and not _answers(self.url) and time.monotonic() < deadline:
            time.sleep(0.5)
        if not self.url or not _answers(self.url):
            self.__exit__()
            raise AssertionError(
                f"kubectl port-forward to {self.namespace}/{self.pod}:{self.port} did not "
                f"answer within {PORT_FORWARD_READY_SECONDS} s; it said: {''.join(seen)!r}"
            )
        return self

    def __exit__(self, *_: object) -> None:
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        if self._process.stdout is not None:
            self._process.stdout.close()  # else a ResourceWarning fails the test's teardown
        self._process = None


class PodPortForwards:
    """Port-forwards opened on demand by `pod_url` and closed after each test.

    Why a registry: `pod_url(pod, port)` is called with a pod object only, in the
    middle of a test; it reuses the open forward to that pod and port (or opens a new
    one when kubectl's died with the pod) and the autouse `close_port_forwards` fixture
    ends them all when the test ends.
    """

    def __init__(self) -> None:
        self.cluster: Cluster | None = None
        self._open: dict[tuple[str, str, int], PortForward] = {}

    def url(self, namespace: str, pod: str, port: int) -> str:
        if self.cluster is None:
            raise AssertionError("no cluster: request the `cluster` fixture first")
        key = (namespace, pod, port)
        forward = self._open.get(key)
        if forward is None or not forward.alive:
            forward = PortForward(self.cluster, namespace, pod, port).__enter__()
            self._open[key] = forward
        return forward.url

    def close(self) -> None:
        for forward in self._open.values():
            forward.__exit__()
        self._open.clear()


pod_port_forwards = PodPortForwards()


@pytest.fixture(autouse=True)
def close_port_forwards() -> Iterator[None]:
    yield
    pod_port_forwards.close()


def _localcluster(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*LOCALCLUSTER, *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )


def _env_value(output: str, name: str) -> str:
    for line in output.splitlines():
        if line.startswith(f"export {name}="):
            value = line.split("=", 1)[1]
            # PATH is printed as <bin dir>:$PATH; the first entry is the bin dir.
            return value.split(":", 1)[0] if name == "PATH" else value
    raise AssertionError(f"`localcluster env` printed no {name}: {output!r}")


def _with_node_ip(cluster: Cluster) -> Cluster:
    """The cluster with node_ip filled in from its (first) node's InternalIP."""
    result = cluster.kubectl(
        "get",
        "nodes",
        "-o",
        "jsonpath={.items[0].status.addresses[?(@.type=='InternalIP')].address}",
    )
    return dataclasses.replace(cluster, node_ip=result.stdout.strip())


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    external = os.environ.get("FUSEBOX_KUBECONFIG")
    if external:
        kubeconfig = Path(external)
        local_bin = REPO_ROOT / ".cache" / "bin"
        found = shutil.which("kubectl")
        bin_dir = local_bin if (local_bin / "kubectl").exists() else Path(found or "").parent
        pod_port_forwards.cluster = _with_node_ip(Cluster(kubeconfig, bin_dir, "", local=False))
        yield pod_port_forwards.cluster
        return
    try:
        with leftovers.session_lock():
            yield from _localcluster_session()
    except leftovers.SessionBusy as busy:
        pytest.exit(f"e2e not started: {busy}", returncode=1)


def _localcluster_session() -> Iterator[Cluster]:
    already_up = _localcluster("status", timeout=120).returncode == 0
    if not already_up:
        started = _localcluster("up", timeout=UP_TIMEOUT_SECONDS)
        if started.returncode != 0:
            tail = "\n".join((started.stdout + started.stderr).splitlines()[-60:])
            pytest.fail(f"`python -m localcluster up` failed; its output ends:\n{tail}")
        # Up but momentarily unhealthy (say, node NotReady): someone else's cluster.
        already_up = "is already up" in started.stderr
    env = _localcluster("env", timeout=60).stdout
    kubeconfig = Path(_env_value(env, "KUBECONFIG"))
    bin_dir = Path(_env_value(env, "PATH"))
    pod_port_forwards.cluster = _with_node_ip(Cluster(kubeconfig, bin_dir, "", local=True))
    try:
        _remove_leftovers(pod_port_forwards.cluster)
        _stop_unless_the_suite_fits(pod_port_forwards.cluster)
        yield pod_port_forwards.cluster
    finally:
        if not already_up:
            stopped = _localcluster("down", timeout=300)
            assert stopped.returncode == 0, f"localcluster down failed: {stopped.stderr}"


def _remove_leftovers(cluster: Cluster) -> None:
    """Remove what a killed session left (see leftovers.py): this session holds the lock,
    so whatever lives in the suite's namespaces is nobody's. Also on a cluster this
    session started: `localcluster up` restarts a cluster whose daemons were killed
    with its objects, and a killed session's release with them. Its Helm releases are
    uninstalled (their operators gone, nobody adds a finalizer back), its services lose
    their finalizers, its namespaces are deleted and waited for, so that their pods no
    longer hold the node's CPU."""
    names = cluster.kubectl("get", "namespaces", "-o", "jsonpath={.items[*].metadata.name}")
    stale = sorted(n for n in names.stdout.split() if capacity.is_suite_namespace(n))
    if not stale:
        return
    print(f"e2e: removing what a killed session left: {', '.join(stale)}", file=sys.stderr)
    releases = json.loads(helm(cluster, "list", "-A", "-o", "json").stdout or "[]")
    for namespace, release in leftovers.releases_in(releases, stale):
        helm(cluster, "uninstall", release, "--namespace", namespace, "--wait", "--timeout", "3m")
    services = cluster.kubectl("get", INFERENCE_SERVICES, "-A", "-o", "json", check=False)
    if services.returncode == 0:
        for namespace, name in leftovers.finalized_services(json.loads(services.stdout), stale):
            drop_finalizers(cluster, namespace, INFERENCE_SERVICES, name)
    cluster.kubectl("delete", "namespace", *stale, "--wait=false", check=False)
    cluster.kubectl(
        "wait",
        "--for=delete",
        *(f"namespace/{n}" for n in stale),
        "--timeout=300s",
        timeout=330,
    )


def _stop_unless_the_suite_fits(cluster: Cluster) -> None:
    """Stop the run, naming who holds the CPU, when the suite's pods could not schedule."""
    allocatable = cluster.kubectl(
        "get", "nodes", "-o", "jsonpath={.items[0].status.allocatable.cpu}"
    ).stdout.strip()
    pods = json.loads(cluster.kubectl("get", "pods", "-A", "-o", "json").stdout)["items"]
    why = capacity.shortfall(allocatable, pods)
    if why:
        pytest.exit(f"e2e not started: {why}", returncode=1)


@contextlib.contextmanager
def fresh_namespace(cluster: Cluster, name: str) -> Iterator[str]:
    """A new namespace enforcing the restricted Pod Security Standard, emptied of its
    InferenceServices and deleted afterwards."""
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl(
        "label",
        "namespace",
        name,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/warn=restricted",
    )
    # Pods are refused until the ServiceAccount controller made `default`.
    cluster.kubectl(
        "-n",
        name,
        "wait",
        "--for=create",
        "serviceaccount/default",
        "--timeout=60s",
    )
    try:
        yield name
    finally:
        remove_inference_services(cluster, name)
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def namespace_name(prefix: str, request: pytest.FixtureRequest) -> str:
    stem = "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:40].strip("-")
    return f"{prefix}-{stem}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """e2e-<test>-<hex>: the namespaces the suite's operator release watches (`e2e-*`)."""
    with fresh_namespace(cluster, namespace_name("e2e", request)) as name:
        yield name


INFERENCE_SERVICES = "inferenceservices.fusebox.dev"
FINALIZER_WAIT_SECONDS = 90


def remove_inference_services(cluster: Cluster, namespace: str) -> None:
    """Delete the namespace's InferenceServices while the operator runs, so kopf removes
    its finalizer; one the operator did not release in time loses the finalizer by hand
    (else the namespace would stay Terminating for ever once the operator is gone)."""
    listed = cluster.kubectl("-n", namespace, "get", INFERENCE_SERVICES, "-o", "name", check=False)
    if listed.returncode != 0 or not listed.stdout.strip():
        return  # no CRD, or nothing made
    deleted = cluster.kubectl(
        "-n",
        namespace,
        "delete",
        INFERENCE_SERVICES,
        "--all",
        "--wait=true",
        f"--timeout={FINALIZER_WAIT_SECONDS}s",
        check=False,
        timeout=FINALIZER_WAIT_SECONDS + 30,
    )
    if deleted.returncode == 0:
        return
    for name in cluster.kubectl(
        "-n", namespace, "get", INFERENCE_SERVICES, "-o", "name", check=False
    ).stdout.split():
        drop_finalizers(cluster, namespace, name)


def drop_finalizers(cluster: Cluster, namespace: str, *target: str) -> None:
    """Release an object nobody will finalize (`kind/name`, or resource and name)."""
    cluster.kubectl(
        *("-n", namespace, "patch", *target),
        *("--type=merge", "-p", '{"metadata":{"finalizers":null}}'),
        check=False,
    )


@pytest.fixture(scope="session")
def model_root() -> Iterator[Path]:
    """The tiny model as `<root>/tiny`, world-readable (pods run as uid 65532).

    A copy outside the cache: the node's PV points at a directory it may
    read, and /root is not traversable by the pods' user.
    """
    from fusebox_server.model.tiny_model import ensure_model

    root = Path("/var/tmp") / f"fusebox-e2e-models-{uuid.uuid4().hex[:8]}"
    shutil.copytree(ensure_model("tiny"), root / "tiny")
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def local_claim(cluster: Cluster, namespace: str, claim: str, path: Path) -> Iterator[str]:
    """A `local` PV over the host directory `path` and the PVC `claim` bound to it in
    `namespace`; yields the PV's name, deleted afterwards (the directory is the caller's)."""
    pv_name = f"{claim}-{namespace}"[:60]
    made = _localcluster("pv", pv_name, "--path", str(path), timeout=120)
    assert made.returncode == 0, made.stderr
    manifest = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "namespace": namespace},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "local",
            "volumeName": pv_name,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    try:
        yield pv_name
    finally:
        cluster.kubectl("delete", "pv", pv_name, "--wait=false", check=False)


@pytest.fixture
def model_claim(cluster: Cluster, namespace: str, model_root: Path) -> Iterator[str]:
    """A `local` PV over model_root and the PVC `models` bound to it in the test's
    namespace, so `pvc://models/tiny` (the examples' source) resolves. Yields the PV name."""
    with local_claim(cluster, namespace, "models", model_root) as pv_name:
        yield pv_name
