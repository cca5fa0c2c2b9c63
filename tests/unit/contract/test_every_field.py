"""Every InferenceService field proven end to end, from the CRD to the process that acts on it.

The CRD's own schema is walked, so a new field (or enum value) without a row
here fails. Each row names its proof:
- Server: the pod rendered for a spec with a non-default value, its server
  env fed to the server's own parser (`fusebox_server.config.parse_config`),
  the resulting ServerConfig carries the value;
- Pod: the rendered objects carry it (resources, probes, nodeSelector,
  volumes, replicas, annotations);
- Operator: a named unit test of the operator's policy or telemetry shows
  the field acting (that test must exist);
- Crossing: a named integration or e2e test shows the field acting across the
  process boundary, on the real server and sidecar (that test must exist, under
  tests/integration or tests/e2e).
Paths the server reads (ConfigMap files, model and token volumes) are
rewritten to a temporary directory holding the rendered ConfigMap data, the
generated tiny model and the Secret's token, so the server parses what the
pod would see.
"""

from __future__ import annotations

import ast
import copy
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from fusebox_contract.model_fetch import FETCH_CONTAINER, FETCHED_MODEL_LINK, MODEL_CACHE_DIR
from fusebox_contract.names import Dtype, Quantization
from fusebox_contract.settings import body_limit_bytes
from fusebox_contract.wiring import (
    ADMIN_TOKEN_DIR,
    ADMIN_TOKEN_KEY,
    CONFIG_DIR,
    MODELS_ROOT,
    RUNTIME_DIR,
    STATS_FILE,
    Port,
)
from fusebox_operator.manifests import GPU_TOLERATION, Manifest, build_children
from fusebox_operator.settings import OperatorSettings
from fusebox_operator.sizing import size_memory
from fusebox_operator.spec import parse_spec
from fusebox_server.config import ServerConfig, parse_config
from fusebox_server.model.tiny_model import ensure_model
from fusebox_sidecar import config as sidecar_config

REPO = Path(__file__).resolve().parents[3]
CRD = yaml.safe_load((REPO / "crds" / "inferenceservice.yaml").read_text(encoding="utf-8"))
SPEC_SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
EXAMPLES = sorted((REPO / "crds" / "examples").glob("*.yaml"))
BASE: dict[str, Any] = {"model": {"name": "chat", "source": "pvc://models/tiny"}, "fallback": {}}
NODE_VRAM_MIB = [24576]
TOKEN = "contract-test-token"


# --- the schema, walked ------------------------------------------------------------


def leaf_fields(node: Mapping[str, Any], path: str) -> Iterator[str]:
    """Every field below `node` that holds a value: scalars, lists and maps."""
    for name, child in (node.get("properties") or {}).items():
        child_path = f"{path}.{name}" if path else name
        if child.get("type") == "object" and child.get("properties"):
            yield from leaf_fields(child, child_path)
        else:
            yield child_path


def enum_values(node: Mapping[str, Any], path: str) -> Iterator[str]:
    if "enum" in node:
        yield from (f"{path}={value}" for value in node["enum"])
    for name, child in (node.get("properties") or {}).items():
        yield from enum_values(child, f"{path}.{name}" if path else name)
    if isinstance(node.get("items"), dict):
        yield from enum_values(node["items"], path)


CRD_ENTRIES = [*leaf_fields(SPEC_SCHEMA, ""), *enum_values(SPEC_SCHEMA, "")]


# --- proofs ----------------------------------------------------------------------------


SPREAD: dict[str, Any] = {
    "maxSkew": 1,
    "topologyKey": "topology.kubernetes.io/zone",
    "whenUnsatisfiable": "ScheduleAnyway",
}
POD_PLACEMENT: dict[str, Any] = {
    "tolerations": [{"key": "pool", "operator": "Exists"}, GPU_TOLERATION],
    "nodeSelector": {"pool": "gpu"},
    "topologySpreadConstraints": [SPREAD],
    "imagePullSecrets": [{"name": "regcred"}],
    "runtimeClassName": "nvidia",
    "priorityClassName": "inference-high",
    "serviceAccountName": "chat-identity",
}
AFFINITY_TERM: dict[str, Any] = {"preferredDuringSchedulingIgnoredDuringExecution": []}
TOLERATION_VALUES = [
    *(
        (
            "operator",
            op,
            {"key": "pool", "operator": op, **({"value": "gpu"} if op == "Equal" else {})},
        )
        for op in ("Exists", "Equal")
    ),
    *(
        ("effect", effect, {"key": "pool", "operator": "Exists", "effect": effect})
        for effect in ("", "NoSchedule", "PreferNoSchedule", "NoExecute")
    ),
]
SPREAD_VALUES = {
    "whenUnsatisfiable": ("DoNotSchedule", "ScheduleAnyway"),
    "nodeAffinityPolicy": ("Honor", "Ignore"),
    "nodeTaintsPolicy": ("Honor", "Ignore"),
}


class PodPath(str):
    """A path as the pod sees it; compared after the same rewrite the env gets."""


@dataclass(frozen=True)
class Server:
    spec: dict[str, Any]
    attribute: str  # ServerConfig's attribute, dotted into a nested one (quality.sample_rate)
    expected: Any
    moves_the_default: bool = True  # False for an enum value that is the default


@dataclass(frozen=True)
class Pod:
    spec: dict[str, Any]
    shows: str  # what the rendered objects must show, in words
    check: Callable[[dict[str, Manifest]], bool]


@dataclass(frozen=True)
class Operator:
    test: str  # node id of the unit test that shows the field acting


@dataclass(frozen=True)
class Crossing:
    test: str  # node id of the integration or e2e test that shows the field acting


Proof = Server | Pod | Operator | Crossing


def server_container(children: dict[str, Manifest]) -> Manifest:
    containers = children["Deployment"]["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "server")


def resources(children: dict[str, Manifest]) -> Manifest:
    found: Manifest = server_container(children)["resources"]
    return found


def claimed_class(children: dict[str, Manifest]) -> str | None:
    """The device class the pod claims through its ResourceClaimTemplate, if it does."""
    template = children.get("ResourceClaimTemplate")
    claims = pod_spec(children).get("resourceClaims") or []
    if template is None or [c.get("resourceClaimTemplateName") for c in claims] != [
        template["metadata"]["name"]
    ]:
        return None
    request = template["spec"]["spec"]["devices"]["requests"][0]
    return str(request["exactly"]["deviceClassName"])


def liveness(children: dict[str, Manifest]) -> Manifest:
    found: Manifest = server_container(children)["livenessProbe"]
    return found


def pod_spec(children: dict[str, Manifest]) -> Manifest:
    found: Manifest = children["Deployment"]["spec"]["template"]["spec"]
    return found


def claims(children: dict[str, Manifest]) -> set[str]:
    return {
        v["persistentVolumeClaim"]["claimName"]
        for v in pod_spec(children)["volumes"]
        if "persistentVolumeClaim" in v
    }


S3_SOURCE = "s3://models/chat"


def fetch_container(children: dict[str, Manifest]) -> Manifest:
    """The model-fetch init container; {} where the source is not fetched."""
    found: Manifest = next(
        (c for c in pod_spec(children)["initContainers"] if c["name"] == FETCH_CONTAINER),
        {"env": []},
    )
    return found


def fetch_env(children: dict[str, Manifest]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in fetch_container(children)["env"] if "value" in e}


def fetch_secrets(children: dict[str, Manifest]) -> set[str]:
    return {
        e["valueFrom"]["secretKeyRef"]["name"]
        for e in fetch_container(children)["env"]
        if "valueFrom" in e
    }


POLICY = "tests/unit/operator/test_policy.py"
STATUS = "tests/unit/operator/test_status.py"
TELEMETRY = "tests/unit/operator/test_telemetry_parse.py"
AUTOSCALING = "tests/unit/operator/test_autoscaling.py"
OBSERVE = "tests/unit/operator/test_observe_mode.py"
GROW = "tests/unit/operator/test_grow_limit.py"
NODE_PRESSURE = "tests/unit/operator/test_node_pressure.py"
FIELD_EFFECTS = "tests/integration/operator/test_field_effects_io.py"
OTHER_SOURCE = {"source": "pvc://weights/chat-int8", "quantization": "none"}

ROWS: dict[str, list[Proof]] = {
    "model.name": [Server({"model": {"name": "llama-chat"}}, "model_name", "llama-chat")],
    "model.source": [
        Server(
            {"model": {"source": "pvc://weights/chat/v2"}},
            "model_dir",
            PodPath(f"{MODELS_ROOT}/weights/chat/v2"),
        ),
        Pod(
            {"model": {"source": "pvc://weights/chat/v2"}},
            "the claim mounted",
            lambda c: claims(c) == {"weights"},
        ),
    ],
    "model.revision": [
        Server({"model": {"revision": "v2.1"}}, "model_revision", "v2.1"),
        Pod(
            {"model": {"revision": "v2.1"}},
            "annotation fusebox.dev/model-revision",
            lambda c: (
                c["Deployment"]["spec"]["template"]["metadata"]["annotations"][
                    "fusebox.dev/model-revision"
                ]
                == "v2.1"
            ),
        ),
    ],
    "model.dtype": [Server({"model": {"dtype": "float16"}}, "dtype", Dtype.FLOAT16)],
    "model.endpoint": [
        Pod(
            {"model": {"source": S3_SOURCE, "endpoint": "http://s3.local:7070"}},
            "the fetcher's S3 endpoint",
            lambda c: fetch_env(c).get("FUSEBOX_FETCH_S3_ENDPOINT") == "http://s3.local:7070",
        )
    ],
    "model.region": [
        Pod(
            {"model": {"source": S3_SOURCE, "region": "eu-west-1"}},
            "the fetcher's S3 region",
            lambda c: fetch_env(c).get("FUSEBOX_FETCH_S3_REGION") == "eu-west-1",
        )
    ],
    "model.credentials.secretName": [
        Pod(
            {"model": {"source": S3_SOURCE, "credentials": {"secretName": "s3-keys"}}},
            "the fetcher's keys from that Secret",
            lambda c: fetch_secrets(c) == {"s3-keys"},
        )
    ],
    "model.cache.claimName": [
        Pod(
            {"model": {"source": S3_SOURCE, "cache": {"claimName": "shared-models"}}},
            "the claim mounted as the model cache",
            lambda c: claims(c) == {"shared-models"},
        )
    ],
    "model.cache.sizeLimit": [
        Pod(
            {"model": {"source": S3_SOURCE, "cache": {"sizeLimit": "7Gi"}}},
            "the emptyDir's sizeLimit",
            lambda c: {"sizeLimit": "7Gi"} in [v.get("emptyDir") for v in pod_spec(c)["volumes"]],
        )
    ],
    "fallback.source": [
        Server(
            {"fallback": OTHER_SOURCE}, "fallback_dir", PodPath(f"{MODELS_ROOT}/weights/chat-int8")
        ),
        Pod(
            {"fallback": OTHER_SOURCE},
            "both claims mounted",
            lambda c: claims(c) == {"models", "weights"},
        ),
    ],
    "fallback.quantization": [
        Server({"fallback": {"quantization": "int4"}}, "fallback_quantization", Quantization.INT4)
    ],
    "replicas": [
        Pod({"replicas": 3}, "3 replicas", lambda c: c["Deployment"]["spec"]["replicas"] == 3)
    ],
    "gpu.count": [
        Server({"gpu": {"count": 0}, "fallback": {"quantization": "int8"}}, "device", "cpu"),
        Pod(
            {"gpu": {"count": 0}},
            "no nvidia.com/gpu",
            lambda c: "nvidia.com/gpu" not in resources(c)["limits"],
        ),
    ],
    "gpu.product": [
        Pod(
            {"gpu": {"product": "NVIDIA-L4"}},
            "nodeSelector nvidia.com/gpu.product",
            lambda c: pod_spec(c).get("nodeSelector") == {"nvidia.com/gpu.product": "NVIDIA-L4"},
        )
    ],
    "gpu.deviceClassName": [
        Pod(
            {"gpu": {"deviceClassName": "gpu.example.com"}},
            "a ResourceClaimTemplate of that class, claimed by the pod instead of nvidia.com/gpu",
            lambda c: (
                claimed_class(c) == "gpu.example.com"
                and "nvidia.com/gpu" not in resources(c)["limits"]
            ),
        )
    ],
    "gpu.memoryGiB": [
        Pod(
            {"gpu": {"memoryGiB": 10}},
            "limit 10 x 1.25 + 2 -> 15Gi",
            lambda c: resources(c)["limits"]["memory"] == "15Gi",
        )
    ],
    "memory.limit": [
        Pod(
            {"memory": {"limit": "64Gi"}},
            "limit 64Gi",
            lambda c: resources(c)["limits"]["memory"] == "64Gi",
        )
    ],
    "memory.headroomRatio": [
        Pod(
            {"memory": {"headroomRatio": 2}},
            "limit 24 x 2 + 2 -> 50Gi",
            lambda c: resources(c)["limits"]["memory"] == "50Gi",
        )
    ],
    "memory.allowSwap": [
        Pod(
            {"memory": {"allowSwap": True}},
            "request below limit (Burstable)",
            lambda c: resources(c)["requests"]["memory"] != resources(c)["limits"]["memory"],
        )
    ],
    "server.maxConcurrency": [Server({"server": {"maxConcurrency": 3}}, "max_concurrency", 3)],
    "server.maxQueue": [Server({"server": {"maxQueue": 7}}, "max_queue", 7)],
    "server.maxInputTokens": [
        Server({"server": {"maxInputTokens": 100000}}, "max_input_tokens", 100000),
        Server({"server": {"maxInputTokens": 100000}}, "max_body_bytes", body_limit_bytes(100000)),
    ],
    "server.maxNewTokens": [Server({"server": {"maxNewTokens": 33}}, "max_new_tokens", 33)],
    "server.requestTimeoutSeconds": [
        Server({"server": {"requestTimeoutSeconds": 9}}, "request_timeout_seconds", 9.0)
    ],
    "server.tokenizerCacheSize": [
        Server({"server": {"tokenizerCacheSize": 0}}, "tokenizer_cache_size", 0)
    ],
    "server.prefixCache.maxBytes": [
        Server({"server": {"prefixCache": {"maxBytes": "512Mi"}}}, "prefix_cache_bytes", 512 << 20),
        Pod(
            {"gpu": {"count": 0}, "server": {"prefixCache": {"maxBytes": "4Gi"}}},
            "a CPU pod's memory limit 6Gi: 2Gi + (4Gi - the default 1Gi) / ratioOfLimit 0.75",
            lambda c: resources(c)["limits"]["memory"] == "6Gi",
        ),
    ],
    "server.templates": [
        Server({"server": {"templates": ["你好", "Hi"]}}, "templates", ("你好", "Hi"))
    ],
    "server.cpu": [
        Server({"server": {"cpu": "2500m"}}, "torch_threads", 2),
        Pod(
            {"server": {"cpu": "2500m"}},
            "cpu request 2500m",
            lambda c: resources(c)["requests"]["cpu"] == "2500m",
        ),
    ],
    "server.env": [
        Server(
            {"server": {"env": [{"name": "FUSEBOX_LOG_LEVEL", "value": "debug"}]}},
            "log_level",
            "debug",
        )
    ],
    "breaker.latency.metric": [
        Operator(f"{TELEMETRY}::test_the_configured_latency_metric_is_used")
    ],
    "breaker.latency.p99ThresholdMillis": [
        Operator(f"{POLICY}::test_p99_equal_to_threshold_is_not_slow")
    ],
    "breaker.latency.forSeconds": [
        Operator(f"{POLICY}::test_breaker_opens_only_after_for_seconds_of_slow_p99")
    ],
    "breaker.latency.minRequests": [
        Operator(f"{POLICY}::test_breaker_needs_minimum_calls_before_opening")
    ],
    "breaker.quality.sampleRate": [
        Server({"breaker": {"quality": {"sampleRate": 0.5}}}, "quality.sample_rate", 0.5)
    ],
    "breaker.quality.maxFailureRate": [
        Operator(
            f"{POLICY}::test_quality_failures_escalate_one_tier_at_a_time_to_fallback_then_cool_off"
        )
    ],
    "breaker.quality.maxOutputInputRatio": [
        Server(
            {"breaker": {"quality": {"maxOutputInputRatio": 12.5}}},
            "quality.max_output_input_ratio",
            12.5,
        )
    ],
    "breaker.quality.blockedTerms": [
        Server(
            {"breaker": {"quality": {"blockedTerms": ["secret"]}}},
            "quality.blocked_terms",
            ("secret",),
        )
    ],
    "breaker.resource.rss.ratioOfLimit": [
        Operator(f"{POLICY}::test_growing_below_ratio_does_nothing")
    ],
    "breaker.resource.rss.growthMiBPerMinute": [
        Operator(f"{POLICY}::test_above_ratio_but_flat_does_nothing")
    ],
    "breaker.resource.gpuMemory.ratioOfVRAM": [
        Operator(f"{POLICY}::test_gpu_memory_above_ratio_of_vram_and_growing_climbs_the_ladder"),
        Crossing(
            f"{FIELD_EFFECTS}::"
            "test_gpu_memory_over_ratio_of_vram_climbs_the_ladder_and_under_it_does_not"
        ),
    ],
    "breaker.resource.gpuMemory.growthMiBPerMinute": [
        Operator(f"{POLICY}::test_gpu_memory_above_ratio_of_vram_and_growing_climbs_the_ladder")
    ],
    "breaker.resource.cooldownSeconds": [
        Operator(
            f"{POLICY}::test_ladder_climbs_in_order_with_cooldowns_while_the_signal_stays_high"
        )
    ],
    "breaker.resource.windowSeconds": [
        Operator(f"{POLICY}::test_growth_is_fitted_over_window_seconds_only")
    ],
    "breaker.openSeconds": [
        Operator(
            f"{POLICY}::test_open_goes_half_open_only_after_open_seconds_then_closes_on_good_results"
        )
    ],
    "breaker.halfOpen.admitPercent": [Operator(f"{POLICY}::test_half_open_admits_admit_percent")],
    "breaker.halfOpen.minRequests": [Operator(f"{POLICY}::test_half_open_waits_for_min_requests")],
    "breaker.halfOpen.p99RecoveryMillis": [
        Operator(f"{POLICY}::test_half_open_reopens_when_p99_not_under_recovery")
    ],
    "breaker.halfOpen.minSuccessRate": [
        Operator(f"{POLICY}::test_half_open_reopens_when_success_rate_is_too_low"),
        Crossing(
            f"{FIELD_EFFECTS}::"
            "test_half_open_closes_at_min_success_rate_half_and_reopens_at_99_on_the_same_outcomes"
        ),
    ],
    "degradation.tiers": [
        Operator(f"{STATUS}::test_status_shows_the_model_and_the_effective_tiers"),
        Operator(f"{POLICY}::test_latency_trip_raises_one_tier"),
    ],
    "degradation.cannedAnswers": [
        Server(
            {"degradation": {"cannedAnswers": {"你好": "你好！"}}},
            "canned_answers",
            {"你好": "你好！"},
        )
    ],
    "degradation.coolOffSeconds": [
        Operator(
            f"{POLICY}::test_quality_failures_escalate_one_tier_at_a_time_to_fallback_then_cool_off"
        )
    ],
    "telemetry.scrapeIntervalSeconds": [
        Operator(f"{POLICY}::test_stale_telemetry_moves_no_breaker"),
        Pod(
            {"telemetry": {"scrapeIntervalSeconds": 10}},
            "liveness threshold ceil((15 + 2 x 10 + 30) / 10) + 1 = 8",
            lambda c: liveness(c)["failureThreshold"] == 8,
        ),
    ],
    "telemetry.scrapeTimeoutSeconds": [
        Operator(f"{TELEMETRY}::test_a_scrape_slower_than_scrape_timeout_is_a_failed_sample")
    ],
    "telemetry.wedgeAfterSeconds": [
        Operator(f"{POLICY}::test_wedged_server_is_restarted_once"),
        Pod(
            {"telemetry": {"wedgeAfterSeconds": 90}},
            "liveness threshold ceil((90 + 2 x 5 + 30) / 10) + 1 = 14",
            lambda c: liveness(c)["failureThreshold"] == 14,
        ),
    ],
    # Every enum value.
    **{
        f"model.dtype={dtype.value}": [
            Server({"model": {"dtype": dtype.value}}, "dtype", dtype, moves_the_default=False)
        ]
        for dtype in Dtype
    },
    **{
        f"fallback.quantization={q.value}": [
            Server(
                {"fallback": {**OTHER_SOURCE, "quantization": q.value}},
                "fallback_quantization",
                q,
                moves_the_default=False,
            )
        ]
        for q in Quantization
    },
    **{
        f"breaker.latency.metric={metric}": [
            Operator(f"{TELEMETRY}::test_the_configured_latency_metric_is_used")
        ]
        for metric in ("ttft", "itl", "e2e")
    },
    "memory.maxGrowthRatio": [
        Operator(f"{GROW}::test_growth_comes_after_the_cheap_steps_and_before_a_reload"),
        Operator(f"{GROW}::test_off_by_default_and_never_with_swap"),
    ],
    "memory.nodeAvailableFloor": [
        Operator(
            f"{NODE_PRESSURE}::test_the_floor_is_the_specs_or_the_kubelets_threshold_plus_a_margin"
        ),
        Operator(
            f"{NODE_PRESSURE}::test_below_the_floor_every_ready_pod_on_that_node_sheds_its_caches_once"
        ),
    ],
    "autoscaling.minReplicas": [
        Pod(
            {"replicas": 1, "autoscaling": {"minReplicas": 2, "maxReplicas": 3}},
            "starts at minReplicas",
            lambda c: c["Deployment"]["spec"]["replicas"] == 2,
        ),
        Operator(
            f"{AUTOSCALING}::test_the_recommendation_is_the_load_over_the_target_rounded_up_and_clamped"
        ),
    ],
    "autoscaling.maxReplicas": [
        Operator(
            f"{AUTOSCALING}::test_the_recommendation_is_the_load_over_the_target_rounded_up_and_clamped"
        )
    ],
    **{
        f"autoscaling.metric={metric}": [
            Operator(
                f"{AUTOSCALING}::test_a_pods_load_is_its_queue_or_its_queue_plus_running_requests"
            )
        ]
        for metric in ("queueLength", "inFlight")
    },
    "autoscaling.metric": [
        Operator(f"{AUTOSCALING}::test_a_pods_load_is_its_queue_or_its_queue_plus_running_requests")
    ],
    "autoscaling.targetPerReplica": [
        Operator(f"{AUTOSCALING}::test_load_scales_up_at_once_and_says_why_in_the_decision")
    ],
    "autoscaling.scaleUpStabilizationSeconds": [
        Operator(f"{AUTOSCALING}::test_scale_up_waits_for_load_to_last_through_its_window"),
        Crossing(f"{FIELD_EFFECTS}::test_scale_up_waits_out_a_30s_window_and_acts_at_once_at_0"),
    ],
    "autoscaling.scaleDownStabilizationSeconds": [
        Operator(f"{AUTOSCALING}::test_scale_down_takes_the_highest_recommendation_of_its_window")
    ],
    "degradation.tiers=no-streaming": [Operator(f"{POLICY}::test_latency_trip_raises_one_tier")],
    "degradation.tiers=fallback-model": [
        Operator(
            f"{POLICY}::test_quality_failures_escalate_one_tier_at_a_time_to_fallback_then_cool_off"
        )
    ],
    "degradation.tiers=canned-answers": [
        Operator(f"{STATUS}::test_canned_answers_tier_without_a_fallback_stays_primary")
    ],
    "mode": [Operator(f"{OBSERVE}::test_the_default_mode_is_enforce")],
    "mode=Observe": [
        Operator(
            f"{OBSERVE}::test_a_ladder_rung_in_observe_is_a_would_act_with_its_figures_and_no_call"
        )
    ],
    "mode=Enforce": [Operator(f"{OBSERVE}::test_the_same_leak_in_enforce_acts")],
    # spec.pod: each Pod API field lands in the pod spec as written (pod_placement.py).
    **{
        f"pod.{field}": [
            Pod(
                {"pod": {field: value}},
                f"pod spec {field}",
                lambda c, field=field, value=value: pod_spec(c).get(field) == value,
            )
        ]
        for field, value in POD_PLACEMENT.items()
    },
    **{
        f"pod.affinity.{kind}": [
            Pod(
                {"pod": {"affinity": {kind: AFFINITY_TERM}}},
                f"pod spec affinity.{kind}",
                lambda c, kind=kind: pod_spec(c).get("affinity") == {kind: AFFINITY_TERM},
            )
        ]
        for kind in ("nodeAffinity", "podAffinity", "podAntiAffinity")
    },
    **{
        f"pod.tolerations.{key}={value}": [
            Pod(
                {"pod": {"tolerations": [toleration]}},
                f"toleration {key} {value or '(empty)'} beside the GPU's",
                lambda c, toleration=toleration: pod_spec(c)["tolerations"][0] == toleration,
            )
        ]
        for key, value, toleration in TOLERATION_VALUES
    },
    **{
        f"pod.topologySpreadConstraints.{key}={value}": [
            Pod(
                {"pod": {"topologySpreadConstraints": [{**SPREAD, key: value}]}},
                f"spread constraint {key} {value}",
                lambda c, key=key, value=value: (
                    (pod_spec(c).get("topologySpreadConstraints") or [{}])[0].get(key) == value
                ),
            )
        ]
        for key, values in SPREAD_VALUES.items()
        for value in values
    },
    "pod.labels": [
        Pod(
            {"pod": {"labels": {"team": "search"}}},
            "pod label team beside Fusebox's",
            lambda c: (
                c["Deployment"]["spec"]["template"]["metadata"]["labels"].get("team") == "search"
            ),
        )
    ],
    "pod.annotations": [
        Pod(
            {"pod": {"annotations": {"example.com/a": "1"}}},
            "pod annotation beside Fusebox's",
            lambda c: (
                c["Deployment"]["spec"]["template"]["metadata"]["annotations"].get("example.com/a")
                == "1"
            ),
        )
    ],
    "pod.image": [
        Pod(
            {"pod": {"image": "registry.example.com/inference:v2"}},
            "the server's image",
            lambda c: server_container(c)["image"] == "registry.example.com/inference:v2",
        )
    ],
}


# --- rendering and the server's view -------------------------------------------------


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    result = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merge(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def render(raw_spec: dict[str, Any]) -> dict[str, Manifest]:
    spec = parse_spec(raw_spec)
    sizing = size_memory(spec, NODE_VRAM_MIB if spec.gpu.count else [])
    children = build_children(spec, "svc", "ns", sizing, OperatorSettings(), TOKEN)
    return {child["kind"]: child for child in children}


class PodFiles:
    """A temporary directory standing in for the pod's volumes."""

    def __init__(self, root: Path, children: dict[str, Manifest], model: Path) -> None:
        self.root, self.model = root, model
        self.prefixes = {
            CONFIG_DIR: root / "config",
            MODELS_ROOT: root / "models",
            # What the fetcher leaves in the cache volume: the model, as on a claim
            # (and, in the runtime volume, the pod's link to it: FETCHED_MODEL_LINK).
            MODEL_CACHE_DIR: root / "model-cache",
            ADMIN_TOKEN_DIR: root / "admin",
            RUNTIME_DIR: root / "run",
        }
        (root / "config").mkdir(parents=True)
        for file_name, text in children["ConfigMap"]["data"].items():
            (root / "config" / file_name).write_text(text, encoding="utf-8")
        (root / "admin").mkdir()
        (root / "admin" / ADMIN_TOKEN_KEY).write_text(
            children["Secret"]["stringData"][ADMIN_TOKEN_KEY], encoding="utf-8"
        )
        (root / "run").mkdir()

    def rewrite(self, value: str) -> str:
        for prefix, local in self.prefixes.items():
            if value == prefix or value.startswith(prefix + "/"):
                path = local / value[len(prefix) :].lstrip("/")
                model = prefix in (MODELS_ROOT, MODEL_CACHE_DIR) or value == FETCHED_MODEL_LINK
                if model and not path.exists():
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.symlink_to(self.model, target_is_directory=True)
                return str(path)
        return value

    def server_env(self, children: dict[str, Manifest]) -> dict[str, str]:
        env = server_container(children)["env"]
        return {item["name"]: self.rewrite(item["value"]) for item in env}


@pytest.fixture(scope="module")
def tiny_model() -> Path:
    return ensure_model("tiny")


def server_config(
    raw_spec: dict[str, Any], root: Path, model: Path
) -> tuple[ServerConfig, PodFiles]:
    children = render(raw_spec)
    files = PodFiles(root, children, model)
    return parse_config([], files.server_env(children)), files


def test_every_crd_field_and_enum_value_has_a_row() -> None:
    assert sorted(set(CRD_ENTRIES) - set(ROWS)) == []


def test_every_row_names_a_crd_field() -> None:
    assert sorted(set(ROWS) - set(CRD_ENTRIES)) == []


SERVER_PROOFS = [
    pytest.param(proof, id=f"{entry}->{proof.attribute}")
    for entry, proofs in ROWS.items()
    for proof in proofs
    if isinstance(proof, Server)
]
POD_PROOFS = [
    pytest.param(proof, id=f"{entry}->{proof.shows}")
    for entry, proofs in ROWS.items()
    for proof in proofs
    if isinstance(proof, Pod)
]
OPERATOR_PROOFS = sorted(
    {proof.test for proofs in ROWS.values() for proof in proofs if isinstance(proof, Operator)}
)
CROSSING_PROOFS = sorted(
    {proof.test for proofs in ROWS.values() for proof in proofs if isinstance(proof, Crossing)}
)


@pytest.mark.parametrize("proof", SERVER_PROOFS)
def test_server_field_reaches_the_servers_own_config(
    proof: Server, tmp_path: Path, tiny_model: Path
) -> None:
    with_value, files = server_config(merge(BASE, proof.spec), tmp_path / "with", tiny_model)
    without, _ = server_config(BASE, tmp_path / "without", tiny_model)
    expected = proof.expected
    if isinstance(expected, PodPath):
        expected = Path(files.rewrite(expected))
    read = attrgetter(proof.attribute)
    assert read(with_value) == expected
    if proof.moves_the_default:
        # The value is not what the server would have had anyway.
        assert read(without) != read(with_value)


@pytest.mark.parametrize("proof", POD_PROOFS)
def test_pod_field_shows_in_the_rendered_objects(proof: Pod) -> None:
    assert proof.check(render(merge(BASE, proof.spec))), proof.shows
    assert not proof.check(render(BASE)), f"{proof.shows} holds without the value"


def function_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test_")
    }


@pytest.mark.parametrize("node_id", OPERATOR_PROOFS, ids=lambda n: n.rpartition("::")[2])
def test_operator_field_has_its_named_policy_test(node_id: str) -> None:
    file_name, _, function = node_id.partition("::")
    path = REPO / file_name
    assert path.exists(), file_name
    assert function in function_names(path), f"{node_id} does not exist"


@pytest.mark.parametrize("node_id", CROSSING_PROOFS, ids=lambda n: n.rpartition("::")[2])
def test_crossing_field_has_its_named_integration_test(node_id: str) -> None:
    file_name, _, function = node_id.partition("::")
    assert file_name.startswith(("tests/integration/", "tests/e2e/")), node_id
    path = REPO / file_name
    assert path.exists(), file_name
    assert function in function_names(path), f"{node_id} does not exist"


def test_the_sidecar_reads_the_stats_file_and_port_it_is_rendered_with() -> None:
    children = render(BASE)
    # The sidecar is a native sidecar: an init container that keeps running.
    containers = children["Deployment"]["spec"]["template"]["spec"]["initContainers"]
    sidecar = next(c for c in containers if c["name"] == "sidecar")
    command = sidecar["command"]
    module_at = command.index("fusebox_sidecar")
    env = {item["name"]: item["value"] for item in sidecar.get("env") or []}
    parsed = sidecar_config.parse_config(command[module_at + 1 :], env)
    assert str(parsed.stats_file) == STATS_FILE
    assert parsed.port == Port.METRICS
    ports = {p["name"]: p["containerPort"] for p in sidecar["ports"]}
    assert ports == {"metrics": Port.METRICS}


# --- the examples --------------------------------------------------------------------


def needs_cuda(raw_spec: dict[str, Any]) -> bool:
    spec = parse_spec(raw_spec)
    return spec.fallback is not None and spec.fallback.quantization.needs_gpu


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_example_renders_and_passes_the_servers_check_config(
    example: Path, tmp_path: Path, tiny_model: Path
) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "fusebox_operator",
            "render",
            str(example),
            "--gpu-memory-mib",
            "24576",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    children = {child["kind"]: child for child in yaml.safe_load_all(result.stdout)}
    files = PodFiles(tmp_path, children, tiny_model)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSEBOX_")}
    env.update(files.server_env(children))
    check = subprocess.run(
        [sys.executable, "-m", "fusebox_server", "--check-config"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    raw_spec = yaml.safe_load(example.read_text(encoding="utf-8"))["spec"]
    if needs_cuda(raw_spec) and not torch.cuda.is_available():
        # The pod runs on a GPU node; here the server's check names the device it lacks.
        assert check.returncode == 2, check.stdout
        assert "needs a CUDA device" in check.stderr
    else:
        assert check.returncode == 0, check.stderr
        assert check.stdout.startswith("config ok:")
