"""The seams issue 32's audit found in the spec: each is refused by parse_spec with the
field named, where before a value was accepted and did something else (or nothing)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest

from fusebox_operator.manifests import build_children
from fusebox_operator.settings import OperatorSettings
from fusebox_operator.sizing import size_memory
from fusebox_operator.spec import (
    SpecError,
    applied_spec_text,
    parse_spec,
    placement_as_applied,
    watched_spec,
)

MODEL = {"name": "chat", "source": "pvc://models/tiny"}
MAX_CPU_CORES = 1024  # docs/decisions/spec-seams.md


def spec(**sections: Any) -> dict[str, Any]:
    return {"model": dict(MODEL), **sections}


def refusal(raw: dict[str, Any]) -> str:
    with pytest.raises(SpecError) as raised:
        parse_spec(raw)
    return str(raised.value)


def server_env(raw: dict[str, Any]) -> dict[str, str]:
    parsed = parse_spec(raw)
    sizing = size_memory(parsed, [])
    children = build_children(parsed, "chat", "ml", sizing, OperatorSettings(), "token")
    deployment = children[-1]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {item["name"]: item.get("value", "") for item in container["env"]}


# --- N1: a queue cap the target cannot pass never asks for a scale-up ------------------------


@pytest.mark.parametrize(
    ("max_queue", "target"),
    [(0, 4), (4, 4), (4, 3.7), (64, 100)],
)
def test_a_queue_cap_that_cannot_exceed_the_target_is_refused_naming_both_fields(
    max_queue: int, target: float
) -> None:
    message = refusal(
        spec(
            gpu={"count": 0},
            server={"maxQueue": max_queue},
            autoscaling={"maxReplicas": 4, "targetPerReplica": target},
        )
    )
    assert "server.maxQueue" in message and "autoscaling.targetPerReplica" in message


def test_a_queue_cap_above_the_target_and_its_tolerance_is_accepted() -> None:
    parsed = parse_spec(
        spec(
            gpu={"count": 0},
            server={"maxQueue": 5},
            autoscaling={"maxReplicas": 4, "targetPerReplica": 4},
        )
    )
    assert parsed.autoscaling is not None and parsed.autoscaling.target_per_replica == 4


def test_in_flight_counts_the_running_slots_too() -> None:
    # inFlight = waiting + generating: maxQueue 0 with 8 slots can still pass a target of 4.
    accepted = spec(
        gpu={"count": 0},
        server={"maxQueue": 0, "maxConcurrency": 8},
        autoscaling={"maxReplicas": 4, "targetPerReplica": 4, "metric": "inFlight"},
    )
    parse_spec(accepted)
    accepted["server"]["maxConcurrency"] = 4
    message = refusal(accepted)
    assert "server.maxQueue + server.maxConcurrency" in message
    assert "autoscaling.targetPerReplica" in message


# --- N3: a quantization needs the compute capability of its kernel --------------------------


@pytest.mark.parametrize(
    ("product", "quantization", "generation"),
    [
        ("Tesla-T4", "int4", "Turing (7.5)"),
        ("Tesla-V100-SXM2-16GB", "int4", "Volta (7.0)"),
        ("Tesla-V100-SXM2-32GB", "fp8", "Volta (7.0)"),
        ("NVIDIA-A100-SXM4-80GB", "fp8", "Ampere (8.0)"),
        ("Quadro-RTX-5000", "int4", "Turing (7.5)"),
        ("Tesla-P100-PCIE-16GB", "int4", "Pascal (6.0)"),
    ],
)
def test_a_quantization_is_refused_on_a_product_below_its_compute_capability(
    product: str, quantization: str, generation: str
) -> None:
    message = refusal(spec(gpu={"product": product}, fallback={"quantization": quantization}))
    assert f"fallback.quantization {quantization} needs compute capability >=" in message
    assert f"{product} is {generation}" in message


def test_a_product_the_table_does_not_know_is_refused_for_int4_and_may_be_left_out() -> None:
    message = refusal(spec(gpu={"product": "Acme-X1"}, fallback={"quantization": "int4"}))
    assert "Acme-X1" in message and "gpu.product" in message
    # Without a product the server checks its own device at start (and --check-config).
    parse_spec(spec(fallback={"quantization": "int4"}))


@pytest.mark.parametrize(
    ("product", "quantization"),
    [
        ("NVIDIA-A100-SXM4-80GB", "int4"),
        ("NVIDIA-A10G", "int4"),
        ("NVIDIA-RTX-A6000", "int4"),
        ("NVIDIA-GeForce-RTX-3090", "int4"),
        ("NVIDIA-L4", "int4"),
        ("NVIDIA-H100-80GB-HBM3", "int4"),
        ("NVIDIA-H100-80GB-HBM3", "fp8"),
        ("NVIDIA-B200", "fp8"),
        ("Tesla-T4", "int8"),
    ],
)
def test_a_quantization_on_a_product_that_reaches_its_capability_parses(
    product: str, quantization: str
) -> None:
    parsed = parse_spec(spec(gpu={"product": product}, fallback={"quantization": quantization}))
    assert parsed.fallback is not None and parsed.fallback.quantization.value == quantization


# --- N5: a GPU-only field without a GPU -----------------------------------------------------


def test_gpu_memory_without_a_gpu_is_refused() -> None:
    message = refusal(spec(gpu={"count": 0, "memoryGiB": 80}))
    assert "gpu.memoryGiB requires gpu.count > 0" in message


# --- N6: a model path leaves its mount ------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "source"),
    [
        ("model", "pvc://models/../../etc"),
        ("model", "pvc://models/.."),
        ("model", "pvc://models/a/../../b"),
        ("model", "file:///opt/../etc"),
        ("model", "file:///.."),
        ("fallback", "pvc://models/../other"),
        ("fallback", "file:///opt/model/../../etc/passwd"),
    ],
)
def test_a_parent_segment_in_a_source_is_refused(section: str, source: str) -> None:
    raw = spec(model=dict(MODEL), gpu={"count": 0})
    raw[section] = {**raw.get(section, {}), "source": source}
    if section == "fallback":
        raw["fallback"]["quantization"] = "none"
    message = refusal(raw)
    assert f"{section}.source" in message and "'..'" in message


@pytest.mark.parametrize(
    "source", ["pvc://models/a..b", "pvc://models/..hidden/x", "pvc://models/...", "pvc://m/./x"]
)
def test_dots_that_are_not_a_parent_segment_stay_inside_the_mount(source: str) -> None:
    env = server_env(spec(model={"name": "chat", "source": source}, gpu={"count": 0}))
    assert env["FUSEBOX_MODEL_DIR"].startswith("/models/")


# --- N7: CPU bounded by what a node has ----------------------------------------------------


@pytest.mark.parametrize("cpu", ["100000", "1025", "1024001m", "1024.5"])
def test_more_cpu_than_a_node_has_is_refused(cpu: str) -> None:
    message = refusal(spec(gpu={"count": 0}, server={"cpu": cpu}))
    assert f"server.cpu {cpu!r}" in message and f"at most {MAX_CPU_CORES}" in message


def test_the_largest_cpu_renders_that_many_torch_threads() -> None:
    env = server_env(spec(gpu={"count": 0}, server={"cpu": str(MAX_CPU_CORES)}))
    assert env["FUSEBOX_TORCH_THREADS"] == str(MAX_CPU_CORES)


# --- N8: NaN, infinities and wrong types are refused, not read as something else ------------


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize(
    ("path", "extra"),
    [
        ("breaker.latency.forSeconds", {}),
        ("memory.headroomRatio", {}),
        ("gpu.memoryGiB", {}),
        ("autoscaling.targetPerReplica", {"autoscaling": {"maxReplicas": 2}}),
        ("telemetry.scrapeTimeoutSeconds", {}),
    ],
)
def test_a_number_that_is_not_finite_is_refused_naming_the_field(
    path: str, extra: dict[str, Any], value: float
) -> None:
    raw = spec(**extra)
    node = raw
    *parents, leaf = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    assert path in refusal(raw)


@pytest.mark.parametrize("value", ["false", "true", 0, 1, [], {}])
def test_allow_swap_must_be_a_boolean(value: Any) -> None:
    message = refusal(spec(gpu={"count": 0}, memory={"allowSwap": value}))
    assert "memory.allowSwap must be true or false" in message


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (spec(gpu={"count": 0, "product": 0}), "gpu.product"),
        (spec(gpu={"count": 0}, server={"cpu": 2}), "server.cpu"),
        (spec(gpu={"count": 0}, server={"cpu": 0}), "server.cpu"),
        (spec(gpu={"count": 0}, fallback={"source": 5, "quantization": "none"}), "fallback.source"),
        (spec(gpu={"count": 0}, server={"env": [{"name": "X", "value": 5}]}), "server.env"),
        (spec(gpu={"count": 0}, degradation={"tiers": [{"a": 1}]}), "degradation.tiers"),
        (spec(gpu={"count": 0}, breaker={"latency": {"metric": ["ttft"]}}), "breaker.latency"),
        (spec(gpu={"count": 0}, breaker={"resource": {"rss": [1]}}), "breaker.resource.rss"),
        (spec(gpu={"count": 0}, server={"maxQueue": 10**400}), "server.maxQueue"),
        (spec(gpu={"count": 0}, memory={"limit": "9" * 400}), "memory.limit"),
        (spec(gpu={"count": 0}, memory={"limit": 16}), "memory.limit"),
        (spec(gpu={"count": 0}, breaker={"openSeconds": 10**400}), "breaker.openSeconds"),
    ],
)
def test_a_value_of_the_wrong_type_is_refused_naming_the_field(
    raw: dict[str, Any], field: str
) -> None:
    assert field in refusal(raw)


# --- a spec applied before these checks keeps its pods protected ---------------------------


@pytest.mark.parametrize(
    "raw",
    [
        spec(gpu={"count": 0}, server={"maxQueue": 0}, autoscaling={"maxReplicas": 3}),
        spec(gpu={"product": "Tesla-T4"}, fallback={"quantization": "int4"}),
        spec(gpu={"count": 0, "memoryGiB": 80}),
    ],
    ids=["queue-cap-below-target", "int4-on-t4", "gpu-memory-without-gpu"],
)
def test_a_running_spec_refused_by_a_newer_check_is_still_watched(raw: dict[str, Any]) -> None:
    refusal(raw)  # a new object or an edit is refused...
    status = {"appliedSpec": applied_spec_text(raw), "appliedGeneration": 3}
    watched = watched_spec(raw, status, 4)  # ...but the pods it already runs stay protected
    assert watched is not None and watched[1] == 3


UNCONFINED = {"container.apparmor.security.beta.kubernetes.io/server": "unconfined"}
FULL_POD = {
    "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
    "nodeSelector": {"pool": "a100"},
    "topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}
    ],
    "imagePullSecrets": [{"name": "registry"}],
    "runtimeClassName": "nvidia",
    "priorityClassName": "inference",
    "serviceAccountName": "chat",
    "labels": {"team": "ml"},
    "annotations": {"owner": "ml"},
    "image": "registry.example/fusebox@sha256:abc",
}


def test_a_running_spec_whose_pod_section_a_newer_check_refuses_is_still_watched() -> None:
    """An AppArmor `unconfined` annotation, refused since a8dbe98: its record froze the
    service's ticks. Watched, its pods keep the placement they run (a resync renders it)."""
    raw = spec(pod={**FULL_POD, "annotations": {**FULL_POD["annotations"], **UNCONFINED}})
    assert "unconfined" in refusal(raw)  # a new object or an edit is refused...
    status = {"appliedSpec": applied_spec_text(raw), "appliedGeneration": 3, "memory": {}}
    watched = watched_spec(raw, status, 4)  # ...but the pods it already runs stay watched
    assert watched is not None and watched[1] == 3
    pod = watched[0].pod
    assert dict(pod.annotations) == {"owner": "ml", **UNCONFINED}
    assert pod == replace(parse_spec(spec(pod=FULL_POD)).pod, annotations=pod.annotations)


def test_a_pod_section_taken_as_applied_is_what_the_parser_keeps_of_a_valid_one() -> None:
    assert placement_as_applied(FULL_POD) == parse_spec(spec(pod=FULL_POD)).pod
    assert placement_as_applied(None) == parse_spec(spec()).pod
