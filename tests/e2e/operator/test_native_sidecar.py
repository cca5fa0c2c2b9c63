"""Issue 14, item 3: the metrics sidecar is a native sidecar container.

Two properties a plain second container lacks, both observed on the real kubelet:
- it starts before the server: the kubelet's own events say so, in the order it
  wrote them (the server is created only after the sidecar started);
- it outlives the server: a deleted pod's server drains its in-flight request for
  a few seconds, and the sidecar keeps serving its figures all that time (a plain
  container would have had SIGTERM together with the server, and be gone).
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from fusebox_contract.metrics import Metric
from fusebox_contract.wiring import FAULTS_ENV, HttpPath, Port

from .conftest import Service, ServiceFactory, base_spec, chat_reply, pod_url, wait_for

SIDECAR = "sidecar"
SERVER = "server"
# Seconds per generated token: a 16-token answer takes longer than the server's drain.
SLOW_MS = 700


def kubelet_events(service: Service, pod: str) -> list[dict[str, Any]]:
    out = service.kubectl(
        "get", "events", "--field-selector", f"involvedObject.name={pod}", "-o", "json"
    ).stdout
    events: list[dict[str, Any]] = json.loads(out)["items"]
    # resourceVersion orders what etcd stored: the order the kubelet reported it.
    return sorted(events, key=lambda e: int(e["metadata"]["resourceVersion"]))


def container_of(event: dict[str, Any]) -> str:
    path = str(event["involvedObject"].get("fieldPath", ""))
    return path.partition("{")[2].rstrip("}")


def sidecar_metrics(service: Service, pod: str) -> str:
    """GET the sidecar's /metrics from inside its own container, as `kubectl exec` does."""
    fetch = (
        "import urllib.request, sys; "
        f"sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:{int(Port.METRICS)}"
        f"{HttpPath.METRICS}', timeout=5).read().decode())"
    )
    result = service.kubectl(
        "exec", pod, "-c", SIDECAR, "--", "/opt/venv/bin/python", "-c", fetch, check=False
    )
    assert result.returncode == 0, f"the sidecar did not answer: {result.stderr}"
    return str(result.stdout)


def gauge(text: str, metric: Metric) -> float | None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == metric:
                return float(sample.value)
    return None


def test_the_sidecar_starts_before_the_server_and_serves_while_the_server_drains(
    inference_service: ServiceFactory,
) -> None:
    spec = base_spec(server={"env": [{"name": FAULTS_ENV, "value": f"slow:{SLOW_MS}"}]})
    service = inference_service("native-sidecar", spec)
    (pod,) = wait_for(
        "one ready pod", lambda: service.ready_pods() or None, diagnose=service.diagnose_pods
    )
    name = pod["metadata"]["name"]

    started = [e for e in kubelet_events(service, name) if e["reason"] in ("Created", "Started")]
    order = [(container_of(e), e["reason"]) for e in started]
    assert order.index((SIDECAR, "Started")) < order.index((SERVER, "Created")), order
    (sidecar_status,) = pod["status"]["initContainerStatuses"]
    assert sidecar_status["name"] == SIDECAR and sidecar_status["started"], sidecar_status

    # A request in flight, then the pod deleted: the server drains it. Sent to the pod
    # itself: through the Service, a pod Ready a moment ago may not be an endpoint yet
    # (a refused connection, then no request ever running; seen in a CI rehearsal).
    replies: list[int] = []
    request = threading.Thread(
        target=lambda: replies.append(chat_reply(pod_url(pod, Port.API), max_tokens=16).status),
        daemon=True,
    )
    request.start()
    wait_for(
        "the request running on the server",
        lambda: gauge(sidecar_metrics(service, name), Metric.REQUESTS_RUNNING) == 1,
        timeout=30,
        every=0.5,
        diagnose=lambda: f"replies so far (status 0: no connection): {replies}",
    )
    service.kubectl("delete", "pod", name, "--wait=false")
    # Past the SIGTERM a plain sidecar container would have obeyed at once, and
    # within the server's few seconds of drain.
    time.sleep(1.5)
    figures = sidecar_metrics(service, name)
    during_drain = service.kubectl("get", "pod", name, "-o", "json", check=False)
    assert during_drain.returncode == 0, "the pod was gone before its server drained"
    draining = json.loads(during_drain.stdout)
    assert draining["metadata"].get("deletionTimestamp"), draining["metadata"]
    server_state = draining["status"]["containerStatuses"][0]["state"]
    sidecar_state = draining["status"]["initContainerStatuses"][0]["state"]
    assert "running" in server_state, server_state  # so the figures came during the drain
    assert "running" in sidecar_state, sidecar_state
    assert gauge(figures, Metric.PROCESS_RESIDENT_MEMORY_BYTES), figures[:2000]
    request.join(timeout=60)
