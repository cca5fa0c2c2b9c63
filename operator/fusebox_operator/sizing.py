"""Host memory limits sized above the GPU memory they must mirror (DESIGN §5).

Why: while a model loads, host memory holds what the GPU will hold; a pod
whose memory limit is below its VRAM makes the kernel's OOM killer take the
GPU process first. So the limit is VRAM x GPUs x headroom + 2 GiB, never
less than an explicit limit, and an explicit limit below VRAM is refused.
Kubernetes has no --memory-swap: requests == limits (Guaranteed QoS) is
what keeps swap away under NodeSwap LimitedSwap.
The server's prefix cache (server.prefixCache.maxBytes) is memory too: on
the CPU it is RSS, so a cache asked beyond the server's default gets room
of its own in the limit (`prefix_cache_limit_bytes`); the default lives in
the limit the rest of the sizing gives, which the server keeps it inside.
Pure: node labels arrive as plain numbers from kube.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fusebox_contract.settings import PREFIX_CACHE_BYTES
from fusebox_operator.gpu_products import product_vram_gib
from fusebox_operator.spec import GIB, InferenceServiceSpec, SpecError

MIB = 1024**2
MAX_LIMIT_BYTES = 1024**5  # a limit beyond a PiB is a typo in a ratio, not a pod
BASE_OVERHEAD_BYTES = 2 * GIB
"""Python, torch, tokenizer and the server itself, beyond the model's weights."""

assert isinstance(PREFIX_CACHE_BYTES.default, int)
PREFIX_CACHE_ROOM_BYTES: int = PREFIX_CACHE_BYTES.default
"""The prefix cache the sizing above holds without adding to it: the server's default (1 GiB).
Not reserved: the server empties its cache when memory comes within 10 points of its
guard (85% of the limit at the default guard), so a default cache fills what the limit
leaves and never costs an OOM. On a 2 GiB CPU pod, beside the tiny model's server
(about 0.8 GiB RSS), that is about 0.9 GiB (docs/decisions/prefix-cache-sizing.md)."""

NODE_VRAM_LABEL = "nvidia.com/gpu.memory"
NODE_PRODUCT_LABEL = "nvidia.com/gpu.product"


class GpuMemoryUnknown(SpecError):
    """No figure for the GPU memory yet: no gpu.memoryGiB, no product in the table,
    and no node labelled with it. Not the spec's fault on a cluster whose GPU
    pool scales from zero, so the operator waits for labelled nodes (Ready
    reason WaitingForGPUNodes) instead of refusing; render, which sees no nodes,
    reports it as the InvalidSpec it inherits from."""


@dataclass(frozen=True)
class MemorySizing:
    limit_bytes: int
    request_bytes: int
    vram_bytes: int  # per GPU; 0 when no GPU is requested
    vram_source: str

    @property
    def qos_class(self) -> str:
        return "Guaranteed" if self.request_bytes == self.limit_bytes else "Burstable"


def recorded_sizing(memory: Mapping[str, Any]) -> MemorySizing | None:
    """The sizing a reconcile wrote in status.memory; None before the first one."""
    try:
        return MemorySizing(
            limit_bytes=int(memory["limitBytes"]),
            request_bytes=int(memory["requestBytes"]),
            vram_bytes=int(memory["vramBytes"]),
            vram_source=str(memory["source"]),
        )
    except (KeyError, TypeError, ValueError):
        return None


def ceil_gib(size_bytes: float) -> int:
    return math.ceil(size_bytes / GIB) * GIB


def vram_per_gpu(spec: InferenceServiceSpec, node_vram_mib: Sequence[int]) -> tuple[int, str]:
    """(bytes, where the figure came from): spec override > node label > product table."""
    if spec.gpu.count == 0:
        return 0, "no GPU requested"
    if spec.gpu.memory_gib is not None:
        return int(spec.gpu.memory_gib * GIB), "spec.gpu.memoryGiB"
    # A label of 0 (or less) is a discovery that failed on that node, not a GPU's memory:
    # sized by it, the limit would sit below the VRAM the server must hold.
    measured = [mib for mib in node_vram_mib if mib > 0]
    if measured:
        # Nodes may differ; size for the largest so any node the pod lands on fits.
        return max(measured) * MIB, f"node label {NODE_VRAM_LABEL}"
    table_gib = product_vram_gib(spec.gpu.product) if spec.gpu.product else None
    if table_gib is not None:
        return table_gib * GIB, f"product table ({spec.gpu.product})"
    raise GpuMemoryUnknown(
        "cannot tell the GPU memory: set spec.gpu.memoryGiB, or spec.gpu.product to a known "
        f"GPU, or label the nodes with {NODE_VRAM_LABEL} (MiB)"
    )


def prefix_cache_limit_bytes(spec: InferenceServiceSpec) -> int:
    """Bytes the memory limit adds for a prefix cache asked beyond the server's default.

    Only on the CPU: with a GPU the cache's keys and values are on the device, in the
    VRAM beside the model, and host memory holds none of it. Each byte beyond
    `PREFIX_CACHE_ROOM_BYTES` adds 1/ratioOfLimit bytes, so a cache grown to its bound
    stays under the share of the limit where the RSS ladder starts acting (a cache that
    fills at speed would otherwise look like a leak and be emptied by it), and further
    under the server's own shedding point.
    """
    if spec.gpu.count > 0:
        return 0
    beyond_bytes = spec.server.prefix_cache_bytes - PREFIX_CACHE_ROOM_BYTES
    if beyond_bytes <= 0:
        return 0
    ratio = spec.breaker.resource.rss.ratio
    added = beyond_bytes / ratio
    if not math.isfinite(added) or added > MAX_LIMIT_BYTES:
        raise SpecError(
            f"server.prefixCache.maxBytes over breaker.resource.rss.ratioOfLimit ({ratio:g}) "
            f"asks a memory limit above {MAX_LIMIT_BYTES // 1024**5} PiB: raise ratioOfLimit "
            "or lower maxBytes"
        )
    return math.ceil(added)


def size_memory(spec: InferenceServiceSpec, node_vram_mib: Sequence[int]) -> MemorySizing:
    """The pod's memory request and limit for the server container (DESIGN §5)."""
    vram_bytes, source = vram_per_gpu(spec, node_vram_mib)
    total_vram_bytes = vram_bytes * spec.gpu.count
    explicit = spec.memory.limit_bytes
    if explicit is not None and explicit < total_vram_bytes:
        raise SpecError(
            f"memory.limit {explicit / GIB:.2f} GiB is below the GPU memory it must hold, "
            f"{total_vram_bytes / GIB:.2f} GiB ({spec.gpu.count} x {vram_bytes / GIB:.2f} GiB "
            f"from {source})"
        )
    sized = total_vram_bytes * spec.memory.headroom_ratio + BASE_OVERHEAD_BYTES
    limit_bytes = ceil_gib(max(explicit or 0, sized) + prefix_cache_limit_bytes(spec))
    if spec.memory.allow_swap:
        # Burstable: the scheduler reserves half; LimitedSwap may swap the rest.
        request_bytes = max(GIB, ceil_gib(limit_bytes / 2))
        request_bytes = min(request_bytes, limit_bytes)
        if request_bytes == limit_bytes:
            request_bytes = limit_bytes - GIB // 2
    else:
        request_bytes = limit_bytes
    return MemorySizing(limit_bytes, request_bytes, vram_bytes, source)
