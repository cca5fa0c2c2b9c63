"""CPU fast paths: linear weights packed once for oneDNN, and attention for one new token.

Why: on CPU a decode step is a few dozen small matrix products (one row
per running request), and the default kernels are poor at that shape.
Measured on the 2-core bench machine with the `small` model and 16 rows
(docs/decisions/speed.md): `F.linear` reached 26 GFLOP/s, about a
quarter of the core's AVX-512 peak and a seventh of its memory bandwidth,
while the same products with the weight reordered once into oneDNN's
blocked layout took 40% less time; and SDPA's CPU flash kernel spent
0.6 ms per layer on a single query row, where a plain matmul, softmax,
matmul does it in a fraction. Both keep the model's arithmetic (greedy
outputs are unchanged; the products differ from `F.linear` by rounding,
about 1e-6), so every variant still decodes as in-process transformers.

What is left as it was: quantized layers (torchao tensor subclasses have
their own kernels), tied weights (packing would copy the embedding), and
any device other than CPU. `pack_for_cpu` says what it did, for the log.
"""

from __future__ import annotations

import os
from typing import Any, Final

import torch
from torch import nn

from fusebox_server.kernel_caches import KERNEL_CACHE_ENVS

# The row count oneDNN is told to expect; the packed weight serves any row count.
PACK_ROWS_HINT: Final = 16
# oneDNN builds and caches a kernel per row count, larger for more rows
# (kernel_caches.py): a prompt's rows go in calls of at most this many, so
# the row counts a model ever sees are 1..64 and every cached kernel is small.
# Measured: a 350-row product takes the same time in 64-row calls.
MAX_ROWS_PER_CALL: Final = 64
ATTENTION: Final = "fusebox_cpu"


class PackedLinear(nn.Module):
    """An `nn.Linear` whose weight oneDNN reordered once; the original weight is dropped."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach()
        # An opaque oneDNN tensor: not a parameter (it has no storage to save or move).
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_ROWS_HINT)
        self.bias = linear.bias

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        rows = inputs.reshape(-1, self.in_features)
        bias = None if self.bias is None else self.bias.detach()
        parts = [
            torch.ops.mkldnn._linear_pointwise(chunk, self.packed, bias, "none", [], "")
            for chunk in torch.split(rows, MAX_ROWS_PER_CALL)
        ]
        output = parts[0] if len(parts) == 1 else torch.cat(parts)
        return output.view(*inputs.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, oneDNN-packed"


def _packable(linear: nn.Linear, tied: set[int]) -> bool:
    weight = linear.weight
    if type(weight) not in (torch.Tensor, nn.Parameter) or weight.device.type != "cpu":
        return False  # a quantized tensor subclass, or not on the CPU
    if id(weight) in tied:
        return False
    if weight.dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return weight.dtype == torch.float32


def pack_linear_layers(model: nn.Module) -> int:
    """Replace every packable `nn.Linear` by a `PackedLinear`; how many were replaced."""
    input_embeddings = getattr(model, "get_input_embeddings", None)
    embeddings = input_embeddings() if callable(input_embeddings) else None
    tied = {id(embeddings.weight)} if isinstance(embeddings, nn.Embedding) else set()
    packed = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and _packable(child, tied):
                setattr(parent, name, PackedLinear(child))
                packed += 1
    return packed


def single_query_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: a decode step's one query row by plain matmuls.

    query (batch, heads, 1, dim), key/value (batch, kv_heads, length, dim), and
    the boolean mask (batch, 1, 1, length) that `sdpa_mask` builds, True where a
    position is attended. Grouped-query heads share their key/value head by a
    reshape, never a copy. Any other shape (a prompt) goes to SDPA unchanged.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if query.shape[2] != 1 or dropout != 0.0 or kwargs.get("softcap") is not None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    batch, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    grouped = query.reshape(batch, kv_heads, heads // kv_heads, dim)
    scores = torch.matmul(grouped, key.transpose(-1, -2))
    scores.mul_(dim**-0.5 if scaling is None else scaling)
    if attention_mask is not None:
        mask = attention_mask[:, :, -1:, : key.shape[-2]]
        if mask.dtype == torch.bool:
            scores.masked_fill_(~mask, float("-inf"))
        else:
            scores.add_(mask)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    output = torch.matmul(weights, value)  # (batch, kv_heads, group, dim)
    return output.reshape(batch, 1, heads, dim), None


def use_single_query_attention(model: Any) -> bool:
    """Route the model's attention through `single_query_attention`; False if it uses another."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False  # a model that asked for another kernel keeps it
    AttentionInterface.register(ATTENTION, single_query_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    model.set_attn_implementation(ATTENTION)
    return True


def pack_for_cpu(model: Any, device: torch.device) -> dict[str, Any]:
    """Switch a loaded model on the CPU to the fast paths above; what was done, for the log."""
    mkldnn = torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
    if device.type != "cpu" or not mkldnn:
        return {"packed_linear_layers": 0, "single_query_attention": False}
    return {
        "packed_linear_layers": pack_linear_layers(model),
        "single_query_attention": use_single_query_attention(model),
        # The bounds torch loaded with (kernel_caches.py); None: oneDNN's default, 1,024.
        "kernel_cache_entries": {name: os.environ.get(name) for name in KERNEL_CACHE_ENVS},
    }
