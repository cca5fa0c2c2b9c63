"""The control plane answers, authorizes with RBAC and serves custom resources."""

from __future__ import annotations

import json
from typing import Any

from ..conftest import wait_established


def test_apiserver_is_ready_and_a_new_service_account_may_not_list_pods(
    cluster: Any, kube: Any
) -> None:
    assert cluster.kubectl("get", "--raw", "/readyz").stdout == "ok"
    kube("create", "serviceaccount", "nobody")
    user = f"system:serviceaccount:{kube.namespace}:nobody"
    denied = kube("auth", "can-i", "list", "pods", f"--as={user}", check=False)
    assert denied.stdout.strip() == "no"
    # The admin still may: the answer depends on who asks.
    assert kube("auth", "can-i", "list", "pods").stdout.strip() == "yes"


CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.e2e.fusebox.dev"},
    "spec": {
        "group": "e2e.fusebox.dev",
        "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
                    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                ],
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {"type": "object", "properties": {"size": {"type": "integer"}}},
                            "status": {
                                "type": "object",
                                "properties": {"phase": {"type": "string"}},
                            },
                        },
                    }
                },
            }
        ],
    },
}


def test_crd_with_status_subresource_shows_printer_columns(cluster: Any, kube: Any) -> None:
    cluster.kubectl("apply", "-f", "-", input=json.dumps(CRD))
    try:
        wait_established(cluster, "widgets.e2e.fusebox.dev")
        widget = {
            "apiVersion": "e2e.fusebox.dev/v1",
            "kind": "Widget",
            "metadata": {"name": "w1"},
            "spec": {"size": 3},
        }
        kube("apply", "-f", "-", input=json.dumps(widget))
        # The status subresource: a status write through it sticks...
        kube(
            "patch",
            "widget",
            "w1",
            "--subresource=status",
            "--type=merge",
            "-p",
            '{"status": {"phase": "Glowing"}}',
        )
        # ...while status in a main-resource update is ignored.
        kube("patch", "widget", "w1", "--type=merge", "-p", '{"status": {"phase": "Ignored"}}')
        table = kube("get", "widget", "w1").stdout.splitlines()
        assert table[0].split() == ["NAME", "SIZE", "PHASE"]
        assert table[1].split()[:3] == ["w1", "3", "Glowing"]
    finally:
        cluster.kubectl("delete", "crd", "widgets.e2e.fusebox.dev", "--wait=false", check=False)
