"""The children from watches, against a real kube-apiserver: what a resync costs and
what it repairs.

Against etcd and the API server on loopback (no nodes, no controllers), the
operator's own Kube with its child watches running:
- a resync of an untouched service reads no child from the apiserver (the
  apiserver's own request counter shows no GET of any watched kind), and the
  children the operator's own session wrote carry the client library's field
  manager, as when the client wrote them;
- a NetworkPolicy deleted and a PodDisruptionBudget edited by another client
  touch their service (its next tick resyncs it), and the resync puts both back;
- a write computed from a view that fell behind is refused by the apiserver
  (409) and made again from a fresh read, never over the other writer's change;
- sizing reads the GPU memory label of nodes from the raw LIST.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import kubernetes
import pytest
import yaml

from fusebox_operator import manifests
from fusebox_operator.admin_secret import AdminSecretRefused
from fusebox_operator.kube import CHILD_PLURALS, WATCHED_CHILD_KINDS, Kube
from fusebox_operator.settings import OperatorSettings
from fusebox_operator.sizing import NODE_PRODUCT_LABEL, NODE_VRAM_LABEL, size_memory
from fusebox_operator.spec import parse_spec

from .loopback_apiserver import kubectl_ok as kubectl
from .loopback_apiserver import loopback_apiserver, skip_without_binaries

pytestmark = pytest.mark.integration

TOKEN = "child-watch-test-token"
NAMESPACE = "ml"
NAME = "chat"
SPEC = {"model": {"name": "chat", "source": "pvc://models/chat"}, "gpu": {"count": 0}}
RESOURCES = ("configmaps", "services", "poddisruptionbudgets", "networkpolicies", "deployments")
T = TypeVar("T")


def in_loop(kube: Kube, call: Coroutine[Any, Any, T]) -> T:
    """`call` in an event loop of its own, as each step of these tests is, the children's
    session (bound to the loop that opened it) closed with it."""

    async def run() -> T:
        try:
            return await call
        finally:
            await kube.close()

    return asyncio.run(run())


def requests(config: Path, verb: str, code: str = "") -> dict[str, float]:
    """apiserver_request_total by resource for one verb (and code), from the server."""
    text = kubectl(config, "get", "--raw", "/metrics")
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if labels.get("verb") != verb or (code and labels.get("code") != code):
            continue
        resource = labels.get("resource", "")
        counts[resource] = counts.get(resource, 0.0) + float(line.rsplit(" ", 1)[1])
    return counts


def wait_for(what: str, check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    skip_without_binaries("kubectl")
    with loopback_apiserver(
        tmp_path_factory.mktemp("apiserver"),
        token=TOKEN,
        user="admin",
        authorization_mode="RBAC",
    ) as config:
        kubectl(config, "create", "namespace", NAMESPACE)
        yield config


@pytest.fixture(scope="module")
def kube(kubeconfig: Path) -> Iterator[Kube]:
    kubernetes.config.load_kube_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
    watching = Kube()
    settings = OperatorSettings.from_env({"FUSEBOX_WATCH_NAMESPACES": NAMESPACE})
    watching.watch_children(settings)
    store = watching._child_store(NAMESPACE)
    assert store is not None
    wait_for("every child kind listed", lambda: all(store.synced(k) for k in WATCHED_CHILD_KINDS))
    yield watching
    watching.stop_watching()


def children() -> list[manifests.Manifest]:
    parsed = parse_spec(SPEC)
    settings = OperatorSettings.from_env({})
    secret, *rest = manifests.build_children(
        parsed, NAME, NAMESPACE, size_memory(parsed, []), settings, "token"
    )
    return [child for child in rest if child["kind"] in WATCHED_CHILD_KINDS]


def apply_all(kube: Kube) -> dict[str, str]:
    async def run() -> dict[str, str]:
        return {m["kind"]: (await kube.apply(m)).outcome for m in children()}

    return in_loop(kube, run())


def test_a_resync_of_an_untouched_service_reads_no_child(kubeconfig: Path, kube: Kube) -> None:
    assert set(apply_all(kube).values()) == {"created"}
    store = kube._child_store(NAMESPACE)
    assert store is not None
    wait_for(
        "the watches to see every child",
        lambda: all(store.get(m["kind"], NAMESPACE, m["metadata"]["name"]) for m in children()),
    )
    gets_before = requests(kubeconfig, "GET")

    outcomes = apply_all(kube)

    assert set(outcomes.values()) == {"unchanged"}
    gets_after = requests(kubeconfig, "GET")
    assert {r: gets_after.get(r, 0) - gets_before.get(r, 0) for r in RESOURCES} == dict.fromkeys(
        RESOURCES, 0
    )
    assert kube.children_touched(NAMESPACE, NAME) is False  # its own writes touch nothing
    # Written on the operator's own session, under the client library's field manager.
    for child in children():
        plural = CHILD_PLURALS[child["kind"]]
        got = kubectl(
            kubeconfig,
            "-n",
            NAMESPACE,
            "get",
            plural,
            child["metadata"]["name"],
            "-o",
            "json",
            "--show-managed-fields",
        )
        managers = {entry["manager"] for entry in json.loads(got)["metadata"]["managedFields"]}
        assert managers == {"OpenAPI-Generator"}, child["kind"]


def test_a_child_deleted_or_edited_elsewhere_touches_its_service_and_is_put_back(
    kubeconfig: Path, kube: Kube
) -> None:
    apply_all(kube)
    kube.children_touched(NAMESPACE, NAME)  # forget anything earlier
    kubectl(kubeconfig, "-n", NAMESPACE, "delete", "networkpolicy", NAME)
    kubectl(
        kubeconfig, "-n", NAMESPACE, "patch", "pdb", NAME,
        "--type", "merge", "-p", '{"spec": {"maxUnavailable": 2}}',
    )  # fmt: skip
    wait_for("the service touched", lambda: kube.children_touched(NAMESPACE, NAME))
    store = kube._child_store(NAMESPACE)
    assert store is not None
    wait_for(
        "both events seen",
        lambda: (
            store.get("NetworkPolicy", NAMESPACE, NAME) is None
            and (store.get("PodDisruptionBudget", NAMESPACE, NAME) or {})
            .get("spec", {})
            .get("maxUnavailable")
            == 2
        ),
    )

    outcomes = apply_all(kube)

    assert outcomes["NetworkPolicy"] == "created"
    assert outcomes["PodDisruptionBudget"] == "updated"
    assert {k for k, v in outcomes.items() if v != "unchanged"} == {
        "NetworkPolicy",
        "PodDisruptionBudget",
    }
    pdb = json.loads(kubectl(kubeconfig, "-n", NAMESPACE, "get", "pdb", NAME, "-o", "json"))
    assert pdb["spec"]["maxUnavailable"] == 1
    kubectl(kubeconfig, "-n", NAMESPACE, "get", "networkpolicy", NAME)


def test_a_write_from_a_view_behind_the_apiserver_is_refused_and_made_again(
    kubeconfig: Path, kube: Kube
) -> None:
    apply_all(kube)
    config_map = next(m for m in children() if m["kind"] == "ConfigMap")
    name = config_map["metadata"]["name"]
    store = kube._child_store(NAMESPACE)
    assert store is not None
    wait_for("the ConfigMap seen", lambda: store.get("ConfigMap", NAMESPACE, name) is not None)
    seen = store.get("ConfigMap", NAMESPACE, name)
    assert isinstance(seen, dict)
    behind: dict[str, Any] = json.loads(json.dumps(seen))
    behind["data"] = {key: "edited by hand" for key in behind.get("data") or {"x": ""}}
    # Another client edits it; the operator's view is made to lag behind that edit.
    edit = {"data": {**dict.fromkeys(config_map["data"], "another writer"), "other": "writer"}}
    kubectl(
        kubeconfig, "-n", NAMESPACE, "patch", "configmap", name,
        "--type", "merge", "-p", json.dumps(edit),
    )  # fmt: skip
    wait_for(
        "the edit seen",
        lambda: "other" in ((store.get("ConfigMap", NAMESPACE, name) or {}).get("data") or {}),
    )
    store.record("ConfigMap", behind)
    refused_before = requests(kubeconfig, "PATCH", code="409").get("configmaps", 0)

    outcome = in_loop(kube, kube.apply(config_map))

    assert outcome.outcome == "updated"
    assert requests(kubeconfig, "PATCH", code="409").get("configmaps", 0) == refused_before + 1
    now = json.loads(kubectl(kubeconfig, "-n", NAMESPACE, "get", "configmap", name, "-o", "json"))
    # Compared again with what the apiserver held: the rendered keys are put back, and
    # the other writer's own key, which the stale view never had, is left alone.
    assert now["data"] == {**config_map["data"], "other": "writer"}


def test_sizing_reads_the_gpu_memory_label_of_the_nodes_of_a_product(
    kubeconfig: Path, kube: Kube
) -> None:
    nodes = [
        ("gpu-a", "NVIDIA-A100-SXM4-80GB", "81920"),
        ("gpu-b", "NVIDIA-A100-SXM4-80GB", "81559"),
        ("gpu-c", "NVIDIA-L4", "23034"),
    ]
    for name, product, mib in nodes:
        kubectl(kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {NODE_PRODUCT_LABEL: product,
                                                  NODE_VRAM_LABEL: mib}},
        }))  # fmt: skip

    found = asyncio.run(kube.node_vram_mib("NVIDIA-A100-SXM4-80GB"))

    assert sorted(found) == [81559, 81920]
    assert sorted(asyncio.run(kube.node_vram_mib(""))) == [23034, 81559, 81920]


OWNER_UID = "0123abcd-0000-0000-0000-000000000000"
FIRST, ROTATED = "f" * 43, "r" * 43  # tokens as long as secrets.token_urlsafe(32)


def adopted_secret(name: str, token: str) -> dict[str, Any]:
    """The admin Secret a reconcile renders and adopts (kopf.adopt's owner reference)."""
    parsed = parse_spec(SPEC)
    secret, *_ = manifests.build_children(
        parsed, name, NAMESPACE, size_memory(parsed, []), OperatorSettings.from_env({}), token
    )
    secret["metadata"]["ownerReferences"] = [{
        "apiVersion": "fusebox.dev/v1alpha1", "kind": "InferenceService", "name": name,
        "uid": OWNER_UID, "controller": True, "blockOwnerDeletion": True,
    }]  # fmt: skip
    return secret


def test_a_secret_check_reads_a_rotated_token_and_recreates_a_deleted_secret(
    kubeconfig: Path, kube: Kube
) -> None:
    """One GET per check: the token the Secret holds now (rotated by hand), or, the
    Secret deleted, a create with the token the pods hold."""
    secret = adopted_secret("rotated", FIRST)
    name = secret["metadata"]["name"]
    assert in_loop(kube, kube.check_secret(secret)) == (True, FIRST)
    kubectl(
        kubeconfig, "-n", NAMESPACE, "patch", "secret", name, "--type", "merge",
        "-p", json.dumps({"stringData": {manifests.ADMIN_TOKEN_KEY: ROTATED}}),
    )  # fmt: skip
    gets_before = requests(kubeconfig, "GET").get("secrets", 0)

    assert in_loop(kube, kube.check_secret(secret)) == (False, ROTATED)
    assert requests(kubeconfig, "GET").get("secrets", 0) - gets_before == 1

    kubectl(kubeconfig, "-n", NAMESPACE, "delete", "secret", name)
    assert in_loop(kube, kube.check_secret(secret)) == (True, FIRST)
    kept = kubectl(kubeconfig, "-n", NAMESPACE, "get", "secret", name, "-o", "json")
    assert json.loads(kept)["data"][manifests.ADMIN_TOKEN_KEY]  # created again


def test_a_secret_planted_before_the_service_is_refused_and_left_untouched(
    kubeconfig: Path, kube: Kube
) -> None:
    """Made with kubectl before the service (no owner), its token is never taken: the
    create and the resync check both refuse it, naming it and why, and write nothing."""
    secret = adopted_secret("planted", FIRST)
    name = secret["metadata"]["name"]
    kubectl(
        kubeconfig, "-n", NAMESPACE, "create", "secret", "generic", name,
        f"--from-literal={manifests.ADMIN_TOKEN_KEY}={ROTATED}",
    )  # fmt: skip
    refused = f"Secret {NAMESPACE}/{name} was not written by Fusebox"
    with pytest.raises(AdminSecretRefused, match=refused):
        in_loop(kube, kube.create_secret_once(secret, likely_absent=True))
    with pytest.raises(AdminSecretRefused, match=refused):
        in_loop(kube, kube.check_secret(secret))
    with pytest.raises(AdminSecretRefused, match=refused):
        in_loop(kube, kube.read_admin_token(NAMESPACE, name, OWNER_UID))
    kept = json.loads(kubectl(kubeconfig, "-n", NAMESPACE, "get", "secret", name, "-o", "json"))
    assert kept["data"][manifests.ADMIN_TOKEN_KEY] == base64.b64encode(ROTATED.encode()).decode()
    assert "ownerReferences" not in kept["metadata"]
