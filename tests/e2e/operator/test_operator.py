"""The operator end to end: real apiserver, kubelet, images, server and sidecar.

Ordered by priority: apply -> serve, CRD validation, the leak ladder (with
`kubectl describe`), wedge -> restart, the latency breaker, operator restart
and deletion, quality -> fallback, RBAC. Timings are shrunk in each spec;
every wait polls with a generous deadline, nothing asserts wall-clock time.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import yaml

from fusebox_contract.admin import AdminPath, ServerState
from fusebox_contract.names import BreakerState, Variant
from fusebox_contract.wiring import VARIANT_HEADER, Port

from .conftest import (
    REPO,
    OperatorRelease,
    Service,
    ServiceFactory,
    base_spec,
    chat,
    chat_reply,
    http,
    pod_url,
    wait_for,
)

GIB = 1024**3
LADDER_EVENTS = ("GarbageCollected", "CacheEmptied", "ModelUnloaded", "ModelReloaded")


E2E_POD: dict[str, Any] = {
    "labels": {"team": "e2e"},
    "annotations": {"example.com/owner": "e2e"},
    "tolerations": [{"key": "example.com/e2e", "operator": "Exists", "effect": "NoSchedule"}],
}
"""spec.pod for the first test: fields that change nothing about where the pod can run."""


def printer_columns(service: Service) -> dict[str, str]:
    out = service.kubectl("get", "fis", service.name).stdout.splitlines()
    header, row = out[0].split(), out[1].split()
    return dict(zip(header, row, strict=False))


def wait_ready(service: Service, pods: int = 1, timeout: float = 420) -> None:
    wait_for(
        f"{pods} ready pod(s) of {service.name}",
        lambda: len(service.ready_pods()) >= pods,
        timeout=timeout,
        diagnose=service.diagnose_pods,
    )
    wait_for(
        "READY True and BREAKER Closed in `kubectl get fis`",
        lambda: (
            (cols := printer_columns(service)).get("READY") == "True"
            and cols.get("BREAKER") == "Closed"
            and cols
        ),
        timeout=120,
        diagnose=service.diagnose,
    )


@contextmanager
def traffic(url: str, every_seconds: float, **chat_args: Any) -> Iterator[list[int]]:
    """Send chat requests in the background; yields the list of status codes seen."""
    statuses: list[int] = []
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            statuses.append(chat(url, **chat_args))
            stop.wait(every_seconds)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield statuses
    finally:
        stop.set()
        thread.join(timeout=90)


def subsequence(wanted: tuple[str, ...] | list[str], seen: list[str]) -> bool:
    iterator = iter(seen)
    return all(any(item == reason for reason in iterator) for item in wanted)


def served_variants(service: Service, count: int = 3) -> list[str | None]:
    """X-Fusebox-Variant of `count` answered chats through the Service: what really served."""
    variants = []
    for _ in range(count):
        reply = wait_for(
            "a 200 through the Service",
            lambda: (r := chat_reply(service.service_url(), max_tokens=2)).status == 200 and r,
            timeout=60,
        )
        variants.append(reply.headers.get(VARIANT_HEADER.lower()))
    return variants


def admin_state(service: Service, pod: dict[str, Any]) -> ServerState:
    path = AdminPath.STATE
    status, body = http(
        path.method, f"{pod_url(pod, Port.ADMIN)}{path}", token=service.admin_token()
    )
    assert status == 200, (status, body)
    return ServerState.parse(body)


# --- 5: apply -> children -> Ready -> serves ----------------------------------------------


def test_apply_creates_owned_children_ready_pods_and_a_serving_endpoint(
    inference_service: ServiceFactory, operator: OperatorRelease
) -> None:
    # spec.pod's labels, annotations and a toleration ride along (checked on the pod below).
    spec = base_spec(gpu={"count": 1}, memory={"limit": "auto"}, pod=E2E_POD)
    service = inference_service("tiny-chat", spec)
    uid = service.get()["metadata"]["uid"]
    for kind, name in [
        ("deployment", "tiny-chat"),
        ("service", "tiny-chat"),
        ("secret", "tiny-chat-admin"),
        ("configmap", "tiny-chat-config"),
        ("poddisruptionbudget", "tiny-chat"),
        ("networkpolicy", "tiny-chat"),
    ]:
        owners = wait_for(
            f"{kind}/{name} owned by the InferenceService",
            lambda kind=kind, name=name: (
                service.kubectl(
                    "get",
                    kind,
                    name,
                    "-o",
                    "jsonpath={.metadata.ownerReferences[0].uid}",
                    check=False,
                ).stdout
            ),
            timeout=120,
        )
        assert owners == uid
    wait_ready(service)
    columns = printer_columns(service)
    assert (
        columns["READY"],
        columns["BREAKER"],
        columns["TIER"],
        columns["VARIANT"],
        columns["REPLICAS"],
    ) == ("True", "Closed", "none", "primary", "1")
    memory = service.status()["memory"]
    # Node label nvidia.com/gpu.memory = 1024 MiB: 1 GiB x 1.25 + 2 GiB -> 4 GiB.
    assert memory["source"] == "node label nvidia.com/gpu.memory"
    assert memory["limitBytes"] == 4 * GIB and memory["qosClass"] == "Guaranteed"
    assert "MemorySized" in service.event_reasons()
    pod = service.ready_pods()[0]
    assert pod["status"]["qosClass"] == "Guaranteed"
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    # spec.pod reached the pod beside Fusebox's own labels, annotations and GPU toleration.
    assert pod["metadata"]["labels"]["team"] == "e2e"
    assert pod["metadata"]["labels"]["fusebox.dev/service"] == "tiny-chat"
    assert pod["metadata"]["annotations"]["example.com/owner"] == "e2e"
    assert E2E_POD["tolerations"][0] in pod["spec"]["tolerations"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"][
        "tolerations"
    ]
    # VARIANT primary is what the pod serves, not only what the status says.
    assert served_variants(service) == [Variant.PRIMARY] * 3
    # Nothing leaves a pod whose model is on a PVC: the operator's health port, open to
    # every pod and listening (the kubelet's probes keep the operator Ready), is out of
    # its reach. Before: "connected". kube-router rejects (refused); others drop (timeout).
    reached = connect_from(service, pod["metadata"]["name"], health_address(operator))
    assert reached in ("ConnectionRefusedError", "timeout")


CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=4).close()
    print("connected")
except socket.timeout:
    print("timeout")
except OSError as error:
    print(type(error).__name__)
"""


def health_address(operator: OperatorRelease) -> tuple[str, int]:
    """The operator pod's IP and health port (the chart admits anyone there)."""
    pod = wait_for("the operator pod Ready", operator.ready_pod, timeout=60)
    (container,) = pod["spec"]["containers"]
    (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == "health"]
    return pod["status"]["podIP"], int(port)


def connect_from(service: Service, pod: str, address: tuple[str, int]) -> str:
    """Open a TCP connection from the pod's server container: what came of it."""
    host, port = address
    result = service.kubectl(
        "exec", pod, "-c", "server", "--", "/opt/venv/bin/python", "-c", CONNECT, host, str(port)
    )
    return str(result.stdout).strip()


# --- 4: the apiserver rejects inconsistent specs ----------------------------------------------

INVALID_SPECS: list[tuple[str, dict[str, Any], str]] = [
    ("no-model", {"replicas": 1}, "spec.model: Required value"),
    (
        "bad-source",
        {"model": {"name": "c", "source": "gs://bucket/m"}, "fallback": {}},
        "must be pvc://CLAIM[/path], file:///path, s3://BUCKET[/PREFIX] or hf://",
    ),
    (
        "bad-claim",
        {"model": {"name": "c", "source": "pvc://Bad_Claim/m"}, "fallback": {}},
        "lowercase DNS label",
    ),
    (
        "no-fallback",
        {
            "model": {"name": "c", "source": "pvc://m/x"},
            "degradation": {"tiers": ["fallback-model"]},
        },
        "spec.fallback is required when degradation.tiers lists fallback-model",
    ),
    (
        "unquantized-fallback",
        {"model": {"name": "c", "source": "pvc://m/x"}, "fallback": {"quantization": "none"}},
        "must be quantized",
    ),
    (
        "admit-zero",
        {
            "model": {"name": "c", "source": "pvc://m/x"},
            "fallback": {},
            "breaker": {"halfOpen": {"admitPercent": 0}},
        },
        "admitPercent",
    ),
    (
        "recovery-above-threshold",
        {
            "model": {"name": "c", "source": "pvc://m/x"},
            "fallback": {},
            "breaker": {
                "latency": {"p99ThresholdMillis": 100},
                "halfOpen": {"p99RecoveryMillis": 150},
            },
        },
        "p99RecoveryMillis must be below breaker.latency.p99ThresholdMillis",
    ),
    (
        "ratio-above-one",
        {
            "model": {"name": "c", "source": "pvc://m/x"},
            "fallback": {},
            "breaker": {"resource": {"rss": {"ratioOfLimit": 1.5}}},
        },
        "ratioOfLimit",
    ),
    (
        "failure-rate-zero",
        {
            "model": {"name": "c", "source": "pvc://m/x"},
            "fallback": {},
            "breaker": {"quality": {"maxFailureRate": 0}},
        },
        "maxFailureRate",
    ),
    (
        "bad-limit",
        {
            "model": {"name": "c", "source": "pvc://m/x"},
            "fallback": {},
            "memory": {"limit": "lots"},
        },
        "memory.limit must be auto or a",
    ),
    (
        "product-without-gpu",
        {
            "model": {"name": "c", "source": "pvc://m/x"},
            "fallback": {},
            "gpu": {"count": 0, "product": "NVIDIA-H100-80GB-HBM3"},
        },
        "gpu.product requires gpu.count > 0",
    ),
    (
        "reserved-env",
        {
            "model": {"name": "c", "source": "pvc://m/x"},
            "fallback": {},
            "server": {"env": [{"name": "FUSEBOX_ADMIN_TOKEN_FILE", "value": "/x"}]},
        },
        "server.env may not set",
    ),
    (
        "unknown-tier",
        {
            "model": {"name": "c", "source": "pvc://m/x"},
            "fallback": {},
            "degradation": {"tiers": ["turbo"]},
        },
        'Unsupported value: "turbo"',
    ),
    (
        "wedge-below-interval",
        {
            "model": {"name": "c", "source": "pvc://m/x"},
            "fallback": {},
            "telemetry": {"scrapeIntervalSeconds": 10, "wedgeAfterSeconds": 5},
        },
        "wedgeAfterSeconds must exceed",
    ),
]


@pytest.mark.parametrize(
    ("name", "spec", "message"), INVALID_SPECS, ids=[c[0] for c in INVALID_SPECS]
)
def test_apiserver_rejects_inconsistent_specs(
    cluster: Any, crd: None, namespace: str, name: str, spec: dict[str, Any], message: str
) -> None:
    document = {
        "apiVersion": "fusebox.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
    result = cluster.kubectl(
        "apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(document), check=False
    )
    assert result.returncode != 0, f"{name} was accepted"
    assert message in result.stderr, result.stderr


def test_the_tiny_chat_example_is_accepted_with_defaults(
    cluster: Any, crd: None, namespace: str
) -> None:
    example = (REPO / "crds" / "examples" / "tiny-chat.yaml").read_text()
    result = cluster.kubectl(
        "apply", "-n", namespace, "--dry-run=server", "-f", "-", "-o", "json", input=example
    )
    spec = json.loads(result.stdout)["spec"]
    assert spec["breaker"]["halfOpen"]["admitPercent"] == 5
    assert spec["memory"] == {
        "limit": "auto",
        "headroomRatio": 1.25,
        "allowSwap": False,
        "maxGrowthRatio": 1,
        "nodeAvailableFloor": "auto",
    }


def test_explicit_limit_below_vram_is_reported_and_nothing_is_deployed(
    inference_service: ServiceFactory,
) -> None:
    spec = base_spec(gpu={"count": 1, "memoryGiB": 1}, memory={"limit": "512Mi"})
    service = inference_service("too-small", spec)
    condition = wait_for(
        "condition InvalidSpec",
        lambda: (
            service.condition("InvalidSpec").get("status") == "True"
            and service.condition("InvalidSpec")
        ),
        timeout=120,
    )
    assert "0.50 GiB" in condition["message"] and "1.00 GiB" in condition["message"]
    assert wait_for(
        "an InvalidSpec event", lambda: "InvalidSpec" in service.event_reasons(), timeout=60
    )
    assert service.kubectl("get", "deployment", "too-small", check=False).returncode != 0


# --- 6 + 11: leak -> ladder -> recovery, and `kubectl describe` tells the story ----------------


def leak_spec(cooldown_seconds: float = 6) -> dict[str, Any]:
    """A leak of 16 MiB a request, with rungs `cooldown_seconds` apart."""
    spec = base_spec(
        breaker={
            "resource": {
                "rss": {"ratioOfLimit": 0.5, "growthMiBPerMinute": 30},
                "cooldownSeconds": cooldown_seconds,
                "windowSeconds": 20,
            }
        }
    )
    spec["server"]["env"] = [{"name": "FUSEBOX_FAULTS", "value": "leak:16"}]
    return spec


def ladder_reasons(service: Service) -> list[str]:
    reasons = set(LADDER_EVENTS) | {"SwappedToFallback", "PodRestarted"}
    return [r for r in service.event_reasons() if r in reasons]


def test_leak_climbs_the_ladder_and_rss_comes_back_under_without_oom(
    inference_service: ServiceFactory,
) -> None:
    service = inference_service("leaky", leak_spec())
    wait_ready(service)
    with traffic(service.service_url(), 1.0, max_tokens=4):
        wait_for(
            "the ladder to reach unload+reload",
            lambda: "ModelReloaded" in ladder_reasons(service) and ladder_reasons(service),
            timeout=300,
            diagnose=service.diagnose,
        )
    reasons = ladder_reasons(service)
    assert reasons[:4] == list(LADDER_EVENTS), reasons
    status = service.status()
    last = status["lastAction"]
    assert last["type"] in ("reload", "swap_fallback", "restart") and last["pod"] and last["result"]
    gc_event = next(e for e in service.events() if e["reason"] == "GarbageCollected")
    assert re.search(r"RSS \d+ MiB = \d+% of the memory limit", gc_event["message"]), gc_event[
        "message"
    ]
    reload = next(a for a in status["recentActions"] if a["type"] == "reload")
    trigger_mib = int(re.search(r"RSS (\d+) MiB", reload["reason"]).group(1))  # type: ignore[union-attr]
    assert "freed" in reload["result"], reload

    def rss_under_trigger() -> list[int] | None:
        # Every pod sampled, with an RSS figure: an empty list proves nothing.
        sampled = [p.get("rssBytes") for p in service.status().get("pods") or []]
        if not sampled or None in sampled:
            return None
        under = all(rss < trigger_mib * 1024**2 for rss in sampled)
        return sampled if under else None

    wait_for(
        f"RSS back under the {trigger_mib} MiB that triggered the reload",
        rss_under_trigger,
        timeout=120,
    )
    wait_for(
        "MemoryPressure False once the ladder is calm",
        lambda: service.condition("MemoryPressure").get("status") == "False",
        timeout=120,
    )
    pods = service.pods()
    assert pods, service.diagnose_pods()
    for pod in pods:
        server = pod["status"]["containerStatuses"][0]
        terminated = (server.get("lastState") or {}).get("terminated") or {}
        assert terminated.get("reason") != "OOMKilled"
    # 11: describe shows conditions with reasons, the breaker block, the last action, events.
    described = service.kubectl("describe", "fis", service.name).stdout
    for text in (
        "Conditions:",
        "PodsReady",
        "Breaker:",
        "Closed",
        "Last Action:",
        "GarbageCollected",
        "ModelReloaded",
        "MemorySized",
    ):
        assert text in described, f"{text!r} missing from kubectl describe:\n{described}"


# --- 9: wedge -> that pod restarted, the service stays available ---------------------------------


def test_wedged_pod_is_restarted_while_the_service_keeps_answering(
    inference_service: ServiceFactory,
) -> None:
    spec = base_spec(replicas=2)
    spec["server"]["env"] = [{"name": "FUSEBOX_FAULTS", "value": "wedge"}]
    service = inference_service("wedgy", spec)
    wait_ready(service, pods=2)
    victim = service.ready_pods()[0]
    name = victim["metadata"]["name"]
    service.set_faults(victim, {"wedge": 1})
    event = wait_for(
        f"PodRestarted for {name}",
        lambda: next(
            (e for e in service.events() if e["reason"] == "PodRestarted" and name in e["message"]),
            None,
        ),
        timeout=180,
    )
    assert "wedged" in event["message"]
    assert wait_for(
        "a 200 through the Service", lambda: chat(service.service_url()) == 200, timeout=60
    )
    assert service.condition("Available")["status"] == "True"
    wait_for(
        "two ready pods without the wedged one",
        lambda: (
            len(names := [p["metadata"]["name"] for p in service.ready_pods()]) == 2
            and name not in names
        ),
        timeout=300,
        diagnose=service.diagnose,
    )


# --- 7: latency -> Open (503) -> HalfOpen (admits its share) -> Closed ---

BURST = 20  # requests sent in half-open, fewer than twice halfOpen.minRequests


def test_slow_pod_opens_the_breaker_then_half_open_then_closed(
    inference_service: ServiceFactory,
) -> None:
    spec = base_spec(
        breaker={
            "latency": {
                "metric": "ttft",
                "p99ThresholdMillis": 400,
                "forSeconds": 4,
                "minRequests": 3,
            },
            "openSeconds": 8,
            # More half-open calls than the measuring burst can admit: it cannot close
            # the breaker half-way through the measurement.
            "halfOpen": {"admitPercent": 50, "minRequests": 30, "p99RecoveryMillis": 300},
        }
    )
    spec["server"]["cpu"] = "1"  # CPU throttling would blur fast vs slow
    spec["server"]["env"] = [{"name": "FUSEBOX_FAULTS", "value": "slow:0"}]
    service = inference_service("slowpoke", spec)
    wait_ready(service)
    pod = service.ready_pods()[0]
    service.set_faults(pod, {"slow": 600})
    with traffic(service.service_url(), 0.5, max_tokens=2) as statuses:
        wait_for(
            "BreakerOpened",
            lambda: "BreakerOpened" in service.event_reasons(),
            timeout=180,
            diagnose=service.diagnose,
        )
        assert wait_for("a 503 while open", lambda: 503 in statuses, timeout=60)
        assert printer_columns(service)["BREAKER"] in ("Open", "HalfOpen")
        service.set_faults(pod, {"slow": 0})
    # No other traffic now: half-open lasts until the next calls, and the burst below
    # is every arrival the server sees.
    wait_for(
        "the pod told HalfOpen",
        lambda: admin_state(service, pod).breaker.state is BreakerState.HALF_OPEN,
        timeout=120,
        diagnose=service.diagnose,
    )
    burst = [chat_reply(f"{pod_url(pod, Port.API)}", max_tokens=2) for _ in range(BURST)]
    state = admin_state(service, pod).breaker
    assert (state.state, state.admit_percent) == (BreakerState.HALF_OPEN, 50), state
    admitted = sum(1 for r in burst if r.status == 200)
    refused = [r for r in burst if r.status == 503]
    assert admitted + len(refused) == BURST, [(r.status, r.body) for r in burst]
    # The server admits an even spread of arrivals: about half (a re-sent state may
    # restart its count), never none and never all.
    assert abs(admitted - BURST // 2) <= 2, f"{admitted} of {BURST} admitted at 50%"
    assert all(isinstance(r.body, dict) and "retry-after" in r.headers for r in refused)
    with traffic(service.service_url(), 0.2, max_tokens=2):
        wait_for(
            "BreakerClosed",
            lambda: "BreakerClosed" in service.event_reasons(),
            timeout=240,
            diagnose=service.diagnose,
        )
    reasons = [r for r in service.event_reasons() if r.startswith("Breaker")]
    assert subsequence(["BreakerOpened", "BreakerHalfOpen", "BreakerClosed"], reasons), reasons
    opened = next(e for e in service.events() if e["reason"] == "BreakerOpened")
    assert "ms > 400 ms" in opened["message"]
    assert service.status()["breaker"]["trips"] >= 1


# --- 10: operator killed mid-ladder resumes without repeating; delete cascades -------------------


def test_operator_restart_resumes_without_repeating_and_delete_cascades(
    inference_service: ServiceFactory, operator: OperatorRelease
) -> None:
    service = inference_service("resume", leak_spec())
    wait_ready(service)
    with traffic(service.service_url(), 1.0, max_tokens=4):
        wait_for(
            "the first ladder step",
            lambda: "GarbageCollected" in ladder_reasons(service),
            timeout=300,
        )
        replacement = operator.crash()  # the pod deleted with no grace, as a crash
        wait_for(
            "the ladder to continue after the restart",
            lambda: "ModelReloaded" in ladder_reasons(service),
            timeout=300,
            diagnose=service.diagnose,
        )
    reasons = ladder_reasons(service)
    before_reload = reasons[: reasons.index("ModelReloaded") + 1]
    assert before_reload == list(LADDER_EVENTS), [
        (e["reason"], e["message"]) for e in service.events() if e["reason"] in LADDER_EVENTS
    ]
    # The replacement pod did the rest: its log names this service's handlers.
    assert replacement in operator.logs(), operator.logs()
    ids = [a["id"] for a in service.status()["recentActions"]]
    assert ids and len(ids) == len(set(ids)), ids
    event_ids = [
        m.group(1) for e in service.events() if (m := re.search(r"\[([^\]]+)\]$", e["message"]))
    ]
    per_action = {i: event_ids.count(i) for i in event_ids}
    # Every ladder step's event carries its action id: at least gc, empty_cache, reload.
    assert len(per_action) >= 3, (per_action, service.event_reasons())
    # A reload posts two events (unloaded, reloaded) under one id; nothing else repeats.
    assert max(per_action.values()) <= 2, per_action

    service.kubectl("delete", "fis", service.name, "--wait=true", "--timeout=120s")
    for kind, name in [
        ("deployment", "resume"),
        ("service", "resume"),
        ("secret", "resume-admin"),
        ("configmap", "resume-config"),
        ("poddisruptionbudget", "resume"),
        ("networkpolicy", "resume"),
    ]:
        wait_for(
            f"{kind}/{name} garbage-collected",
            lambda kind=kind, name=name: (
                service.kubectl("get", kind, name, check=False).returncode != 0
            ),
            timeout=180,
        )


# --- 8: quality -> tier 2 (fallback), cool-off -> primary ---


def test_quality_failures_degrade_to_fallback_and_cool_off_restores_primary(
    inference_service: ServiceFactory,
) -> None:
    spec = base_spec(
        breaker={
            "quality": {"sampleRate": 1.0, "maxFailureRate": 0.15, "maxOutputInputRatio": 0.01}
        }
    )
    service = inference_service("picky", spec)
    wait_ready(service)
    with traffic(service.service_url(), 1.0, max_tokens=8):
        wait_for(
            "TIER fallback-model and VARIANT fallback",
            lambda: (
                (c := printer_columns(service)).get("TIER") == "fallback-model"
                and c.get("VARIANT") == "fallback"
            ),
            timeout=180,
        )
        # The status claims the fallback: the answers say the fallback served them.
        assert served_variants(service) == [Variant.FALLBACK] * 3
    assert "SwappedToFallback" in service.event_reasons()
    wait_for(
        "VARIANT primary after the cool-off",
        lambda: (
            (c := printer_columns(service)).get("VARIANT") == "primary" and c.get("TIER") == "none"
        ),
        timeout=240,
    )
    assert "RestoredPrimary" in service.event_reasons()
    assert served_variants(service) == [Variant.PRIMARY] * 3


# --- 12: RBAC ------------------------------------------------------------------------------------


RBAC_DIR = REPO / "operator" / "rbac"
ALLOWED = [
    ("watch", "inferenceservices.fusebox.dev"),
    ("patch", "inferenceservices.fusebox.dev/status"),
    ("create", "deployments.apps"),
    ("update", "deployments.apps"),
    ("create", "secrets"),
    ("get", "secrets"),
    ("list", "pods"),
    ("delete", "pods"),
    ("patch", "pods"),  # the pod-deletion-cost before a scale-down
    ("watch", "endpointslices.discovery.k8s.io"),  # Ready reads the Service's endpoints
    ("create", "events"),
    ("list", "events"),  # a successor's lookup of an action its predecessor ran
    ("list", "nodes"),
    ("create", "networkpolicies.networking.k8s.io"),
    ("create", "poddisruptionbudgets.policy"),
]
DENIED = [
    ("list", "secrets"),
    ("watch", "secrets"),
    ("update", "secrets"),
    ("watch", "events"),
    ("delete", "events"),
    ("create", "pods"),
    ("create", "pods/exec"),
    ("delete", "deployments.apps"),
    ("patch", "nodes"),
    ("delete", "inferenceservices.fusebox.dev"),
    ("create", "clusterroles.rbac.authorization.k8s.io"),
]


def rbac_copy(namespace: str) -> list[dict[str, Any]]:
    """operator/rbac/ as objects of this test's own: the same rules under names no
    other install uses (the demo's Helm release owns the originals)."""
    name = f"fusebox-operator-{namespace}"
    objects = []
    for path in sorted(RBAC_DIR.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            document["metadata"]["name"] = name
            if document["kind"] == "ServiceAccount":
                document["metadata"]["namespace"] = namespace
            if document["kind"] == "ClusterRoleBinding":
                document["roleRef"]["name"] = name
                for subject in document["subjects"]:
                    subject.update(name=name, namespace=namespace)
            objects.append(document)
    return objects


def test_operator_rbac_allows_what_it_needs_and_denies_the_rest(
    cluster: Any, crd: None, namespace: str
) -> None:
    objects = rbac_copy(namespace)
    account = next(o for o in objects if o["kind"] == "ServiceAccount")["metadata"]["name"]
    as_operator = f"--as=system:serviceaccount:{namespace}:{account}"
    manifest = yaml.safe_dump_all(objects)
    try:
        cluster.kubectl("apply", "-f", "-", input=manifest)
        for verb, resource in ALLOWED:
            result = cluster.kubectl(
                "auth", "can-i", verb, resource, as_operator, "-n", namespace, check=False
            )
            assert result.stdout.strip() == "yes", (
                f"{verb} {resource}: {result.stdout}{result.stderr}"
            )
        for verb, resource in DENIED:
            result = cluster.kubectl(
                "auth", "can-i", verb, resource, as_operator, "-n", namespace, check=False
            )
            assert result.stdout.strip() == "no", f"{verb} {resource} allowed"
    finally:
        cluster.kubectl("delete", "-f", "-", "--ignore-not-found", input=manifest, check=False)


def test_a_wait_for_pods_that_cannot_schedule_says_why(
    inference_service: ServiceFactory,
) -> None:
    service = inference_service(
        "unschedulable",
        base_spec(gpu={"count": 1, "product": "NVIDIA-NO-SUCH-GPU", "memoryGiB": 1}),
    )
    wait_for("a pod of the service", lambda: service.pods(), timeout=120)
    with pytest.raises(pytest.fail.Exception) as timeout:
        wait_ready(service, timeout=20)
    message = str(timeout.value)
    assert "phase Pending" in message, message
    assert "PodScheduled=False Unschedulable" in message, message
    assert "nvidia.com/gpu.product" in message or "node affinity" in message.lower(), message


def test_an_operator_install_that_cannot_schedule_says_why(
    cluster: Any, crd: None, namespace: str
) -> None:
    """The suite installs its operator with `helm --wait`; when the node has no room
    (the demo's pods hold its CPU), helm says only "context deadline exceeded"."""
    release = OperatorRelease(cluster, namespace, f"nocpu-{namespace[-6:]}")
    try:
        with pytest.raises(pytest.fail.Exception) as failed:
            release.install(
                *("--set", f"watchNamespaces={{{namespace}}}"),
                *("--set", "resources.requests.cpu=64", "--set", "resources.limits.cpu=64"),
                timeout="30s",
            )
    finally:
        subprocess.run(
            [str(cluster.bin_dir / "helm"), f"--kubeconfig={cluster.kubeconfig}"]
            + ["uninstall", release.release, "--namespace", namespace],
            capture_output=True,
            check=False,
            timeout=180,
        )
    message = str(failed.value)
    assert "phase Pending" in message, message
    assert "PodScheduled=False Unschedulable" in message, message
    assert "Insufficient cpu" in message, message
