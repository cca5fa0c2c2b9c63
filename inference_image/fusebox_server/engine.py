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

from fusebox_contract.names import Dtype, Quantization
from fusebox_server.openai_schema import Sampling
from fusebox_server.quantization import load_dtype, quantize


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
    quantization: Quantization
    dtype: str
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


def load_model(
    variant: str,
    model_dir: Path,
    quantization: Quantization,
    device: torch.device,
    tokenizer: Any,
    dtype: Dtype = Dtype.AUTO,
) -> LoadedModel:
    """Load a variant in `dtype` (auto: as saved) onto `device`, then quantize it."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    model: Any = AutoModelForCausalLM.from_pretrained(
        str(model_dir), local_files_only=True, dtype=load_dtype(dtype, quantization)
    )
    model.to(device)
    quantize(model, quantization, device)
    model.eval()
    return LoadedModel(
        variant=variant,
        model_dir=model_dir,
        model=model,
        device=device,
        eos_token_ids=_eos_ids(model, tokenizer),
        parameter_bytes=parameter_bytes(model),
        quantization=quantization,
        dtype=str(model.dtype).removeprefix("torch."),
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
    """One request's generation state: its sampler, and its KV cache until it joins a batch.

    The first `step()` runs the prompt (prefill) on the request's own cache;
    after that the request normally joins a `DecodeBatch`, which owns the
    cache and decodes every member with one forward pass per step.
    """

    def __init__(
        self, loaded: LoadedModel, prompt_ids: tuple[int, ...], sampling: Sampling
    ) -> None:
        from transformers import DynamicCache

        self.loaded = loaded
        self.sampling = sampling
        self._pending = torch.tensor([list(prompt_ids)], dtype=torch.long, device=loaded.device)
        self.cache: Any = DynamicCache(config=loaded.model.config)
        self.position = len(prompt_ids)  # the position of the next token fed to the model
        self.last_token = -1
        self.generator: torch.Generator | None = None
        if sampling.temperature > 0.0:
            self.generator = torch.Generator(device=loaded.device)
            seed = sampling.seed if sampling.seed is not None else time.time_ns() % (1 << 62)
            self.generator.manual_seed(seed)

    def step(self) -> int:
        """Run the model once on this request alone; returns the next token id."""
        with torch.inference_mode():
            output = self.loaded.model(input_ids=self._pending, cache=self.cache, use_cache=True)
            token_id = choose_token(output.logits[0, -1], self.sampling, self.generator)
        self._pending = torch.tensor([[token_id]], dtype=torch.long, device=self.loaded.device)
        self.last_token = token_id
        return token_id

    def is_end(self, token_id: int) -> bool:
        return token_id in self.loaded.eos_token_ids


def _left_pad(tensor: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    missing = length - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


class DecodeBatch:
    """Step-level batching: the running requests decode together, one forward per step.

    Rows join after their own prefill and leave when they finish, at any step.
    Their caches are left-padded to a common length; the attention mask hides
    the padding and explicit position ids keep each row's own positions, so a
    row decodes as it would alone. Columns that are padding in every row are
    trimmed when a row leaves, so the batch never grows past its longest row.
    """

    def __init__(self, loaded: LoadedModel) -> None:
        self.loaded = loaded
        self.rows: list[Decoding] = []
        self._cache: Any = None
        self._mask: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, row: Decoding) -> None:
        layers = row.cache.layers
        length = layers[0].keys.shape[-2]
        mask = torch.ones((1, length), dtype=torch.long, device=self.loaded.device)
        rows = [*self.rows, row]
        if self._cache is None or self._mask is None:
            self._cache, self._mask = row.cache, mask
        else:
            # All new tensors first, then swap them in: an allocation that fails half-way
            # must leave the batch as it was, not with some layers one row longer.
            width = max(length, self._mask.shape[1])
            merged = [
                (
                    torch.cat([_left_pad(mine.keys, width, 2), _left_pad(theirs.keys, width, 2)]),
                    torch.cat(
                        [_left_pad(mine.values, width, 2), _left_pad(theirs.values, width, 2)]
                    ),
                )
                for mine, theirs in zip(self._cache.layers, layers, strict=True)
            ]
            merged_mask = torch.cat([_left_pad(self._mask, width, 1), _left_pad(mask, width, 1)])
            for layer, (keys, values) in zip(self._cache.layers, merged, strict=True):
                layer.keys, layer.values = keys, values
            self._mask = merged_mask
        self.rows = rows
        row.cache = None

    def remove(self, row: Decoding) -> None:
        if row not in self.rows:
            return
        keep = [index for index, member in enumerate(self.rows) if member is not row]
        rows = [self.rows[index] for index in keep]
        if not keep or self._mask is None:
            self.rows, self._cache, self._mask = rows, None, None
            return
        # As in add: compute everything, then commit, so a failed allocation changes nothing.
        index = torch.tensor(keep, dtype=torch.long, device=self.loaded.device)
        mask = self._mask.index_select(0, index)
        used = torch.nonzero(mask.any(dim=0))
        start = int(used[0].item()) if used.numel() else 0
        kept = [
            (
                layer.keys.index_select(0, index)[:, :, start:],
                layer.values.index_select(0, index)[:, :, start:],
            )
            for layer in self._cache.layers
        ]
        for layer, (keys, values) in zip(self._cache.layers, kept, strict=True):
            layer.keys, layer.values = keys, values
        self._mask = mask[:, start:]
        self.rows = rows

    def step(self) -> list[int]:
        """One forward pass for every row; returns each row's next token."""
        assert self._mask is not None
        device = self.loaded.device
        inputs = torch.tensor([[row.last_token] for row in self.rows], device=device)
        positions = torch.tensor([[row.position] for row in self.rows], device=device)
        mask = torch.cat([self._mask, self._mask.new_ones((len(self.rows), 1))], dim=1)
        with torch.inference_mode():
            output = self.loaded.model(
                input_ids=inputs,
                attention_mask=mask,
                position_ids=positions,
                cache=self._cache,
                use_cache=True,
            )
            logits = output.logits[:, -1]
            tokens = [
                choose_token(logits[index], row.sampling, row.generator)
                for index, row in enumerate(self.rows)
            ]
        self._mask = mask
        for row, token in zip(self.rows, tokens, strict=True):
            row.last_token = token
            row.position += 1
        return tokens
