"""The model side: loading variants, quantizing, and one decoding step at a time.

Why: this is the only module besides `worker.py` that touches torch, and it
knows nothing of HTTP. Decoding is exposed step by step (`Decoding.step`) so
the worker can check cancellation and deadlines between tokens, interleave
running requests, and stream each token as soon as it exists.

The `leak` fault's blocks hang off the loaded model (`LoadedModel.leaked`),
so the operator's ladder can recover from it: `gc`/`empty_cache` cannot free
them (they are referenced), `unload` and `swap` drop them with the model.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fusebox_server.openai_schema import Sampling


def pick_device(requested: str) -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


def tensor_storage_bytes(tensor: torch.Tensor) -> int:
    """Bytes a tensor really holds; tensor subclasses (torchao) are walked to their parts."""
    flatten = getattr(tensor, "__tensor_flatten__", None)
    if flatten is not None and type(tensor) not in (torch.Tensor, torch.nn.Parameter):
        names, _ = flatten()
        return sum(tensor_storage_bytes(getattr(tensor, name)) for name in names)
    return int(tensor.numel() * tensor.element_size())


def parameter_bytes(model: torch.nn.Module) -> int:
    return sum(tensor_storage_bytes(p) for p in model.parameters()) + sum(
        tensor_storage_bytes(b) for b in model.buffers()
    )


@dataclass
class LoadedModel:
    variant: str
    model_dir: Path
    model: Any
    device: torch.device
    eos_token_ids: frozenset[int]
    parameter_bytes: int
    quantization: str
    leaked: list[torch.Tensor] = field(default_factory=list)


def _eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    configured = getattr(model.generation_config, "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif isinstance(configured, list):
        ids.update(int(i) for i in configured)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)


def quantize_int8(model: Any, device: torch.device) -> None:
    """Int8 weight-only on the linear layers (torchao; CPU and CUDA alike)."""
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    quantize_(model, Int8WeightOnlyConfig(), device=device)


def load_model(
    variant: str, model_dir: Path, quantization: str, device: torch.device, tokenizer: Any
) -> LoadedModel:
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # a progress bar is not a JSON log line
    model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True)
    model.to(device)
    model.eval()
    if quantization == "int8":
        quantize_int8(model, device)
    return LoadedModel(
        variant=variant,
        model_dir=model_dir,
        model=model,
        device=device,
        eos_token_ids=_eos_ids(model, tokenizer),
        parameter_bytes=parameter_bytes(model),
        quantization=quantization,
    )


def release_memory(device: torch.device) -> None:
    """What `gc` plus `empty_cache` do; safe on CPU."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def leak_block(loaded: LoadedModel, mib: int) -> None:
    """The `leak` fault: hold `mib` MiB, touched, on the model's device."""
    if mib <= 0:
        return
    loaded.leaked.append(
        torch.ones(mib * (1 << 20) // 4, dtype=torch.float32, device=loaded.device)
    )


def choose_token(
    logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None
) -> int:
    if sampling.temperature == 0.0:
        return int(torch.argmax(logits).item())
    scaled = logits.float() / sampling.temperature
    probs = torch.softmax(scaled, dim=-1)
    if sampling.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < sampling.top_p
        sorted_probs = torch.where(keep, sorted_probs, torch.zeros_like(sorted_probs))
        choice = torch.multinomial(sorted_probs, 1, generator=generator)
        return int(order[choice].item())
    return int(torch.multinomial(probs, 1, generator=generator).item())


class Decoding:
    """One request's generation state: its KV cache and sampler; one token per step."""

    def __init__(
        self, loaded: LoadedModel, prompt_ids: tuple[int, ...], sampling: Sampling
    ) -> None:
        from transformers import DynamicCache

        self.loaded = loaded
        self.sampling = sampling
        self._pending = torch.tensor([list(prompt_ids)], dtype=torch.long, device=loaded.device)
        self._cache = DynamicCache(config=loaded.model.config)
        self._generator: torch.Generator | None = None
        if sampling.temperature > 0.0:
            self._generator = torch.Generator(device=loaded.device)
            seed = sampling.seed if sampling.seed is not None else time.time_ns() % (1 << 62)
            self._generator.manual_seed(seed)

    def step(self) -> int:
        """Run the model once; returns the next token id."""
        with torch.inference_mode():
            output = self.loaded.model(input_ids=self._pending, cache=self._cache, use_cache=True)
            token_id = choose_token(output.logits[0, -1], self.sampling, self._generator)
        self._pending = torch.tensor([[token_id]], dtype=torch.long, device=self.loaded.device)
        return token_id

    def is_end(self, token_id: int) -> bool:
        return token_id in self.loaded.eos_token_ids
