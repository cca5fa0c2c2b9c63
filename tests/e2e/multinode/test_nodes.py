"""Several nodes of one localcluster: GPUs on each, the pod network between them,
spread, drain within a PodDisruptionBudget, and a node lost and back."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ..conftest import Cluster, wait_for
from ..localcluster.conftest import Kube
from .conftest import NODES, multinode_cli, pods_by_node

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]

# Run in a pod: GET each URL once; print the pod name each answered with, or the error.
ASK = """
import json, sys, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
answers = []
for url in sys.argv[1:]:
    try:
        answers.append(json.load(opener.open(url, timeout=5))["pod"])
    except Exception as err:
        answers.append("error: " + repr(err))
print(json.dumps(answers))
"""


def _deployment(kube: Kube, name: str, replicas: int, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": kube.testapp_pod_spec(**spec),
            },
        },
    }


def _spread(name: str, when_unsatisfiable: str) -> list[dict[str, Any]]:
    return [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": when_unsatisfiable,
            "labelSelector": {"matchLabels": {"app": name}},
        }
    ]


def _ask_from(kube: Kube, pod: str, *urls: str) -> list[str]:
    out = kube("exec", pod, "--", "python3", "-c", ASK, *urls).stdout
    answers: list[str] = json.loads(out)
    return answers


def _node_ready(cluster: Cluster, node: str) -> str:
    return cluster.kubectl(
        "get",
        "node",
        node,
        "-o",
        "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
    ).stdout.strip()


def test_every_node_is_ready_with_gpus_of_its_own(
    multinode: Cluster, node_names: list[str]
) -> None:
    assert len(node_names) == NODES
    nodes = json.loads(multinode.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    for node in nodes:
        name = node["metadata"]["name"]
        assert _node_ready(multinode, name) == "True", name
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "1", name
        assert node["metadata"]["labels"]["nvidia.com/gpu.present"] == "true", name
        assert node["metadata"]["labels"]["nvidia.com/gpu.product"], name
    cidrs = [n["spec"]["podCIDR"] for n in nodes]
    assert len(set(cidrs)) == NODES
    uuids: dict[str, list[str]] = {}

    def every_node_published_its_gpus() -> bool:
        # Each node's DRA driver publishes its ResourceSlice a moment after it starts.
        found = json.loads(multinode.kubectl("get", "resourceslices", "-o", "json").stdout)
        uuids.clear()
        for piece in found["items"]:
            devices = piece["spec"]["devices"]
            uuids[piece["spec"]["nodeName"]] = [d["attributes"]["uuid"]["string"] for d in devices]
        return sorted(uuids) == sorted(node_names)

    wait_for("a ResourceSlice from every node", every_node_published_its_gpus, timeout=60)
    every_uuid = [u for found in uuids.values() for u in found]
    assert len(set(every_uuid)) == len(every_uuid) == NODES


def test_pods_on_different_nodes_reach_each_other_and_a_service_across_nodes(
    mkube: Kube, node_names: list[str]
) -> None:
    _, second, third = node_names[:3]
    mkube.apply(
        mkube.testapp_pod("client", nodeName=second),
        mkube.testapp_pod("peer", nodeName=third),
        _deployment(
            mkube,
            "backend",
            2,
            affinity={
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "kubernetes.io/hostname",
                                        "operator": "NotIn",
                                        "values": [second],
                                    }
                                ]
                            }
                        ]
                    }
                }
            },
        ),
    )
    mkube("expose", "deployment", "backend", "--port=80", "--target-port=8080")
    for pod in ("client", "peer"):
        mkube.wait(f"pod/{pod}", "condition=Ready")
    mkube.wait("deployment/backend", "jsonpath={.status.readyReplicas}=2")
    peer_ip = mkube.get("pod", "peer")["status"]["podIP"]
    assert _ask_from(mkube, "client", f"http://{peer_ip}:8080/") == ["peer"]
    backends = {p["metadata"]["name"] for p in mkube.get("pods", "-l", "app=backend")["items"]}
    assert all(
        p["spec"]["nodeName"] != second for p in mkube.get("pods", "-l", "app=backend")["items"]
    )
    seen: set[str] = set()

    def every_backend_answered_by_dns_name() -> bool:
        urls = ["http://backend/"] * 6
        seen.update(a for a in _ask_from(mkube, "client", *urls) if not a.startswith("error"))
        return seen == backends

    mkube.eventually(every_backend_answered_by_dns_name, what="both backends through the Service")


def test_replicas_with_topology_spread_land_on_different_nodes(
    mkube: Kube, node_names: list[str]
) -> None:
    name = "spread"
    mkube.apply(
        _deployment(mkube, name, NODES, topologySpreadConstraints=_spread(name, "DoNotSchedule"))
    )
    mkube.wait(f"deployment/{name}", f"jsonpath={{.status.readyReplicas}}={NODES}")
    placed = pods_by_node(mkube, f"app={name}")
    assert sorted(placed) == sorted(node_names)
    assert all(len(pods) == 1 for pods in placed.values())


def test_drain_evicts_within_the_disruption_budget_and_pods_move_to_other_nodes(
    multinode: Cluster, mkube: Kube, node_names: list[str]
) -> None:
    name, drained = "drained", node_names[1]
    mkube.apply(
        _deployment(
            mkube,
            name,
            NODES,
            topologySpreadConstraints=_spread(name, "ScheduleAnyway"),
            terminationGracePeriodSeconds=2,
        ),
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": name},
            "spec": {"minAvailable": NODES, "selector": {"matchLabels": {"app": name}}},
        },
    )
    mkube.wait(f"deployment/{name}", f"jsonpath={{.status.readyReplicas}}={NODES}")
    assert drained in pods_by_node(mkube, f"app={name}")
    try:
        # Every replica is needed: the Eviction API refuses, so the drain cannot finish.
        refused = multinode.kubectl(
            "drain", drained, "--ignore-daemonsets", "--timeout=15s", check=False, timeout=60
        )
        assert refused.returncode != 0
        assert "disruption budget" in refused.stderr, refused.stderr
        assert drained in pods_by_node(mkube, f"app={name}")
        mkube(
            "patch",
            "pdb",
            name,
            "--type=merge",
            "-p",
            json.dumps({"spec": {"minAvailable": NODES - 1}}),
        )
        multinode_cli("node", "drain", drained, "--timeout=120")
        mkube.wait(f"deployment/{name}", f"jsonpath={{.status.readyReplicas}}={NODES}")
        placed = pods_by_node(mkube, f"app={name}")
        assert drained not in placed
        assert sum(len(p) for p in placed.values()) == NODES
        unschedulable = multinode.kubectl(
            "get", "node", drained, "-o", "jsonpath={.spec.unschedulable}"
        )
        assert unschedulable.stdout == "true"
    finally:
        multinode_cli("node", "uncordon", drained)


def test_a_stopped_node_turns_not_ready_and_comes_back_with_its_pod(
    multinode: Cluster, mkube: Kube, node_names: list[str]
) -> None:
    lost = node_names[-1]
    mkube.apply(mkube.testapp_pod("pinned", nodeName=lost))
    mkube.wait("pod/pinned", "condition=Ready")
    try:
        multinode_cli("node", "stop", lost)
        mkube.eventually(
            lambda: _node_ready(multinode, lost) == "Unknown",
            timeout_seconds=150,
            interval_seconds=3,
            what=f"{lost} NotReady after its kubelet died",
        )
        status = multinode_cli("status", timeout=120, check=False)
        assert status.returncode == 1
        section = status.stdout.split(f"node {lost} ", 1)[1]
        assert "kubelet                stopped" in section, status.stdout
        assert "containerd             stopped" in section, status.stdout
    finally:
        multinode_cli("node", "start", lost)
    assert _node_ready(multinode, lost) == "True"
    mkube.wait("pod/pinned", "condition=Ready", timeout_seconds=180)
    pinned = mkube.get("pod", "pinned")
    restarts = pinned["status"]["containerStatuses"][0]["restartCount"]
    assert restarts >= 1, "the pod's container was killed with the node and started again"


def _allocatable_gpus(cluster: Cluster, node: str) -> str:
    return cluster.kubectl(
        "get", "node", node, "-o", r"jsonpath={.status.allocatable.nvidia\.com/gpu}"
    ).stdout.strip()


def test_a_gpu_unhealthy_on_one_node_leaves_the_other_nodes_gpus_alone(
    multinode: Cluster, node_names: list[str]
) -> None:
    sick, *healthy = node_names[::-1]
    try:
        multinode_cli("gpu", "--node", sick, "unhealthy", "0")
        wait_for(
            f"{sick} to offer no GPU",
            lambda: _allocatable_gpus(multinode, sick) == "0",
            timeout=60,
            every=1,
        )
        assert [_allocatable_gpus(multinode, n) for n in healthy] == ["1"] * len(healthy)
    finally:
        multinode_cli("gpu", "--node", sick, "healthy", "0")
    wait_for(
        f"{sick} to offer its GPU again",
        lambda: _allocatable_gpus(multinode, sick) == "1",
        timeout=60,
        every=1,
    )


def test_restarting_a_node_s_daemons_keeps_its_pod_and_the_control_plane_is_node_1_s(
    multinode: Cluster, mkube: Kube, node_names: list[str]
) -> None:
    node = node_names[1]
    mkube.apply(mkube.testapp_pod("steady", nodeName=node))
    mkube.wait("pod/steady", "condition=Ready")
    before = mkube.get("pod", "steady")
    multinode_cli("restart", "--node", node, "containerd", "kubelet", "kube-proxy")
    assert _node_ready(multinode, node) == "True"
    after = mkube.get("pod", "steady")
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["status"]["containerStatuses"][0]["restartCount"] == 0
    refused = multinode_cli("restart", "--node", node, "etcd", check=False)
    assert refused.returncode == 1
    assert "etcd: not a component" in refused.stderr, refused.stderr
