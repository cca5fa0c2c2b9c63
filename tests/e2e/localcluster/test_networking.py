"""Pod IPs, Services (kube-proxy) and cluster DNS (CoreDNS) work as on a real cluster."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest

from .conftest import eventually

# Run in a pod: ask a URL `times` times, `pause` s apart; print which pods answered.
ASK_REPEATEDLY = """
import json, sys, time, urllib.request
url, times, pause = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
answers = []
for _ in range(times):
    try:
        answers.append(json.load(urllib.request.urlopen(url, timeout=5))["pod"])
    except Exception as err:
        answers.append("error: " + repr(err))
    time.sleep(pause)
print(json.dumps(answers))
"""


def _deployment(kube: Any, name: str, replicas: int) -> dict[str, Any]:
    app = kube.testapp_container(
        env=[
            *kube.testapp_container()["env"],
            # Keep serving while the endpoint is withdrawn, as a graceful server does.
            {"name": "TERM_DELAY_SECONDS", "value": "10"},
        ],
        readinessProbe={"httpGet": {"path": "/readyz", "port": 8080}, "periodSeconds": 1},
    )
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": kube.testapp_pod_spec(terminationGracePeriodSeconds=20, containers=[app]),
            },
        },
    }


def test_deployment_pods_and_service_answer_by_ip_clusterip_and_dns(
    cluster: Any, kube: Any
) -> None:
    kube.apply(_deployment(kube, "web", 2))
    kube("expose", "deployment", "web", "--port=80", "--target-port=8080")
    kube.wait("deployment/web", "condition=Available")
    kube.wait("deployment/web", "jsonpath={.status.readyReplicas}=2")
    pods = kube.get("pods", "-l", "app=web")["items"]
    ips = {p["metadata"]["name"]: p["status"]["podIP"] for p in pods}
    assert len(ips) == 2 and len(set(ips.values())) == 2

    if cluster.local:
        # From the host, through its route to the node: each pod IP answers as itself.
        for name, ip in ips.items():
            assert kube.http_get_json(f"http://{ip}:8080/")["pod"] == name
        cluster_ip = kube.get("service", "web")["spec"]["clusterIP"]
        # kube-proxy programs a new Service on its next sync, not at once: until
        # then the ClusterIP refuses, and a sync that saw one ready endpoint sends
        # everything to that pod until the next. Ask until both pods have answered.
        seen: set[str] = set()

        def both_pods_answered() -> bool:
            with contextlib.suppress(OSError):  # refused: not programmed yet
                seen.add(kube.http_get_json(f"http://{cluster_ip}/")["pod"])
            return seen == set(ips)

        eventually(
            both_pods_answered,
            timeout_seconds=90,
            interval_seconds=0.2,
            what=f"both pods to answer through the ClusterIP {cluster_ip}",
        )

    # From inside a pod: the Service's DNS name balances across both pods.
    client = next(iter(ips))
    dns_name = f"http://web.{kube.namespace}.svc.cluster.local/"
    answers = json.loads(
        kube("exec", client, "--", "python3", "-c", ASK_REPEATEDLY, dns_name, "30", "0").stdout
    )
    assert set(answers) == set(ips), answers

    # Losing a pod: requests to the Service keep succeeding while it is replaced.
    victim, survivor = sorted(ips)
    kube("delete", "pod", victim, "--wait=false")
    answers = json.loads(
        kube("exec", survivor, "--", "python3", "-c", ASK_REPEATEDLY, dns_name, "40", "0.25").stdout
    )
    assert not [a for a in answers if a.startswith("error")], answers
    kube.wait("deployment/web", "jsonpath={.status.readyReplicas}=2")


# Run in a pod: try to open a TCP connection to each address; print what happened.
CONNECT = """
import json, socket, sys
results = {}
for address in sys.argv[1:]:
    try:
        socket.create_connection((address, 80), timeout=3).close()
        results[address] = "connected"
    except OSError as err:
        results[address] = type(err).__name__
print(json.dumps(results))
"""


def test_pods_cannot_reach_anything_beyond_the_machine(cluster: Any, kube: Any) -> None:
    if not cluster.local:
        pytest.fail("this checks localcluster's network isolation")
    kube.apply(kube.testapp_pod("isolated"))
    kube.wait("pod/isolated", "condition=Ready")
    # A public address, a documentation-range address and the default gateway's range.
    targets = ["1.1.1.1", "192.0.2.1", "8.8.8.8"]
    results = json.loads(kube("exec", "isolated", "--", "python3", "-c", CONNECT, *targets).stdout)
    assert set(results) == set(targets)
    assert "connected" not in results.values(), results
