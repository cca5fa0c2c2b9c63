"""Issue 10 end to end: where the CRD, the apiserver, the operator, the pod and the
server meet, seen as a user sees it (status, conditions, events, HTTP answers,
pod UIDs and restart counts) on a real cluster.

Ordered cheapest first: the apiserver's verdict on the examples and on specs
the operator would refuse, the CRD's defaults and maxima accepted, then the
examples reaching Ready, a live ConfigMap edit, the fallback tier rolled one
pod at a time under traffic, and a wedge the operator (not the kubelet) acts on.
Timings are shrunk in each spec; waits poll with generous deadlines.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from fusebox_contract.names import ConditionType, DegradationTier, EventReason, Variant
from fusebox_contract.settings import RESERVED_ENV_NAMES
from fusebox_contract.wiring import FAULTS_ENV, SERVED_BY_HEADER, VARIANT_HEADER, Port
from fusebox_operator.spec import parse_spec

from .conftest import (
    CRD,
    REPO,
    Reply,
    Service,
    ServiceFactory,
    answer_text,
    base_spec,
    chat_reply,
    http,
    pod_url,
    ready_endpoints,
    wait_for,
)

EXAMPLES = sorted((REPO / "crds" / "examples").glob("*.yaml"))
TINY_SOURCE = "pvc://models/tiny"  # the model_claim fixture's claim and path


def load_example(path: Path) -> dict[str, Any]:
    return dict(yaml.safe_load(path.read_text()))


def fits_localcluster(document: dict[str, Any]) -> bool:
    """Serves the tiny model from the `models` claim, with no GPU product to wait for."""
    spec = document["spec"]
    return (
        spec["model"]["source"] == TINY_SOURCE
        and not (spec.get("fallback") or {}).get("source")
        and not (spec.get("gpu") or {}).get("product")
    )


FITTING = [p for p in EXAMPLES if fits_localcluster(load_example(p))]


def cpu_millis(quantity: str) -> int:
    return int(quantity[:-1]) if quantity.endswith("m") else int(float(quantity) * 1000)


def fit_cpu_to_node(spec: dict[str, Any], cluster: Any) -> dict[str, Any]:
    """The spec with server.cpu lowered, if need be, so every replica's CPU request fits
    the node's allocatable CPU next to the sidecars and CoreDNS (as the demo does)."""
    allocatable = cluster.kubectl(
        "get", "nodes", "-o", "jsonpath={.items[0].status.allocatable.cpu}"
    ).stdout.strip()
    replicas = max(int(spec.get("replicas", 1)), 1)
    share = (cpu_millis(allocatable) - 600) // replicas // 50 * 50
    server = dict(spec.get("server") or {})
    wanted = cpu_millis(str(server.get("cpu", "1")))
    server["cpu"] = f"{max(250, min(wanted, share))}m"
    return {**spec, "server": server}


def document(name: str, spec: dict[str, Any], namespace: str) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "fusebox.dev/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec,
        },
        allow_unicode=True,
    )


def wait_accepted(service: Service) -> dict[str, Any]:
    """InvalidSpec False (the operator parsed the spec) and the Deployment applied."""
    condition = wait_for(
        f"InvalidSpec False on {service.name}",
        lambda: (
            (c := service.condition(ConditionType.INVALID_SPEC)).get("status") in ("True", "False")
            and c
        ),
        timeout=120,
    )
    assert condition["status"] == "False", condition
    wait_for(
        f"deployment/{service.name}",
        lambda: service.kubectl("get", "deployment", service.name, check=False).returncode == 0,
        timeout=60,
    )
    return condition


def wait_serving(service: Service, pods: int, timeout: float = 420) -> None:
    wait_for(
        f"{pods} ready pod(s) of {service.name}",
        lambda: len(service.ready_pods()) >= pods,
        timeout=timeout,
        diagnose=service.diagnose_pods,
    )
    wait_for(
        "condition Ready True",
        lambda: service.condition(ConditionType.READY).get("status") == "True",
        timeout=120,
    )


def restart_counts(pod: dict[str, Any]) -> dict[str, int]:
    return {
        s["name"]: int(s.get("restartCount", 0))
        for s in pod["status"].get("containerStatuses") or []
    }


def pod_variant(pod: dict[str, Any]) -> str | None:
    status, body = http("GET", f"{pod_url(pod, Port.API)}/readyz", timeout=10)
    return str(body.get("variant")) if isinstance(body, dict) and status in (200, 503) else None


def merge_patch(service: Service, spec: dict[str, Any]) -> None:
    service.kubectl(
        "patch",
        "inferenceservice",
        service.name,
        "--type=merge",
        "-p",
        json.dumps({"spec": spec}, ensure_ascii=False),
    )


@dataclass
class Load:
    """Steady chat traffic through the Service and, each second, its ready endpoints."""

    replies: list[tuple[float, Reply]] = field(default_factory=list)
    endpoints: list[int] = field(default_factory=list)

    def last_variants(self, count: int) -> list[str | None]:
        answered = [r for _, r in self.replies if r.status == 200]
        return [r.headers.get(VARIANT_HEADER.lower()) for r in answered[-count:]]

    def failures(self) -> list[str]:
        """Replies that are neither 200 nor a 429/503 carrying Retry-After."""
        bad = []
        for _, reply in self.replies:
            if reply.status == 200:
                continue
            if reply.status in (429, 503) and "retry-after" in reply.headers:
                continue
            bad.append(f"{reply.status} {reply.headers} {str(reply.body)[:200]}")
        return bad


@contextmanager
def load(service: Service, every_seconds: float = 0.5) -> Iterator[Load]:
    seen = Load()
    stop = threading.Event()
    url = service.service_url()

    def send() -> None:
        while not stop.is_set():
            seen.replies.append((time.monotonic(), chat_reply(url, max_tokens=4)))
            stop.wait(every_seconds)

    def sample() -> None:
        while not stop.is_set():
            seen.endpoints.append(ready_endpoints(service))
            stop.wait(1.0)

    threads = [threading.Thread(target=f, daemon=True) for f in (send, sample)]
    for thread in threads:
        thread.start()
    try:
        yield seen
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=90)


# --- 1: the examples -------------------------------------------------------------------------


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_passes_the_apiservers_schema_and_rules(
    cluster: Any, crd: None, namespace: str, path: Path
) -> None:
    result = cluster.kubectl(
        "apply", "-n", namespace, "--dry-run=server", "-f", str(path), check=False
    )
    assert result.returncode == 0, f"{path.name} refused: {result.stderr}"


@pytest.mark.parametrize("path", FITTING, ids=[p.stem for p in FITTING])
def test_examples_that_fit_localcluster_reach_ready_and_answer(
    cluster: Any, inference_service: ServiceFactory, two_gpus: None, path: Path
) -> None:
    example = load_example(path)
    spec = fit_cpu_to_node(example["spec"], cluster)
    service = inference_service(example["metadata"]["name"], spec)
    wait_accepted(service)
    replicas = int(service.get()["spec"]["replicas"])
    wait_serving(service, pods=replicas)
    reply = wait_for(
        "a 200 through the Service",
        lambda: (r := chat_reply(service.service_url())).status == 200 and r,
        timeout=60,
    )
    assert reply.headers.get(VARIANT_HEADER.lower()) == Variant.PRIMARY, reply.headers


def test_the_h100_example_is_accepted_and_its_pods_wait_for_a_node_that_fits(
    cluster: Any, operator: Any, namespace: str
) -> None:
    """No models claim here: nothing of the 7B model can start on this machine."""
    path = REPO / "crds" / "examples" / "llama-h100.yaml"
    example = load_example(path)
    cluster.kubectl("apply", "-n", namespace, "-f", str(path))
    service = Service(cluster, namespace, example["metadata"]["name"])
    wait_accepted(service)
    wait_for(
        "a MemorySized event",
        lambda: EventReason.MEMORY_SIZED in service.event_reasons(),
        timeout=60,
    )
    pods = wait_for(
        f"{example['spec']['replicas']} pods",
        lambda: len(p := service.pods()) == example["spec"]["replicas"] and p,
        timeout=120,
    )

    def unschedulable() -> list[str] | None:
        reasons = []
        for pod in service.pods():
            scheduled = next(
                (c for c in pod["status"].get("conditions") or [] if c["type"] == "PodScheduled"),
                {},
            )
            if pod["status"].get("phase") != "Pending" or scheduled.get("status") != "False":
                return None
            reasons.append(f"{scheduled.get('reason')}: {scheduled.get('message')}")
        return reasons

    reasons = wait_for("every pod Pending and unschedulable", unschedulable, timeout=120)
    assert all(r.startswith("Unschedulable") for r in reasons), reasons
    assert len(pods) == len(reasons)
    print("llama-h100 pods wait:", reasons)


# --- 2: the CRD's defaults alone form a valid object -------------------------------------------


def test_a_spec_with_only_a_model_is_admitted_and_accepted(
    inference_service: ServiceFactory,
) -> None:
    service = inference_service("defaults", {"model": {"name": "chat", "source": TINY_SOURCE}})
    condition = wait_accepted(service)
    assert condition.get("reason"), condition
    spec = service.get()["spec"]
    assert "fallback" not in spec
    assert DegradationTier.FALLBACK_MODEL not in spec["degradation"].get("tiers", []), spec


# --- 3: the apiserver refuses what the operator would refuse, and admits what it accepts ------


def refusal_spec(**sections: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"name": "c", "source": TINY_SOURCE},
        "fallback": {"quantization": "int8"},
        "gpu": {"count": 0},
    }
    for key, value in sections.items():
        if value is None:
            spec.pop(key, None)
        elif isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key] = {**spec[key], **value}
        else:
            spec[key] = value
    return spec


REFUSALS: list[tuple[str, dict[str, Any], str]] = [
    ("limit-in-millibytes", refusal_spec(memory={"limit": "500m"}), "memory.limit"),
    ("file-source-without-path", refusal_spec(model={"source": "file://x"}), "model.source"),
    (
        "pvc-path-with-space",
        refusal_spec(model={"source": "pvc://models/my model"}),
        "model.source",
    ),
    (
        "above-the-parsers-maximum",
        refusal_spec(breaker={"latency": {"minRequests": 1_000_001}}),
        "minRequests",
    ),
    (
        "reserved-env-model-dir",
        refusal_spec(server={"env": [{"name": "FUSEBOX_MODEL_DIR", "value": "/x"}]}),
        "server.env",
    ),
    (
        "reserved-env-host",
        refusal_spec(server={"env": [{"name": "FUSEBOX_HOST", "value": "127.0.0.1"}]}),
        "server.env",
    ),
    ("two-gpus", refusal_spec(gpu={"count": 2}), "gpu.count"),
    ("int4-without-gpu", refusal_spec(fallback={"quantization": "int4"}), "quantization"),
    ("awq", refusal_spec(fallback={"quantization": "awq"}), "quantization"),
    (
        "fallback-tier-without-fallback",
        refusal_spec(fallback=None, degradation={"tiers": ["fallback-model"]}),
        "fallback",
    ),
    # Issue 32's seams: each was admitted, and rendered into something else.
    (
        "queue-cap-below-target",
        refusal_spec(server={"maxQueue": 0}, autoscaling={"maxReplicas": 3}),
        "server.maxQueue (with metric inFlight",
    ),
    (
        "in-flight-cap-below-target",
        refusal_spec(
            server={"maxQueue": 0, "maxConcurrency": 2},
            autoscaling={"maxReplicas": 3, "metric": "inFlight"},
        ),
        "must exceed autoscaling.targetPerReplica",
    ),
    (
        "int4-on-t4",
        refusal_spec(gpu={"count": 1, "product": "Tesla-T4"}, fallback={"quantization": "int4"}),
        "int4 needs compute capability >= 8.0",
    ),
    (
        "int4-on-v100",
        refusal_spec(
            gpu={"count": 1, "product": "Tesla-V100-SXM2-16GB"},
            fallback={"quantization": "int4"},
        ),
        "int4 needs compute capability >= 8.0",
    ),
    (
        "fp8-on-a100",
        refusal_spec(
            gpu={"count": 1, "product": "NVIDIA-A100-SXM4-80GB"},
            fallback={"quantization": "fp8"},
        ),
        "fp8 needs compute capability >= 8.9",
    ),
    (
        "gpu-memory-without-gpu",
        refusal_spec(gpu={"count": 0, "memoryGiB": 80}),
        "gpu.memoryGiB requires gpu.count > 0",
    ),
    (
        "pvc-parent-segments",
        refusal_spec(model={"source": "pvc://models/../../etc"}),
        "model.source must not have a '..' path segment",
    ),
    (
        "file-parent-segment",
        refusal_spec(model={"source": "file:///opt/../etc"}),
        "model.source must not have a '..' path segment",
    ),
    (
        "fallback-parent-segment",
        refusal_spec(fallback={"source": "pvc://models/../x", "quantization": "none"}),
        "fallback.source must not have a '..' path segment",
    ),
    ("cpu-100000", refusal_spec(server={"cpu": "100000"}), "server.cpu must be at most 1024"),
    ("cpu-millis-above", refusal_spec(server={"cpu": "1024001m"}), "server.cpu must be at most"),
]


@pytest.mark.parametrize(("name", "spec", "field"), REFUSALS, ids=[c[0] for c in REFUSALS])
def test_the_apiserver_refuses_what_the_operator_cannot_serve_naming_the_field(
    cluster: Any, crd: None, namespace: str, name: str, spec: dict[str, Any], field: str
) -> None:
    result = cluster.kubectl(
        "apply", "--dry-run=server", "-f", "-", input=document(name, spec, namespace), check=False
    )
    assert result.returncode != 0, f"{name} was admitted"
    assert field in result.stderr, result.stderr


# Beside each new refusal, what the operator still accepts: the rules are no wider.
ADMITTED_AT_THE_SEAMS: list[tuple[str, dict[str, Any]]] = [
    (
        "int4-on-a100",
        refusal_spec(
            gpu={"count": 1, "product": "NVIDIA-A100-SXM4-80GB"},
            fallback={"quantization": "int4"},
        ),
    ),
    (
        "fp8-on-h100",
        refusal_spec(
            gpu={"count": 1, "product": "NVIDIA-H100-80GB-HBM3"},
            fallback={"quantization": "fp8"},
        ),
    ),
    ("int4-product-unnamed", refusal_spec(gpu={"count": 1}, fallback={"quantization": "int4"})),
    ("cpu-1024", refusal_spec(server={"cpu": "1024"})),
    ("dots-in-a-name", refusal_spec(model={"source": "pvc://models/v1..v2/..x"})),
    (
        "queue-cap-above-target",
        refusal_spec(server={"maxQueue": 5}, autoscaling={"maxReplicas": 3}),
    ),
    (
        "in-flight-slots-above-target",
        refusal_spec(server={"maxQueue": 0}, autoscaling={"maxReplicas": 3, "metric": "inFlight"}),
    ),
]


@pytest.mark.parametrize(
    ("name", "spec"), ADMITTED_AT_THE_SEAMS, ids=[c[0] for c in ADMITTED_AT_THE_SEAMS]
)
def test_the_apiserver_admits_what_the_operator_accepts_beside_each_seam(
    cluster: Any, crd: None, namespace: str, name: str, spec: dict[str, Any]
) -> None:
    parse_spec(spec)  # the operator accepts it
    result = cluster.kubectl(
        "apply", "--dry-run=server", "-f", "-", input=document(name, spec, namespace), check=False
    )
    assert result.returncode == 0, result.stderr


# (case, name, admitted): a DNS subdomain (what the apiserver checks of any object)
# that is no DNS-1035 label would make the Service named after it fail for ever.
SERVICE_NAMES: list[tuple[str, str, bool]] = [
    ("dotted", "chat.v2", False),
    ("64-characters", "c" * 64, False),
    ("digit-first", "1chat", False),
    ("63-characters", "c" * 63, True),
]


@pytest.mark.parametrize(
    ("case", "name", "admitted"), SERVICE_NAMES, ids=[c[0] for c in SERVICE_NAMES]
)
def test_the_apiserver_admits_only_names_the_service_can_carry(
    cluster: Any, crd: None, namespace: str, case: str, name: str, admitted: bool
) -> None:
    result = cluster.kubectl(
        "apply",
        "--dry-run=server",
        "-f",
        "-",
        input=document(name, refusal_spec(), namespace),
        check=False,
    )
    if admitted:
        assert result.returncode == 0, result.stderr
    else:
        assert result.returncode != 0, f"{name} was admitted"
        assert "metadata.name must be a DNS-1035 label" in result.stderr, result.stderr


def crd_maxima(schema: dict[str, Any]) -> dict[str, Any]:
    """Every numeric field of an object schema at its maximum, nested objects included."""
    values: dict[str, Any] = {}
    for key, prop in (schema.get("properties") or {}).items():
        if prop.get("type") in ("integer", "number") and "maximum" in prop:
            if not prop.get("exclusiveMaximum"):
                values[key] = prop["maximum"]
        elif prop.get("type") == "object":
            nested = crd_maxima(prop)
            if nested:
                values[key] = nested
    return values


def spec_at_the_maxima() -> dict[str, Any]:
    crd_doc = yaml.safe_load(CRD.read_text())
    schema = crd_doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec = crd_maxima(schema)
    spec["model"] = {"name": "chat", "source": TINY_SOURCE}
    spec["fallback"] = {"quantization": "int8"}
    # Cross-field rules the CRD states: keep them true while each number is at its maximum.
    breaker = spec.get("breaker", {})
    threshold = breaker.get("latency", {}).get("p99ThresholdMillis")
    if threshold is not None and "p99RecoveryMillis" in breaker.get("halfOpen", {}):
        breaker["halfOpen"]["p99RecoveryMillis"] = threshold / 2
    return spec


def test_numbers_at_the_crds_maxima_are_admitted_and_accepted(
    inference_service: ServiceFactory,
) -> None:
    spec = spec_at_the_maxima()
    service = inference_service("maxima", spec)
    wait_accepted(service)
    # 100 replicas of a multi-TiB pod: none can run here; remove them at once.
    service.kubectl("delete", "inferenceservice", service.name, "--wait=false")


def test_a_claim_name_of_63_characters_is_admitted_and_deployed(
    inference_service: ServiceFactory,
) -> None:
    claim = "models-" + "x" * 56
    assert len(claim) == 63
    service = inference_service("long-claim", base_spec(model={"source": f"pvc://{claim}/tiny"}))
    wait_accepted(service)
    volumes = service.kubectl(
        "get", "deployment", service.name, "-o", "jsonpath={.spec.template.spec.volumes}"
    ).stdout
    assert claim in volumes, volumes


# --- 4: a ConfigMap-carried setting reaches a running pod without a restart ---------------------


FAILING_RATIO = 0.01
"""maxOutputInputRatio at which every answer fails the quality check: any answer longer
than a hundredth of its prompt (the chat template alone is tens of tokens)."""
PASSING_RATIO = 100.0  # the CRD's default: every answer of this model passes


def quality_switch_spec(**overrides: Any) -> dict[str, Any]:
    """base_spec whose every sampled answer fails the quality check (until
    maxOutputInputRatio is raised back to PASSING_RATIO)."""
    spec = base_spec(
        breaker={
            "quality": {
                "sampleRate": 1.0,
                "maxFailureRate": 0.15,
                "maxOutputInputRatio": FAILING_RATIO,
            }
        },
        **overrides,
    )
    return spec


def test_editing_quality_and_canned_answers_reaches_the_running_pod_without_a_restart(
    inference_service: ServiceFactory,
) -> None:
    spec = quality_switch_spec(
        degradation={
            "tiers": [DegradationTier.CANNED_ANSWERS.value],
            "coolOffSeconds": 600,
            "cannedAnswers": {"你好": "你好！"},
        }
    )
    spec.pop("fallback")
    spec["breaker"]["quality"]["maxOutputInputRatio"] = (
        PASSING_RATIO  # every answer passes, for now
    )
    service = inference_service("canned", spec)
    wait_serving(service, pods=1)
    url = service.service_url()
    uid = service.ready_pods()[0]["metadata"]["uid"]

    def tier() -> str | None:
        return (service.status().get("degradation") or {}).get("tier")

    with load(service, every_seconds=1.0) as seen:
        wait_for(
            "ten answers from the model",
            lambda: (
                sum(
                    r.headers.get(SERVED_BY_HEADER.lower()) == Variant.PRIMARY
                    for _, r in seen.replies
                )
                >= 10
            ),
            timeout=240,
        )
        assert tier() != DegradationTier.CANNED_ANSWERS
        # A live edit of the server's side of the quality breaker: any output longer
        # than a hundredth of its prompt now fails, so every sampled answer does.
        merge_patch(service, {"breaker": {"quality": {"maxOutputInputRatio": FAILING_RATIO}}})
        wait_for(
            "tier canned-answers", lambda: tier() == DegradationTier.CANNED_ANSWERS, timeout=240
        )
    wait_for(
        "the canned answer", lambda: answer_text(chat_reply(url, "你好")) == "你好！", timeout=60
    )

    merge_patch(service, {"degradation": {"cannedAnswers": {"你好": "你好，请稍后再试。"}}})
    wait_for(
        "the edited canned answer",
        # 11 tokens: the answer is cut to max_tokens, as a generation is, and
        # base_spec caps a request at server.maxNewTokens 16 (more is a 400).
        lambda: answer_text(chat_reply(url, "你好", max_tokens=16)) == "你好，请稍后再试。",
        timeout=240,
        every=3,
    )
    pods = service.pods()
    assert [p["metadata"]["uid"] for p in pods] == [uid]
    assert set(restart_counts(pods[0]).values()) == {0}, restart_counts(pods[0])
    # The operator said so when it applied each edit: live, no restart.
    applied = [e["message"] for e in service.events() if e["reason"] == EventReason.SPEC_APPLIED]
    for file in ("quality.json", "canned-answers.json"):
        assert any(
            f"through the ConfigMap, no restart: {file}" in message and "rolls" not in message
            for message in applied
        ), (file, applied)
    # No fallback in the spec: the canned tier swapped no model.
    assert service.status().get("activeVariant") == Variant.PRIMARY
    assert pod_variant(pods[0]) == Variant.PRIMARY


# --- 5: the fallback tier rolls one pod at a time under traffic ---------------------------------


def test_fallback_tier_and_back_keeps_a_ready_endpoint_under_traffic(
    inference_service: ServiceFactory,
) -> None:
    # Every model load takes 10 s more (the load_delay fault), as a large model's does:
    # a pod really is unready while it swaps, so all-at-once would empty the Service.
    spec = quality_switch_spec(
        replicas=2,
        degradation={
            "tiers": [DegradationTier.FALLBACK_MODEL.value],
            "coolOffSeconds": 20,
            "cannedAnswers": {},  # no canned-answers tier: the CRD refuses answers for it
        },
        server={"env": [{"name": FAULTS_ENV, "value": "load_delay:10"}]},
    )
    service = inference_service("rolling", spec)
    wait_serving(service, pods=2)

    def all_pods_on(variant: Variant) -> bool:
        pods = service.ready_pods()
        return (
            len(pods) == 2
            and service.status().get("activeVariant") == variant
            and all(pod_variant(p) == variant for p in pods)
        )

    with load(service) as seen:
        wait_for(
            "both pods on the fallback",
            lambda: all_pods_on(Variant.FALLBACK),
            timeout=420,
            diagnose=service.diagnose,
        )
        assert (service.status().get("degradation") or {}).get(
            "tier"
        ) == DegradationTier.FALLBACK_MODEL
        wait_for(
            "the fallback named in the answers' variant header",
            lambda: seen.last_variants(3) == [Variant.FALLBACK] * 3,
            timeout=60,
        )
        merge_patch(service, {"breaker": {"quality": {"maxOutputInputRatio": PASSING_RATIO}}})
        wait_for(
            "both pods back on the primary",
            lambda: all_pods_on(Variant.PRIMARY),
            timeout=420,
            diagnose=service.diagnose,
        )
        wait_for(
            "the primary named in the answers' variant header",
            lambda: seen.last_variants(3) == [Variant.PRIMARY] * 3,
            timeout=60,
        )
    counted = [e for e in seen.endpoints if e >= 0]
    assert counted and min(counted) >= 1, seen.endpoints
    assert 1 in counted, f"no pod was ever seen out of service: {seen.endpoints}"
    assert not seen.failures(), seen.failures()[:10]
    statuses = Counter(r.status for _, r in seen.replies)
    print("replies:", dict(statuses), "ready endpoints:", Counter(seen.endpoints))
    reasons = service.event_reasons()
    assert EventReason.SWAPPED_TO_FALLBACK in reasons and EventReason.RESTORED_PRIMARY in reasons


# --- 6: wedge: the operator acts before the kubelet ---------------------------------------------


def test_a_wedged_pod_is_replaced_by_the_operator_not_restarted_by_the_kubelet(
    inference_service: ServiceFactory,
) -> None:
    spec = base_spec(telemetry={"wedgeAfterSeconds": 90})
    spec["server"]["env"] = [{"name": FAULTS_ENV, "value": "wedge"}]
    service = inference_service("wedge90", spec)
    wait_serving(service, pods=1)
    victim = service.ready_pods()[0]
    name, uid = victim["metadata"]["name"], victim["metadata"]["uid"]
    service.set_faults(victim, {"wedge": 1})

    counts: list[dict[str, int]] = []

    def gone_or_deleting() -> bool:
        result = service.kubectl("get", "pod", name, "-o", "json", check=False)
        if result.returncode != 0:
            return True
        pod = json.loads(result.stdout)
        if pod["metadata"]["uid"] != uid or pod["metadata"].get("deletionTimestamp"):
            return True
        counts.append(restart_counts(pod))
        return False

    wait_for(
        f"{name} deleted by the operator", gone_or_deleting, timeout=300, diagnose=service.diagnose
    )
    assert counts and all(set(c.values()) == {0} for c in counts), counts
    event = wait_for(
        f"PodRestarted for {name}",
        lambda: next(
            (
                e
                for e in service.events()
                if e["reason"] == EventReason.POD_RESTARTED and name in e["message"]
            ),
            None,
        ),
        timeout=60,
    )
    assert "wedged" in event["message"], event["message"]
    replacement = wait_for(
        "a ready replacement pod",
        lambda: next((p for p in service.ready_pods() if p["metadata"]["uid"] != uid), None),
        timeout=300,
        diagnose=service.diagnose,
    )
    assert set(restart_counts(replacement).values()) == {0}


def test_helpers_agree_with_the_contract() -> None:
    """Cheap guard for this file's own assumptions (no cluster)."""
    assert "FUSEBOX_FAULTS" not in RESERVED_ENV_NAMES  # the fault switch stays a user env
    assert {p.stem for p in FITTING} >= {"tiny-chat"}
    assert spec_at_the_maxima()["replicas"] >= 1
