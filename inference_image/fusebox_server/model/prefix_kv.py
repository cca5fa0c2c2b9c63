"""The prefix cache's values: a prompt's keys and values per layer, cut from a prefill.

Why a module of its own: `prefix_cache.py` decides what is kept and matched
without torch; this one is the torch side of it: what a prefilled row's
cache holds of its prompt, how many bytes that is, and an independent copy
of its first tokens. A value is one tuple of (keys, values) per layer, each
(1, kv heads, tokens, head dim) on the model's device, in the model's dtype.
"""

from __future__ import annotations

import torch

from fusebox_server.model.engine import Decoding
from fusebox_server.model.prefix_cache import PrefixCache

PrefixKV = tuple[tuple[torch.Tensor, torch.Tensor], ...]


def kv_bytes(kv: PrefixKV) -> int:
    return sum(t.numel() * t.element_size() for layer in kv for t in layer)


def cut_kv(kv: PrefixKV, length: int) -> PrefixKV:
    """The first `length` tokens, copied: nothing shares storage with `kv`, so evicting
    `kv` frees it whole."""
    with torch.inference_mode():
        return tuple(
            (keys[:, :, :length].clone(), values[:, :, :length].clone()) for keys, values in kv
        )


def prompt_kv(row: Decoding) -> PrefixKV:
    """The keys and values a prefilled row's cache holds of its prompt (views: the
    cache cuts its copy, `cut_kv`). Only between its prefill and joining a batch."""
    start = row.padding
    end = start + row.position
    return tuple(
        (
            layer.keys[row.cache_row : row.cache_row + 1, :, start:end],
            layer.values[row.cache_row : row.cache_row + 1, :, start:end],
        )
        for layer in row.cache.layers
    )


def new_prefix_cache(capacity_bytes: int) -> PrefixCache[PrefixKV]:
    return PrefixCache(capacity_bytes, kv_bytes, cut_kv)


def leading(kv: PrefixKV, length: int) -> PrefixKV:
    """Views of the first `length` tokens (what a matching prompt starts from)."""
    return tuple((keys[:, :, :length], values[:, :, :length]) for keys, values in kv)
