"""sizing.size_memory: the DESIGN §5 table, its precedence, rounding and QoS."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from fusebox_operator.gpu_products import product_vram_gib
from fusebox_operator.sizing import GpuMemoryUnknown, size_memory
from fusebox_operator.spec import GIB, SpecError, parse_spec

from .conftest import REPO


def spec_with(gpu: dict[str, Any], memory: dict[str, Any] | None = None) -> Any:
    return parse_spec(
        {
            "model": {"name": "chat", "source": "pvc://models/m"},
            "fallback": {},
            "gpu": gpu,
            "memory": memory or {},
        }
    )


def test_node_label_wins_over_product_table() -> None:
    sizing = size_memory(spec_with({"count": 1, "product": "NVIDIA-H100-80GB-HBM3"}), [1024])
    assert sizing.vram_bytes == GIB
    assert sizing.vram_source == "node label nvidia.com/gpu.memory"
    # 1 GiB x 1.25 + 2 GiB = 3.25 GiB, rounded up to 4 GiB
    assert sizing.limit_bytes == 4 * GIB


def test_memory_gib_override_wins_over_label_and_table() -> None:
    sizing = size_memory(
        spec_with({"count": 1, "product": "NVIDIA-H100-80GB-HBM3", "memoryGiB": 16}), [81920]
    )
    assert sizing.vram_source == "spec.gpu.memoryGiB"
    assert sizing.limit_bytes == 22 * GIB  # 16 x 1.25 + 2


def test_product_table_when_no_label() -> None:
    sizing = size_memory(spec_with({"count": 1, "product": "NVIDIA-H100-80GB-HBM3"}), [])
    assert sizing.vram_bytes == 80 * GIB
    assert sizing.limit_bytes == 102 * GIB
    assert sizing.vram_source.startswith("product table")


def test_a_node_label_of_zero_is_no_measurement() -> None:
    """A label of 0 is a failed discovery: sized by it, a GPU pod got a 2 GiB limit."""
    with pytest.raises(GpuMemoryUnknown, match="cannot tell the GPU memory"):
        size_memory(spec_with({"count": 1}), [0])
    sizing = size_memory(spec_with({"count": 1, "product": "NVIDIA-H100-80GB-HBM3"}), [0, -5])
    assert sizing.vram_bytes == 80 * GIB and sizing.vram_source.startswith("product table")


def test_a_ratio_that_would_ask_an_absurd_limit_is_a_spec_error_not_a_crash() -> None:
    spec = parse_spec(
        {
            "model": {"name": "chat", "source": "pvc://models/m"},
            "gpu": {"count": 0},
            "server": {"prefixCache": {"maxBytes": "2Gi"}},
            "breaker": {"resource": {"rss": {"ratioOfLimit": 1e-300}}},
        }
    )
    with pytest.raises(SpecError, match="ratioOfLimit"):
        size_memory(spec, [])


def test_largest_node_label_is_used_when_nodes_differ() -> None:
    sizing = size_memory(spec_with({"count": 1}), [16384, 24576])
    assert sizing.vram_bytes == 24 * GIB


@pytest.mark.parametrize(
    ("product", "gib"),
    [
        ("Tesla-T4", 16),
        ("Tesla-V100-SXM2-32GB", 32),
        ("Tesla-V100-PCIE-16GB", 16),
        ("NVIDIA-A10", 24),
        ("NVIDIA-L4", 24),
        ("NVIDIA-A100-SXM4-80GB", 80),
        ("NVIDIA-A100-PCIE-40GB", 40),
        ("NVIDIA-H200", 141),
        ("NVIDIA-B200", 180),
        ("NVIDIA-GeForce-RTX-4090", None),
    ],
)
def test_product_table(product: str, gib: int | None) -> None:
    assert product_vram_gib(product) == gib


def test_unknown_vram_is_an_invalid_spec() -> None:
    with pytest.raises(SpecError, match="memoryGiB"):
        size_memory(spec_with({"count": 1, "product": "Mystery-GPU"}), [])


def test_rounding_up_to_a_whole_gib() -> None:
    sizing = size_memory(spec_with({"count": 1, "memoryGiB": 10}, {"headroomRatio": 1.01}), [])
    # 10.1 + 2 = 12.1 GiB -> 13 GiB
    assert sizing.limit_bytes == 13 * GIB


def test_explicit_limit_above_sizing_is_kept() -> None:
    sizing = size_memory(spec_with({"count": 1, "memoryGiB": 1}, {"limit": "10Gi"}), [])
    assert sizing.limit_bytes == 10 * GIB


def test_explicit_limit_below_vram_is_rejected_naming_both_numbers() -> None:
    with pytest.raises(SpecError) as raised:
        size_memory(spec_with({"count": 1, "memoryGiB": 48}, {"limit": "32Gi"}), [])
    assert "32.00 GiB" in str(raised.value) and "48.00 GiB" in str(raised.value)


def test_no_swap_means_guaranteed_requests_equal_limits() -> None:
    sizing = size_memory(spec_with({"count": 1, "memoryGiB": 24}, {"allowSwap": False}), [])
    assert sizing.request_bytes == sizing.limit_bytes
    assert sizing.qos_class == "Guaranteed"


def test_swap_allowed_means_lower_request_burstable() -> None:
    sizing = size_memory(spec_with({"count": 1, "memoryGiB": 24}, {"allowSwap": True}), [])
    assert sizing.request_bytes < sizing.limit_bytes
    assert sizing.qos_class == "Burstable"


@pytest.mark.parametrize(("limit", "request_gib"), [("7Gi", 4), ("8Gi", 4), ("3Gi", 2)])
def test_swap_allowed_requests_half_the_limit_rounded_up_to_a_gib_as_described(
    limit: str, request_gib: int
) -> None:
    spec = spec_with({"count": 0}, {"allowSwap": True, "limit": limit})
    assert size_memory(spec, []).request_bytes == request_gib * GIB
    crd = yaml.safe_load((REPO / "crds" / "inferenceservice.yaml").read_text(encoding="utf-8"))
    spec_schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    described = spec_schema["properties"]["memory"]["properties"]["allowSwap"]["description"]
    assert "half the limit, rounded up to a whole GiB, at least 1Gi" in described


def test_cpu_only_pod_gets_the_base_overhead() -> None:
    sizing = size_memory(spec_with({"count": 0}), [])
    assert sizing.limit_bytes == 2 * GIB and sizing.vram_source == "no GPU requested"
