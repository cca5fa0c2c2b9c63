"""The child store: what the watches saw of each child, and which services to repair.

A service is touched (its next tick resyncs it) when one of its children is
deleted, or edited in what an editor sets; never by a status or a new
resourceVersion alone, nor by the operator's own write. A kind not yet synced
answers UNKNOWN, so apply reads the apiserver instead of trusting a partial view.
"""

from __future__ import annotations

import copy
import gc
import json
import tracemalloc
from typing import Any

import pytest

from fusebox_operator import child_store, manifests
from fusebox_operator.child_store import UNKNOWN, ChildStore
from fusebox_operator.manifests import SERVICE_LABEL
from fusebox_operator.settings import OperatorSettings
from fusebox_operator.sizing import size_memory
from fusebox_operator.spec import parse_spec


def policy(service: str = "chat", version: str = "1", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": service,
            "namespace": "team",
            "labels": {SERVICE_LABEL: service},
            "resourceVersion": version,
        },
        "spec": {"podSelector": {}, **spec},
    }


def synced(*children: dict[str, Any]) -> ChildStore:
    store = ChildStore()
    store.replace("NetworkPolicy", children)
    return store


def test_a_kind_not_synced_is_unknown_and_a_synced_one_answers_absent_or_the_child() -> None:
    store = ChildStore()
    assert store.get("NetworkPolicy", "team", "chat") is UNKNOWN
    store.replace("NetworkPolicy", [policy()])
    assert store.get("NetworkPolicy", "team", "chat") == policy()
    assert store.get("NetworkPolicy", "team", "other") is None
    assert store.get("Deployment", "team", "chat") is UNKNOWN  # each kind on its own
    store.lost("NetworkPolicy")
    assert store.get("NetworkPolicy", "team", "chat") is UNKNOWN


def test_a_deleted_child_touches_its_service_once() -> None:
    store = synced(policy(), policy("other"))
    store.remove("NetworkPolicy", policy())
    assert store.take_touched("team", "chat") is True
    assert store.take_touched("team", "chat") is False  # told once
    assert store.take_touched("team", "other") is False
    assert store.get("NetworkPolicy", "team", "chat") is None


def test_an_edit_touches_the_service_and_a_status_or_version_change_does_not() -> None:
    store = synced(policy())
    moved = policy(version="2")
    moved["status"] = {"observed": True}
    store.put("NetworkPolicy", moved)
    assert store.take_touched("team", "chat") is False
    store.put("NetworkPolicy", policy(version="3", policyTypes=["Ingress"]))
    assert store.take_touched("team", "chat") is True


def test_the_operators_own_write_then_its_event_touch_nothing() -> None:
    store = synced(policy())
    written = policy(version="2", policyTypes=["Ingress"])
    store.record("NetworkPolicy", written)
    store.put("NetworkPolicy", copy.deepcopy(written))  # the watch event of that write
    assert store.take_touched("team", "chat") is False
    assert store.get("NetworkPolicy", "team", "chat") == written


def test_a_new_child_touches_nothing_and_a_relist_touches_what_the_watch_missed() -> None:
    store = synced(policy(), policy("edited"), policy("kept"))
    store.put("NetworkPolicy", policy("fresh"))
    assert store.take_touched("team", "fresh") is False
    # The watch lost its place; the LIST shows one child gone and one edited meanwhile.
    store.replace("NetworkPolicy", [policy("edited", policyTypes=["Egress"]), policy("kept")])
    assert store.take_touched("team", "chat") is True
    assert store.take_touched("team", "edited") is True
    assert store.take_touched("team", "kept") is False
    assert store.get("NetworkPolicy", "team", "fresh") is None


def test_the_store_keeps_no_status_nor_managed_fields() -> None:
    seen = policy()
    seen["status"] = {"conditions": []}
    seen["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {}}]
    store = synced(seen)
    store.put("NetworkPolicy", {**seen, "metadata": {**seen["metadata"], "name": "b"}})
    store.record("NetworkPolicy", {**seen, "metadata": {**seen["metadata"], "name": "c"}})
    for name in ("chat", "b", "c"):
        held = store.get("NetworkPolicy", "team", name)
        assert isinstance(held, dict)
        assert "status" not in held and "managedFields" not in held["metadata"]
        assert held["spec"] == seen["spec"]


def test_a_hundred_services_children_are_held_in_under_six_tenths_of_a_mib() -> None:
    """Held as parsed dicts they took about 4.7 MiB; as compact text about 0.85; deflated
    about 0.4 (docs/decisions/operator-memory.md)."""
    spec = parse_spec(
        {"model": {"name": "chat", "source": "pvc://models/chat"}, "gpu": {"memoryGiB": 80}}
    )
    settings = OperatorSettings.from_env({})
    texts = [
        json.dumps(child)
        for index in range(100)
        for child in manifests.build_children(
            spec, f"svc-{index:03d}", "team", size_memory(spec, []), settings, "token"
        )[1:]
    ]
    tracemalloc.start()
    try:
        listed = [json.loads(text) for text in texts]  # what a LIST hands over
        store = ChildStore()
        for kind in {child["kind"] for child in listed}:
            store.replace(kind, [child for child in listed if child["kind"] == kind])
        del listed
        gc.collect()
        held_bytes, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert store.get("Deployment", "team", "svc-099") is not None
    assert held_bytes < 0.6 * 1024**2


def deployment(version: str, revision: str | None = None, **status: Any) -> dict[str, Any]:
    annotations = {"fusebox.dev/template-hash": "abc"}
    if revision is not None:
        annotations["deployment.kubernetes.io/revision"] = revision
    return {
        "metadata": {
            "name": "chat",
            "namespace": "team",
            "labels": {SERVICE_LABEL: "chat"},
            "annotations": annotations,
            "resourceVersion": version,
            "generation": 1,
        },
        "spec": {"replicas": 0, "template": {"spec": {"containers": [{"name": "server"}]}}},
        "status": status,
    }


def test_the_deployment_controllers_revision_number_is_not_an_edit() -> None:
    """A new Deployment gets `deployment.kubernetes.io/revision` from the controller a
    moment after its create: no editor wrote it, and no rendered child sets it."""
    store = ChildStore()
    store.replace("Deployment", [])
    store.record("Deployment", deployment("1"))
    store.put("Deployment", deployment("2", revision="1", observedGeneration=1))
    assert store.take_touched("team", "chat") is False
    edited = deployment("3", revision="1")
    edited["spec"]["template"]["spec"]["containers"][0]["name"] = "renamed"
    store.put("Deployment", edited)
    assert store.take_touched("team", "chat") is True
    held = store.get("Deployment", "team", "chat")
    assert isinstance(held, dict)
    assert held["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "1"


def test_a_status_change_keeps_the_new_resource_version_for_the_next_write() -> None:
    store = synced(policy())
    moved = policy(version="7")
    moved["status"] = {"observed": True}
    store.put("NetworkPolicy", moved)
    held = store.get("NetworkPolicy", "team", "chat")
    assert held == policy(version="7")  # the version a write carries is the latest seen
    store.replace("NetworkPolicy", [policy(version="9")])  # a relist: the same
    assert store.get("NetworkPolicy", "team", "chat") == policy(version="9")
    assert store.take_touched("team", "chat") is False


def test_the_event_of_the_operators_own_write_is_not_serialized_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The watch event of a version the store recorded from the apiserver's answer brings
    nothing new: it costs no serialization (the ADDED event of each child the operator
    creates)."""
    store = synced(policy())
    written = policy(version="2", policyTypes=["Ingress"])
    store.record("NetworkPolicy", written)
    serialized: list[Any] = []
    real_dumps = child_store.json.dumps
    monkeypatch.setattr(
        child_store.json, "dumps", lambda *a, **k: serialized.append(a) or real_dumps(*a, **k)
    )
    store.put("NetworkPolicy", copy.deepcopy(written))
    assert serialized == []
    store.put("NetworkPolicy", policy(version="3", policyTypes=["Egress"]))
    assert len(serialized) == 1  # a new version is read as before
    assert store.take_touched("team", "chat") is True
