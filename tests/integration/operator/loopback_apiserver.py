"""A real kube-apiserver on loopback for integration tests: etcd and the API server
from the cluster binaries (`make setup-binaries`), no nodes and no pods.

Why: what a test needs to prove against an API server (a CRD keeping the status
the operator writes, a server-side apply upgrading a CRD, RBAC refusing what a
role does not grant) only a real one shows, and a whole localcluster is minutes
where this is seconds. Each test module starts its own and gets a kubeconfig.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import kubernetes
import pytest
import yaml

from fusebox_operator.kube import Kube

REPO = Path(__file__).resolve().parents[3]
BINARIES = REPO / ".cache" / "bin"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_ready(url: str, token: str, deadline: float) -> None:
    while time.monotonic() < deadline:
        answer = subprocess.run(
            ["curl", "-sk", "-H", f"Authorization: Bearer {token}", url],
            capture_output=True,
            text=True,
            check=False,
        )
        if answer.stdout == "ok":
            return
        time.sleep(0.25)
    raise AssertionError(f"{url} not ready")


def skip_without_binaries(*names: str) -> None:
    """Skip the test when the cluster binaries it needs have not been built."""
    missing = [
        name for name in ("etcd", "kube-apiserver", *names) if not (BINARIES / name).exists()
    ]
    if missing:
        pytest.skip(f"no {', '.join(missing)} in .cache/bin: run `make setup-binaries`")


def _kubeconfig(port: int, certs: Path, user: str, token: str, namespace: str | None) -> str:
    context: dict[str, str] = {"cluster": "loop", "user": user}
    if namespace:
        context["namespace"] = namespace
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "loop",
                    "cluster": {
                        "server": f"https://127.0.0.1:{port}",
                        # The serving certificate the API server made (with its CA).
                        "certificate-authority": str(certs / "apiserver.crt"),
                    },
                }
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "loop", "context": context}],
            "current-context": "loop",
        }
    )


@contextmanager
def loopback_apiserver(
    tmp: Path,
    *,
    token: str,
    user: str,
    authorization_mode: str,
    namespace: str | None = None,
    service_cidr: str = "10.0.0.0/24",
) -> Iterator[Path]:
    """etcd and kube-apiserver under `tmp`, serving on a free loopback port; yields a
    kubeconfig whose user (`token`, in system:masters) is the default context's, in
    `namespace` when given; `service_cidr` bounds the Services it can hold (a /24:
    253, enough for a test; the fleet bench asks for more). Both processes stop
    when the block ends."""
    etcd, apiserver = BINARIES / "etcd", BINARIES / "kube-apiserver"
    key = tmp / "sa.key"
    subprocess.run(["openssl", "genrsa", "-out", str(key), "2048"], check=True, capture_output=True)
    (tmp / "tokens.csv").write_text(f'{token},{user},uid1,"system:masters"\n')
    client, peer, secure = free_port(), free_port(), free_port()
    logs = [(tmp / "etcd.log").open("w"), (tmp / "apiserver.log").open("w")]
    processes = [
        subprocess.Popen(
            [
                str(etcd),
                f"--data-dir={tmp / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{client}",
                f"--advertise-client-urls=http://127.0.0.1:{client}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=default=http://127.0.0.1:{peer}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=logs[0],
        ),
        subprocess.Popen(
            [
                str(apiserver),
                f"--etcd-servers=http://127.0.0.1:{client}",
                "--bind-address=127.0.0.1",
                f"--secure-port={secure}",
                f"--cert-dir={tmp / 'certs'}",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={key}",
                f"--service-account-signing-key-file={key}",
                f"--token-auth-file={tmp / 'tokens.csv'}",
                f"--authorization-mode={authorization_mode}",
                f"--service-cluster-ip-range={service_cidr}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=logs[1],
        ),
    ]
    try:
        _wait_ready(f"https://127.0.0.1:{secure}/readyz", token, time.monotonic() + 90)
        config = tmp / "kubeconfig"
        config.write_text(_kubeconfig(secure, tmp / "certs", user, token, namespace))
        yield config
    finally:
        for process in reversed(processes):
            process.terminate()
            process.wait(timeout=30)
        for log in logs:
            log.close()


def kubectl(config: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """kubectl against the kubeconfig `config`; the caller checks the return code."""
    return subprocess.run(
        [str(BINARIES / "kubectl"), f"--kubeconfig={config}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def kubectl_ok(config: Path, *args: str, stdin: str = "") -> str:
    """kubectl's output; the test fails with its stderr when it fails."""
    done = kubectl(config, *args, stdin=stdin)
    assert done.returncode == 0, done.stderr
    return done.stdout


def kube_as(config: Path, user: str) -> Kube:
    """The operator's own Kube on `config`'s API server, every request made as `user`
    (impersonated), so only that user's RBAC applies."""
    configuration = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=str(config), client_configuration=configuration
    )
    kube = Kube(configuration)
    kube.api_client.set_default_header("Impersonate-User", user)
    return kube


def wait_established(config: Path, name: str, timeout_seconds: float = 60) -> None:
    """Poll the CRD until it is Established. Not `kubectl wait`: a CRD just created can
    read `status.conditions: null` until its controller writes them, and kubectl wait
    then fails at once (".status.conditions accessor error: <nil>"); seen in a CI
    rehearsal with the e2e tier beside it."""
    path = '{.status.conditions[?(@.type=="Established")].status}'
    deadline = time.monotonic() + timeout_seconds
    while True:
        answer = kubectl(config, "get", "crd", name, "-o", f"jsonpath={path}")
        if answer.stdout.strip() == "True":
            return
        assert time.monotonic() < deadline, f"CRD {name} not Established: {answer.stderr}"
        time.sleep(0.2)


@contextmanager
def apiserver_with_crd(tmp: Path, *, token: str, namespace: str) -> Iterator[Path]:
    """A loopback API server (RBAC, `token` an admin) holding the InferenceService CRD,
    Established, and `namespace`: where the CRD's schema, defaults and CEL rules are
    tested against the API server's own validation."""
    skip_without_binaries("kubectl")
    with loopback_apiserver(tmp, token=token, user="admin", authorization_mode="RBAC") as config:
        applied = kubectl(config, "apply", "-f", str(REPO / "crds" / "inferenceservice.yaml"))
        assert applied.returncode == 0, applied.stderr
        wait_established(config, "inferenceservices.fusebox.dev")
        assert kubectl(config, "create", "namespace", namespace).returncode == 0
        yield config
