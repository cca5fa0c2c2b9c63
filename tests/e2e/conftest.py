"""Fixtures every e2e test shares: a real cluster and a fresh namespace per test.

`cluster` (session): the cluster FUSEBOX_KUBECONFIG names, if set (kind, k3d,
a real one); otherwise localcluster, started with `python -m localcluster up`
if it is not already up, and stopped at the end of the session only if this
session started it. If the cluster cannot come up, every test using it fails
with the start log's tail: nothing is skipped silently.

`namespace` (function): a new namespace enforcing the `restricted` Pod
Security Standard, deleted (without waiting) after the test.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
LOCALCLUSTER = [sys.executable, "-m", "localcluster"]
UP_TIMEOUT_SECONDS = 600
_PROXY_VARIABLES = frozenset({"http_proxy", "https_proxy", "all_proxy", "no_proxy"})


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
        yield _with_node_ip(Cluster(kubeconfig, bin_dir, "", local=False))
        return
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
    try:
        yield _with_node_ip(Cluster(kubeconfig, bin_dir, "", local=True))
    finally:
        if not already_up:
            stopped = _localcluster("down", timeout=300)
            assert stopped.returncode == 0, f"localcluster down failed: {stopped.stderr}"


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    stem = "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:40].strip("-")
    name = f"e2e-{stem}-{uuid.uuid4().hex[:6]}"
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
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="session")
def model_root() -> Iterator[Path]:
    """The tiny model as `<root>/tiny`, world-readable (pods run as uid 65532).

    A copy outside the cache: the node's PV points at a directory it may
    read, and /root is not traversable by the pods' user.
    """
    from fusebox_server.tiny_model import ensure_model

    root = Path("/var/tmp") / f"fusebox-e2e-models-{uuid.uuid4().hex[:8]}"
    shutil.copytree(ensure_model("tiny"), root / "tiny")
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def model_claim(cluster: Cluster, namespace: str, model_root: Path) -> Iterator[str]:
    """A `local` PV over model_root and the PVC `models` bound to it in the test's
    namespace, so `pvc://models/tiny` (the examples' source) resolves. Yields the PV name."""
    pv_name = f"models-{namespace}"[:60]
    made = _localcluster("pv", pv_name, "--path", str(model_root), timeout=120)
    assert made.returncode == 0, made.stderr
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "models", "namespace": namespace},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "local",
            "volumeName": pv_name,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(claim))
    try:
        yield pv_name
    finally:
        cluster.kubectl("delete", "pv", pv_name, "--wait=false", check=False)
