"""reconcile_status: what a reconcile writes when it refuses, waits or applies."""

from __future__ import annotations

import yaml

from fusebox_contract.names import ConditionType, EventReason
from fusebox_operator.reconcile_status import (
    admin_secret_refused_status,
    applied_status,
    invalid_status,
    memory_sized_message,
    waiting_for_gpu_nodes,
)
from fusebox_operator.sizing import MemorySizing
from fusebox_operator.spec import applied_spec_text, parse_spec
from fusebox_operator.status import iso, set_condition

from .conftest import REPO

T0 = 1_800_000_000.0
RAW = {"model": {"name": "chat", "source": "pvc://models/chat"}, "gpu": {"count": 1}}
SIZING = MemorySizing(34 * 1024**3, 34 * 1024**3, 24 * 1024**3, "node label nvidia.com/gpu.memory")


def condition(status: dict, kind: ConditionType) -> dict:
    return next(c for c in status["conditions"] if c["type"] == kind)


def test_a_refused_spec_says_why_in_invalid_spec_and_ready() -> None:
    status = invalid_status({}, "gpu.count 2: more than 1 GPU", 4, T0)
    for kind in (ConditionType.INVALID_SPEC, ConditionType.READY):
        assert condition(status, kind)["reason"] == EventReason.INVALID_SPEC
        assert condition(status, kind)["message"] == "gpu.count 2: more than 1 GPU"
    assert condition(status, ConditionType.INVALID_SPEC)["status"] == "True"
    assert status["observedGeneration"] == 4


def test_a_refused_edit_of_a_running_service_leaves_ready_to_its_pods() -> None:
    # Pods of an applied spec serve (status.memory): Ready is the tick's, and a refused
    # edit is told by InvalidSpec alone, never by Ready False and back a tick later.
    ready = set_condition([], ConditionType.READY, True, "PodsReady", "1/1", 1, T0)
    refused = invalid_status({"conditions": ready, "memory": {}}, "fp8 on an A100", 2, T0 + 5)
    assert condition(refused, ConditionType.READY) == ready[0]
    invalid = condition(refused, ConditionType.INVALID_SPEC)
    assert (invalid["status"], invalid["reason"]) == ("True", EventReason.INVALID_SPEC)
    assert invalid["message"] == "fp8 on an A100"


def test_a_wait_for_gpu_nodes_is_new_once_and_leaves_ready_to_running_pods() -> None:
    first, text, new = waiting_for_gpu_nodes({}, "no node says nvidia.com/gpu.memory", 1, T0)
    assert new and text.endswith("looking again every 60 s")
    assert condition(first, ConditionType.READY)["reason"] == EventReason.WAITING_FOR_GPU_NODES
    _, _, again = waiting_for_gpu_nodes(first, "no node says nvidia.com/gpu.memory", 1, T0 + 60)
    assert not again
    # Pods of an applied spec run (status.memory): Ready is theirs, the tick's.
    ready = set_condition([], ConditionType.READY, True, "PodsReady", "1/1", 1, T0)
    running, _, _ = waiting_for_gpu_nodes({"conditions": ready, "memory": {}}, "x", 2, T0)
    assert condition(running, ConditionType.READY)["reason"] == "PodsReady"


def test_a_refused_admin_secret_holds_ready_until_applied_and_never_the_pods_ready() -> None:
    refused = admin_secret_refused_status({}, "Secret team/chat-admin has no controller", 1, T0)
    ready = condition(refused, ConditionType.READY)
    assert (ready["status"], ready["reason"]) == ("False", EventReason.ADMIN_SECRET_REFUSED)
    assert ready["message"] == "Secret team/chat-admin has no controller"
    # Deleted, then applied: the refusal is cleared like any reconcile's own.
    applied = applied_status(refused, RAW, SIZING, "chat", 1, T0 + 30)
    assert condition(applied, ConditionType.READY)["reason"] == "Reconciling"
    # Pods of an applied spec run (status.memory): Ready is theirs, the tick's.
    ready_rows = set_condition([], ConditionType.READY, True, "PodsReady", "1/1", 1, T0)
    assert admin_secret_refused_status({"conditions": ready_rows, "memory": {}}, "x", 2, T0) == {}


def test_an_applied_spec_records_its_sizing_and_the_spec_the_loop_watches_with() -> None:
    status = applied_status({}, RAW, SIZING, "chat", 3, T0)
    assert status["memory"] == {
        "limitBytes": SIZING.limit_bytes,
        "requestBytes": SIZING.request_bytes,
        "vramBytes": SIZING.vram_bytes,
        "source": "node label nvidia.com/gpu.memory",
        "qosClass": "Guaranteed",
    }
    assert status["appliedSpec"] == applied_spec_text(RAW)
    assert (status["appliedGeneration"], status["observedGeneration"]) == (3, 3)
    assert status["selector"] == "fusebox.dev/service=chat"
    spec_valid = condition(status, ConditionType.INVALID_SPEC)
    assert (spec_valid["status"], spec_valid["reason"]) == ("False", "SpecValid")
    assert condition(status, ConditionType.READY)["reason"] == "Reconciling"


def test_a_refused_edit_is_observed_not_applied_as_the_crd_describes_the_two() -> None:
    # The Kubernetes convention: observedGeneration is the last generation processed,
    # applied or refused; the children stay on appliedGeneration's spec.
    applied = applied_status({}, RAW, SIZING, "chat", 3, T0)
    stored = {**applied, **invalid_status(applied, "fp8 on an A100", 4, T0 + 5)}
    assert (stored["observedGeneration"], stored["appliedGeneration"]) == (4, 3)
    assert stored["appliedSpec"] == applied_spec_text(RAW)
    crd = yaml.safe_load((REPO / "crds" / "inferenceservice.yaml").read_text(encoding="utf-8"))
    status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    observed = status["properties"]["observedGeneration"]["description"]
    assert "applied or refused" in observed and "appliedGeneration" in observed


def test_an_applied_spec_clears_a_refusal_but_never_ready_the_pods_reported() -> None:
    refused = invalid_status({}, "bad", 2, T0)
    fixed = applied_status(refused, RAW, SIZING, "chat", 3, T0 + 5)
    ready = condition(fixed, ConditionType.READY)
    assert (ready["reason"], ready["lastTransitionTime"]) == ("Reconciling", iso(T0))
    serving = set_condition([], ConditionType.READY, True, "PodsReady", "1/1 pods serving", 3, T0)
    edited = applied_status({"conditions": serving}, RAW, SIZING, "chat", 4, T0 + 5)
    assert condition(edited, ConditionType.READY)["reason"] == "PodsReady"


def test_the_memory_sized_event_names_the_limit_and_where_vram_came_from() -> None:
    message = memory_sized_message(SIZING, parse_spec(RAW))
    assert message == (
        "memory limit 34Gi, request 34Gi (Guaranteed); VRAM 24.00 GiB x 1 from "
        "node label nvidia.com/gpu.memory, headroom 1.25"
    )
