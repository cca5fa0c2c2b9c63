"""NetworkPolicy is enforced in localcluster (kube-router), Fusebox's own policies included.

Three namespaces stand in for a real installation: the server side (this
module's namespace), the operator's and the monitoring one. Every client pod
probes every target port once per check (TCP connect, short timeout) and the
whole matrix is compared, so a policy that leaks and one that over-blocks both
fail. The Fusebox policies are the ones users get: the operator's
NetworkPolicy for an InferenceService as `python -m fusebox_operator render`
prints it, and the chart's policy for the operator pod from `helm template`.
Traffic from the host (the root network namespace, where this test runs)
is probed too: it is filtered like any other source outside a policy's peers.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[3]
RELEASE = "fusebox"
EXAMPLE = REPO_ROOT / "crds" / "examples" / "tiny-chat.yaml"
SERVICE_NAME = "tiny-chat"  # the example's metadata.name: its pods' fusebox.dev/service label
API, ADMIN, METRICS = 8000, 8001, 9400
PEER_LABEL = "e2e-netpol-peer"

# Run in a client pod: try each host:port once; print {target: "open" | why not}.
PROBE = """
import json, socket, sys
from concurrent.futures import ThreadPoolExecutor
def probe(target):
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
        return "open"
    except OSError as err:
        return type(err).__name__
targets = sys.argv[1:]
with ThreadPoolExecutor(len(targets)) as pool:
    print(json.dumps(dict(zip(targets, pool.map(probe, targets)))))
"""


def _localcluster(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "localcluster", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


@pytest.fixture(scope="module")
def enforcing(cluster: Any) -> Iterator[None]:
    """The cluster enforces NetworkPolicy for this module; left as it was found."""
    if not cluster.local:
        pytest.fail("this test proves localcluster's enforcement; FUSEBOX_KUBECONFIG is set")
    status = _localcluster("status")
    was_off = "NetworkPolicy" in status.stdout and "not enforced" in status.stdout
    if was_off:
        turned_on = _localcluster("up", "--network-policy")
        assert turned_on.returncode == 0, turned_on.stderr[-3000:]
    try:
        yield
    finally:
        if was_off:
            turned_off = _localcluster("up", "--no-network-policy")
            assert turned_off.returncode == 0, turned_off.stderr[-3000:]


def _server_container(name: str, port: int, kube: Any) -> dict[str, Any]:
    container: dict[str, Any] = kube.testapp_container(
        name=name,
        env=[*kube.testapp_container()["env"], {"name": "PORT", "value": str(port)}],
        ports=[{"containerPort": port}],
        readinessProbe={"tcpSocket": {"port": port}, "periodSeconds": 1},
    )
    return container


def _pod(kube: Any, name: str, labels: dict[str, str], ports: tuple[int, ...]) -> dict[str, Any]:
    containers = [_server_container(f"port-{p}", p, kube) for p in ports]
    pod: dict[str, Any] = kube.testapp_pod(name, labels=labels, containers=containers)
    return pod


def _documents(text: str, kind: str, namespace: str) -> list[dict[str, Any]]:
    found = [d for d in yaml.safe_load_all(text) if d and d.get("kind") == kind]
    for document in found:
        document["metadata"]["namespace"] = namespace
    assert found, f"no {kind} in the rendered output"
    return found


class World:
    """The namespaces, pods and policies of one installation, and the probe matrix."""

    def __init__(self, cluster: Any, server: Any, operator: Any, monitoring: Any) -> None:
        self.cluster = cluster
        self.server = server
        self.operator = operator
        self.monitoring = monitoring
        self.ips: dict[str, str] = {}

    def build(self) -> None:
        server, operator, monitoring = self.server, self.operator, self.monitoring
        server.apply(
            _pod(server, "web", {"app": "web"}, (8080,)),
            _pod(server, "inference", {"fusebox.dev/service": SERVICE_NAME}, (API, ADMIN, METRICS)),
            _pod(server, "with-x", {"access": "x"}, (8080,)),
            _pod(server, "neighbour", {"app": "neighbour"}, (8080,)),
        )
        operator_labels = {
            "app.kubernetes.io/name": "fusebox-operator",
            "app.kubernetes.io/instance": RELEASE,
        }
        operator.apply(
            _pod(operator, "operator", operator_labels, (8080, 9999)),
            _pod(operator, "op-plain", {"app": "op-plain"}, (8080,)),
        )
        monitoring.apply(_pod(monitoring, "monitor", {"app": "monitor"}, (8080,)))
        self.cluster.kubectl("label", "namespace", monitoring.namespace, f"{PEER_LABEL}=yes")
        for kube in (server, operator, monitoring):
            kube("wait", "--for=condition=Ready", "pods", "--all", "--timeout=180s", timeout=210)
            for pod in kube.get("pods")["items"]:
                self.ips[pod["metadata"]["name"]] = pod["status"]["podIP"]

    def apply_policies(self) -> None:
        server = self.server
        server.apply(
            {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": {"name": "default-deny-ingress"},
                "spec": {"podSelector": {}, "policyTypes": ["Ingress"]},
            },
            {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": {"name": "web-from-x"},
                "spec": {
                    "podSelector": {"matchLabels": {"app": "web"}},
                    "policyTypes": ["Ingress"],
                    "ingress": [
                        {
                            "from": [
                                {"podSelector": {"matchLabels": {"access": "x"}}},
                                {"namespaceSelector": {"matchLabels": {PEER_LABEL: "yes"}}},
                            ],
                            "ports": [{"port": 8080, "protocol": "TCP"}],
                        }
                    ],
                },
            },
        )
        env = {
            **os.environ,
            "FUSEBOX_OPERATOR_NAMESPACE": self.operator.namespace,
            "FUSEBOX_MONITORING_NAMESPACE": self.monitoring.namespace,
        }
        rendered = subprocess.run(
            [
                sys.executable,
                "-m",
                "fusebox_operator",
                "render",
                "--gpu-memory-mib",
                "1024",
                "--namespace",
                server.namespace,
                str(EXAMPLE),
            ],
            capture_output=True,
            text=True,
            check=True,
            env=env,
            cwd=REPO_ROOT,
        ).stdout
        server.apply(*_documents(rendered, "NetworkPolicy", server.namespace))
        chart = subprocess.run(
            [
                str(self.cluster.bin_dir / "helm"),
                "template",
                RELEASE,
                str(REPO_ROOT / "helm" / "fusebox"),
                "--namespace",
                self.operator.namespace,
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        self.operator.apply(*_documents(chart, "NetworkPolicy", self.operator.namespace))

    def target(self, pod: str, port: int) -> str:
        return f"{self.ips[pod]}:{port}"

    def probe_from(self, kube: Any, client: str, targets: list[str]) -> dict[str, str]:
        out = kube("exec", client, "-c", "port-8080", "--", "python3", "-c", PROBE, *targets)
        result: dict[str, str] = json.loads(out.stdout)
        return result


def _from_host(target: str) -> str:
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
        return "open"
    except OSError as err:
        return type(err).__name__


@pytest.fixture(scope="module")
def world(cluster: Any, enforcing: None, module_kube: Any, more_namespaces: Any) -> World:
    built = World(
        cluster, module_kube, more_namespaces("netpol-operator"), more_namespaces("netpol-monitor")
    )
    built.build()
    built.apply_policies()
    return built


def _expected(world: World) -> dict[str, dict[str, bool]]:
    """client -> target -> may connect, as the policies say."""
    t = world.target
    inference = {p: t("inference", p) for p in (API, ADMIN, METRICS)}
    return {
        # The operator pod (chart policy: egress only to Fusebox pods' 8001/9400).
        "operator": {
            inference[API]: False,
            inference[ADMIN]: True,
            inference[METRICS]: True,
            t("web", 8080): False,
        },
        # Another pod in the operator's namespace is not the operator.
        "op-plain": {
            inference[API]: True,
            inference[ADMIN]: False,
            inference[METRICS]: False,
            t("web", 8080): False,
            t("operator", 8080): True,  # the chart admits the operator's 8080 from anywhere
            t("operator", 9999): False,  # and nothing else
        },
        "monitor": {
            inference[API]: True,
            inference[ADMIN]: False,
            inference[METRICS]: True,
            t("web", 8080): True,  # its namespace carries the peer label
        },
        "with-x": {t("web", 8080): True, inference[ADMIN]: False},
        "neighbour": {
            t("web", 8080): False,
            inference[API]: True,
            inference[ADMIN]: False,
            inference[METRICS]: False,
        },
    }


def _observed(world: World) -> dict[str, dict[str, bool]]:
    where = {
        "operator": world.operator,
        "op-plain": world.operator,
        "monitor": world.monitoring,
        "with-x": world.server,
        "neighbour": world.server,
    }
    expected = _expected(world)

    def one(client: str) -> tuple[str, dict[str, bool]]:
        answers = world.probe_from(where[client], client, list(expected[client]))
        return client, {target: answer == "open" for target, answer in answers.items()}

    with ThreadPoolExecutor(len(where)) as pool:
        return dict(pool.map(one, where))


def _assert_matrix(world: World) -> None:
    expected = _expected(world)
    # kube-router applies a new policy within a sync; wait for the matrix, then hold it.
    observed = world.server.eventually(
        lambda: (o := _observed(world)) == expected and o,
        timeout_seconds=60,
        interval_seconds=1,
        what="the probe matrix to match the policies",
    )
    assert observed == expected


def test_policies_admit_exactly_their_peers_fusebox_admin_and_metrics_ports_included(
    world: World,
) -> None:
    _assert_matrix(world)


def test_traffic_from_the_host_is_filtered_like_any_source_outside_the_peers(
    world: World,
) -> None:
    answers = {
        "web": _from_host(world.target("web", 8080)),
        "admin": _from_host(world.target("inference", ADMIN)),
        "metrics": _from_host(world.target("inference", METRICS)),
        "api": _from_host(world.target("inference", API)),
    }
    # The API port admits everyone; the rest refuse the host as kube-router
    # refuses anyone outside a policy's peers: rejected, not silently dropped.
    assert answers == {
        "api": "open",
        "web": "ConnectionRefusedError",
        "admin": "ConnectionRefusedError",
        "metrics": "ConnectionRefusedError",
    }


def test_policies_hold_through_a_kube_router_restart(world: World) -> None:
    restarted = _localcluster("restart", "network-policy")
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    _assert_matrix(world)
