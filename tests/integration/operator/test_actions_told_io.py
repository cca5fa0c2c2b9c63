"""Kube.actions_told against a real kube-apiserver, as the operator's ServiceAccount.

A successor operator that finds an action its predecessor ran (the server replays
its result) posts the action's event unless an Event on the service already names
the action. Here the Events are real objects in a real API server, read under the
role in operator/rbac/ (impersonated):
- only the service's own Events count, and only the ids they name;
- a role that may not list events reads none, so the action is told again rather
  than told nowhere.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from .loopback_apiserver import REPO, kube_as, loopback_apiserver, skip_without_binaries
from .loopback_apiserver import kubectl_ok as kubectl

pytestmark = pytest.mark.integration

TOKEN = "actions-told-test-token"
NAMESPACE = "ml"
NAME = "chat"
OPERATOR = "system:serviceaccount:fusebox-system:fusebox-operator"
UNGRANTED = "system:serviceaccount:fusebox-system:no-events"


def event(name: str, kind: str, involved: str, message: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "involvedObject": {
            "apiVersion": "fusebox.dev/v1alpha1" if kind == "InferenceService" else "v1",
            "kind": kind,
            "name": involved,
            "namespace": NAMESPACE,
        },
        "reason": "GarbageCollected",
        "message": message,
        "type": "Normal",
    }


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    skip_without_binaries("kubectl")
    with loopback_apiserver(
        tmp_path_factory.mktemp("apiserver"), token=TOKEN, user="admin", authorization_mode="RBAC"
    ) as config:
        kubectl(config, "create", "namespace", NAMESPACE)
        kubectl(config, "create", "namespace", "fusebox-system")
        for part in ("serviceaccount", "clusterrole", "clusterrolebinding"):
            kubectl(config, "apply", "-f", str(REPO / "operator" / "rbac" / f"{part}.yaml"))
        told = [
            event("gc-1", "InferenceService", NAME, "chat-0: RSS high -> 1G [chat-000003-gc]"),
            # Another service's event, and a pod's, naming ids this service might use.
            event("gc-2", "InferenceService", "other", "other-0: RSS high [chat-000004-gc]"),
            event("gc-3", "Pod", "chat-0", "chat-0: RSS high [chat-000005-gc]"),
        ]  # fmt: skip
        kubectl(
            config,
            "apply",
            "-f",
            "-",
            stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": told}),
        )
        yield config


def test_only_the_ids_the_services_own_events_name_are_told(kubeconfig: Path) -> None:
    kube = kube_as(kubeconfig, OPERATOR)
    asked = ["chat-000003-gc", "chat-000004-gc", "chat-000005-gc", "chat-000006-gc"]
    assert asyncio.run(kube.actions_told(NAMESPACE, NAME, asked)) == {"chat-000003-gc"}
    # An id is matched whole: a prefix of a told id is not told.
    assert asyncio.run(kube.actions_told(NAMESPACE, NAME, ["chat-000003"])) == set()


def test_a_role_that_may_not_list_events_reads_none_told(
    kubeconfig: Path, caplog: pytest.LogCaptureFixture
) -> None:
    role = yaml.safe_load((REPO / "operator" / "rbac" / "clusterrole.yaml").read_text())
    role["metadata"]["name"] = "no-events"
    for rule in role["rules"]:
        if "events" in rule["resources"]:
            rule["verbs"] = ["create"]
    kubectl(kubeconfig, "apply", "-f", "-", stdin=json.dumps(role))
    kubectl(kubeconfig, "-n", "fusebox-system", "create", "serviceaccount", "no-events")
    kubectl(
        kubeconfig, "create", "clusterrolebinding", "no-events", "--clusterrole=no-events",
        "--serviceaccount=fusebox-system:no-events",
    )  # fmt: skip
    kube = kube_as(kubeconfig, UNGRANTED)
    assert asyncio.run(kube.actions_told(NAMESPACE, NAME, ["chat-000003-gc"])) == set()
    assert "events unread, replayed actions told again: Forbidden" in caplog.text
