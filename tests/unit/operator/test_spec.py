"""spec.parse_spec: defaults equal the CRD's, bad specs give one actionable message."""

from __future__ import annotations

from typing import Any

import pytest

from fusebox_operator.spec import ModelSource, SpecError, parse_quantity_bytes, parse_spec

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
    ],
)
def test_model_sources_parse(source: str, expected: ModelSource) -> None:
    assert ModelSource.parse(source) == expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (minimal(model={"name": "chat", "source": "s3://bucket/x"}), "must start with pvc://"),
        (
            minimal(model={"name": "chat", "source": "hf://org/repo"}),
            "hf:// sources are not served",
        ),
        (minimal(model={"name": "chat", "source": "pvc://Bad_Claim/x"}), "claim name"),
        ({"model": {"name": "chat", "source": "pvc://m/x"}}, "spec.fallback is required"),
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
        (
            minimal(telemetry={"scrapeIntervalSeconds": 10, "wedgeAfterSeconds": 5}),
            "wedgeAfterSeconds",
        ),
        (minimal(degradation={"tiers": ["turbo"]}), "degradation tier 'turbo'"),
        (minimal(replicas="two"), "spec.replicas must be an integer"),
    ],
)
def test_invalid_specs_are_rejected_with_a_clear_message(
    spec: dict[str, Any], message: str
) -> None:
    with pytest.raises(SpecError, match=None) as raised:
        parse_spec(spec)
    assert message in str(raised.value)


def test_fallback_is_optional_without_the_fallback_tier() -> None:
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
