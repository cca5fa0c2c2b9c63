"""Each leak kind is cured by its lowest ladder step, and a fast leak skips the cheap ones.

One InferenceService, one pod, every leak kind armed at start and off; the
test switches one kind on at a time through the admin API while traffic
flows, waits for the ladder, switches it off and waits for the episode to
end (MemoryPressure False) before the next kind:

1. reference cycles (12 MiB a request, ~10 MiB/s): the ladder stops at gc;
2. allocator-held memory (same rate): gc frees nothing, empty_cache does;
3. model-held blocks, fast (96 MiB a request, the limit seconds away): the
   operator skips gc and empty_cache, says so, and reloads.

The trigger is 32% of a 3 GiB limit, growing faster than 30 MiB/min over a
7 s window; with a 15 s cooldown and a 30 s reload, a cheap step is skipped
below ~46 s to OOM (the slow kinds are minutes away, the fast one seconds).
Every kind but the model's must leave the pod and its model alone.
"""

from __future__ import annotations

import re
import time
from typing import Any

from fusebox_contract.admin import AdminPath, FaultsRequest, ServerState
from fusebox_contract.names import ConditionType, EventReason, Fault
from fusebox_contract.wiring import FAULTS_ENV, Port

from .conftest import (
    Service,
    ServiceFactory,
    base_spec,
    http_reply,
    pod_url,
    traffic,
    wait_for,
)

LADDER_REASONS = (
    EventReason.GARBAGE_COLLECTED,
    EventReason.CACHE_EMPTIED,
    EventReason.MODEL_UNLOADED,
    EventReason.MODEL_RELOADED,
    EventReason.SWAPPED_TO_FALLBACK,
    EventReason.POD_RESTARTED,
)
KINDS = (Fault.LEAK, Fault.LEAK_CYCLES, Fault.LEAK_ALLOCATOR)
MIB = 1024**2
LIMIT = "3Gi"  # the idle server is ~760 MiB: room for a trigger above it and a fast leak
LIMIT_BYTES = 3072 * MIB
TRIGGER_RATIO = 0.32
TRIGGER_BYTES = TRIGGER_RATIO * LIMIT_BYTES
WARM_UP_SECONDS = 3


def leak_kinds_spec() -> dict[str, Any]:
    spec = base_spec(
        breaker={
            "resource": {
                "rss": {"ratioOfLimit": TRIGGER_RATIO, "growthMiBPerMinute": 30},
                "cooldownSeconds": 15,
                # Three or four 2 s scrapes: the growth of the last seconds, so a leak
                # that just started fast is not averaged with the flat minutes before.
                "windowSeconds": 7,
            }
        }
    )
    spec["memory"] = {"limit": LIMIT}
    spec["server"]["env"] = [
        {"name": FAULTS_ENV, "value": ",".join(f"{kind.value}:0" for kind in KINDS)}
    ]
    return spec


class Pod:
    """The service's one pod, through its admin API."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.raw = wait_for(
            "one ready pod",
            lambda: (pods := service.ready_pods()) and pods[0],
            timeout=420,
            diagnose=service.diagnose_pods,
        )
        self.name = self.raw["metadata"]["name"]
        self.token = service.admin_token()

    def admin(self, path: AdminPath, body: dict[str, Any] | None = None) -> Any:
        url = f"{pod_url(self.raw, Port.ADMIN)}{path}"
        reply = http_reply(path.method, url, body, token=self.token)
        assert reply.status == 200, reply
        return reply.body

    def set_leak(self, kind: Fault, mib: int) -> None:
        request = FaultsRequest({kind: mib})
        self.admin(request.path, request.encode())

    def model_loads(self) -> int:
        loads = ServerState.parse(self.admin(AdminPath.STATE)).model_loads
        assert loads is not None
        return loads


def ladder_events(service: Service) -> list[dict[str, Any]]:
    return [e for e in service.events() if e["reason"] in LADDER_REASONS]


def freed_mib(message: str) -> float:
    """The MiB an action freed, from its event ("RSS 900.0Mi -> 610.0Mi (freed 290.0Mi)")."""
    found = re.search(r"freed ([\d.]+)(Gi|Mi|Ki)", message)
    assert found, message
    return float(found.group(1)) * {"Gi": 1024, "Mi": 1, "Ki": 1 / 1024}[found.group(2)]


def leak_until(
    service: Service, pod: Pod, kind: Fault, mib: int, every_seconds: float, until: EventReason
) -> list[dict[str, Any]]:
    """Leak `kind` under traffic until the event `until`; the ladder events it caused.

    The traffic runs at its pace before the leak is armed, so the leak starts
    at its full rate rather than with the first slow requests."""
    seen = len(ladder_events(service))
    with traffic(service.service_url(), every_seconds):
        time.sleep(WARM_UP_SECONDS)
        pod.set_leak(kind, mib)
        try:
            wait_for(
                f"{until} for the {kind} leak",
                lambda: until in [e["reason"] for e in ladder_events(service)[seen:]],
                timeout=150,
            )
        finally:
            pod.set_leak(kind, 0)
    wait_for(
        "MemoryPressure False: the episode is over",
        lambda: service.condition(ConditionType.MEMORY_PRESSURE).get("status") == "False",
        timeout=90,
    )
    return ladder_events(service)[seen:]


def test_each_leak_kind_stops_at_its_step_and_a_fast_leak_skips_the_cheap_ones(
    inference_service: ServiceFactory,
) -> None:
    service = inference_service("leakkinds", leak_kinds_spec())
    pod = Pod(service)
    loads = pod.model_loads()
    idle = wait_for(
        "the pod's idle RSS in status",
        lambda: next((p.get("rssBytes") for p in service.status().get("pods") or []), None),
        timeout=90,
    )
    assert idle < TRIGGER_BYTES - 100 * MIB, f"idle RSS {idle / MIB:.0f} MiB: raise the limit"

    cycles = leak_until(service, pod, Fault.LEAK_CYCLES, 12, 1.0, EventReason.GARBAGE_COLLECTED)
    assert {e["reason"] for e in cycles} == {EventReason.GARBAGE_COLLECTED}, cycles
    assert freed_mib(cycles[0]["message"]) >= 64, cycles[0]["message"]

    held = leak_until(service, pod, Fault.LEAK_ALLOCATOR, 12, 1.0, EventReason.CACHE_EMPTIED)
    reasons = [e["reason"] for e in held]
    assert reasons[0] == EventReason.GARBAGE_COLLECTED, held
    assert set(reasons) == {EventReason.GARBAGE_COLLECTED, EventReason.CACHE_EMPTIED}, held
    emptied = held[reasons.index(EventReason.CACHE_EMPTIED)]["message"]
    assert freed_mib(emptied) >= 64, emptied
    assert pod.model_loads() == loads, "a leak a cheaper step cures reloaded the model"

    fast = leak_until(service, pod, Fault.LEAK, 96, 0.2, EventReason.MODEL_RELOADED)
    assert [e["reason"] for e in fast][:2] == [
        EventReason.MODEL_UNLOADED,
        EventReason.MODEL_RELOADED,
    ], fast
    message = fast[0]["message"]
    assert re.search(r"time to OOM ~\d+ s: skipping gc and empty_cache", message), message
    reload = next(a for a in service.status()["recentActions"] if a["type"] == "reload")
    assert "skipping gc and empty_cache" in reload["reason"], reload

    assert pod.model_loads() >= loads + 1
    (still,) = service.ready_pods()
    assert still["metadata"]["name"] == pod.name, "the pod was replaced"
    assert still["status"]["containerStatuses"][0].get("restartCount", 0) == 0
