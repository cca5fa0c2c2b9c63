"""The operator, installed from the chart, over several nodes: a node lost in the
middle of a memory ladder, and a GPU unhealthy on one node only.

Two of the cluster's nodes hold the inference image (unpacked only: `load-images
--discard-unpacked-layers`, about 6 GB a node instead of 12) and carry a label the
service selects; the model is one host directory that both reach, as a share
mounted on every GPU node would be. The third node holds the operator's image
only (the operator may run anywhere).
"""

from __future__ import annotations

import calendar
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from fusebox_contract.names import ConditionType, EventReason
from fusebox_contract.wiring import GPU_DEVICE_CLASS, Port
from localcluster import dra, images
from localcluster.containerd import CTR

from ..conftest import Cluster, wait_for
from ..localcluster.conftest import Kube
from ..operator.conftest import (
    Service,
    apply_service,
    base_spec,
    pod_url,
    traffic,
)
from ..operator.test_operator import LADDER_EVENTS, leak_spec
from ..operator.test_operator_replicas import action_id
from .conftest import (
    HOSTNAME,
    IMAGE_LABEL,
    INFERENCE_IMAGE,
    multinode_cli,
    node_view,
    ready_pod_on,
    shared_model_claim,
    spread_one_per_node,
    wait_serving,
)

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]

# How long a pod stays on a node the node controller has marked unreachable (the
# Pod API's default is 300 s; a GPU pool that wants its pods back sooner sets less).
EVICT_AFTER_SECONDS = 5


def ladder_events(service: Service) -> list[dict[str, Any]]:
    return ladder_events_of(service.events())


def ladder_events_of(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["reason"] in LADDER_EVENTS]


def server_limits(pod: dict[str, Any]) -> dict[str, str]:
    (server,) = [c for c in pod["spec"]["containers"] if c["name"] == "server"]
    return dict(server["resources"]["limits"])


def test_a_node_lost_mid_ladder_leaves_its_pod_alone_and_the_replacement_is_sized_and_watched(
    multinode: Cluster, services_kube: Kube, inference_nodes: list[str], model_root: Path
) -> None:
    """The service's one pod prefers node 2; a leak under traffic starts the ladder; node
    2 is then lost (its kubelet, containerd and every process of its pods killed).

    Measured here: Ready turned Unknown (MetricsUnreachable, naming the pod) within
    5 s, False (PodsNotReady) once the node controller marked the pod, and True again
    67-70 s after the loss, with the replacement serving. The operator says once that
    the pod went unobserved (a TelemetryStale warning), calls nothing on it and
    repeats no rung; the pod is evicted after its toleration and its replacement on
    node 1 is sized as before and scraped: status lists it alone, with figures
    observed after the loss."""
    survivor, lost = inference_nodes
    spec = leak_spec()
    spec["pod"] = {
        "nodeSelector": {IMAGE_LABEL: "true"},
        "affinity": {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "preference": {
                            "matchExpressions": [
                                {
                                    "key": HOSTNAME,
                                    "operator": "In",
                                    "values": [lost],
                                }
                            ]
                        },
                    }
                ]
            }
        },
        "tolerations": [
            {
                "key": f"node.kubernetes.io/{taint}",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": EVICT_AFTER_SECONDS,
            }
            for taint in ("unreachable", "not-ready")
        ],
    }
    with shared_model_claim(multinode, services_kube.namespace, model_root, inference_nodes):
        service = apply_service(multinode, services_kube.namespace, "roaming", spec)
        first = wait_for(
            f"the pod Ready on {lost}",
            lambda: ready_pod_on(service, lost),
            timeout=420,
            diagnose=service.diagnose,
        )
        with traffic(pod_url(first, Port.API), 1.0):
            wait_for(
                "the ladder's first rung",
                lambda: ladder_events(service),
                timeout=300,
                every=0.5,
                diagnose=service.diagnose,
            )
        try:
            told_before = {e["metadata"]["uid"] for e in service.events()}
            lost_at = time.time()
            multinode_cli("node", "stop", lost)
            said: list[tuple[str, str]] = []  # Ready's (status, message), each poll

            def replacement() -> dict[str, Any] | None:
                ready = service.condition(ConditionType.READY)
                said.append((ready.get("status", ""), ready.get("message", "")))
                return ready_pod_on(service, survivor)

            second = wait_for(
                f"a replacement Ready on {survivor}",
                replacement,
                timeout=420,
                diagnose=service.diagnose,
            )
            print(f"replacement Ready {time.time() - lost_at:.0f} s after the node was lost")
            new_pod = wait_for(
                "status to name the replacement with figures observed after the loss",
                lambda: observed_after(service, second["metadata"]["name"], lost_at),
                timeout=120,
                diagnose=service.diagnose,
            )
            wait_serving(service, "the service Ready again")
            status, events = service.status(), service.events()
        finally:
            multinode_cli("node", "start", lost, timeout=300)

    dead = first["metadata"]["name"]
    # Ready left True once the operator saw the loss, naming the lost pod, and did not
    # come back before the replacement served (the last poll may have seen it serve).
    first_doubt = next(i for i, (ready, _) in enumerate(said) if ready != "True")
    assert any(dead in message for ready, message in said[first_doubt:] if ready != "True"), said
    assert all(ready != "True" for ready, _ in said[first_doubt:-1]), said
    # Since the loss: told once, as a warning naming the pod; no action on it.
    since_loss = [e for e in events if e["metadata"]["uid"] not in told_before]
    stale = [
        e for e in since_loss if e["reason"] == EventReason.TELEMETRY_STALE and dead in e["message"]
    ]
    assert len(stale) == 1 and stale[0]["type"] == "Warning", [e["message"] for e in stale]
    acted = [e for e in ladder_events_of(since_loss) if dead in e["message"]]
    assert acted == [], "acted on the lost pod"
    # No action id on two rungs (a reload's unload and reload share one).
    reasons_by_id: dict[str, set[str]] = {}
    for event in ladder_events_of(events):
        reasons_by_id.setdefault(action_id(event) or "", set()).add(event["reason"])
    repeated = {
        i: r
        for i, r in reasons_by_id.items()
        if len(r) > 1 and r != {EventReason.MODEL_UNLOADED, EventReason.MODEL_RELOADED}
    }
    assert repeated == {}, f"an action id on more than one rung: {repeated}"
    # Sized as before, and watched: scraped, under the limit the service was sized to.
    assert server_limits(second) == server_limits(first)
    assert new_pod["memoryLimitBytes"] == status["memory"]["limitBytes"]
    assert [p["name"] for p in status["pods"]] == [second["metadata"]["name"]]


def observed_after(service: Service, pod: str, moment: float) -> dict[str, Any] | None:
    """The pod's status entry once it serves, with figures (its memory limit among them)
    scraped after `moment`; an entry of a server still starting has none yet."""
    for entry in service.status().get("pods") or []:
        sampled = entry.get("sampledAt")
        if (
            entry.get("name") == pod
            and entry.get("serving") == "Serving"
            and "memoryLimitBytes" in entry
            and sampled
            and _epoch(sampled) > moment
        ):
            return dict(entry)
    return None


def _epoch(iso_time: str) -> float:
    return float(calendar.timegm(time.strptime(iso_time, "%Y-%m-%dT%H:%M:%SZ")))


def _claimed_device(service: Service, pod: dict[str, Any]) -> str:
    (claimed,) = pod["status"]["resourceClaimStatuses"]
    claim = json.loads(
        service.kubectl("get", "resourceclaim", claimed["resourceClaimName"], "-o", "json").stdout
    )
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["pool"] == pod["spec"]["nodeName"], result
    return str(result["device"])


def test_a_gpu_unhealthy_on_one_node_drains_only_the_pod_there_and_it_waits_named(
    multinode: Cluster, services_kube: Kube, inference_nodes: list[str], model_root: Path
) -> None:
    """Two replicas, one per node, each on its node's one GPU through a DRA claim. Node
    2's GPU turns unhealthy: only the pod there is drained (one GPUUnhealthy warning
    naming it and the device); node 1's pod keeps serving untouched. Its replacement
    has no healthy GPU to go to, and Ready says so, naming it; once the GPU is healthy
    again it lands on node 2 and the service serves 2/2."""
    healthy_node, sick_node = inference_nodes
    name = "spread-gpus"
    spec = base_spec(replicas=2, gpu={"count": 1, "deviceClassName": GPU_DEVICE_CLASS})
    spec["pod"] = {
        "nodeSelector": {IMAGE_LABEL: "true"},
        "topologySpreadConstraints": spread_one_per_node(name),
    }
    control = dra.control_for(node_view(sick_node))
    with shared_model_claim(multinode, services_kube.namespace, model_root, inference_nodes):
        service = apply_service(multinode, services_kube.namespace, name, spec)
        placed = wait_for(
            "a ready pod on each node",
            lambda: (
                found
                if len(found := {p["spec"]["nodeName"]: p for p in service.ready_pods()}) == 2
                else None
            ),
            timeout=420,
            diagnose=service.diagnose,
        )
        kept, sick = placed[healthy_node], placed[sick_node]
        device = _claimed_device(service, sick)
        index = int(device.removeprefix("gpu-"))
        try:
            dra.set_health(control, index, healthy=False)
            drained = wait_for(
                "a GPUUnhealthy event",
                lambda: [e for e in service.events() if e["reason"] == EventReason.GPU_UNHEALTHY],
                timeout=120,
                diagnose=service.diagnose,
            )
            assert len(drained) == 1 and drained[0]["type"] == "Warning", drained
            assert sick["metadata"]["name"] in drained[0]["message"], drained
            assert device in drained[0]["message"], drained

            def waiting_named() -> dict[str, Any] | None:
                pending = [
                    p for p in service.pods() if p["metadata"]["uid"] != kept["metadata"]["uid"]
                ]
                ready = service.condition(ConditionType.READY)
                named = [p for p in pending if p["metadata"]["name"] in ready.get("message", "")]
                fresh = [p for p in named if p["metadata"]["uid"] != sick["metadata"]["uid"]]
                return ready if fresh and ready.get("status") == "False" else None

            ready = wait_for(
                "Ready False naming the replacement that has no GPU",
                waiting_named,
                timeout=180,
                diagnose=service.diagnose,
            )
            print("while no GPU is free:", ready["reason"], ready["message"][:300])
        finally:
            dra.set_health(control, index, healthy=True)
        wait_for(
            "a ready pod on each node again",
            lambda: len({p["spec"]["nodeName"] for p in service.ready_pods()}) == 2,
            timeout=300,
            diagnose=service.diagnose,
        )
        wait_serving(service, "the service Ready 2/2")
        still = next(p for p in service.ready_pods() if p["spec"]["nodeName"] == healthy_node)
        events = service.events()

    # Node 1's pod: the same pod, never restarted, and no event about it.
    assert still["metadata"]["uid"] == kept["metadata"]["uid"]
    assert all(s["restartCount"] == 0 for s in still["status"]["containerStatuses"])
    assert [e for e in events if kept["metadata"]["name"] in e["message"]] == []
    assert [e for e in events if e["reason"] == EventReason.GPU_UNHEALTHY] == drained


def test_the_inference_image_is_kept_unpacked_only_on_the_nodes_given_it(
    inference_nodes: list[str],
) -> None:
    """`load-images --discard-unpacked-layers`: the nodes run pods of the image (the
    tests above) while their content stores hold none of its own layer blobs (a base
    layer it shares with the test app, loaded the usual way, stays), only the small
    manifest and config."""
    layout = images.layout_dir(images.cache_dir())
    index = json.loads((layout / "index.json").read_text())

    def layers_of(manifest_digest: str) -> set[str]:
        algorithm, hex_digest = manifest_digest.split(":", 1)
        manifest = json.loads((layout / "blobs" / algorithm / hex_digest).read_text())
        return {layer["digest"] for layer in manifest["layers"]}

    by_name = images.manifests_by_name(index)
    manifest_digest = by_name[INFERENCE_IMAGE].digest
    shared = set().union(
        *(layers_of(d.digest) for name, d in by_name.items() if name != INFERENCE_IMAGE)
    )
    layers = layers_of(manifest_digest) - shared
    assert layers, "the inference image has no layer of its own"
    for node in inference_nodes:
        view = node_view(node)
        content = subprocess.run(
            [CTR, "--address", str(view.containerd_socket), "--namespace", "k8s.io"]
            + ["content", "ls", "--quiet"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert manifest_digest in content, f"{node} lacks the image"
        assert layers.isdisjoint(content), f"{node} kept layer blobs of the inference image"
