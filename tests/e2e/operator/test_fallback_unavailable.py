"""Issue 10, one seam end to end: a fallback the pods' device cannot serve is named and
does not hold up the rollout. Issue 32 (N2): a fallback whose weights are corrupt, found
only when the fallback tier loads it, leaves the service answering from the primary.

On localcluster `gpu.count: 1` is a simulated GPU, so the server runs on a CPU, where
int4 cannot load: each server serves the primary and says so in its stats file
(`fallback_available: false` and the reason). Pushed to the fallback tier by the
quality switch, the operator must still give every pod the level (the rollout must
not wait for a swap that cannot come), keep both pods serving the primary, and post
one FallbackUnavailable Warning per pod naming it.
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from typing import Any

from fusebox_contract.names import (
    ConditionType,
    DegradationLevel,
    DegradationTier,
    EventReason,
    Variant,
)
from fusebox_contract.wiring import VARIANT_HEADER, HttpPath, Port
from fusebox_operator.observations import PodSample
from fusebox_operator.telemetry import parse_metrics, sample_from_metrics

from .conftest import ServiceFactory, chat_reply, http, pod_url, wait_for
from .test_seams import quality_switch_spec, wait_serving


def scraped(pod: dict[str, Any]) -> PodSample | None:
    """The pod's sidecar, read as the operator reads it."""
    status, text = http("GET", f"{pod_url(pod, Port.METRICS)}{HttpPath.METRICS}", timeout=10)
    if status != 200 or not isinstance(text, str):
        return None
    return sample_from_metrics(pod["metadata"]["name"], parse_metrics(text), 0.0, "ttft")


def test_an_int4_fallback_on_a_cpu_is_named_and_the_level_still_reaches_every_pod(
    inference_service: ServiceFactory, two_gpus: None
) -> None:
    spec = quality_switch_spec(
        replicas=2,
        gpu={"count": 1},
        fallback={"quantization": "int4"},
        degradation={
            "tiers": [DegradationTier.FALLBACK_MODEL.value],
            "coolOffSeconds": 600,
            "cannedAnswers": {},  # no canned-answers tier: the CRD refuses answers for it
        },
    )
    spec.pop("memory")  # sized by the operator from the (simulated) GPU, as tiny-chat is
    service = inference_service("int4-on-cpu", spec)
    wait_serving(service, pods=2)
    names = sorted(p["metadata"]["name"] for p in service.ready_pods())

    # Every sampled answer fails the quality check: the service climbs to the fallback tier.
    def at_fallback_tier() -> bool:
        chat_reply(service.service_url(), max_tokens=4)
        degradation = service.status().get("degradation") or {}
        return degradation.get("tier") == DegradationTier.FALLBACK_MODEL

    wait_for(
        "tier fallback-model", at_fallback_tier, timeout=300, every=1, diagnose=service.diagnose
    )

    def every_pod_at_level_two() -> list[PodSample] | None:
        samples = [scraped(p) for p in service.ready_pods()]
        if len(samples) != 2 or any(s is None for s in samples):
            return None
        found = [s for s in samples if s is not None]
        at_two = all(s.degradation_level == DegradationLevel.FALLBACK_MODEL for s in found)
        return found if at_two else None

    samples = wait_for(
        "the level on both pods", every_pod_at_level_two, timeout=180, diagnose=service.diagnose
    )
    for sample in samples:
        assert sample.fallback_configured is True, sample
        assert sample.fallback_available is False, sample
        assert sample.variant is Variant.PRIMARY, sample
        assert sample.converging is False, sample
        assert sample.fallback_unavailable_reason and "int4" in sample.fallback_unavailable_reason

    def named_pods() -> Counter[str] | None:
        named: Counter[str] = Counter()
        for event in service.events():
            if event["reason"] == EventReason.FALLBACK_UNAVAILABLE:
                named.update(n for n in names if n in event["message"])
        return named if set(named) == set(names) else None

    named = wait_for("FallbackUnavailable naming both pods", named_pods, timeout=120)
    assert set(named.values()) == {1}, named  # once per pod, not once per tick
    warnings = [e for e in service.events() if e["reason"] == EventReason.FALLBACK_UNAVAILABLE]
    assert all(e["type"] == "Warning" and "CUDA" in e["message"] for e in warnings), warnings

    degraded = service.condition(ConditionType.DEGRADED)
    assert degraded.get("status") == "True", degraded
    assert "cannot swap" in degraded.get("message", ""), degraded
    assert service.status().get("activeVariant") == Variant.PRIMARY
    # Both pods keep serving, and the answers say the primary served them.
    assert len(service.ready_pods()) == 2
    for _ in range(3):
        reply = wait_for(
            "a 200 through the Service",
            lambda: (r := chat_reply(service.service_url(), max_tokens=4)).status == 200 and r,
            timeout=60,
        )
        assert reply.headers.get(VARIANT_HEADER.lower()) == Variant.PRIMARY, reply.headers
    assert EventReason.SWAPPED_TO_FALLBACK not in service.event_reasons()


def test_a_fallback_with_corrupt_weights_leaves_the_service_answering_from_the_primary(
    inference_service: ServiceFactory, model_root: Path
) -> None:
    # The tiny model with its weights cut short: --check-config passes (it reads no weights),
    # the pod starts on the primary, and the fallback fails only when the tier loads it.
    corrupt = model_root / "tiny-corrupt-weights"
    if not corrupt.exists():
        shutil.copytree(model_root / "tiny", corrupt)
        weights = corrupt / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:4096])
    spec = quality_switch_spec(
        fallback={"source": f"pvc://models/{corrupt.name}", "quantization": "none"},
        degradation={
            "tiers": [DegradationTier.FALLBACK_MODEL.value],
            "coolOffSeconds": 600,
            "cannedAnswers": {},  # no canned-answers tier: the CRD refuses answers for it
        },
    )
    service = inference_service("corrupt-fallback", spec)
    wait_serving(service, pods=1)
    (name,) = [p["metadata"]["name"] for p in service.ready_pods()]

    def fallback_refused() -> PodSample | None:
        chat_reply(service.service_url(), max_tokens=4)  # every sampled answer fails quality
        pods = service.ready_pods()
        sample = scraped(pods[0]) if len(pods) == 1 else None
        refused = sample is not None and sample.fallback_available is False
        return sample if refused else None

    sample = wait_for(
        "the pod saying its fallback failed to load",
        fallback_refused,
        timeout=300,
        every=1,
        diagnose=service.diagnose,
    )
    assert sample.degradation_level == DegradationLevel.FALLBACK_MODEL, sample
    assert sample.variant is Variant.PRIMARY and sample.model_loaded is True, sample
    reason = sample.fallback_unavailable_reason or ""
    assert "loading it failed" in reason and "SafetensorError" in reason, reason

    def named() -> list[dict[str, Any]] | None:
        found = [
            e
            for e in service.events()
            if e["reason"] == EventReason.FALLBACK_UNAVAILABLE and name in e["message"]
        ]
        return found or None

    (event,) = wait_for("FallbackUnavailable naming the pod", named, timeout=120)
    assert event["type"] == "Warning" and "loading it failed" in event["message"], event
    # The one replica never left the Service for good: it answers 200, from the primary.
    assert [p["metadata"]["name"] for p in service.ready_pods()] == [name]
    for _ in range(3):
        reply = wait_for(
            "a 200 through the Service",
            lambda: (r := chat_reply(service.service_url(), max_tokens=4)).status == 200 and r,
            timeout=60,
        )
        assert reply.headers.get(VARIANT_HEADER.lower()) == Variant.PRIMARY, reply.headers
    assert service.status().get("activeVariant") == Variant.PRIMARY
