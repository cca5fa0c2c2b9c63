"""Drift (drift.py): a child still carries what was rendered unless a field the operator
set moved. What the apiserver adds or respells is not drift, so an untouched service's
resync writes nothing; every real edit is named by its path in ChildRestored."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from fusebox_operator.drift import Applied, differences, restored_message, secret_restored_message
from fusebox_operator.manifests import build_network_policy, build_service
from fusebox_operator.settings import OperatorSettings
from fusebox_operator.sizing import MemorySizing, recorded_sizing

SNAPSHOTS = Path(__file__).parent / "snapshots"


def served_back(manifest: dict[str, Any]) -> dict[str, Any]:
    """The Deployment as the apiserver returns it: defaults added, empties dropped,
    quantities canonical, status and bookkeeping filled in."""
    current = copy.deepcopy(manifest)
    current["metadata"].update(
        uid="4f1d", resourceVersion="812", generation=3, managedFields=[{"manager": "kopf"}]
    )
    current["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] = "{}"
    current["spec"].update(revisionHistoryLimit=10, progressDeadlineSeconds=600)
    pod = current["spec"]["template"]["spec"]
    pod.update(dnsPolicy="ClusterFirst", schedulerName="default-scheduler")
    for container in pod["containers"] + pod.get("initContainers", []):
        container.setdefault("terminationMessagePolicy", "File")
        container.setdefault("imagePullPolicy", "IfNotPresent")
        for port in container.get("ports", []):
            port["protocol"] = "TCP"
        for variable in container.get("env", []):
            if variable.get("value") == "":
                del variable["value"]
    for volume in pod["volumes"]:
        for source in ("configMap", "secret"):
            if source in volume:
                volume[source].setdefault("defaultMode", 420)
    pod.setdefault("securityContext", {})
    current["status"] = {"replicas": 2, "readyReplicas": 2}
    return current


def deployment() -> dict[str, Any]:
    loaded = yaml.safe_load((SNAPSHOTS / "deployment-tiny-chat.yaml").read_text())
    assert loaded["kind"] == "Deployment"
    return dict(loaded)


def test_what_the_apiserver_adds_or_drops_is_not_drift() -> None:
    rendered = deployment()
    assert differences(rendered, served_back(rendered)) == []


def test_an_edited_image_and_an_added_env_var_are_named_by_their_paths() -> None:
    rendered = deployment()
    current = served_back(rendered)
    server = current["spec"]["template"]["spec"]["containers"][0]
    server["image"] = "registry.example/other:1"
    server["env"].append({"name": "EXTRA", "value": "1"})
    assert sorted(differences(rendered, current)) == [
        "spec.template.spec.containers[0].env",
        "spec.template.spec.containers[0].image",
    ]


@pytest.mark.parametrize(
    ("edit", "path"),
    [
        (lambda pod, server: pod.update(hostNetwork=True), "spec.template.spec.hostNetwork"),
        (lambda pod, server: pod.update(hostPID=True), "spec.template.spec.hostPID"),
        (
            lambda pod, server: pod["securityContext"].update(supplementalGroups=[0]),
            "spec.template.spec.securityContext.supplementalGroups",
        ),
        (
            lambda pod, server: server["securityContext"].update(privileged=True),
            "spec.template.spec.containers[0].securityContext.privileged",
        ),
        (
            lambda pod, server: server["securityContext"]["capabilities"].update(add=["SYS_ADMIN"]),
            "spec.template.spec.containers[0].securityContext.capabilities.add",
        ),
        (
            lambda pod, server: server.update(command=["sh", "-c", "cat /var/run/*/token"]),
            "spec.template.spec.containers[0].command",
        ),
        (
            lambda pod, server: server.update(envFrom=[{"secretRef": {"name": "other"}}]),
            "spec.template.spec.containers[0].envFrom",
        ),
        (
            lambda pod, server: pod["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
            "spec.template.spec.volumes",
        ),
        (
            lambda pod, server: pod["volumes"][1]["emptyDir"].update(medium="Memory"),
            "spec.template.spec.volumes[1].emptyDir.medium",
        ),
    ],
)
def test_a_hand_edit_adding_what_the_pods_may_do_is_drift(
    edit: Callable[[dict[str, Any], dict[str, Any]], None], path: str
) -> None:
    rendered = deployment()
    current = served_back(rendered)
    pod = current["spec"]["template"]["spec"]
    edit(pod, pod["containers"][0])

    assert differences(rendered, current) == [path]


def test_an_egress_rule_added_to_the_network_policy_by_hand_is_drift() -> None:
    wanted = build_network_policy("demo", "ns", OperatorSettings())
    body = {k: v for k, v in wanted.items() if k not in ("apiVersion", "kind")}
    current = copy.deepcopy(body)
    current["metadata"].update(uid="1", resourceVersion="2")
    assert differences(body, current) == []

    current["spec"]["egress"] = [{}]
    current["spec"]["ingress"][0]["from"] = [{"ipBlock": {"cidr": "0.0.0.0/0"}}]

    assert differences(body, current) == ["spec.ingress[0].from", "spec.egress"]


def test_external_ips_added_to_the_service_by_hand_are_drift() -> None:
    wanted = build_service("demo", "ns")
    body = {k: v for k, v in wanted.items() if k not in ("apiVersion", "kind")}
    current = copy.deepcopy(body)
    current["spec"].update(clusterIP="10.0.0.7", clusterIPs=["10.0.0.7"], sessionAffinity="None")
    assert differences(body, current) == []

    current["spec"]["externalIPs"] = ["203.0.113.9"]

    assert differences(body, current) == ["spec.externalIPs"]


def test_a_deleted_field_is_drift_and_an_emptied_one_is_not() -> None:
    assert differences({"spec": {"maxUnavailable": 1}}, {"spec": {}}) == ["spec.maxUnavailable"]
    assert differences({"spec": {"flag": False, "items": [], "note": ""}}, {"spec": {}}) == []
    assert differences({"data": {"a.json": "{}"}}, {"data": None}) == ["data"]


@pytest.mark.parametrize(
    ("wanted", "current", "same"),
    [
        ("0.5", "500m", True),
        ("2147483648", "2Gi", True),
        (1024, "1Ki", True),
        ("1.5m", "1500u", True),  # a sub-millicore cpu as the apiserver stores it
        ("0.0000000001", "1n", True),  # the apiserver keeps nanos, rounding up
        ("0.000000002", "2n", True),
        ("1Gi", "1G", False),
        ("500m", "600m", False),
        (True, 1, False),
        ("http", "metrics", False),
    ],
)
def test_a_quantity_in_another_spelling_is_the_same_value(
    wanted: Any, current: Any, same: bool
) -> None:
    found = differences({"limits": {"memory": wanted}}, {"limits": {"memory": current}})
    assert found == ([] if same else ["limits.memory"])


def test_a_list_of_another_length_or_type_is_drift() -> None:
    assert differences({"ports": [1, 2]}, {"ports": [1]}) == ["ports"]
    assert differences({"ports": [1]}, {"ports": "1"}) == ["ports"]
    assert differences({"spec": {"a": 1}}, {"spec": [1]}) == ["spec"]


def manifest(kind: str, name: str, **spec: Any) -> dict[str, Any]:
    return {"kind": kind, "metadata": {"name": name}, "spec": spec}


def test_the_events_name_the_child_and_what_moved() -> None:
    created = Applied(manifest("NetworkPolicy", "chat"), "created")
    assert restored_message(created, "chat") == (
        "NetworkPolicy chat was missing (deleted outside Fusebox): recreated"
    )
    edited = Applied(manifest("Deployment", "chat"), "updated", ["a", "b", "c", "d", "e"])
    assert restored_message(edited, "chat") == (
        "Deployment chat was edited outside Fusebox (a, b, c and 2 more): restored to the spec"
    )
    scaled = Applied(manifest("Deployment", "chat", replicas=2), "scaled", ["spec.replicas"])
    message = restored_message(scaled, "chat")
    assert "spec.replicas back to 2" in message
    assert "kubectl scale fis chat --replicas N" in message
    assert not Applied(manifest("Service", "chat"), "unchanged").wrote


def test_a_recreated_secret_says_whether_the_pods_token_survived() -> None:
    secret = {"kind": "Secret", "metadata": {"name": "chat-admin"}}
    kept = secret_restored_message(secret, "chat", same_token=True)
    assert kept.endswith("recreated with the token the pods hold")
    lost = secret_restored_message(secret, "chat", same_token=False)
    assert "new token" in lost and "kubectl rollout restart deployment chat" in lost


def test_the_resync_renders_with_the_sizing_the_reconcile_recorded() -> None:
    status_memory = {
        "limitBytes": 4 * 1024**3,
        "requestBytes": 2 * 1024**3,
        "vramBytes": 1024**3,
        "source": "node label",
        "qosClass": "Burstable",
    }
    assert recorded_sizing(status_memory) == MemorySizing(
        limit_bytes=4 * 1024**3,
        request_bytes=2 * 1024**3,
        vram_bytes=1024**3,
        vram_source="node label",
    )
    assert recorded_sizing({}) is None
    assert recorded_sizing({**status_memory, "limitBytes": "many"}) is None


def test_the_resync_interval_is_a_setting() -> None:
    assert OperatorSettings.from_env({}).resync_seconds == 60
    assert OperatorSettings.from_env({"FUSEBOX_RESYNC_SECONDS": "10"}).resync_seconds == 10
    with pytest.raises(ValueError, match="FUSEBOX_RESYNC_SECONDS=0 must be at least 5"):
        OperatorSettings.from_env({"FUSEBOX_RESYNC_SECONDS": "0"})
