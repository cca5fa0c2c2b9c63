"""What bench/gpu_realistic.py runs: the model's shape, the run's presets, and the memory sums.

Why a module of its own: the device script (torch, servers, child processes)
and its tests both need Llama-3.1-8B's configuration, the dry run's narrow
copy of it, and what the device's memory could hold of such a model's KV
cache; none of that needs torch, so it lives here, importable and testable
anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Llama-3.1-8B's architecture (its published config.json); the zoo's llama3 family keeps
# every field but the width and depth, which this restores.
LLAMA31_8B_SIZES = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
}


# The dry run's narrow model: the same fields, GQA 4:1, 2 layers of 128.
DRY_RUN_SIZES = {
    "hidden_size": 128,
    "intermediate_size": 448,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 32,
}


@dataclass(frozen=True)
class RealisticConfig:
    """Everything a run is parameterised by; `for_gpu` and `for_dry_run` are the presets."""

    device: str
    dtype: str
    sizes: dict[str, int]
    vocab_size: int
    scale: int  # the workload's lengths are the full shape's divided by this
    clients: tuple[int, ...]
    requests_per_client: float
    warmup_requests: int
    open_rates: tuple[float, ...]
    open_requests: int
    admission_levels: tuple[int, ...]
    admission_new_tokens: int
    c1_requests: int
    static_batch_rows: int
    compile_generate: bool
    threads: int  # intra-op CPU threads per process (0: torch's default)
    start_timeout_seconds: float
    min_peer_seconds: float  # a peer setting gets at least this (or what is left), in order
    request_timeout_seconds: float
    peer_variants: dict[str, str]
    peer_common_flags: str = ""
    skipped: dict[str, str] = field(default_factory=dict)


def for_gpu() -> RealisticConfig:
    return RealisticConfig(
        device="cuda",
        dtype="bfloat16",
        sizes=dict(LLAMA31_8B_SIZES),
        vocab_size=128256,
        scale=1,
        clients=(64, 32, 128),
        requests_per_client=2.0,
        warmup_requests=16,
        open_rates=(2.0, 4.0, 8.0),
        open_requests=40,
        admission_levels=(64, 128, 256, 384, 512, 768, 1024),
        admission_new_tokens=32,
        c1_requests=4,
        static_batch_rows=64,
        compile_generate=True,
        threads=0,
        start_timeout_seconds=240.0,
        min_peer_seconds=75.0,
        request_timeout_seconds=180.0,
        # Alone on the card each peer sizes its paged cache from free memory (0.9 by
        # default); the sweep varies what 5.24 offers: CUDA graphs, compile, tokens per
        # batch. flash_attention_2 needs a package the device lacks, so `sdpa` it is.
        peer_variants={
            "graphs": "--cb-use-cuda-graph",
            "graphs_bt8k": "--cb-use-cuda-graph --cb-max-batch-tokens 8192",
            "default": "",
            "graphs_compile": "--cb-use-cuda-graph --compile",
        },
        peer_common_flags="--attn-implementation sdpa",
    )


def for_dry_run() -> RealisticConfig:
    return RealisticConfig(
        device="cpu",
        dtype="float32",
        sizes=dict(DRY_RUN_SIZES),
        vocab_size=128256,
        scale=8,
        clients=(4, 2),
        requests_per_client=1.0,
        warmup_requests=2,
        open_rates=(1.0, 2.0, 4.0),
        open_requests=4,
        admission_levels=(2, 4, 8),
        admission_new_tokens=4,
        c1_requests=2,
        static_batch_rows=4,
        compile_generate=False,
        threads=1,
        start_timeout_seconds=180.0,
        min_peer_seconds=20.0,
        request_timeout_seconds=120.0,
        peer_variants={"default": "", "blocks16": "--cb-num-blocks 16"},
        skipped={
            "generate_compile": "dry run on 2 shared cores: compiling takes longer than the "
            "phase; the static cache runs uncompiled",
            "peer_cuda_graphs": "dry run on the CPU: --cb-use-cuda-graph needs CUDA",
        },
    )


def llama_config(sizes: dict[str, int], vocab_size: int = 128256) -> dict[str, Any]:
    """Llama-3.1-8B's config fields with `sizes` (width, depth, heads) and `vocab_size`."""
    from fusebox_server.zoo.families import FAMILIES

    config = dict(FAMILIES["llama3"].config)
    config.update(sizes)
    config["vocab_size"] = vocab_size
    if vocab_size < 128256:
        raise ValueError("the llama3 tokenizer's special ids need the 128,256-token vocabulary")
    return config


def parameter_count(config: dict[str, Any]) -> int:
    """Parameters of a Llama of `config` (untied embeddings, no biases)."""
    hidden, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
    heads, kv_heads = int(config["num_attention_heads"]), int(config["num_key_value_heads"])
    head_dim = int(config["head_dim"])
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    mlp = 3 * hidden * int(config["intermediate_size"])
    per_layer = attention + mlp + 2 * hidden
    return layers * per_layer + 2 * int(config["vocab_size"]) * hidden + hidden


def kv_bytes_per_token(config: dict[str, Any], dtype_bytes: int) -> int:
    """Keys and values of one token over every layer: the KV cache's cost of a token."""
    layers, kv_heads = int(config["num_hidden_layers"]), int(config["num_key_value_heads"])
    return 2 * layers * kv_heads * int(config["head_dim"]) * dtype_bytes


def physical_request_limit(
    device_bytes: int, weight_bytes: int, per_token_bytes: int, tokens_per_request: int
) -> int:
    """How many requests of `tokens_per_request` the device's memory could hold beside the
    weights, with nothing else on it: the bound no server can pass."""
    free = max(0, device_bytes - weight_bytes)
    return free // max(1, per_token_bytes * tokens_per_request)


def build_estimate(model: dict[str, Any]) -> dict[str, Any]:
    """The 8 B model's save time at the write rate this build measured (saving is bound by
    the disk; initialising on the device is not, so it is not scaled)."""
    parameters = parameter_count(llama_config(LLAMA31_8B_SIZES))
    rate = model["weight_bytes"] / max(1e-9, model["save_seconds"])
    return {
        "parameters_8b": parameters,
        "save_bytes_per_second": rate,
        "estimated_8b_save_seconds": 2 * parameters / rate,
    }


def admission_limit(model: dict[str, Any], prompt_tokens: int, new_tokens: int) -> dict[str, Any]:
    """What the device's memory could hold of such requests beside the weights."""
    per_token = kv_bytes_per_token(model["config"], 2 if model["dtype"] != "float32" else 4)
    tokens = prompt_tokens + new_tokens
    return {
        "kv_bytes_per_token": per_token,
        "tokens_per_request": tokens,
        "device_memory_bytes": model["device_memory_bytes"],
        "weight_bytes": model["weight_bytes"],
        "physical_limit_requests": physical_request_limit(
            model["device_memory_bytes"], model["weight_bytes"], per_token, tokens
        ),
    }
