"""The chaos tier (`pytest -m chaos`, part of `make test`): a serving InferenceService
while the cluster's own parts fail under it.

- etcd (and with it the API server), containerd and kube-proxy restarted in turn under
  steady traffic: no answer other than 200 or a 429/503 with Retry-After, every pod the
  same pod with no container restart, and the operator still writing status after;
- the metrics sidecar killed: the kubelet restarts it alone (a native sidecar), the
  server keeps serving, telemetry comes back fresh and the operator takes no action
  against the pod.

The operator killed mid-ladder is test_operator.py's restart test; a GPU lost is
test_gpu_lost.py.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from fusebox_contract.names import ConditionType, EventReason

from ..conftest import localcluster
from .conftest import (
    Reply,
    Service,
    ServiceFactory,
    base_spec,
    chat_reply,
    wait_for,
)

pytestmark = pytest.mark.chaos

ACCEPTABLE = {200, 429, 503}


@contextmanager
def steady_traffic(service: Service) -> Iterator[list[Reply]]:
    """One client sending chat requests back to back through the Service."""
    replies: list[Reply] = []
    stop = threading.Event()
    url = service.service_url()  # looked up once: the API server may be the thing down

    def client() -> None:
        while not stop.is_set():
            replies.append(chat_reply(url, max_tokens=4, timeout=30))
            stop.wait(0.2)

    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    try:
        yield replies
    finally:
        stop.set()
        thread.join(timeout=60)


def unacceptable(replies: list[Reply]) -> list[tuple[int, Any]]:
    """Answers other than 200, or a 429/503 without Retry-After; connection errors too."""
    bad = []
    for reply in replies:
        retry_after = reply.headers.get("retry-after")
        if reply.status not in ACCEPTABLE or (reply.status != 200 and not retry_after):
            bad.append((reply.status, reply.body))
    return bad


def containers(pod: dict[str, Any]) -> dict[str, tuple[str, int]]:
    statuses = [
        *(pod["status"].get("initContainerStatuses") or []),
        *(pod["status"].get("containerStatuses") or []),
    ]
    return {c["name"]: (c.get("containerID", ""), c["restartCount"]) for c in statuses}


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def serving(service: Service) -> dict[str, Any]:
    (pod,) = wait_for("one ready pod", service.ready_pods, timeout=300, diagnose=service.diagnose)
    return pod


def test_control_plane_restarts_under_traffic_lose_nothing(
    inference_service: ServiceFactory,
) -> None:
    service = inference_service("chaos-control-plane", base_spec())
    pod = serving(service)
    before = containers(pod)
    with steady_traffic(service) as replies:
        for component in ("etcd", "containerd", "kube-proxy"):
            localcluster("restart", component)
            seen = len(replies)
            wait_for(
                f"answers again after restarting {component}",
                lambda: len(replies) > seen + 3,  # noqa: B023 (read while `seen` holds)
                timeout=120,
            )
    assert len(replies) > 10, len(replies)
    assert unacceptable(replies) == [], unacceptable(replies)[:5]
    assert replies[-1].status == 200
    (after,) = service.pods()
    assert after["metadata"]["uid"] == pod["metadata"]["uid"]
    assert containers(after) == before  # no container was restarted or replaced
    # The operator outlived the API server's restart: its status moves on.
    restarted_at = now_iso()
    wait_for(
        "the operator to write status after the restarts",
        lambda: str(service.status().get("updatedAt", "")) > restarted_at,
        timeout=120,
    )
    assert EventReason.POD_RESTARTED not in service.event_reasons()


def test_a_killed_sidecar_is_restarted_alone_and_nothing_acts_on_the_pod(
    inference_service: ServiceFactory,
) -> None:
    service = inference_service("chaos-sidecar", base_spec())
    pod = serving(service)
    name = pod["metadata"]["name"]
    before = containers(pod)
    # The sidecar's own process (pid 1 of its container is not it: the pod shares
    # one process namespace), found by its command line and killed with SIGKILL.
    kill = (
        "import os, signal\n"
        "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    try:\n"
        "        line = open(f'/proc/{pid}/cmdline', 'rb').read()\n"
        "    except OSError:\n"
        "        continue\n"
        "    if b'fusebox_sidecar' in line:\n"
        "        os.kill(int(pid), signal.SIGKILL)\n"
    )
    with steady_traffic(service) as replies:
        service.kubectl("exec", name, "-c", "sidecar", "--", "/opt/venv/bin/python", "-c", kill,
                        check=False)  # fmt: skip
        restarted = wait_for(
            "the kubelet to restart the sidecar",
            lambda: (
                (p := service.pods()[0])
                and containers(p)["sidecar"][1] > before["sidecar"][1]
                and p
            ),
            timeout=120,
        )
        wait_for(
            "TelemetryFresh True again",
            lambda: (
                service.condition(ConditionType.TELEMETRY_FRESH).get("status") == "True"
                and len(replies) > 5
            ),
            timeout=120,
        )
    assert containers(restarted)["server"] == before["server"]  # the server never restarted
    assert restarted["metadata"]["uid"] == pod["metadata"]["uid"]
    assert unacceptable(replies) == [], unacceptable(replies)[:5]
    assert EventReason.POD_RESTARTED not in service.event_reasons()
