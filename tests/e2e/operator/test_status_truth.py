"""Status tells the truth about serving, on a real cluster (issue 32).

- A pod whose memory guard refuses every request still passes its readiness probe:
  `kubectl get fis` shows READY False with reason MemoryGuard naming the pod and
  BREAKER Refusing, within a couple of scrape intervals of the first refusal.
- The operator pod killed and the API server restarted with NetworkPolicy enforced:
  the new pod's blind window (from its Ready, or from the API server serving
  InferenceServices again if that is later, to its first admin call a pod's server
  accepts) is measured and bounded, because a new pod's IP must first be admitted by
  the policy agent (kube-router here), which itself must reconnect to the API server.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from typing import Any

import pytest

from fusebox_contract.names import ConditionType

from ..conftest import localcluster
from .conftest import (
    OperatorRelease,
    Service,
    ServiceFactory,
    base_spec,
    chat_reply,
    wait_for,
)

SCRAPE_INTERVAL_SECONDS = 2.0  # base_spec's telemetry.scrapeIntervalSeconds
# The bound on a new operator's blind window on localcluster: the 10 s, five of
# the suite's scrape intervals (a new operator tries each pod once an interval). The
# node daemons' share is what makes it hold: their client-go watches back off while the
# only API server is down. kube-proxy then kept the `kubernetes` Service without
# endpoints (a stopping API server empties them) 8 s after the API served again, and
# kube-router admitted a new pod's IP 12-85 s late after repeated restarts (2026-12-06).
# `restart apiserver` restarts both with it, as an HA control plane's failover would
# spare them (localcluster/recovery.py, RESTART_WITH): 0.0-5.8 s in four runs (0.0-9.0 s
# with kube-router alone restarted, four runs).
BLIND_WINDOW_INTERVALS = 5


def guarded_spec() -> dict[str, Any]:
    """A service whose server's memory guard refuses at 70% of its 2 GiB limit, and
    whose ladder acts only at 95%: the guard, not the operator, holds the leak."""
    spec = base_spec(
        breaker={"resource": {"rss": {"ratioOfLimit": 0.95, "growthMiBPerMinute": 1 << 20}}}
    )
    spec["server"]["env"] = [
        {"name": "FUSEBOX_FAULTS", "value": "leak:0"},
        {"name": "FUSEBOX_MEMORY_GUARD_RATIO", "value": "0.7"},
    ]
    return spec


def columns(service: Service) -> dict[str, str]:
    out = service.kubectl("get", "fis", service.name).stdout.splitlines()
    return dict(zip(out[0].split(), out[1].split(), strict=False))


def ready(service: Service) -> tuple[str, str, str]:
    condition = service.condition(ConditionType.READY)
    return condition.get("status", ""), condition.get("reason", ""), condition.get("message", "")


def test_a_pod_refusing_under_its_memory_guard_is_shown_not_serving(
    inference_service: ServiceFactory,
) -> None:
    service = inference_service("truth-guard", guarded_spec())
    wait_for("Ready True", lambda: ready(service)[0] == "True", timeout=420,
             diagnose=service.diagnose)  # fmt: skip
    (pod,) = service.ready_pods()
    name = pod["metadata"]["name"]
    service.set_faults(pod, {"leak": 64})
    url = service.service_url()
    refused = None
    for _ in range(80):  # 64 MiB a request: the guard's 1.4 GiB is a few dozen away
        reply = chat_reply(url, max_tokens=2, timeout=30)
        body = reply.body if isinstance(reply.body, dict) else {}
        if reply.status == 503 and body.get("error", {}).get("code") == "memory_pressure":
            refused = time.monotonic()
            break
    assert refused is not None, "the memory guard never refused a request"
    # The kubelet still calls the pod Ready: the readiness probe proves the model runs.
    assert service.ready_pods(), service.diagnose_pods()
    wait_for(
        "READY False with reason MemoryGuard",
        lambda: ready(service)[:2] == ("False", "MemoryGuard"),
        timeout=60,
        every=0.5,
        diagnose=service.diagnose,
    )
    delay = time.monotonic() - refused
    status, _, message = ready(service)
    assert f"{name} memory guard refusing" in message, message
    shown = columns(service)
    assert (shown["READY"], shown["BREAKER"]) == ("False", "Refusing"), shown
    entry = next(p for p in service.status()["pods"] if p["name"] == name)
    assert entry["serving"] == "MemoryGuard", entry
    print(f"status said MemoryGuard {delay:.1f} s after the first refusal")  # noqa: T201


def server_log_times(service: Service, pod: str, event: str) -> list[dt.datetime]:
    """When the pod's server logged `event` (its JSON log lines' timestamps)."""
    out = service.kubectl("logs", pod, "-c", "server", "--tail=2000").stdout
    times = []
    for line in out.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == event and "timestamp" in record:
            times.append(dt.datetime.fromisoformat(str(record["timestamp"]).replace("Z", "+00:00")))
    return times


def pod_ready_at(operator: OperatorRelease, name: str) -> dt.datetime:
    (pod,) = [p for p in operator.pods() if p["metadata"]["name"] == name]
    condition = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
    return dt.datetime.fromisoformat(condition["lastTransitionTime"].replace("Z", "+00:00"))


@pytest.mark.chaos
def test_a_new_operator_pod_reaches_the_admin_port_promptly_under_network_policy(
    inference_service: ServiceFactory, operator: OperatorRelease
) -> None:
    service = inference_service("truth-blind", base_spec())
    wait_for("Ready True", lambda: ready(service)[0] == "True", timeout=420,
             diagnose=service.diagnose)  # fmt: skip
    (pod,) = service.ready_pods()
    name = pod["metadata"]["name"]
    crashed = dt.datetime.now(dt.UTC)
    # The episode: the operator pod force-deleted and the API server restarted
    # with it, so every watcher (the policy agent's too) must reconnect and relist.
    served_again: list[dt.datetime] = []

    def restart_api_server() -> None:
        localcluster("restart", "apiserver")
        # `restart` returns once the API server serves; custom resources' storage starts
        # after the core's ("storage is (re)initializing", 10-20 s on a new machine), and
        # until it does no operator, admitted or not, can see a service to call.
        wait_for(
            "InferenceServices served again",
            lambda: (
                service.kubectl("get", "inferenceservice", service.name, check=False).returncode
                == 0
            ),
            timeout=120,
            every=0.2,
        )
        served_again.append(dt.datetime.now(dt.UTC))

    replacement = operator.crash(then=restart_api_server)
    pod_ready = pod_ready_at(operator, replacement)
    started = max(pod_ready, served_again[0])
    print(
        f"InferenceServices served again {(served_again[0] - crashed).total_seconds():.1f} s "
        f"after the crash; the new pod Ready {(pod_ready - crashed).total_seconds():.1f} s"
    )  # noqa: T201
    # A new operator tells every pod its breaker state on its first tick that reaches
    # it; the server logs each call it accepts (the old operator is gone by then).
    first = wait_for(
        "the new operator's first admin call accepted by the server",
        lambda: next((t for t in server_log_times(service, name, "breaker_set") if t > crashed),
                     None),
        timeout=300,
        diagnose=lambda: operator.logs(40),
    )  # fmt: skip
    blind = max(0.0, (first - started).total_seconds())
    print(f"blind window: {blind:.1f} s from the new pod's Ready and the API serving it")  # noqa: T201
    bound = BLIND_WINDOW_INTERVALS * SCRAPE_INTERVAL_SECONDS
    assert blind <= bound, f"the new operator was blind {blind:.1f} s (> {bound:.0f} s)"
    wait_for("Ready True", lambda: ready(service)[0] == "True", timeout=60)
