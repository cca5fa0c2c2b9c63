"""spec.parse_spec: defaults equal the CRD's, bad specs give one actionable message."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from fusebox_contract.names import DegradationTier, Dtype, Quantization
from fusebox_contract.settings import RESERVED_ENV_NAMES
from fusebox_operator.gpu_products import fp8_capable
from fusebox_operator.manifests import build_children
from fusebox_operator.settings import OperatorSettings
from fusebox_operator.sizing import size_memory
from fusebox_operator.spec import (
    ModelFetchSpec,
    ModelSource,
    SpecError,
    applied_spec_text,
    check_service_name,
    parse_cpu_quantity,
    parse_quantity_bytes,
    parse_spec,
    watched_spec,
)

from .conftest import load_example


def minimal(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"name": "chat", "source": "pvc://models/tiny"},
        "fallback": {"quantization": "int8"},
    }
    spec.update(overrides)
    return spec


def test_minimal_spec_gets_design_defaults() -> None:
    spec = parse_spec(minimal())
    assert spec.replicas == 1
    assert spec.gpu.count == 1
    assert spec.memory.limit_bytes is None and spec.memory.headroom_ratio == 1.25
    assert spec.breaker.latency.p99_threshold_millis == 200
    assert spec.breaker.half_open.admit_percent == 5
    assert spec.degradation.levels == (1, 2, 3)
    assert spec.telemetry.scrape_interval_seconds == 5


def test_tiny_chat_example_parses() -> None:
    spec = parse_spec(load_example("tiny-chat.yaml")["spec"])
    assert spec.replicas == 2
    assert spec.fallback is not None and spec.fallback.source is None
    assert spec.model.source == ModelSource("pvc", "models", "tiny")


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("pvc://models/tiny", ModelSource("pvc", "models", "tiny")),
        ("pvc://models", ModelSource("pvc", "models", "")),
        ("pvc://models/a/b/", ModelSource("pvc", "models", "a/b")),
        ("file:///opt/model", ModelSource("file", "", "/opt/model")),
        ("s3://models/llama/v1/", ModelSource("s3", path="llama/v1", repository="models")),
        ("s3://models", ModelSource("s3", path="", repository="models")),
        ("hf://org/name", ModelSource("hf", repository="org/name")),
        ("hf://org/name@v1.0", ModelSource("hf", repository="org/name", revision="v1.0")),
    ],
)
def test_model_sources_parse(source: str, expected: ModelSource) -> None:
    assert ModelSource.parse(source) == expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (minimal(model={"name": "chat", "source": "gs://bucket/x"}), "must start with pvc://"),
        (minimal(model={"name": "chat", "source": "s3://B/x"}), "s3:// needs a bucket name"),
        (minimal(model={"name": "chat", "source": "s3://models/a b"}), "s3:// needs a bucket"),
        (minimal(model={"name": "chat", "source": "s3://models/a/../b"}), "'..' path segment"),
        (minimal(model={"name": "chat", "source": "hf://repo"}), "hf:// needs ORG/NAME"),
        (minimal(model={"name": "chat", "source": "hf://org/x@a@b"}), "hf:// needs ORG/NAME"),
        (
            minimal(model={"name": "chat", "source": "pvc://m/x", "endpoint": "http://s3:9000"}),
            "model.endpoint applies to s3:// and hf:// sources only",
        ),
        (
            minimal(model={"name": "chat", "source": "pvc://m/x", "cache": {}}),
            "model.cache applies to s3:// and hf://",
        ),
        (
            minimal(model={"name": "chat", "source": "hf://org/x", "region": "eu-west-1"}),
            "model.region applies to s3:// sources only",
        ),
        (
            minimal(model={"name": "chat", "source": "s3://models/x", "endpoint": "a b"}),
            "model.endpoint 'a b' must be host[:port]",
        ),
        (
            minimal(
                model={
                    "name": "chat",
                    "source": "s3://models/x",
                    "credentials": {"secretName": "A"},
                }
            ),
            "model.credentials.secretName 'A' must be an object name",
        ),
        (
            minimal(model={"name": "chat", "source": "s3://models/x", "cache": {"sizeLimit": "0"}}),
            "model.cache.sizeLimit must be above zero",
        ),
        (
            minimal(
                model={"name": "chat", "source": "s3://models/x"},
                fallback={"source": "s3://models/y", "quantization": "none"},
            ),
            "fetched for model.source only",
        ),
        (minimal(model={"name": "chat", "source": "pvc://Bad_Claim/x"}), "claim name"),
        (minimal(model={"name": "chat", "source": f"pvc://{'c' * 64}/x"}), "claim name"),
        (minimal(model={"name": "chat", "source": "pvc://models/a b"}), "without whitespace"),
        (minimal(model={"name": "chat", "source": "file://x"}), "file:// needs an absolute"),
        (minimal(model={"name": "chat", "source": "file:///"}), "file:// needs an absolute"),
        (
            {
                "model": {"name": "chat", "source": "pvc://m/x"},
                "degradation": {"tiers": ["fallback-model"]},
            },
            "spec.fallback is required",
        ),
        (minimal(fallback={"quantization": "awq"}), "must be one of none, int8, int4, fp8"),
        (minimal(model={"name": "c", "source": "pvc://m", "dtype": "int8"}), "model.dtype"),
        (minimal(gpu={"count": 0}, fallback={"quantization": "int4"}), "int4 needs a GPU"),
        (minimal(gpu={"count": 0}, fallback={"quantization": "fp8"}), "fp8 needs a GPU"),
        (
            minimal(gpu={"product": "NVIDIA-A100-SXM4-80GB"}, fallback={"quantization": "fp8"}),
            "NVIDIA-A100-SXM4-80GB is Ampere (8.0) and has no fp8 support",
        ),
        (minimal(gpu={"count": 2}), "more than 1 GPU per pod is not supported yet"),
        (minimal(gpu={"product": "NVIDIA H100"}), "must be a label value"),
        (minimal(memory={"limit": "500m"}), "not a memory quantity"),
        (minimal(server={"cpu": "0"}), "server.cpu '0' must be above zero"),
        (minimal(server={"cpu": "two"}), "must be a CPU quantity"),
        # The CRD's maxLength, as the API server applies it, though the quantity is 1 core.
        (minimal(server={"cpu": "0" * 32 + "1"}), "server.cpu must be at most 32 characters"),
        (minimal(telemetry={"wedgeAfterSeconds": 4000}), "wedgeAfterSeconds must be in"),
        (
            minimal(breaker={"halfOpen": {"p99RecoveryMillis": 0}}),
            "p99RecoveryMillis must be in (0, 3.6e+06]",
        ),
        (minimal(fallback={"quantization": "none"}), "must be quantized"),
        (minimal(gpu={"count": 0, "product": "NVIDIA-H100"}), "gpu.product requires"),
        (minimal(breaker={"halfOpen": {"admitPercent": 0}}), "admitPercent must be in [1, 100]"),
        (minimal(breaker={"halfOpen": {"p99RecoveryMillis": 300}}), "must be below"),
        (minimal(breaker={"quality": {"maxFailureRate": 0}}), "maxFailureRate must be in (0, 1]"),
        (minimal(breaker={"resource": {"rss": {"ratioOfLimit": 1.5}}}), "ratioOfLimit must be in"),
        (
            minimal(server={"env": [{"name": "FUSEBOX_ADMIN_TOKEN_FILE", "value": "/x"}]}),
            "may not set",
        ),
        (minimal(memory={"limit": "lots"}), "not a memory quantity"),
        (minimal(memory={"limit": "4Gi\n"}), "not a memory quantity"),
        (
            minimal(telemetry={"scrapeIntervalSeconds": 10, "wedgeAfterSeconds": 5}),
            "wedgeAfterSeconds",
        ),
        (minimal(degradation={"tiers": ["turbo"]}), "degradation.tiers: tier 'turbo'"),
        (minimal(replicas="two"), "spec.replicas must be an integer"),
    ],
)
def test_invalid_specs_are_rejected_with_a_clear_message(
    spec: dict[str, Any], message: str
) -> None:
    with pytest.raises(SpecError, match=None) as raised:
        parse_spec(spec)
    assert message in str(raised.value)


@pytest.mark.parametrize("name", sorted(RESERVED_ENV_NAMES))
def test_every_reserved_env_name_is_refused_in_server_env(name: str) -> None:
    with pytest.raises(SpecError, match=f"server.env may not set {name}"):
        parse_spec(minimal(server={"env": [{"name": name, "value": "x"}]}))


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA_VISIBLE_DEVICES",
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_DRIVER_CAPABILITIES",
        "NVIDIA_MIG_CONFIG_DEVICES",
        "NVIDIA_MIG_MONITOR_DEVICES",
    ],
)
def test_server_env_may_not_choose_the_pods_gpus(name: str) -> None:
    # The NVIDIA toolkit would hand a pod that asks for no GPU every GPU on the node.
    with pytest.raises(SpecError, match=f"server.env may not set {name}"):
        parse_spec(minimal(gpu={"count": 0}, server={"env": [{"name": name, "value": "all"}]}))


def test_only_model_is_a_valid_spec_without_a_fallback_tier() -> None:
    spec = parse_spec({"model": {"name": "chat", "source": "pvc://models/tiny"}})
    assert spec.fallback is None
    assert spec.degradation.tiers == (
        DegradationTier.NO_STREAMING,
        DegradationTier.CANNED_ANSWERS,
    )


def test_absent_tiers_with_a_fallback_are_every_tier() -> None:
    assert parse_spec(minimal()).degradation.tiers == tuple(DegradationTier)


@pytest.mark.parametrize(
    ("product", "capable"),
    [
        ("NVIDIA-H100-80GB-HBM3", True),
        ("NVIDIA-H200", True),
        ("NVIDIA-GH200-480GB", True),
        ("NVIDIA-H20", True),
        ("NVIDIA-L4", True),
        ("NVIDIA-L40S", True),
        ("NVIDIA-B200", True),
        ("NVIDIA-GB200", True),
        ("NVIDIA-RTX-6000-Ada-Generation", True),
        ("NVIDIA-RTX-4000-Ada-Generation", True),
        ("NVIDIA-RTX-4000-SFF-Ada-Generation", True),
        ("NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition", True),
        ("NVIDIA-GeForce-RTX-4090", True),
        ("NVIDIA-GeForce-RTX-4060-Ti", True),
        ("NVIDIA-GeForce-RTX-5090", True),
        # Turing (sm_75): the RTX digits of the 40/50 series without their generation.
        ("Quadro-RTX-4000", False),
        ("Quadro-RTX-5000", False),
        ("NVIDIA-Quadro-RTX-5000", False),
        ("Quadro-RTX-6000", False),
        ("NVIDIA-A100-SXM4-80GB", False),
        ("NVIDIA-A10G", False),
        ("Tesla-T4", False),
        ("Tesla-V100-SXM2-16GB", False),
        ("NVIDIA-RTX-A6000", False),
    ],
)
def test_fp8_needs_compute_capability_8_9(product: str, capable: bool) -> None:
    assert fp8_capable(product) is capable


def test_fp8_on_a_hopper_gpu_and_int4_on_any_gpu_parse() -> None:
    fp8 = parse_spec(
        minimal(gpu={"product": "NVIDIA-H100-80GB-HBM3"}, fallback={"quantization": "fp8"})
    )
    assert fp8.fallback is not None and fp8.fallback.quantization is Quantization.FP8
    int4 = parse_spec(minimal(fallback={"quantization": "int4"}))
    assert int4.fallback is not None and int4.fallback.quantization is Quantization.INT4


def test_dtype_and_revision_are_kept() -> None:
    spec = parse_spec(
        minimal(model={"name": "c", "source": "pvc://m", "dtype": "bfloat16", "revision": "abc"})
    )
    assert (spec.model.dtype, spec.model.revision) == (Dtype.BFLOAT16, "abc")


@pytest.mark.parametrize(
    ("text", "cores"), [("500m", 0.5), ("2", 2.0), ("1.5", 1.5), ("250m", 0.25)]
)
def test_cpu_quantities(text: str, cores: float) -> None:
    assert parse_cpu_quantity(text) == cores


def test_fallback_is_optional_without_the_fallback_tier_listed() -> None:
    spec = parse_spec(
        {"model": {"name": "c", "source": "pvc://m"}, "degradation": {"tiers": ["no-streaming"]}}
    )
    assert spec.fallback is None
    assert spec.degradation.levels == (1,)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("4Gi", 4 * 1024**3), ("1500M", 1_500_000_000), ("123", 123), ("0.5Gi", 512 * 1024**2)],
)
def test_memory_quantities(text: str, expected: int) -> None:
    assert parse_quantity_bytes(text) == expected


@pytest.mark.parametrize("name", ["chat", "c", "chat-v2", "a1", "c" * 63])
def test_a_dns_1035_label_of_at_most_63_characters_names_a_service(name: str) -> None:
    check_service_name(name)


@pytest.mark.parametrize("name", ["chat.v2", "c" * 64, "1chat", "Chat", "chat-", "chat_v2", ""])
def test_a_name_the_service_or_a_label_cannot_carry_is_refused(name: str) -> None:
    with pytest.raises(SpecError, match="metadata.name .* DNS-1035 label"):
        check_service_name(name)


DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def test_every_child_of_the_longest_name_fits_its_kind() -> None:
    # The longest suffix the operator appends is the ResourceClaimTemplate's "-gpu-<8 hex>".
    name = "c" * 63
    check_service_name(name)
    spec = parse_spec(minimal(gpu={"deviceClassName": "gpu.nvidia.com", "memoryGiB": 16}))
    children = build_children(
        spec, name, "ml", size_memory(spec, []), OperatorSettings.from_env({}), "t"
    )
    assert "ResourceClaimTemplate" in [child["kind"] for child in children]
    for child in children:
        child_name = child["metadata"]["name"]
        assert len(child_name) <= 253 and DNS_SUBDOMAIN.fullmatch(child_name), child_name
        if child["kind"] == "Service":
            assert len(child_name) <= 63
        assert all(len(value) <= 63 for value in child["metadata"]["labels"].values())


def test_the_watched_spec_is_the_applied_one_not_the_edit() -> None:
    applied = minimal(telemetry={"scrapeIntervalSeconds": 7, "wedgeAfterSeconds": 30})
    status = {"appliedSpec": applied_spec_text(applied), "appliedGeneration": 3, "memory": {}}
    watched = watched_spec(minimal(replicas=-1), status, generation=4)
    assert watched is not None
    spec, generation = watched
    assert (spec.telemetry.scrape_interval_seconds, generation) == (7, 3)
    assert json.loads(status["appliedSpec"]) == applied


def test_without_a_record_the_accepted_current_spec_is_watched() -> None:
    # A status an operator without status.appliedSpec wrote: its sizing says it was applied.
    accepted = {"memory": {"limitBytes": 1}, "conditions": []}
    assert watched_spec(minimal(), accepted, 2) == (parse_spec(minimal()), 2)
    refused = {**accepted, "conditions": [{"type": "InvalidSpec", "status": "True"}]}
    assert watched_spec(minimal(), refused, 2) is None
    assert watched_spec(minimal(), {}, 2) is None


def test_a_record_that_does_not_parse_watches_nothing() -> None:
    status = {"appliedSpec": "{not json", "appliedGeneration": 1, "memory": {}}
    assert watched_spec(minimal(), status, 2) is None


def test_a_fetched_source_gets_the_crd_defaults_for_its_fetch_fields() -> None:
    model = parse_spec(minimal(model={"name": "chat", "source": "s3://models/tiny"})).model
    assert model.fetch == ModelFetchSpec(
        endpoint="", region="", secret_name="", cache_claim="", cache_size_bytes=20 * 1024**3
    )


def test_a_fetched_source_takes_its_endpoint_credentials_and_cache() -> None:
    model = parse_spec(
        minimal(
            model={
                "name": "chat",
                "source": "hf://org/name@abc123",
                "revision": "main",
                "endpoint": "http://hub.internal:8090",
                "credentials": {"secretName": "hub-token"},
                "cache": {"claimName": "models-cache"},
            }
        )
    ).model
    assert model.fetch == ModelFetchSpec(
        "http://hub.internal:8090", "", "hub-token", "models-cache", 20 * 1024**3
    )
    assert model.fetch_revision == "abc123"  # the source's @REVISION (model.revision: main)


def test_a_local_source_has_nothing_to_fetch() -> None:
    model = parse_spec(minimal()).model
    assert model.fetch is None and not model.source.fetched
