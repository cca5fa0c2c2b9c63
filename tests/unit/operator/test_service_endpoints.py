"""Ready follows the Service's EndpointSlices: a pod the Service sends no traffic to does
not serve, and slices the operator cannot read are said, never passed over.

The ticks run the real control loop (tick.run_tick) without kopf, each handed
what the EndpointSlice watch's store holds (endpoint_store.EndpointStore, fed
the slices' JSON as the watch hands them over); the pods answer their scrapes
as serving. The EndpointSlice controller is what the tests stop: the pods stay
Ready while the slices do not move.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from kubernetes.client import V1ObjectMeta, V1Pod, V1PodCondition, V1PodStatus
from kubernetes.client.exceptions import ApiException

from fusebox_contract.names import ConditionType, EventReason, Variant
from fusebox_operator.actuator import ActionResult, RuntimeCall
from fusebox_operator.endpoint_store import EndpointStore
from fusebox_operator.endpoints import (
    ENDPOINTS_GRACE_SECONDS,
    EndpointMemory,
    EndpointsRead,
    ServiceEndpoints,
    judge_endpoints,
    slice_endpoints,
)
from fusebox_operator.kube import slices_unread
from fusebox_operator.observations import PodSample, PodView
from fusebox_operator.spec import parse_spec
from fusebox_operator.tick import TickInputs, TickMemory, TickOutcome, run_tick

from .served import view_of

T0 = 1_800_000_000.0
INTERVAL = 5.0
NAMESPACE = "ml"
SERVICE = "chat"
TWO = parse_spec({"model": {"name": "chat", "source": "pvc://models/tiny"}, "replicas": 2})
MIB = 1024**2


def pod(name: str, ip: str, ready_since: float = T0 - 600) -> PodView:
    """A Ready pod whose sidecar answers; Ready since `ready_since` (the kubelet's clock)."""
    return PodView(
        name, f"uid-{name}", ip, "Running", True, True, True, 0, False, False,
        ready_since=ready_since,
    )  # fmt: skip


def answer(name: str, at: float) -> PodSample:
    """What a serving pod's sidecar answers."""
    return PodSample(
        name,
        at,
        model_loaded=True,
        degradation_level=0,
        variant=Variant.PRIMARY,
        stats_valid=True,
        stats_age_seconds=1.0,
        rss_bytes=800 * MIB,
        rss_measured=True,
        memory_guard_active=False,
    )


def endpoint_slice(
    name: str, *endpoints: tuple[str, str, bool | None], service: str = SERVICE
) -> dict[str, Any]:
    """An EndpointSlice as the API serves it, as the slice controller writes one: the
    Service's labels copied, an endpoint per pod (pod, IP, ready; None: no ready condition)."""
    listed = []
    for target, ip, ready in endpoints:
        endpoint: dict[str, Any] = {"addresses": [ip], "conditions": {}}
        if ready is not None:
            endpoint["conditions"]["ready"] = ready
        if target:
            endpoint["targetRef"] = {"kind": "Pod", "namespace": NAMESPACE, "name": target}
        listed.append(endpoint)
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {
                "kubernetes.io/service-name": service,
                "fusebox.dev/service": service,
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
            },
        },
        "addressType": "IPv4",
        "endpoints": listed,
        "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
    }


def stored(*slices: dict[str, Any], now: float = T0) -> EndpointStore:
    """A store as the EndpointSlice watch leaves it after listing `slices`."""
    store = EndpointStore(now)
    store.replace(
        (s["metadata"]["namespace"], s["metadata"]["name"], slice_endpoints(s)) for s in slices
    )
    return store


class IdleActuator:
    async def execute(self, *_: Any) -> ActionResult:
        return ActionResult("done")

    async def reconcile_runtime(self, *_: Any) -> RuntimeCall:
        return RuntimeCall()


class Service:
    """One InferenceService's ticks beside its Service's EndpointSlice store."""

    def __init__(self, pods: Sequence[PodView], store: EndpointStore) -> None:
        self.spec = TWO
        self.pods = list(pods)
        self.store = store
        self.memory = TickMemory()
        self.status: dict[str, Any] = {}
        self.events: list[Any] = []
        self.now = T0

    def tick(self) -> TickOutcome:
        async def scrape(targets: Sequence[PodView]) -> list[PodSample]:
            return [answer(t.name, self.now) for t in targets]

        inputs = TickInputs(
            NAMESPACE, "svc", self.spec, self.status, self.pods, "token", 1,
            endpoints=self.store.read(NAMESPACE, SERVICE),
        )  # fmt: skip
        clock = self.now
        outcome = asyncio.run(run_tick(inputs, self.memory, scrape, IdleActuator(), lambda: clock))
        merged = {**self.status, **outcome.status_patch}
        self.status = {key: value for key, value in merged.items() if value is not None}
        self.events += outcome.events
        self.now += INTERVAL
        return outcome

    def ticks_for(self, seconds: float) -> None:
        end = self.now + seconds
        while self.now < end:
            self.tick()

    def condition(self, kind: ConditionType) -> dict[str, Any]:
        return next(c for c in self.status["conditions"] if c["type"] == kind)

    def ready(self) -> tuple[str, str]:
        ready = self.condition(ConditionType.READY)
        return ready["status"], ready["reason"]

    def warnings(self, reason: EventReason) -> list[str]:
        return [e.message for e in self.events if e.type == "Warning" and e.reason == reason]


A, B = pod("chat-a", "10.1.0.1"), pod("chat-b", "10.1.0.2")
BOTH_LISTED = endpoint_slice("chat-x1", ("chat-a", "10.1.0.1", True), ("chat-b", "10.1.0.2", True))


def test_ready_pods_the_services_slices_list_nowhere_make_ready_false_naming_the_service() -> None:
    """The slice controller down while both pods were replaced: the slices still list
    the old pods, and the new ones, Ready and serving, get no traffic."""
    old_pods = endpoint_slice("chat-x1", ("chat-old1", "10.1.0.7", True))
    service = Service([A, B], stored(old_pods))
    first = service.tick()
    assert service.ready() == ("False", "NoReadyEndpoints")
    message = service.condition(ConditionType.READY)["message"]
    assert message == (
        "0/2 pods serving; 2 of 2 Ready pod(s) missing from Service chat's ready endpoints "
        "(EndpointSlices): chat-a for 600 s, chat-b for 600 s"
    )
    available = service.condition(ConditionType.AVAILABLE)
    assert (available["status"], available["reason"]) == ("False", "NoReadyEndpoints")
    summary = service.status["summary"]
    assert (summary["ready"], summary["breaker"]) == ("0/2", "Refusing")
    assert [p["serving"] for p in service.status["pods"]] == ["NoReadyEndpoints"] * 2
    (warning,) = [e for e in first.events if e.reason is EventReason.NO_READY_ENDPOINTS]
    assert (warning.type, warning.message) == ("Warning", message)
    # The spell goes on: told once.
    service.tick()
    assert len(service.warnings(EventReason.NO_READY_ENDPOINTS)) == 1


def test_the_slice_controllers_lag_behind_a_new_ready_pod_is_not_an_outage() -> None:
    just_ready = [pod("chat-a", "10.1.0.1", T0 - 1), pod("chat-b", "10.1.0.2", T0 - 1)]
    store = stored(endpoint_slice("chat-x1"))
    service = Service(just_ready, store)
    service.tick()
    assert service.ready() == ("True", "PodsReady")
    store.put(NAMESPACE, "chat-x1", slice_endpoints(BOTH_LISTED))  # a second later
    service.ticks_for(2 * ENDPOINTS_GRACE_SECONDS)
    assert service.ready() == ("True", "PodsReady")
    assert service.warnings(EventReason.NO_READY_ENDPOINTS) == []


def test_slices_that_never_list_a_new_pod_flip_ready_once_the_grace_is_over() -> None:
    just_ready = [pod("chat-a", "10.1.0.1", T0), pod("chat-b", "10.1.0.2", T0)]
    service = Service(just_ready, stored(endpoint_slice("chat-x1")))
    service.ticks_for(ENDPOINTS_GRACE_SECONDS)
    assert service.ready() == ("True", "PodsReady")
    service.tick()
    assert service.ready() == ("False", "NoReadyEndpoints")
    assert len(service.warnings(EventReason.NO_READY_ENDPOINTS)) == 1


def test_one_serving_pod_missing_from_the_slices_is_named_and_the_other_still_serves() -> None:
    """Decided: a pod the Service sends nothing to counts as a pod down (Ready False,
    x/y serving), as a pod whose server refuses does; Available stays True."""
    only_a = endpoint_slice("chat-x1", ("chat-a", "10.1.0.1", True))
    service = Service([A, B], stored(only_a))
    service.tick()
    assert service.ready() == ("False", "NoReadyEndpoints")
    assert service.condition(ConditionType.READY)["message"] == (
        "1/2 pods serving; 1 of 2 Ready pod(s) missing from Service chat's ready endpoints "
        "(EndpointSlices): chat-b for 600 s"
    )
    available = service.condition(ConditionType.AVAILABLE)
    assert (available["status"], available["message"]) == ("True", "1 pod(s) serving")
    assert service.status["summary"]["breaker"] == "Closed"


def test_a_pod_dropped_from_the_slices_gets_the_grace_from_when_it_was_dropped() -> None:
    store = stored(BOTH_LISTED)
    service = Service([A, B], store)
    service.tick()
    assert service.ready() == ("True", "PodsReady")
    only_a = endpoint_slice("chat-x1", ("chat-a", "10.1.0.1", True))
    store.put(NAMESPACE, "chat-x1", slice_endpoints(only_a))  # a slice rewritten by hand
    service.ticks_for(ENDPOINTS_GRACE_SECONDS - INTERVAL)
    assert service.ready() == ("True", "PodsReady")
    service.ticks_for(2 * INTERVAL)
    assert service.ready() == ("False", "NoReadyEndpoints")
    # The controller comes back and lists it again: serving.
    store.put(NAMESPACE, "chat-x1", slice_endpoints(BOTH_LISTED))
    service.tick()
    assert service.ready() == ("True", "PodsReady")
    assert service.condition(ConditionType.READY)["message"] == "2/2 pods serving"


def test_an_endpoint_not_ready_in_the_slice_does_not_count_and_one_without_a_condition_does() -> (
    None
):
    """The API reads an absent `ready` as ready (kube-proxy routes to it); an endpoint
    without a targetRef (a slice written by hand) is matched by its address."""
    mixed = endpoint_slice("chat-x1", ("chat-a", "10.1.0.1", None), ("chat-b", "10.1.0.2", False))
    service = Service([A, B], stored(mixed))
    service.tick()
    assert service.ready() == ("False", "NoReadyEndpoints")
    assert "chat-b for 600 s" in service.condition(ConditionType.READY)["message"]
    by_hand = endpoint_slice("chat-manual", ("", "10.1.0.1", True), ("", "10.1.0.2", True))
    matched = Service([A, B], stored(by_hand))
    matched.tick()
    assert matched.ready() == ("True", "PodsReady")


def test_another_services_slice_does_not_stand_for_this_one() -> None:
    other = endpoint_slice(
        "demo-x1", ("chat-a", "10.1.0.1", True), ("chat-b", "10.1.0.2", True), service="demo"
    )
    service = Service([A, B], stored(other))
    service.tick()
    assert service.ready() == ("False", "NoReadyEndpoints")


def test_a_restarted_operator_says_the_outage_at_its_first_tick_and_warns_no_twice() -> None:
    service = Service([A, B], stored(endpoint_slice("chat-x1")))
    service.tick()
    assert service.ready() == ("False", "NoReadyEndpoints")
    restarted = Service([A, B], service.store)
    restarted.status, restarted.now = service.status, service.now
    restarted.tick()
    assert restarted.ready() == ("False", "NoReadyEndpoints")
    assert restarted.warnings(EventReason.NO_READY_ENDPOINTS) == []


def test_slices_the_operator_may_not_read_make_ready_unknown_saying_why() -> None:
    """A role without list/watch on endpointslices: the watch's LIST is refused."""
    store = EndpointStore(T0)
    refused = ApiException(status=403, reason="Forbidden")
    store.lost(slices_unread(refused), T0)
    service = Service([A, B], store)
    service.tick()
    assert service.ready() == ("True", "PodsReady")  # within the grace: the watch starting
    service.ticks_for(ENDPOINTS_GRACE_SECONDS)
    assert service.ready() == ("Unknown", "EndpointsUnread")
    message = service.condition(ConditionType.READY)["message"]
    assert message == (
        "2/2 pods serving; the EndpointSlices of Service chat could not be read (the API "
        "server answered 403 Forbidden: the operator may not list and watch "
        "endpointslices.discovery.k8s.io for 30 s): whether traffic reaches the pods is not "
        "observed"
    )
    assert service.status["summary"]["ready"] == "2/2"  # what the pods do was observed
    assert service.condition(ConditionType.AVAILABLE)["status"] == "True"
    service.tick()
    assert service.warnings(EventReason.ENDPOINTS_UNREAD) == [message]
    # Granted: the next LIST fills the store, and Ready is the pods' again.
    store.replace([("ml", "chat-x1", slice_endpoints(BOTH_LISTED))])
    service.tick()
    assert service.ready() == ("True", "PodsReady")


def test_a_service_scaled_to_zero_is_ready_whether_or_not_the_slices_are_read() -> None:
    """No pod to send traffic to: nothing the slices could say changes 0/0."""
    store = EndpointStore(T0 - 3600)
    store.lost(slices_unread(ApiException(status=403, reason="Forbidden")), T0 - 3600)
    service = Service([], store)
    service.spec = parse_spec(
        {"model": {"name": "chat", "source": "pvc://models/tiny"}, "replicas": 0}
    )
    service.tick()
    assert service.ready() == ("True", "PodsReady")


def test_a_watch_that_lost_its_place_reads_its_last_slices_through_the_grace() -> None:
    store = stored(BOTH_LISTED)
    service = Service([A, B], store)
    service.tick()
    store.lost("the API server is unreachable (MaxRetryError)", service.now)
    service.ticks_for(ENDPOINTS_GRACE_SECONDS)
    assert service.ready() == ("True", "PodsReady")
    service.tick()
    assert service.ready() == ("Unknown", "EndpointsUnread")
    assert (
        "the API server is unreachable (MaxRetryError) for 30 s"
        in (service.condition(ConditionType.READY)["message"])
    )


def test_ready_false_for_another_cause_stays_false_while_the_slices_are_unread() -> None:
    """Unread slices only keep Ready from True: a pod down is observed all the same."""
    store = EndpointStore(T0 - 3600)
    store.lost(slices_unread(ApiException(status=403, reason="Forbidden")), T0 - 3600)
    service = Service([A, replace(B, ready=False)], store)
    service.tick()
    assert service.ready() == ("False", "PodsNotReady")


# ----- the pure parts -------------------------------------------------------------------


def test_no_read_says_nothing_and_a_store_never_listed_says_nothing_within_the_grace() -> None:
    gaps, _ = judge_endpoints(None, [A, B], EndpointMemory(), T0)
    assert not gaps.missing and not gaps.unread
    never = EndpointsRead(SERVICE, None, T0 - 5, "the EndpointSlice watch has not listed them yet")
    gaps, _ = judge_endpoints(never, [A, B], EndpointMemory(), T0)
    assert not gaps.missing and not gaps.unread
    gaps, _ = judge_endpoints(never, [A, B], EndpointMemory(), T0 + ENDPOINTS_GRACE_SECONDS)
    assert gaps.unread == "the EndpointSlice watch has not listed them yet for 35 s"


def test_a_pod_whose_ready_time_is_ahead_of_the_operators_clock_gets_the_full_grace() -> None:
    ahead = pod("chat-a", "10.1.0.1", T0 + 120)  # the node's clock runs fast
    read = EndpointsRead(SERVICE, ServiceEndpoints())
    gaps, memory = judge_endpoints(read, [ahead], EndpointMemory(), T0)
    assert not gaps.missing and memory.missing_since == {"chat-a": T0}


def test_the_store_keeps_each_services_slices_and_forgets_a_deleted_one() -> None:
    store = stored(
        BOTH_LISTED, endpoint_slice("demo-x1", ("demo-a", "10.1.0.9", True), service="demo")
    )
    assert store.read(NAMESPACE, SERVICE).endpoints == ServiceEndpoints(
        frozenset({"chat-a", "chat-b"})
    )
    second = endpoint_slice("chat-x2", ("chat-c", "10.1.0.3", True))
    store.put(NAMESPACE, "chat-x2", slice_endpoints(second))
    assert store.read(NAMESPACE, SERVICE).endpoints == ServiceEndpoints(
        frozenset({"chat-a", "chat-b", "chat-c"})
    )
    store.remove(NAMESPACE, "chat-x1")
    store.remove(NAMESPACE, "chat-x1")  # a DELETED event after a relist: nothing left
    assert store.read(NAMESPACE, SERVICE).endpoints == ServiceEndpoints(frozenset({"chat-c"}))
    assert store.read("other", SERVICE).endpoints == ServiceEndpoints()
    assert store.read(NAMESPACE, "demo").endpoints == ServiceEndpoints(frozenset({"demo-a"}))


def test_a_lost_store_keeps_the_time_it_first_stopped_being_current() -> None:
    store = stored(BOTH_LISTED)
    assert store.read(NAMESPACE, SERVICE).unread_since is None
    store.lost("watch expired", T0 + 10)
    store.lost("the API server answered 403 Forbidden", T0 + 15)
    read = store.read(NAMESPACE, SERVICE)
    assert (read.unread_since, read.cause) == (T0 + 10, "the API server answered 403 Forbidden")
    assert read.endpoints is not None and "chat-a" in read.endpoints.pods


def test_the_reasons_a_watch_fails_are_told_without_the_request() -> None:
    assert slices_unread(ApiException(status=403, reason="Forbidden")) == (
        "the API server answered 403 Forbidden: the operator may not list and watch "
        "endpointslices.discovery.k8s.io"
    )
    assert slices_unread(ApiException(status=500, reason="Internal Server Error")) == (
        "the API server answered 500 Internal Server Error"
    )
    assert "the API server is unreachable (ConnectionRefusedError)" in slices_unread(
        ConnectionRefusedError("https://10.0.0.1:6443/apis/... Authorization: Bearer x")
    )


def test_a_ready_pod_carries_when_the_kubelet_called_it_ready() -> None:
    since = dt.datetime(2027, 1, 15, 8, 0, tzinfo=dt.UTC)
    ready = V1Pod(
        metadata=V1ObjectMeta(name="chat-a", uid="u"),
        status=V1PodStatus(
            phase="Running",
            conditions=[V1PodCondition(type="Ready", status="True", last_transition_time=since)],
        ),
    )
    assert view_of(ready).ready_since == since.timestamp()
    ready.status.conditions[0].status = "False"
    assert view_of(ready).ready_since is None
