"""A cluster of its own with several nodes, beside (never instead of) the default one.

`multinode` (package-scoped: every module here shares it) brings up the localcluster named
FUSEBOX_MULTINODE_NAME (default fbxmn) with FUSEBOX_MULTINODE_NODES nodes
(default 3) on subnets, veths and a namespace of its own, so it runs while
the rest of the e2e suite holds the default cluster `fusebox`; it takes the
cluster down when the last module here ends (unless
FUSEBOX_MULTINODE_KEEP=1), and it never
touches the default one. Only the images these tests run are loaded, on
every node. `mkube` binds it to
a fresh `restricted` namespace per test, deleted (and waited for) afterwards.

The operator's modules share one install of the chart (`operator_across`, on node 3)
and two nodes holding the inference image (`inference_nodes`, labelled IMAGE_LABEL);
`shared_model_claim` gives a service the model wherever its pods land among them.
Their modules are named test_operator_* so that they run after test_nodes.py, which
stops node 3 (the operator's) and restarts daemons under the pods it finds.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from fusebox_contract.names import ConditionType
from localcluster import nodes
from localcluster.config import ClusterConfig, load_saved

from ..conftest import (
    REPO_ROOT,
    Cluster,
    remove_inference_services,
    wait_established,
    wait_for,
)
from ..localcluster.conftest import Kube, new_namespace
from ..operator.conftest import CHART, CRD, CRD_NAME, OperatorRelease, Service

NAME = os.environ.get("FUSEBOX_MULTINODE_NAME", "fbxmn")
NODES = int(os.environ.get("FUSEBOX_MULTINODE_NODES", "3"))
NODE_CIDR, POD_CIDR, SERVICE_CIDR = "10.240.0.0/28", "10.241.0.0/16", "10.242.0.0/16"
HOST_VETH, NODE_VETH = "fbm0", "fbm1"
UP_FLAGS = (
    f"--nodes={NODES}",
    f"--node-cidr={NODE_CIDR}",
    f"--pod-cidr={POD_CIDR}",
    f"--service-cidr={SERVICE_CIDR}",
    f"--host-veth={HOST_VETH}",
    f"--node-veth={NODE_VETH}",
    "--images=pause,coredns,testapp",
)
UP_TIMEOUT_SECONDS = 600


def multinode_cli(
    *args: str, timeout: float = 300, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """`python -m localcluster --name <this cluster> ARGS`; fails the test with its stderr."""
    result = subprocess.run(
        [sys.executable, "-m", "localcluster", "--name", NAME, *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )
    if check and result.returncode != 0:
        pytest.fail(f"localcluster --name {NAME} {' '.join(args)}: {head_and_tail(result.stderr)}")
    return result


def head_and_tail(text: str, head: int = 2000, tail: int = 2000) -> str:
    """`up`'s reason comes first and the daemons' log tails after it: keep both ends."""
    if len(text) <= head + tail:
        return text
    return f"{text[:head]}\n[... {len(text) - head - tail} characters ...]\n{text[-tail:]}"


@pytest.fixture(scope="package")
def multinode() -> Iterator[Cluster]:
    first = multinode_cli("up", *UP_FLAGS, timeout=UP_TIMEOUT_SECONDS, check=False)
    if first.returncode != 0:
        # Seen once in a CI rehearsal with the other tiers beside it (the reason was cut
        # off then): say why, start over once, and fail if that fails too.
        print(f"multinode: the first `up` failed, starting over:\n{head_and_tail(first.stderr)}")
        multinode_cli("down", timeout=300, check=False)
        multinode_cli("up", *UP_FLAGS, timeout=UP_TIMEOUT_SECONDS)
    env = multinode_cli("env", timeout=60).stdout
    values = dict(
        line.removeprefix("export ").split("=", 1)
        for line in env.splitlines()
        if line.startswith("export ")
    )
    bin_dir = Path(values["PATH"].split(":", 1)[0])
    cluster = Cluster(Path(values["KUBECONFIG"]), bin_dir, node_ip="", local=True)
    try:
        yield cluster
    finally:
        if os.environ.get("FUSEBOX_MULTINODE_KEEP") != "1":
            multinode_cli("down", timeout=300)
            assert host_leftovers() == [], "`down` left part of the cluster on the host"


def host_leftovers() -> list[str]:
    """What of this cluster is still on the host: its nodes' namespaces, the veth,
    routes into its subnets, firewall rules, cgroups."""
    found = [
        f"netns {n}"
        for n in subprocess.run(
            ["ip", "netns", "list"], capture_output=True, text=True
        ).stdout.split()
        if n == NAME or n.startswith(f"{NAME}-node")
    ]
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    found += [f"link {link}" for link in (HOST_VETH, NODE_VETH) if f" {link}:" in links]
    routes = subprocess.run(["ip", "route", "show"], capture_output=True, text=True).stdout
    ours = [ipaddress.ip_network(c) for c in (NODE_CIDR, POD_CIDR, SERVICE_CIDR)]
    for route in routes.splitlines():
        destination = route.split()[0]
        if destination != "default" and any(
            ipaddress.ip_network(destination, strict=False).overlaps(net) for net in ours
        ):
            found.append(f"route {route}")
    rules = subprocess.run(["iptables", "-w", "-S"], capture_output=True, text=True).stdout
    found += [f"iptables {r}" for r in rules.splitlines() if f"fusebox-localcluster:{NAME}" in r]
    found += [
        f"cgroup {c}"
        for c in Path("/sys/fs/cgroup").glob(f"*/fusebox-{NAME}*")
        if c.name == f"fusebox-{NAME}" or c.name.startswith(f"fusebox-{NAME}-node")
    ]
    return found


@pytest.fixture
def mkube(multinode: Cluster) -> Iterator[Kube]:
    name = new_namespace(multinode, "mn")
    try:
        yield Kube(multinode, name)
    finally:
        # Wait until it is gone: the next test drains or stops nodes, and a pod of this
        # one still terminating there would be in its way (a bare pod stops a drain).
        multinode.kubectl("delete", "namespace", name, "--timeout=120s", check=False, timeout=150)


def nodes_in_order(cluster: Cluster) -> list[str]:
    """The cluster's nodes, node 1 (the control plane's) first."""
    names = cluster.kubectl("get", "nodes", "-o", "name").stdout.split()
    return sorted((n.removeprefix("node/") for n in names), key=lambda n: (len(n), n))


@pytest.fixture
def node_names(multinode: Cluster) -> list[str]:
    """The nodes, node 1 (the control plane's) first."""
    return nodes_in_order(multinode)


def pods_by_node(kube: Kube, selector: str) -> dict[str, list[dict[str, Any]]]:
    """Ready pods matching selector, by the node they run on."""
    placed: dict[str, list[dict[str, Any]]] = {}
    for pod in kube.get("pods", "-l", selector)["items"]:
        ready = any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in pod.get("status", {}).get("conditions", [])
        )
        if ready and not pod["metadata"].get("deletionTimestamp"):
            placed.setdefault(pod["spec"]["nodeName"], []).append(pod)
    return placed


# --- the operator across nodes (shared by every module that installs it) --------------------

IMAGE_LABEL = "fusebox.dev/e2e-inference-image"
HOSTNAME = "kubernetes.io/hostname"
WATCHED = "e2e-mn-*"  # the namespaces mkube makes
INFERENCE_IMAGE = "localhost/fusebox/inference:dev"


def node_view(node: str) -> ClusterConfig:
    """localcluster's view of one node of this cluster (its sockets, its GPUs' controls)."""
    saved = load_saved(NAME, os.environ)
    assert saved is not None, f"cluster {NAME} is not saved"
    return nodes.by_name(saved, node)


@pytest.fixture(scope="package")
def inference_nodes(multinode: Cluster) -> Iterator[list[str]]:
    """Nodes 1 and 2, holding the inference image and labelled IMAGE_LABEL; every node
    holds the operator's image. Loaded once: a node's store outlives `down`."""
    every_node = nodes_in_order(multinode)
    chosen = every_node[:2]
    for node in every_node:
        wanted = ("inference:dev", "operator:dev") if node in chosen else ("operator:dev",)
        multinode_cli(
            "load-images", "--node", node, "--discard-unpacked-layers", *wanted, timeout=900
        )
    for node in chosen:
        multinode.kubectl("label", "node", node, f"{IMAGE_LABEL}=true", "--overwrite")
    try:
        yield chosen
    finally:
        for node in chosen:
            multinode.kubectl("label", "node", node, f"{IMAGE_LABEL}-", check=False)


@pytest.fixture(scope="package")
def operator_across(multinode: Cluster, inference_nodes: list[str]) -> Iterator[OperatorRelease]:
    """The chart from this checkout, watching mkube's namespaces, with the CRD."""
    multinode.kubectl("apply", "-f", str(CRD))
    wait_established(multinode, CRD_NAME)
    suffix = uuid.uuid4().hex[:6]
    release = OperatorRelease(multinode, f"fusebox-mn-{suffix}", f"mn-{suffix}")
    multinode.kubectl("create", "namespace", release.namespace)
    multinode.kubectl(
        "label", "namespace", release.namespace, "pod-security.kubernetes.io/enforce=restricted"
    )
    try:
        # On the node no service pod can use, so losing a service's node does not
        # take the operator with it (that is the peering's case, test_operator_replicas).
        operator_node = next(n for n in nodes_in_order(multinode) if n not in inference_nodes)
        release.install(
            *("--set-json", f"watchNamespaces={json.dumps([WATCHED])}"),
            *("--set-json", f"nodeSelector={json.dumps({HOSTNAME: operator_node})}"),
            chart=(str(CHART),),
        )
        wait_for(
            "the operator pod Ready", release.ready_pod, timeout=120, diagnose=release.describe
        )
        yield release
    finally:
        release.uninstall_with_services()
        multinode.kubectl("delete", "namespace", release.namespace, "--wait=false", check=False)


@pytest.fixture
def services_kube(mkube: Kube, operator_across: OperatorRelease) -> Iterator[Kube]:
    """mkube's namespace, its InferenceServices deleted while the operator still runs
    (else their finalizers would hold the namespace Terminating for ever)."""
    try:
        yield mkube
    finally:
        remove_inference_services(mkube.cluster, mkube.namespace)


@contextmanager
def shared_model_claim(
    cluster: Cluster, namespace: str, root: Path, nodes: list[str]
) -> Iterator[None]:
    """The PVC `models` over `root`, reachable from each of `nodes` (one host directory:
    on real nodes, a share mounted on each), read-only, so `pvc://models/tiny` resolves
    wherever the pod lands among them."""
    pv_name = f"models-{namespace}"[:60]
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": pv_name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadOnlyMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "local",
            "local": {"path": str(root)},
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": HOSTNAME, "operator": "In", "values": nodes}]}
                    ]
                }
            },
        },
    }
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "models", "namespace": namespace},
        "spec": {
            "accessModes": ["ReadOnlyMany"],
            "storageClassName": "local",
            "volumeName": pv_name,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    cluster.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps({"kind": "List", "apiVersion": "v1", "items": [volume, claim]}),
    )
    try:
        yield
    finally:
        cluster.kubectl("-n", namespace, "delete", "pvc", "models", "--wait=false", check=False)
        cluster.kubectl("delete", "pv", pv_name, "--wait=false", check=False)


def wait_serving(service: Service, what: str) -> None:
    wait_for(
        what,
        lambda: service.condition(ConditionType.READY).get("status") == "True",
        timeout=120,
        diagnose=service.diagnose,
    )


def one_ready_pod_per_node(service: Service) -> dict[str, dict[str, Any]] | None:
    """The service's two ready pods by node, once each runs on a node of its own."""
    placed = {p["spec"]["nodeName"]: p for p in service.ready_pods()}
    return placed if len(placed) == 2 and len(service.ready_pods()) == 2 else None


def ready_pod_on(service: Service, node: str) -> dict[str, Any] | None:
    placed = [p for p in service.ready_pods() if p["spec"].get("nodeName") == node]
    return placed[0] if placed else None


def spread_one_per_node(service_name: str, **policy: str) -> list[dict[str, Any]]:
    """At most one more of the service's pods on any node than on another (`policy`:
    nodeTaintsPolicy, nodeAffinityPolicy)."""
    return [
        {
            "maxSkew": 1,
            "topologyKey": HOSTNAME,
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"fusebox.dev/service": service_name}},
            **policy,
        }
    ]
