"""Children deleted or edited by hand are put back, each named in a ChildRestored Warning.

A platform engineer who deletes a service's NetworkPolicy, ConfigMap or admin
Secret, or edits its Deployment or PDB with kubectl, finds them as the spec says
again within one resync (the suite's operator resyncs every RESYNC_SECONDS), with
an event naming the child and the field that had moved; the pod keeps serving and
keeps its admin token. An untouched service's resyncs write nothing.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

from fusebox_contract.names import EventReason

from .conftest import RESYNC_SECONDS, Service, ServiceFactory, base_spec, wait_for


def restored(service: Service) -> list[str]:
    events = service.events()
    return [str(e["message"]) for e in events if e["reason"] == EventReason.CHILD_RESTORED]


def child(service: Service, kind: str, name: str) -> dict[str, Any] | None:
    result = service.kubectl("get", kind, name, "-o", "json", check=False)
    return json.loads(result.stdout) if result.returncode == 0 else None


def versions(service: Service) -> dict[str, str]:
    """What moves only when someone writes a child's spec or data (not its status)."""
    name = service.name
    return {
        "deployment": str(child(service, "deployment", name)["metadata"]["generation"]),
        "pdb": str(child(service, "pdb", name)["metadata"]["generation"]),
        **{
            kind: child(service, kind, object_name)["metadata"]["resourceVersion"]
            for kind, object_name in (
                ("service", name),
                ("configmap", f"{name}-config"),
                ("networkpolicy", name),
                ("secret", f"{name}-admin"),
            )
        },
    }


def test_children_deleted_or_edited_by_hand_are_put_back_and_named(
    inference_service: ServiceFactory,
) -> None:
    service = inference_service("restored", base_spec(), edited_children=True)
    name = service.name
    (pod,) = wait_for("the pod Ready", service.ready_pods, timeout=240, diagnose=service.diagnose)
    token = service.admin_token()

    untouched = versions(service)
    time.sleep(2 * RESYNC_SECONDS + 2)  # two resyncs of an untouched service
    assert versions(service) == untouched
    assert restored(service) == []

    service.kubectl("delete", "networkpolicy", name)
    service.kubectl("delete", "configmap", f"{name}-config")
    service.kubectl("delete", "secret", f"{name}-admin")
    service.kubectl(
        "patch", "deployment", name, "--type", "merge",
        "-p", '{"spec": {"strategy": {"rollingUpdate": {"maxSurge": 1}}}}',
    )  # fmt: skip
    service.kubectl(
        "patch", "pdb", name, "--type", "merge", "-p", '{"spec": {"maxUnavailable": 2}}'
    )  # fmt: skip
    expected = [
        f"NetworkPolicy {name} was missing (deleted outside Fusebox): recreated",
        f"ConfigMap {name}-config was missing (deleted outside Fusebox): recreated",
        f"Secret {name}-admin was missing (deleted outside Fusebox): recreated with the token "
        "the pods hold",
        f"Deployment {name} was edited outside Fusebox (spec.strategy.rollingUpdate.maxSurge): "
        "restored to the spec",
        f"PodDisruptionBudget {name} was edited outside Fusebox (spec.maxUnavailable): "
        "restored to the spec",
    ]
    wait_for(
        "a ChildRestored event for each child",
        lambda: set(expected) <= set(restored(service)) or None,
        timeout=6 * RESYNC_SECONDS,
        diagnose=lambda: "\n".join(restored(service)),
    )
    assert len(restored(service)) == len(expected), restored(service)

    assert child(service, "networkpolicy", name) is not None
    assert child(service, "configmap", f"{name}-config") is not None
    assert service.admin_token() == token  # the pods' token, not a new one
    deployment = child(service, "deployment", name)
    assert deployment is not None
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0
    assert child(service, "pdb", name)["spec"]["maxUnavailable"] == 1
    # Putting the Deployment back changed no pod template: the same pod serves on.
    assert [p["metadata"]["name"] for p in service.ready_pods()] == [pod["metadata"]["name"]]


def test_an_admin_secret_planted_before_the_service_is_refused_until_it_is_deleted(
    inference_service: ServiceFactory, cluster: Any, namespace: str
) -> None:
    """Someone who may create Secrets in the namespace makes `<name>-admin` first, with
    a token they know: the operator takes no token it did not write. Ready False names
    the Secret and why, a Warning says it once, no pod is made to mount it; deleted,
    the operator writes its own (controlled by the service) and applies the rest."""
    name, planted = "planted", "p" * 43
    secret = f"{name}-admin"
    cluster.kubectl(
        "-n", namespace, "create", "secret", "generic", secret, f"--from-literal=token={planted}"
    )
    service = inference_service(name, base_spec())

    def refused() -> dict[str, Any] | None:
        ready = service.condition("Ready")
        return ready if ready.get("reason") == EventReason.ADMIN_SECRET_REFUSED else None

    ready = wait_for("Ready AdminSecretRefused", refused, timeout=90, diagnose=service.diagnose)
    assert ready["status"] == "False"
    assert f"Secret {namespace}/{secret} was not written by Fusebox" in ready["message"]
    assert planted not in json.dumps(service.get()) + json.dumps(service.events())
    assert child(service, "deployment", name) is None
    warnings = [e for e in service.events() if e["reason"] == EventReason.ADMIN_SECRET_REFUSED]
    assert [e["type"] for e in warnings] == ["Warning"]

    service.kubectl("delete", "secret", secret)
    wait_for("the Deployment", lambda: child(service, "deployment", name), timeout=120)
    written = child(service, "secret", secret)
    assert written is not None
    (owner,) = written["metadata"]["ownerReferences"]
    assert (owner["uid"], owner["controller"]) == (service.get()["metadata"]["uid"], True)
    assert written["data"]["token"] != base64.b64encode(planted.encode()).decode()
    service.kubectl("delete", "inferenceservice", name, "--wait=false")  # no pod to start
