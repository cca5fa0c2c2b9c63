"""The kopf handlers, called as kopf calls them: what a user sees in the status
kopf would patch and in the events, for the cases where the handlers decide
between refusing, waiting and watching. The apiserver is a small fake (the
node labels, the pods, the children written); kopf.event is recorded."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

import aiohttp
import kopf
import pytest

from fusebox_contract.names import ConditionType, EventReason
from fusebox_operator import handlers
from fusebox_operator.actuator import RuntimeCall
from fusebox_operator.admin_secret import CONFLICT_RETRY_SECONDS, AdminSecretRefused
from fusebox_operator.drift import Applied
from fusebox_operator.endpoints import EndpointsRead, ServiceEndpoints
from fusebox_operator.kube import ChildRefused, KubeError
from fusebox_operator.kubelet_pressure import KubeletPressureReader
from fusebox_operator.memo import (
    CONTEXT_KEY,
    RECONCILE_SETTLE_SECONDS,
    SECRET_CHECK_EVERY_RESYNCS,
    SERVICE_KEY,
    OperatorContext,
    ServiceMemo,
)
from fusebox_operator.observations import PodSample, PodView
from fusebox_operator.policy_state import PolicyState
from fusebox_operator.settings import OperatorSettings
from fusebox_operator.tick import TickOutcome

NAMESPACE = "ml"
MODEL_ONLY = {"model": {"name": "chat", "source": "pvc://models/chat"}}  # 1 GPU, no product
VALID = {
    **MODEL_ONLY,
    "gpu": {"count": 1, "product": "NVIDIA-A100-SXM4-80GB"},
    "fallback": {"quantization": "int8"},
}
# Admitted by the CRD (fp8 with a GPU), refused by the operator: an A100 has no fp8.
REFUSED_EDIT = {**VALID, "fallback": {"quantization": "fp8"}}


class FakeKube:
    """The apiserver as the handlers see it through kube.Kube."""

    def __init__(self, node_vram_mib: tuple[int, ...] = ()) -> None:
        self.node_vram = list(node_vram_mib)
        self.written: list[str] = []
        self.pods_listed = 0
        self.statuses: dict[str, dict[str, Any]] = {}  # each service's status as stored
        self.status_reads = 0
        self.secret_reads = 0
        self.secrets_likely_absent: list[bool] = []
        self.touched: set[str] = set()  # services whose children a watch saw move
        self.secret_token = "token"  # what the admin Secret holds now
        self.secret_refusal: str | None = None  # why the Secret there is not the service's
        self.actuator = FakeActuator()
        self.pods: list[PodView] = []  # what the pod watch holds
        self.refusals: dict[str, KubeError] = {}  # what a write of a kind is answered
        self.list_error: KubeError | None = None  # what a pod LIST is answered instead
        # What the EndpointSlice watch holds, per Service (absent: listed, no slice).
        self.endpoints: dict[str, EndpointsRead] = {}

    def service_endpoints(self, namespace: str, service: str) -> EndpointsRead:
        return self.endpoints.get(service, EndpointsRead(service, ServiceEndpoints()))

    async def read_service_status(self, namespace: str, name: str) -> dict[str, Any]:
        self.status_reads += 1
        return dict(self.statuses.get(name, {}))

    async def actions_told(self, namespace: str, name: str, ids: Sequence[str]) -> set[str]:
        return set()  # no Event names an action here

    def children_touched(self, namespace: str, service: str) -> bool:
        if service not in self.touched:
            return False
        self.touched.discard(service)
        return True

    async def node_vram_mib(self, product: str) -> list[int]:
        return list(self.node_vram)

    def _refuse_a_foreign_secret(self) -> None:
        if self.secret_refusal is not None:
            raise AdminSecretRefused(self.secret_refusal)

    async def create_secret_once(
        self, manifest: Mapping[str, Any], likely_absent: bool = False
    ) -> bool:
        self._refuse_a_foreign_secret()
        self.written.append(f"{manifest['kind']} {manifest['metadata']['name']}")
        self.secrets_likely_absent.append(likely_absent)
        return True

    async def apply(self, manifest: Mapping[str, Any], scale: bool = True) -> Applied:
        if manifest["kind"] in self.refusals:
            raise self.refusals[manifest["kind"]]
        self.written.append(f"{manifest['kind']} {manifest['metadata']['name']}")
        return Applied(manifest, "created")

    async def list_pods(
        self, namespace: str, labels: Mapping[str, str], deployment: str
    ) -> list[Any]:
        self.pods_listed += 1
        if self.list_error is not None:
            raise self.list_error
        return list(self.pods)

    async def read_admin_token(self, namespace: str, name: str, owner_uid: str) -> str:
        self.secret_reads += 1
        self._refuse_a_foreign_secret()
        return self.secret_token

    async def check_secret(self, manifest: Mapping[str, Any]) -> tuple[bool, str]:
        self.secret_reads += 1
        self._refuse_a_foreign_secret()
        return False, self.secret_token

    async def set_deletion_costs(self, namespace: str, costs: Mapping[str, int]) -> None:
        if "Pod" in self.refusals:
            raise self.refusals["Pod"]
        self.written.append(f"pod-deletion-costs {dict(costs)}")

    async def scale_deployment(self, namespace: str, name: str, replicas: int) -> bool:
        self.written.append(f"scale {name} {replicas}")
        return True


class FakeActuator:
    """Nothing is sent (a pod's runtime state is taken as told); a test says which token
    a pod refused."""

    def __init__(self) -> None:
        self.refused: set[str] = set()

    async def reconcile_runtime(self, *_: Any) -> RuntimeCall:
        return RuntimeCall()

    def token_refused(self, token: str) -> bool:
        found = token in self.refused
        self.refused.discard(token)
        return found


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, str, str]]]:
    posted: list[tuple[str, str, str]] = []

    def record(body: Any, *, type: str, reason: str, message: str = "") -> None:
        posted.append((type, reason, message))

    monkeypatch.setattr(kopf, "event", record)
    yield posted


class Service:
    """One InferenceService: its body, and its status as kopf's patches leave it."""

    def __init__(self, kube: FakeKube, name: str = "chat") -> None:
        self.name = name
        self.kube = kube
        self.status: dict[str, Any] = {}
        self.generation = 0
        # Kept between calls, as kopf keeps an object's memo in one process; None:
        # every call gets a fresh one, as after an operator restart.
        self.kept: ServiceMemo | None = None
        # The operator-wide reader of the Nodes' MemoryPressure startup puts in the memo.
        self.kubelet: KubeletPressureReader | None = None

    def body(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": "fusebox.dev/v1alpha1",
            "kind": "InferenceService",
            "metadata": {
                "name": self.name,
                "namespace": NAMESPACE,
                "uid": "0123abcd-0000-0000-0000-000000000000",
                "generation": self.generation,
            },
            "spec": dict(spec),
            "status": self.status,
        }

    def memo(self) -> kopf.Memo:
        """A fresh memo: what a restarted operator knows (nothing but the object)."""
        # No pods are listed, so the tick never scrapes nor acts: no session, no actuator.
        context = OperatorContext(
            OperatorSettings.from_env({}),
            self.kube,  # type: ignore[arg-type]
            None,  # type: ignore[arg-type]
            self.kube.actuator,  # type: ignore[arg-type]
        )
        service = self.kept or ServiceMemo(next_resync_at=time.time() + 3600)
        memo = kopf.Memo({CONTEXT_KEY: context, SERVICE_KEY: service})
        if self.kubelet is not None:
            memo[handlers.KUBELET_PRESSURE_KEY] = self.kubelet
        return memo

    def _merge(self, patch: kopf.Patch) -> None:
        self.status = {**self.status, **dict(patch.get("status") or {})}
        self.kube.statuses[self.name] = self.status

    def reconcile(
        self, spec: Mapping[str, Any], old: Mapping[str, Any] | None = None, reason: str = "update"
    ) -> None:
        """One reconcile of `spec` as a new generation; its patch lands even when it raises."""
        self.generation += 1
        body = self.body(spec)
        patch = kopf.Patch()
        try:
            asyncio.run(
                handlers.reconcile(
                    spec=body["spec"],
                    name=self.name,
                    namespace=NAMESPACE,
                    body=body,
                    status=self.status,
                    meta=body["metadata"],
                    patch=patch,
                    memo=self.memo(),
                    old=old,
                    reason=reason,
                )
            )
        finally:
            self._merge(patch)

    def tick(
        self, spec: Mapping[str, Any], read: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """One timer tick; `read`: the status its body holds, when older than the stored one
        (kopf gave the timer the body before another handler's patch landed)."""
        body = self.body(spec)
        if read is not None:
            body["status"] = dict(read)
        patch = kopf.Patch()
        asyncio.run(
            handlers.telemetry(
                spec=body["spec"],
                name=self.name,
                namespace=NAMESPACE,
                uid=body["metadata"]["uid"],
                body=body,
                status=body["status"],
                meta=body["metadata"],
                patch=patch,
                memo=self.memo(),
            )
        )
        self._merge(patch)
        return dict(patch.get("status") or {})

    def condition(self, kind: ConditionType) -> dict[str, Any]:
        return next(c for c in self.status["conditions"] if c["type"] == kind)


def test_a_refused_edit_leaves_the_running_pods_watched_with_the_applied_spec(
    events: list[tuple[str, str, str]],
) -> None:
    service = Service(FakeKube())
    service.reconcile(VALID)
    with pytest.raises(kopf.PermanentError):
        service.reconcile(REFUSED_EDIT, old=VALID)
    assert service.condition(ConditionType.INVALID_SPEC)["status"] == "True"
    listed = service.kube.pods_listed
    service.status["updatedAt"] = "2000-01-01T00:00:00Z"  # due for its refresh

    # A fresh memo, as after an operator restart: status alone says what was applied.
    written = service.tick(REFUSED_EDIT)

    assert service.kube.pods_listed == listed + 1  # the pods of generation 1 are still scraped
    assert written["replicas"] == 0  # and the tick's status is written
    ready = service.condition(ConditionType.READY)
    assert (ready["reason"], ready["observedGeneration"]) == ("PodsNotReady", 1)
    invalid = service.condition(ConditionType.INVALID_SPEC)
    assert (invalid["status"], invalid["reason"]) == ("True", EventReason.INVALID_SPEC)
    assert "has no fp8 support" in invalid["message"]
    assert invalid["observedGeneration"] == 2


def test_a_tick_keeps_the_conditions_a_reconcile_wrote_while_it_ran(
    events: list[tuple[str, str, str]],
) -> None:
    service = Service(FakeKube())
    service.kept = ServiceMemo(next_resync_at=time.time() + 3600)
    service.reconcile(VALID)
    # The tick read its body when its figures were due for their refresh.
    read_by_the_tick = {**service.status, "updatedAt": "2000-01-01T00:00:00Z"}
    # While the tick scrapes, an edit is refused: its reconcile writes InvalidSpec.
    with pytest.raises(kopf.PermanentError):
        service.reconcile(REFUSED_EDIT, old=VALID)

    written = service.tick(VALID, read=read_by_the_tick)

    assert ConditionType.READY in {c["type"] for c in written["conditions"]}
    invalid = service.condition(ConditionType.INVALID_SPEC)
    assert (invalid["status"], invalid["observedGeneration"]) == ("True", 2)
    assert "has no fp8 support" in invalid["message"]


def test_a_tick_long_after_the_last_reconcile_writes_without_reading_its_object(
    events: list[tuple[str, str, str]],
) -> None:
    service = Service(FakeKube())
    service.kept = ServiceMemo(next_resync_at=time.time() + 3600)
    service.reconcile(VALID)
    service.status["updatedAt"] = "2000-01-01T00:00:00Z"  # due for its refresh
    service.tick(VALID)
    assert service.kube.status_reads == 1  # a reconcile just wrote: its conditions kept
    assert service.kept.reconciled_at is not None
    service.kept.reconciled_at -= RECONCILE_SETTLE_SECONDS
    service.kept.next_scrape_at = 0.0
    service.status["updatedAt"] = "2000-01-01T00:00:00Z"  # due for its refresh

    written = service.tick(VALID)

    assert "conditions" in written  # written, from the body the tick read
    assert service.kube.status_reads == 1  # and no GET of the object before it


def test_a_new_service_creates_its_secret_without_reading_first(
    events: list[tuple[str, str, str]],
) -> None:
    service = Service(FakeKube())
    service.reconcile(VALID, reason="create")
    service.reconcile(VALID, reason="resume")
    assert service.kube.secrets_likely_absent == [True, False]


def test_the_token_a_reconcile_just_wrote_is_not_read_back_by_the_first_tick(
    events: list[tuple[str, str, str]],
) -> None:
    service = Service(FakeKube())
    service.kept = ServiceMemo(next_resync_at=time.time() + 3600)
    service.reconcile(VALID, reason="create")  # the fake creates the Secret
    service.tick(VALID)
    assert service.kube.pods_listed == 2  # the reconcile's first observation, then the tick
    assert service.kube.secret_reads == 0
    assert service.kept.admin_token  # the generated one, kept for the admin calls


def test_a_child_a_watch_saw_move_is_resynced_at_the_next_tick(
    events: list[tuple[str, str, str]],
) -> None:
    kube = FakeKube()
    service = Service(kube)
    service.kept = ServiceMemo(next_resync_at=time.time() + 3600)  # no periodic resync due
    service.reconcile(VALID)
    kube.written.clear()
    service.tick(VALID)
    assert kube.written == []
    kube.touched.add(service.name)
    service.kept.next_scrape_at = 0.0

    service.tick(VALID)

    assert "NetworkPolicy chat" in kube.written  # every child compared and applied again
    restored = [m for _, reason, m in events if reason == EventReason.CHILD_RESTORED]
    assert "NetworkPolicy chat was missing (deleted outside Fusebox): recreated" in restored


def test_a_tick_that_read_the_status_before_an_edits_reconcile_landed_restores_nothing(
    events: list[tuple[str, str, str]],
) -> None:
    """The reconcile of an edit applied its children, and the watch saw them move; a
    tick whose body still holds the previous appliedSpec must not put the previous
    children back (seen in a CI rehearsal: two "edited outside Fusebox" Warnings for a
    ConfigMap only the operator had written)."""
    kube = FakeKube()
    service = Service(kube)
    service.kept = ServiceMemo(next_resync_at=time.time() + 3600)
    service.reconcile(VALID)
    before_edit = dict(service.status)
    edited = {**VALID, "telemetry": {"scrapeIntervalSeconds": 7, "wedgeAfterSeconds": 30}}
    service.reconcile(edited, old=VALID)
    assert service.status["appliedGeneration"] == 2 != before_edit["appliedGeneration"]
    kube.written.clear()
    kube.touched.add(service.name)
    service.kept.next_scrape_at = 0.0

    service.tick(edited, read=before_edit)

    assert kube.written == []
    assert [r for _, r, _ in events if r == EventReason.CHILD_RESTORED] == []
    # With the status the reconcile wrote, the next tick compares the children again.
    kube.touched.add(service.name)
    service.kept.next_scrape_at = 0.0
    service.tick(edited)
    assert "NetworkPolicy chat" in kube.written


def test_a_replica_resumed_after_another_applied_an_edit_puts_back_its_children(
    events: list[tuple[str, str, str]],
) -> None:
    """kopf peering paused this replica (its memo kept) while another applied an edit;
    no resume handler runs when it acts again, and a child deleted by hand is still
    put back: the generation the other replica applied is the one resynced."""
    kube = FakeKube()
    service = Service(kube)
    paused = service.kept = ServiceMemo(next_resync_at=time.time() + 3600)
    service.reconcile(VALID)
    service.tick(VALID)
    # The other replica: its own memo, the edit applied, its tick writing status.
    service.kept = ServiceMemo(next_resync_at=time.time() + 3600)
    edited = {**VALID, "telemetry": {"scrapeIntervalSeconds": 7, "wedgeAfterSeconds": 30}}
    service.reconcile(edited, old=VALID)
    service.tick(edited)
    service.status["operator"] = {"pod": "fusebox-operator-other", "since": "2027-01-15T08:00:00Z"}
    kube.statuses[service.name] = service.status
    # It leaves; this replica resumes, and a watch saw a child deleted.
    service.kept = paused
    kube.written.clear()
    kube.touched.add(service.name)
    paused.next_scrape_at = 0.0

    service.tick(edited)

    assert "NetworkPolicy chat" in kube.written
    restored = [m for _, reason, m in events if reason == EventReason.CHILD_RESTORED]
    assert "NetworkPolicy chat was missing (deleted outside Fusebox): recreated" in restored


# Edits the reconcile holds back before writing any child: refused, or waiting for
# GPU nodes (the labelled nodes gone when the edit comes).
HELD_BACK_EDITS = {
    "refused": (VALID, REFUSED_EDIT),
    "waiting": (MODEL_ONLY, {**MODEL_ONLY, "server": {"maxConcurrency": 4}}),
}


@pytest.mark.parametrize("restarted", [False, True], ids=["same-process", "after-restart"])
@pytest.mark.parametrize("held", sorted(HELD_BACK_EDITS))
def test_a_child_deleted_while_a_later_edit_is_held_back_is_put_back_from_the_applied_spec(
    events: list[tuple[str, str, str]], held: str, restarted: bool
) -> None:
    """docs/operator.md: the resync waits only while an edit is being reconciled. A
    refused (InvalidSpec) or waiting (WaitingForGPUNodes) edit was reconciled: the
    children of the applied generation are still the ones kept, even after a restart
    (whose resume refused the edit again, so this process applied nothing)."""
    applied, edit = HELD_BACK_EDITS[held]
    kube = FakeKube((81920,))
    service = Service(kube)
    service.kept = ServiceMemo(next_resync_at=time.time() + 3600)
    service.reconcile(applied)
    if held == "waiting":
        kube.node_vram = []  # the labelled nodes are gone when the edit comes
    with pytest.raises((kopf.PermanentError, kopf.TemporaryError)):
        service.reconcile(edit, old=applied)
    if restarted:
        service.kept = None
    kube.written.clear()
    kube.touched.add(service.name)  # a watch saw the NetworkPolicy deleted
    if service.kept is not None:
        service.kept.next_scrape_at = 0.0

    service.tick(edit)

    assert "NetworkPolicy chat" in kube.written
    restored = [m for _, reason, m in events if reason == EventReason.CHILD_RESTORED]
    assert "NetworkPolicy chat was missing (deleted outside Fusebox): recreated" in restored
    assert service.status["appliedGeneration"] == 1  # generation 1's children, not the edit's


TOPOLOGY_KEY = (
    "spec.template.spec.affinity.podAntiAffinity."
    "requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey"
)


def test_a_child_the_api_server_refuses_is_an_invalid_spec_naming_the_field(
    events: list[tuple[str, str, str]],
) -> None:
    """A spec the parser accepts but Kubernetes does not: said in status, not only retried
    every 10 s with 'Unprocessable Entity' in the operator's log."""
    kube = FakeKube()
    service = Service(kube)
    service.reconcile(VALID)
    edited = {**VALID, "server": {"maxConcurrency": 4}}
    kube.refusals["Deployment"] = ChildRefused(
        "Deployment", NAMESPACE, "chat", ((TOPOLOGY_KEY, "Required value: can not be empty"),), ""
    )
    with pytest.raises(kopf.TemporaryError) as raised:
        service.reconcile(edited, old=VALID)

    assert raised.value.delay == handlers.CHILD_REFUSED_RETRY_SECONDS > 10
    invalid = service.condition(ConditionType.INVALID_SPEC)
    assert (invalid["status"], invalid["reason"]) == ("True", "ChildRefused")
    assert invalid["observedGeneration"] == 2
    assert f"Deployment {NAMESPACE}/chat" in invalid["message"]
    assert f"{TOPOLOGY_KEY}: Required value: can not be empty" in invalid["message"]
    assert service.status["appliedGeneration"] == 1  # the edit is not applied
    assert service.condition(ConditionType.READY)["reason"] != "ChildRefused"  # gen 1's pods'

    del kube.refusals["Deployment"]  # the spec fixed
    service.reconcile(VALID, old=edited)
    invalid = service.condition(ConditionType.INVALID_SPEC)
    assert (invalid["status"], invalid["reason"]) == ("False", "SpecValid")


def test_a_child_refused_before_anything_was_applied_holds_ready_false_with_its_words(
    events: list[tuple[str, str, str]],
) -> None:
    kube = FakeKube()
    kube.refusals["Deployment"] = ChildRefused(
        "Deployment", NAMESPACE, "chat", ((TOPOLOGY_KEY, "Required value: can not be empty"),), ""
    )
    service = Service(kube)
    with pytest.raises(kopf.TemporaryError):
        service.reconcile(VALID, reason="create")
    ready = service.condition(ConditionType.READY)
    assert (ready["status"], ready["reason"]) == ("False", "ChildRefused")
    assert TOPOLOGY_KEY in ready["message"]


def test_any_other_api_error_is_retried_soon_and_says_nothing_in_status(
    events: list[tuple[str, str, str]],
) -> None:
    kube = FakeKube()
    service = Service(kube)
    service.reconcile(VALID)
    before = service.condition(ConditionType.INVALID_SPEC)
    kube.refusals["Deployment"] = KubeError(f"Deployment {NAMESPACE}/chat: Service Unavailable")
    with pytest.raises(kopf.TemporaryError) as raised:
        service.reconcile(VALID, old=VALID)
    assert raised.value.delay == 10
    assert service.condition(ConditionType.INVALID_SPEC) == before


def test_before_any_spec_is_applied_nothing_is_watched(
    events: list[tuple[str, str, str]],
) -> None:
    service = Service(FakeKube())
    with pytest.raises(kopf.PermanentError):
        service.reconcile(REFUSED_EDIT)
    assert service.tick(REFUSED_EDIT) == {}
    assert service.kube.pods_listed == 0


def test_a_record_a_check_added_since_refuses_is_still_watched(
    events: list[tuple[str, str, str]],
) -> None:
    """Applied before the AppArmor refusal (a8dbe98): its ticks stopped, silently."""
    unconfined = {"container.apparmor.security.beta.kubernetes.io/server": "unconfined"}
    applied = {**VALID, "pod": {"annotations": unconfined}}
    service = Service(FakeKube())
    service.reconcile(VALID)
    service.status["appliedSpec"] = json.dumps(applied)  # as the older operator wrote it
    service.status["updatedAt"] = "2000-01-01T00:00:00Z"  # due for its refresh
    listed = service.kube.pods_listed
    written = service.tick(applied)
    assert service.kube.pods_listed == listed + 1  # its pods are scraped
    assert written["replicas"] == 0 and "conditions" in written  # and their status written


def test_a_record_this_operator_cannot_read_is_said_once_not_left_standing(
    events: list[tuple[str, str, str]], caplog: pytest.LogCaptureFixture
) -> None:
    service = Service(FakeKube())
    service.reconcile(VALID)
    service.status["appliedSpec"] = "{not json"
    written = service.tick(VALID)
    fresh = service.condition(ConditionType.TELEMETRY_FRESH)
    assert (fresh["status"], fresh["reason"]) == ("False", "AppliedSpecUnreadable")
    assert "status.appliedSpec cannot be read" in fresh["message"]
    ready = service.condition(ConditionType.READY)
    assert (ready["status"], ready["reason"]) == ("Unknown", "AppliedSpecUnreadable")
    assert list(written) == ["conditions"]
    assert service.tick(VALID) == {}  # said once: the next ticks write nothing more
    logged = [r for r in caplog.records if "appliedSpec unreadable" in r.getMessage()]
    assert len(logged) == 1


def test_a_fixed_edit_is_applied_and_then_watched(events: list[tuple[str, str, str]]) -> None:
    service = Service(FakeKube())
    service.reconcile(VALID)
    with pytest.raises(kopf.PermanentError):
        service.reconcile(REFUSED_EDIT, old=VALID)
    fixed = {**VALID, "telemetry": {"scrapeIntervalSeconds": 7, "wedgeAfterSeconds": 30}}
    service.reconcile(fixed, old=REFUSED_EDIT)
    assert service.status["appliedGeneration"] == 3
    assert service.condition(ConditionType.INVALID_SPEC)["status"] == "False"
    service.tick(fixed)
    assert service.condition(ConditionType.READY)["observedGeneration"] == 3


def test_the_first_edit_accepted_after_a_refused_one_says_what_it_does(
    events: list[tuple[str, str, str]],
) -> None:
    """kopf records the refused spec as handled, so it is the next edit's `old`: the
    edit is told against the spec whose pods run (status.appliedSpec) instead."""
    service = Service(FakeKube())
    service.reconcile(VALID)
    with pytest.raises(kopf.PermanentError):
        service.reconcile(REFUSED_EDIT, old=VALID)
    fixed = {**VALID, "server": {"maxConcurrency": 4}}
    service.reconcile(fixed, old=REFUSED_EDIT)
    applied = [m for _, reason, m in events if reason == EventReason.SPEC_APPLIED]
    assert len(applied) == 1
    assert applied[0].startswith("generation 3: rolls the pods one at a time: ")
    assert "FUSEBOX_MAX_CONCURRENCY" in applied[0]


def test_an_edit_handled_again_is_told_once(events: list[tuple[str, str, str]]) -> None:
    """A replica taking over (or kopf retrying) handles the applied generation again,
    its `old` the spec itself: nothing new to tell, though status.appliedSpec (written
    with the operator's defaults) is not the raw spec byte for byte."""
    service = Service(FakeKube())
    service.reconcile(VALID)
    edited = {**VALID, "server": {"maxConcurrency": 4}}
    service.reconcile(edited, old=VALID)
    service.generation -= 1  # the same generation, handled again
    service.reconcile(edited, old=edited)
    applied = [m for _, reason, m in events if reason == EventReason.SPEC_APPLIED]
    assert len(applied) == 1, applied


@pytest.mark.parametrize("name", ["chat.v2", "a" * 64, "1chat", "Chat", "chat-"])
def test_a_name_its_service_cannot_carry_is_an_invalid_spec_and_nothing_is_written(
    events: list[tuple[str, str, str]], name: str
) -> None:
    service = Service(FakeKube(), name=name)
    with pytest.raises(kopf.PermanentError):
        service.reconcile(VALID)
    invalid = service.condition(ConditionType.INVALID_SPEC)
    assert invalid["status"] == "True"
    assert "metadata.name" in invalid["message"] and "DNS-1035" in invalid["message"]
    assert service.kube.written == []
    assert [reason for _, reason, _ in events] == [EventReason.INVALID_SPEC]


def test_a_name_of_63_characters_is_applied(events: list[tuple[str, str, str]]) -> None:
    name = "c" + "-" * 61 + "9"
    service = Service(FakeKube(), name=name)
    service.reconcile(VALID)
    assert f"Service {name}" in service.kube.written


def test_no_labelled_gpu_node_yet_is_waited_for_not_refused(
    events: list[tuple[str, str, str]],
) -> None:
    spec = MODEL_ONLY
    kube = FakeKube()  # a GPU pool scaled to zero: no node says nvidia.com/gpu.memory
    service = Service(kube)
    with pytest.raises(kopf.TemporaryError) as raised:
        service.reconcile(spec)
    assert raised.value.delay == handlers.GPU_NODES_RETRY_SECONDS
    ready = service.condition(ConditionType.READY)
    assert (ready["status"], ready["reason"]) == ("False", EventReason.WAITING_FOR_GPU_NODES)
    assert "nvidia.com/gpu.memory" in ready["message"]
    invalid = service.condition(ConditionType.INVALID_SPEC)
    assert (invalid["status"], invalid["reason"]) == ("False", EventReason.WAITING_FOR_GPU_NODES)
    assert kube.written == []

    # kopf retries the same generation; the event is not posted again.
    service.generation -= 1
    with pytest.raises(kopf.TemporaryError):
        service.reconcile(spec)
    assert [r for _, r, _ in events] == [EventReason.WAITING_FOR_GPU_NODES]

    kube.node_vram = [81920]  # the pool scaled up, GPU Feature Discovery labelled the node
    service.generation -= 1
    service.reconcile(spec)
    assert f"Deployment {service.name}" in kube.written
    assert service.status["memory"]["source"] == "node label nvidia.com/gpu.memory"
    assert service.condition(ConditionType.READY)["reason"] == "PodsNotReady"  # none listed
    assert service.condition(ConditionType.INVALID_SPEC)["reason"] == "SpecValid"


def test_waiting_for_gpu_nodes_leaves_ready_to_the_pods_already_running(
    events: list[tuple[str, str, str]],
) -> None:
    kube = FakeKube(node_vram_mib=(81920,))
    service = Service(kube)
    spec = MODEL_ONLY
    service.reconcile(spec)
    service.tick(spec)
    kube.node_vram = []  # the labelled nodes are gone when an edit comes
    edited = {**spec, "server": {"maxConcurrency": 4}}
    with pytest.raises(kopf.TemporaryError):
        service.reconcile(edited, old=spec)
    assert service.condition(ConditionType.READY)["reason"] == "PodsNotReady"  # the tick's
    waiting = service.condition(ConditionType.INVALID_SPEC)
    assert (waiting["status"], waiting["reason"]) == ("False", EventReason.WAITING_FOR_GPU_NODES)
    listed = kube.pods_listed
    service.tick(edited)
    assert kube.pods_listed == listed + 1  # generation 1's pods stay watched


def test_undoing_an_edit_that_waited_for_gpu_nodes_accepts_the_spec_again(
    events: list[tuple[str, str, str]],
) -> None:
    kube = FakeKube(node_vram_mib=(81920,))
    service = Service(kube)
    spec = MODEL_ONLY
    service.reconcile(spec)
    applied = service.status["appliedGeneration"]
    edited = {**spec, "gpu": {"count": 1, "product": "Fusebox-Unknown-Accelerator"}}
    kube.node_vram = []  # no node offers that product
    with pytest.raises(kopf.TemporaryError):
        service.reconcile(edited, old=spec)
    service.tick(edited)
    assert service.condition(ConditionType.INVALID_SPEC)["reason"] == (
        EventReason.WAITING_FOR_GPU_NODES
    )
    # Undone: the spec is the one kopf last handled, so no reconcile runs; the loop says it.
    service.generation += 1
    service.tick(spec)
    accepted = service.condition(ConditionType.INVALID_SPEC)
    assert (accepted["status"], accepted["reason"]) == ("False", "SpecValid")
    assert accepted["observedGeneration"] == service.generation
    assert service.status["appliedGeneration"] == service.generation > applied


def test_undoing_an_edit_whose_child_was_refused_accepts_the_spec_again(
    events: list[tuple[str, str, str]],
) -> None:
    kube = FakeKube()
    service = Service(kube)
    service.kept = ServiceMemo(next_resync_at=time.time() + 3600)
    service.reconcile(VALID)
    edited = {**VALID, "server": {"maxConcurrency": 4}}
    kube.refusals["Deployment"] = ChildRefused(
        "Deployment", NAMESPACE, "chat", ((TOPOLOGY_KEY, "Required value: can not be empty"),), ""
    )
    with pytest.raises(kopf.TemporaryError):
        service.reconcile(edited, old=VALID)
    assert service.condition(ConditionType.INVALID_SPEC)["reason"] == "ChildRefused"
    del kube.refusals["Deployment"]  # the applied spec's Deployment was never refused
    kube.written.clear()
    events.clear()
    # Undone: the spec is the one kopf last handled, so no reconcile runs; the loop says it.
    service.generation += 1
    service.kept.next_scrape_at = 0.0
    service.tick(VALID)

    accepted = service.condition(ConditionType.INVALID_SPEC)
    assert (accepted["status"], accepted["reason"]) == ("False", "SpecValid")
    assert accepted["observedGeneration"] == service.generation
    assert service.status["appliedGeneration"] == service.generation
    # The refused edit's reconcile wrote the children before the Deployment: put back now,
    # told as the edit undone, not as someone else's edit.
    assert "ConfigMap chat-config" in kube.written
    [told] = [m for _, reason, m in events if reason == EventReason.SPEC_APPLIED]
    assert f"generation {service.generation}: the spec of generation 1 again" in told
    assert "ChildRefused undone" in told and "ConfigMap chat-config" in told
    assert EventReason.CHILD_RESTORED not in [reason for _, reason, _ in events]


def chinese_canned_answers(first: str) -> dict[str, Any]:
    """32 canned answers of Chinese text, within the CRD's bounds: 150 KB as kopf writes it."""
    answers = {f"{first * 250}{i}": "你" * 512 for i in range(32)}
    return {**VALID, "degradation": {"cannedAnswers": answers}}


def test_a_spec_too_large_in_bytes_is_refused_in_status_and_kopfs_record_stays_small(
    events: list[tuple[str, str, str]],
) -> None:
    service = Service(FakeKube())
    service.reconcile(VALID)
    large = chinese_canned_answers("问")
    with pytest.raises(kopf.PermanentError):
        service.reconcile(large, old=VALID)
    invalid = service.condition(ConditionType.INVALID_SPEC)
    assert (invalid["status"], invalid["reason"]) == ("True", EventReason.INVALID_SPEC)
    assert "spec.degradation.cannedAnswers takes" in invalid["message"]

    # kopf stores the refused spec as handled in the same cycle, before the status:
    # recorded by its digest, the annotation cannot pass Kubernetes' 256 KiB.
    storage = handlers.BoundedDiffBaseStorage(
        prefix="fusebox.dev", key="last-handled-configuration"
    )
    body = kopf.Body(service.body(large))
    patch = kopf.Patch()
    storage.store(body=body, patch=patch, essence=storage.build(body=body))
    recorded = patch["metadata"]["annotations"]
    assert recorded and all(len(key) + len(value) < 1024 for key, value in recorded.items())
    other = kopf.Body(service.body(chinese_canned_answers("答")))
    assert storage.build(body=other) != storage.build(body=body)  # every edit still a diff
    small = kopf.Body(service.body(VALID))
    assert storage.build(body=small)["spec"] == VALID  # a spec that fits is kopf's as ever


def created_with_a_token(kube: FakeKube) -> Service:
    """A service reconciled once (its admin Secret made, the token kept), the next
    resync far away; no Secret read so far."""
    service = Service(kube)
    service.kept = ServiceMemo(next_resync_at=time.time() + 3600)
    service.reconcile(VALID, reason="create")
    assert service.kept.admin_token is not None and kube.secret_reads == 0
    return service


def test_a_resync_reads_the_secret_every_few_runs_and_picks_up_a_rotated_token(
    events: list[tuple[str, str, str]],
) -> None:
    kube = FakeKube()
    service = created_with_a_token(kube)
    kube.secret_token = "rotated"  # someone rotates the Secret's token
    resync = OperatorSettings.from_env({}).resync_seconds
    reads = []
    for _ in range(SECRET_CHECK_EVERY_RESYNCS):
        service.kept.next_scrape_at = service.kept.next_resync_at = 0.0
        assert service.kept.secret_seen_at is not None
        service.kept.secret_seen_at -= resync  # one resync period passes
        service.tick(VALID)
        reads.append(kube.secret_reads)

    assert reads == [0] * (SECRET_CHECK_EVERY_RESYNCS - 1) + [1]
    assert service.kept.admin_token == "rotated"


def test_a_token_a_pod_refuses_is_read_again_at_the_next_tick(
    events: list[tuple[str, str, str]],
) -> None:
    kube = FakeKube()
    service = created_with_a_token(kube)
    created = service.kept.admin_token
    assert created is not None
    kube.secret_token = "rotated"
    kube.actuator.refused.add(created)  # a pod answered 401 to the tick's admin call

    service.tick(VALID)
    assert service.kept.admin_token is None and kube.secret_reads == 0
    service.kept.next_scrape_at = 0.0
    service.tick(VALID)

    assert kube.secret_reads == 1
    assert service.kept.admin_token == "rotated"


FOREIGN = "Secret team/chat-admin was not written by Fusebox for this InferenceService"


def refusals(events: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    return [event for event in events if event[1] == EventReason.ADMIN_SECRET_REFUSED]


def test_a_foreign_admin_secret_holds_a_new_service_back_until_it_is_gone(
    events: list[tuple[str, str, str]],
) -> None:
    kube = FakeKube()
    kube.secret_refusal = FOREIGN  # someone made chat-admin before the service existed
    service = Service(kube)
    service.kept = ServiceMemo(next_resync_at=time.time() + 3600)  # kopf's, across retries
    with pytest.raises(kopf.TemporaryError) as raised:
        service.reconcile(VALID, reason="create")
    assert raised.value.delay == CONFLICT_RETRY_SECONDS
    ready = service.condition(ConditionType.READY)
    assert (ready["status"], ready["reason"]) == ("False", EventReason.ADMIN_SECRET_REFUSED)
    assert ready["message"].startswith(FOREIGN)
    assert kube.written == []  # no Deployment would mount a token Fusebox did not write
    assert "memory" not in service.status

    # kopf retries the same generation: one Warning for the spell, not one per retry.
    service.generation -= 1
    with pytest.raises(kopf.TemporaryError):
        service.reconcile(VALID, reason="create")
    assert refusals(events) == [("Warning", EventReason.ADMIN_SECRET_REFUSED, FOREIGN)]

    kube.secret_refusal = None  # deleted: the operator writes its own
    service.generation -= 1
    service.reconcile(VALID, reason="create")
    assert f"Deployment {service.name}" in kube.written
    assert service.condition(ConditionType.READY)["reason"] != EventReason.ADMIN_SECRET_REFUSED


def test_a_tick_observes_without_a_token_from_a_secret_it_refuses(
    events: list[tuple[str, str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    kube = FakeKube()
    service = created_with_a_token(kube)
    service.kept.forget_token()  # a pod refused it: the next tick reads the Secret
    kube.secret_refusal = FOREIGN  # replaced by one of someone else's meanwhile
    tokens: list[str] = []
    run_tick = handlers.run_tick

    async def recorded(inputs: Any, *args: Any) -> Any:
        tokens.append(inputs.token)
        return await run_tick(inputs, *args)

    monkeypatch.setattr(handlers, "run_tick", recorded)
    reads = kube.secret_reads
    service.tick(VALID)
    service.kept.next_scrape_at = 0.0
    service.tick(VALID)

    assert tokens == ["", ""]  # observed all the same; an admin call carries no token
    assert service.kept.admin_token is None  # the foreign token is never taken
    assert refusals(events) == [("Warning", EventReason.ADMIN_SECRET_REFUSED, FOREIGN)]
    # One read found it refused; the next tick does not GET it again until a resync
    # period has passed, then reads it (deleted meanwhile: the token the pods hold).
    assert kube.secret_reads == reads + 1
    kube.secret_refusal = None
    assert service.kept.secret_refused_at is not None
    service.kept.secret_refused_at -= OperatorSettings.from_env({}).resync_seconds
    service.kept.next_scrape_at = 0.0
    service.tick(VALID)
    assert kube.secret_reads == reads + 2 and tokens[-1] == kube.secret_token


def test_a_resync_that_finds_a_foreign_secret_says_so_once_and_keeps_the_token_it_had(
    events: list[tuple[str, str, str]],
) -> None:
    kube = FakeKube()
    service = created_with_a_token(kube)
    token = service.kept.admin_token
    kube.secret_refusal = FOREIGN
    for _ in range(2):
        service.kept.next_scrape_at = service.kept.next_resync_at = 0.0
        service.kept.secret_seen_at = 0.0  # the Secret check is due
        service.tick(VALID)
    assert kube.secret_reads == 2
    assert service.kept.admin_token == token
    assert refusals(events) == [("Warning", EventReason.ADMIN_SECRET_REFUSED, FOREIGN)]


# A pod the ReplicaSet made, not yet scheduled: nothing to scrape, but the tick's to see.
PENDING = PodView("chat-0", "uid-0", "", "Pending", False, False, False, 0, False, False)
LONG_AGO = "2000-01-01T00:00:00Z"


def test_a_new_service_is_written_once_with_its_first_observation(
    events: list[tuple[str, str, str]],
) -> None:
    service = Service(FakeKube())
    service.kept = ServiceMemo(next_resync_at=time.time() + 3600)
    service.reconcile(VALID, reason="create")

    # The reconcile's write says what the first tick would have: no pod yet, so none serves.
    assert (service.status["pods"], service.status["replicas"]) == ([], 0)
    assert service.status["updatedAt"] and service.status["appliedGeneration"] == 1
    ready = service.condition(ConditionType.READY)
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "False",
        "PodsNotReady",
        "0/1 pods serving",
    )
    assert service.condition(ConditionType.INVALID_SPEC)["reason"] == "SpecValid"
    assert [reason for _, reason, _ in events] == [EventReason.MEMORY_SIZED]

    # The first timer tick lists the pods (still none), finds nothing moved, writes nothing,
    # and so reads nothing back either.
    assert service.tick(VALID) == {}
    assert (service.kube.pods_listed, service.kube.status_reads) == (2, 0)


def test_a_new_service_whose_pods_are_listed_already_is_observed_by_its_first_tick(
    events: list[tuple[str, str, str]],
) -> None:
    kube = FakeKube()
    kube.pods = [PENDING]
    service = Service(kube)
    service.kept = ServiceMemo(next_resync_at=time.time() + 3600)
    service.reconcile(VALID, reason="create")

    assert "updatedAt" not in service.status and "pods" not in service.status
    assert service.condition(ConditionType.READY)["reason"] == "Reconciling"
    written = service.tick(VALID)
    assert written["replicas"] == 1 and written["updatedAt"]


def test_a_resume_observes_only_a_service_no_tick_has_written(
    events: list[tuple[str, str, str]],
) -> None:
    kube = FakeKube()
    kube.pods = [PENDING]  # the operator stops before the first tick; the pod goes
    service = Service(kube)
    service.reconcile(VALID, reason="create")
    assert "updatedAt" not in service.status
    kube.pods = []

    service.reconcile(VALID, reason="resume")  # restarted: no tick status yet, so observed
    assert service.status["updatedAt"] and service.status["pods"] == []

    service.status["updatedAt"] = LONG_AGO
    kube.pods = [PENDING]
    service.reconcile(VALID, reason="resume")  # ticked before: its status is the tick's
    assert service.status["updatedAt"] == LONG_AGO
    assert service.condition(ConditionType.READY)["reason"] == "PodsNotReady"


class NodesAPI:
    """CoreV1Api.list_node as the API server answers it: node n2's kubelet under pressure."""

    def __init__(self) -> None:
        self.lists = 0

    def list_node(self, **_: Any) -> Any:
        self.lists += 1
        condition = {
            "type": "MemoryPressure",
            "status": "True",
            "lastTransitionTime": "2026-12-06T03:20:11Z",
            "message": "kubelet has insufficient memory available",
        }
        body = {"items": [{"metadata": {"name": "n2"}, "status": {"conditions": [condition]}}]}
        return type("Raw", (), {"data": json.dumps(body).encode()})()


def test_the_tick_is_told_which_nodes_their_kubelet_reports_under_memory_pressure(
    events: list[tuple[str, str, str]],
) -> None:
    kube = FakeKube()
    kube.pods = [replace(PENDING, node="n2")]  # placed on n2, not yet scrapable
    nodes = NodesAPI()
    service = Service(kube)
    service.kubelet = KubeletPressureReader(nodes)
    service.kept = ServiceMemo(next_resync_at=time.time() + 3600)
    service.reconcile(VALID, reason="create")
    service.tick(VALID)

    (warning,) = [m for _, reason, m in events if reason == EventReason.NODE_MEMORY_PRESSURE]
    assert warning.startswith("node n2: the kubelet reports MemoryPressure since ")
    condition = service.condition(ConditionType.NODE_MEMORY_PRESSURE)
    assert (condition["status"], condition["reason"]) == ("True", "KubeletMemoryPressure")
    # The next tick within the reader's interval lists no Nodes again.
    service.kept.next_scrape_at = 0.0
    service.tick(VALID)
    assert nodes.lists == 1


class ClosingKube:
    """The Kube methods the cleanup calls, recording them."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def stop_watching(self) -> None:
        self.calls.append("stop_watching")

    async def close(self) -> None:
        self.calls.append("close")


def test_cleanup_stops_the_watches_and_closes_every_session() -> None:
    """At exit nothing stays open: the children's watches and write session (else aiohttp
    logs "Unclosed client session"), the scrapes' and the admin calls' sessions."""
    kube = ClosingKube()

    async def exit_with_sessions() -> tuple[aiohttp.ClientSession, aiohttp.ClientSession]:
        scrapes, admin = aiohttp.ClientSession(), aiohttp.ClientSession()
        actuator = type("Actuator", (), {"session": admin})()
        context = OperatorContext(OperatorSettings.from_env({}), kube, scrapes, actuator)  # type: ignore[arg-type]
        await handlers.cleanup(memo=kopf.Memo({CONTEXT_KEY: context}))
        return scrapes, admin

    scrapes, admin = asyncio.run(exit_with_sessions())
    assert kube.calls == ["stop_watching", "close"]
    assert scrapes.closed and admin.closed


def test_a_tick_that_cannot_list_the_pods_says_so_instead_of_standing_as_observed(
    events: list[tuple[str, str, str]],
) -> None:
    kube = FakeKube()
    kube.pods = [PENDING]
    service = Service(kube)
    service.kept = ServiceMemo(next_resync_at=time.time() + 3600)
    service.reconcile(VALID, reason="create")
    service.tick(VALID)
    assert service.condition(ConditionType.READY)["reason"] == "PodsNotReady"

    kube.list_error = KubeError("pods in ml: the API server is unreachable (MaxRetryError)")
    service.kept.next_scrape_at = 0.0
    service.tick(VALID)
    ready = service.condition(ConditionType.READY)
    fresh = service.condition(ConditionType.TELEMETRY_FRESH)
    assert (ready["status"], ready["reason"]) == ("Unknown", "PodsNotListed")
    assert (fresh["status"], fresh["reason"]) == ("False", "PodsNotListed")
    assert "the API server is unreachable (MaxRetryError)" in fresh["message"]
    # The spell is written once, not at every tick.
    service.kept.next_scrape_at = 0.0
    assert service.tick(VALID) == {}


class LostNodeAPI(NodesAPI):
    """Node n2's kubelet stopped posting: the node controller set its Ready Unknown."""

    def list_node(self, **_: Any) -> Any:
        self.lists += 1
        condition = {
            "type": "Ready",
            "status": "Unknown",
            "lastTransitionTime": "2026-12-06T03:20:11Z",
            "reason": "NodeStatusUnknown",
        }
        body = {"items": [{"metadata": {"name": "n2"}, "status": {"conditions": [condition]}}]}
        return type("Raw", (), {"data": json.dumps(body).encode()})()


def test_a_pod_on_a_node_gone_not_ready_is_named_with_its_node(
    events: list[tuple[str, str, str]],
) -> None:
    kube = FakeKube()
    kube.pods = [replace(PENDING, node="n2")]
    service = Service(kube)
    service.kubelet = KubeletPressureReader(LostNodeAPI())
    service.kept = ServiceMemo(next_resync_at=time.time() + 3600)
    service.reconcile(VALID, reason="create")
    service.tick(VALID)
    assert service.condition(ConditionType.READY)["message"] == (
        "0/1 pods serving; chat-0 not ready: node n2 NotReady since 2026-12-06T03:20:11Z"
    )


def scaling_down(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tick decides a scale-down from 3 to 1, with the pods' deletion costs."""

    async def decided(*_: Any) -> TickOutcome:
        costs = {"chat-a": 2, "chat-b": 0, "chat-c": 1}
        return TickOutcome({}, [], PolicyState("svc"), [], replicas=1, deletion_costs=costs)

    monkeypatch.setattr(handlers, "run_tick", decided)


def test_a_scale_down_sets_the_pods_deletion_costs_before_lowering_the_count(
    events: list[tuple[str, str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    service = Service(FakeKube())
    service.reconcile(VALID)
    scaling_down(monkeypatch)
    service.kube.written.clear()
    service.tick(VALID)
    assert service.kube.written == [
        "pod-deletion-costs {'chat-a': 2, 'chat-b': 0, 'chat-c': 1}",
        "scale chat 1",
    ]


def test_a_refused_deletion_cost_still_scales_down(
    events: list[tuple[str, str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    kube = FakeKube()
    service = Service(kube)
    service.reconcile(VALID)
    scaling_down(monkeypatch)
    kube.refusals["Pod"] = KubeError("pod-deletion-cost of pod ml/chat-a: Forbidden")
    kube.written.clear()
    service.tick(VALID)
    assert kube.written == ["scale chat 1"]  # the ReplicaSet picks, as without the costs


def test_a_tick_judges_the_serving_pods_by_the_services_endpointslices_as_watched(
    events: list[tuple[str, str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Service is named as the object: its slices, as the watch holds them, decide
    whether the Ready pod that serves gets traffic."""
    serving = PodView(
        "chat-a", "uid-a", "10.1.0.1", "Running", True, True, True, 0, False, False,
        ready_since=time.time() - 600,
    )  # fmt: skip

    async def scrape_all(_session: Any, targets: Any, *_: Any) -> list[PodSample]:
        return [
            PodSample(t.name, time.time(), model_loaded=True, stats_valid=True,
                      stats_age_seconds=1.0, memory_guard_active=False)
            for t in targets
        ]  # fmt: skip

    monkeypatch.setattr(handlers, "scrape_all", scrape_all)
    kube = FakeKube()
    kube.pods = [serving]
    kube.endpoints["other"] = EndpointsRead("other", ServiceEndpoints(frozenset({"chat-a"})))
    service = Service(kube)
    service.kept = ServiceMemo(next_resync_at=time.time() + 3600)
    service.reconcile(VALID, reason="create")
    service.tick(VALID)
    ready = service.condition(ConditionType.READY)
    assert (ready["status"], ready["reason"]) == ("False", "NoReadyEndpoints")
    assert "Service chat's ready endpoints" in ready["message"]
    assert [r for t, r, _ in events if t == "Warning"] == [EventReason.NO_READY_ENDPOINTS]

    kube.endpoints["chat"] = EndpointsRead("chat", ServiceEndpoints(frozenset({"chat-a"})))
    service.kept.next_scrape_at = 0.0
    service.tick(VALID)
    ready = service.condition(ConditionType.READY)
    assert (ready["status"], ready["reason"]) == ("True", "PodsReady")
