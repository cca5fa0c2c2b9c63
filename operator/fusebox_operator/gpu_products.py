"""What Fusebox knows of a GPU from its product name: its generation and its VRAM.

Why: GPU Feature Discovery labels each node with `nvidia.com/gpu.product`, and a
spec may name one in `gpu.product`. Two decisions hang on that name alone, before
any pod runs: whether a fallback quantization's kernel runs on it (compute
capability, judged against the contract's `Quantization.min_compute_capability`)
and how much VRAM the memory limit must mirror when no node says. One table each,
here, so spec.py and sizing.py do not each keep a partial one.
Pure: names in, figures out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fusebox_contract.names import Quantization

# GPU Feature Discovery product names (nvidia.com/gpu.product, upper-cased) by
# generation. RE2 syntax (no lookaround) so that the CRD's CEL rules use them as they
# are; a name matches as a whole token between non-alphanumerics.
FP8_GPU_PATTERN = (
    r"(^|[^A-Z0-9])(L4|L40|L40S|L20|H20|H100|H200|H800|GH200|B100|B200|B300|GB200|GB300|"
    r"RTX-[45]0[5-9]0|ADA|BLACKWELL)([^0-9A-Z]|$)"
)
"""Compute capability >= 8.9 (Ada, Hopper, Blackwell): the devices with fp8 tensor
cores. An RTX number alone is no generation: Turing's Quadro RTX 4000/5000 (sm_75)
share the digits, so the workstation cards match by their "Ada"/"Blackwell" marker
and the GeForce ones by their model numbers, RTX 4050-4090 and 5050-5090."""
PRODUCT_LABEL = "nvidia.com/gpu.product"
"""The node label GPU Feature Discovery writes, which gpu.product selects on."""

AMPERE_GPU_PATTERN = (
    r"(^|[^A-Z0-9])(A2|A10|A10G|A10M|A16|A30|A40|A100|A800|RTX-A[0-9]{4}|RTX-30[5-9]0)"
    r"([^0-9A-Z]|$)"
)
"""Compute capability 8.0-8.7 (Ampere): data-centre A-parts, RTX A-series, RTX 30."""
TURING_GPU_PATTERN = (
    r"(^|[^A-Z0-9])(T4|T400|T600|T1000|QUADRO-RTX-[3-8]000|TITAN-RTX|RTX-20[5-8]0|"
    r"GTX-16[5-6]0)([^0-9A-Z]|$)"
)
VOLTA_GPU_PATTERN = r"(^|[^A-Z0-9])(V100|V100S|TITAN-V)([^0-9A-Z]|$)"
PASCAL_GPU_PATTERN = r"(^|[^A-Z0-9])(P100|P40|P6|P4|GTX-10[5-8]0|TITAN-XP)([^0-9A-Z]|$)"


@dataclass(frozen=True)
class GpuGeneration:
    """GPU products of one generation, known by name, and the least compute capability
    among them: what a quantization kernel needs is judged against that."""

    name: str
    compute_capability: tuple[int, int]
    product_pattern: str
    examples: str

    def makes(self, product: str) -> bool:
        return re.search(self.product_pattern, product.upper()) is not None


GPU_GENERATIONS: tuple[GpuGeneration, ...] = (
    GpuGeneration(
        "Ada, Hopper or Blackwell", (8, 9), FP8_GPU_PATTERN, "L4, L40S, H100, H200, B200"
    ),
    GpuGeneration("Ampere", (8, 0), AMPERE_GPU_PATTERN, "A10, A100, RTX-A6000"),
    GpuGeneration("Turing", (7, 5), TURING_GPU_PATTERN, "T4"),
    GpuGeneration("Volta", (7, 0), VOLTA_GPU_PATTERN, "V100"),
    GpuGeneration("Pascal", (6, 0), PASCAL_GPU_PATTERN, "P100"),
)
"""Newest first: the first generation whose pattern matches a product name is its own."""


def gpu_generation(product: str) -> GpuGeneration | None:
    """The generation of a GPU product name as GPU Feature Discovery labels it, if known."""
    return next((g for g in GPU_GENERATIONS if g.makes(product)), None)


def fp8_capable(product: str) -> bool:
    """Whether a GPU product name is Ada, Hopper or Blackwell class (fp8 tensor cores)."""
    generation = gpu_generation(product)
    needed = Quantization.FP8.min_compute_capability
    return generation is not None and needed is not None and generation.compute_capability >= needed


# GPU family -> (default VRAM GiB, sizes a product name may state explicitly).
_PRODUCT_VRAM_GIB: dict[str, tuple[int, tuple[int, ...]]] = {
    "T4": (16, (16,)),
    "V100": (16, (16, 32)),
    "A10": (24, (24,)),
    "L4": (24, (24,)),
    "A100": (40, (40, 80)),
    "H100": (80, (80, 94)),
    "H200": (141, (141,)),
    "B200": (180, (180, 192)),
}
_FAMILY = re.compile(r"(?:^|[^A-Z0-9])(T4|V100|A100|A10|L4|H100|H200|B200)(?![0-9])")
_STATED_GB = re.compile(r"(\d+)\s*GB")


def product_vram_gib(product: str) -> int | None:
    """VRAM of a GPU product name as GPU Feature Discovery labels it, or None."""
    family = _FAMILY.search(product.upper())
    if family is None:
        return None
    default_gib, sizes = _PRODUCT_VRAM_GIB[family.group(1)]
    for stated in _STATED_GB.findall(product.upper()):
        if int(stated) in sizes:
            return int(stated)
    return default_gib
