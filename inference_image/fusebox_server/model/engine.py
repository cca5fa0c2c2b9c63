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
import inspect
import math
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from fusebox_contract.names import Dtype, Quantization
from fusebox_server.model.cpu_kernels import pack_for_cpu
from fusebox_server.model.decode_settings import DecodeSettings
from fusebox_server.model.quantization import load_dtype, quantize
from fusebox_server.model.structured_output import ConstrainedRow, TokenVocabulary, vocabulary_of
from fusebox_server.model.token_choice import (
    RowAdjustments,
    TokenScore,
    adjusts_logits,
    score_token,
)


def pick_device(requested: str) -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


def configure_attention(device: torch.device) -> None:
    """On CUDA, keep torch's cuDNN attention backend out of scaled_dot_product_attention.

    cuDNN builds an execution plan per new shape (rows x cached length), and a
    server sees new shapes nearly every step: on the H200 a 32-row decode step
    of the 1 B bench model took 46 ms with cuDNN on shapes not seen before and
    15.6 ms without it (`bench/results/gpu/profile.md`). The other backends
    (flash, memory-efficient) take the same time on any shape.
    """
    if device.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)


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
    # Extra forward arguments for a prompt: only the last position's logits, where the model
    # takes `logits_to_keep` (the others would cost a vocabulary-wide projection per token).
    prompt_arguments: dict[str, Any] = field(default_factory=dict)
    # What `cpu_kernels.pack_for_cpu` switched on (logged with the load).
    kernels: dict[str, Any] = field(default_factory=dict)
    # Linear layers the quantization left in the model's dtype (`quantization.quantize`).
    unquantized_layers: tuple[str, ...] = ()
    # The tokenizer it was loaded with: a job encoded with another is refused
    # (`tokenization.encodes_alike`); None when unknown (refused the same way).
    tokenizer: Any = None

    @property
    def footprint_bytes(self) -> int:
        """What the load holds: its weights, and the plain copies some packed layers keep
        for one-row products (`cpu_kernels.SingleRowChoice`)."""
        return self.parameter_bytes + int(self.kernels.get("single_row_plain_bytes", 0))


class UnsoundVariant(RuntimeError):
    """A loaded variant computes non-finite logits: serving it would sample from NaN.

    On CUDA that is a device-side assert, which poisons the whole process, so a
    variant is checked once at load and refused rather than served.
    """


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
    configure_attention(device)
    model: Any = AutoModelForCausalLM.from_pretrained(
        str(model_dir), local_files_only=True, dtype=load_dtype(dtype, quantization)
    )
    model.to(device)
    unquantized = quantize(model, quantization, device)
    model.eval()
    weights = parameter_bytes(model)  # before packing: packed weights are opaque, same size
    kernels = pack_for_cpu(model, device)
    # Structured output's token table and llguidance's tokenizer, once per tokenizer: up to
    # a second on a 128k vocabulary, which the first constrained request would otherwise
    # pay inside the worker, stalling every row of the batch.
    vocabulary_of(tokenizer)
    return LoadedModel(
        variant=variant,
        model_dir=model_dir,
        model=model,
        device=device,
        eos_token_ids=_eos_ids(model, tokenizer),
        parameter_bytes=weights,
        quantization=quantization,
        dtype=str(model.dtype).removeprefix("torch."),
        prompt_arguments=_last_logits_only(model),
        kernels=kernels,
        unquantized_layers=unquantized,
        tokenizer=tokenizer,
    )


def check_logits_finite(loaded: LoadedModel, prompt_ids: Sequence[int]) -> None:
    """Raise UnsoundVariant unless one forward pass over `prompt_ids` gives finite logits."""
    with torch.inference_mode():
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=loaded.device)
        logits = loaded.model(input_ids=ids).logits
        finite = bool(torch.isfinite(logits).all())
    if not finite:
        raise UnsoundVariant(
            f"the {loaded.variant} variant ({loaded.quantization.value} of {loaded.dtype}) "
            "computes non-finite logits, so it is not served"
        )


def _last_logits_only(model: Any) -> dict[str, Any]:
    if "logits_to_keep" in inspect.signature(model.forward).parameters:
        return {"logits_to_keep": 1}
    return {}


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


# Below this temperature sampling is greedy. logits / temperature overflows float32 long
# before the temperature reaches 0 (1e-39 makes every logit inf, and softmax NaN); at
# this floor the logits of a real model stay far from it. vLLM's _SAMPLING_EPS is the same.
GREEDY_BELOW_TEMPERATURE = 1e-5


def is_greedy(settings: DecodeSettings) -> bool:
    return settings.temperature < GREEDY_BELOW_TEMPERATURE


def choose_token(
    logits: torch.Tensor, settings: DecodeSettings, generator: torch.Generator | None
) -> int:
    if is_greedy(settings):
        return int(torch.argmax(logits).item())
    probs = torch.softmax(logits.float() / settings.temperature, dim=-1)
    if settings.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < settings.top_p
        # The most likely token always stays: a top_p too small for float32 (1e-46 rounds
        # to 0) would otherwise keep nothing, and sampling from nothing raises.
        keep[0] = True
        sorted_probs = torch.where(keep, sorted_probs, torch.zeros_like(sorted_probs))
        choice = torch.multinomial(sorted_probs, 1, generator=generator)
        return int(order[choice].item())
    return int(torch.multinomial(probs, 1, generator=generator).item())


def draw_tokens(
    logits: torch.Tensor, count: int, settings: DecodeSettings, generator: torch.Generator | None
) -> list[int]:
    """`count` tokens drawn in turn under the settings' temperature and top_p, repeats
    dropped (`structured_output.Sampler`): the first of them that fits a row's format is
    a draw from the model's distribution over the tokens that fit.

    One softmax, one cumulative sum and a search for all the draws: on 128k tokens a
    `torch.multinomial` took 7 ms on one CPU thread, the search a quarter of one.
    """
    if not bool(logits.max() > -math.inf):  # everything masked: softmax would be NaN
        return []
    probs = torch.softmax(logits.float() / settings.temperature, dim=-1)
    if settings.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        dropped = torch.cumsum(sorted_probs, dim=-1) - sorted_probs >= settings.top_p
        dropped[0] = False  # the most likely token always stays, as in `choose_token`
        probs = probs.index_fill(0, order[dropped], 0.0)
    cumulative = torch.cumsum(probs, dim=-1)
    points = torch.rand(count, generator=generator, device=probs.device) * cumulative[-1]
    drawn = torch.searchsorted(cumulative, points, right=True).clamp_(max=probs.shape[-1] - 1)
    return list(dict.fromkeys(int(token) for token in drawn.tolist()))


def takes_shared_argmax(settings: DecodeSettings) -> bool:
    """Greedy, with nothing to adjust, score or constrain: the batch's one argmax is this
    row's token."""
    scored = settings.top_alternatives is not None
    constrained = settings.output_format is not None
    return is_greedy(settings) and not adjusts_logits(settings) and not scored and not constrained


def choose_row_token(logits: torch.Tensor, row: Decoding) -> int:
    """One row's token from its own logits: penalties and bias applied, then greedy or
    sampled (among the tokens its output format allows, when it has one); the row's score
    is kept (`Decoding.last_score`) when it asked for scores, of the raw logits."""
    settings = row.settings
    adjusted = row.adjustments.apply(logits) if adjusts_logits(settings) else logits
    if row.constraint is not None:
        sampler = None
        if not is_greedy(settings):
            sampler = partial(draw_tokens, settings=settings, generator=row.generator)
        token = row.constraint.choose(adjusted, sampler)
        row.constraint.took(token)
    elif is_greedy(settings):
        token = int(torch.argmax(adjusted).item())
    else:
        token = choose_token(adjusted, settings, row.generator)
    if settings.top_alternatives is not None:
        row.last_score = score_token(logits, token, settings.top_alternatives)
    row.adjustments.took(token, logits.shape[-1], logits.device)
    return token


def choose_tokens(
    logits: torch.Tensor, rows: Sequence[Decoding], greedy: list[int] | None = None
) -> list[int | Exception]:
    """The next token of every row from a batch's last-position logits, or that row's error.

    Rows that take the shared argmax share one argmax and one transfer for the
    whole batch (one `.item()` per row was a measurable share of a CPU decode
    step); `greedy` is that argmax when the caller has it already (a CUDA
    graph computes it). Other rows (sampled, penalised, biased or scored)
    choose from their own logits (`choose_row_token`). A row whose choice
    fails gets its error in its place, so it fails alone and the batch's
    other rows go on.
    """
    if greedy is None:
        greedy = logits.argmax(dim=-1).tolist()
    tokens: list[int | Exception] = []
    for index, row in enumerate(rows):
        if takes_shared_argmax(row.settings):
            tokens.append(greedy[index])
            continue
        try:
            tokens.append(choose_row_token(logits[index], row))
        except Exception as error:
            tokens.append(error)
    return tokens


def full_cache() -> Any:
    """A cache that keeps every layer's keys and values for every position.

    Why not `DynamicCache(config=...)`: for a model with sliding-window layers
    (Mistral, Gemma 2) that one keeps only the last window of a sliding
    layer, so a prefilled row's layers differ in length and no longer line up
    with its positions; a batch that takes the row over (`DecodeBatch.add`,
    `SlotBatch.add`) copied misaligned keys, or failed on the shapes. Kept
    whole, the window is applied by the attention mask instead, as the
    batches do, at the cost of a sliding layer's memory past its window.
    """
    from transformers import DynamicCache

    return DynamicCache()


class Decoding:
    """One request's generation state: its sampler, and its KV cache until it joins a batch.

    The first `step()` runs the prompt (prefill) on the request's own cache;
    after that the request normally joins a `DecodeBatch`, which owns the
    cache and decodes every member with one forward pass per step.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        prompt_ids: tuple[int, ...],
        settings: DecodeSettings,
        vocabulary: TokenVocabulary | None = None,
    ) -> None:
        """`vocabulary`: the tokenizer's tokens as bytes, needed when the settings have an
        output format (`structured_output.vocabulary_of`)."""
        self.loaded = loaded
        self.settings = settings
        self._pending = torch.tensor([list(prompt_ids)], dtype=torch.long, device=loaded.device)
        self.cache: Any = full_cache()
        # A row prefilled in a group shares the group's cache: its row there, and its left
        # padding columns (the group's prompts are left-padded to the longest).
        self.cache_row = 0
        self.padding = 0
        self.position = len(prompt_ids)  # the position of the next token fed to the model
        self.last_token = -1
        self.adjustments = RowAdjustments(settings)
        self.constraint: ConstrainedRow | None = None
        if settings.output_format is not None:
            if vocabulary is None:
                raise ValueError("an output format needs the tokenizer's vocabulary")
            self.constraint = ConstrainedRow(
                settings.output_format,
                vocabulary,
                loaded.eos_token_ids,
                settings.max_new_tokens,
            )
        # The score of the token chosen last, when the settings ask for scores.
        self.last_score: TokenScore | None = None
        self.generator: torch.Generator | None = None
        if not is_greedy(settings):
            self.generator = torch.Generator(device=loaded.device)
            # Unseeded rows draw their seed from the OS: the n choices of one request start
            # within a clock tick of each other, and must not share a seed.
            seed = settings.seed if settings.seed is not None else secrets.randbits(62)
            self.generator.manual_seed(seed)

    def step(self) -> int:
        """Run the model once on this request alone; returns the next token id."""
        with torch.inference_mode():
            output = self.loaded.model(
                input_ids=self._pending,
                cache=self.cache,
                use_cache=True,
                **self.loaded.prompt_arguments,
            )
            token_id = choose_row_token(output.logits[0, -1], self)
        self.started(token_id)
        return token_id

    def start_from_prefix(self, layers: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Begin with the keys and values of the prompt's first tokens, computed before
        (the prefix cache): the prefill then runs only the rest. Only before the first step;
        `layers` are read, never written (the cache concatenates onto a copy)."""
        length = layers[0][0].shape[-2]
        if not 0 < length < self._pending.shape[-1]:
            raise ValueError(f"a prefix of {length} tokens leaves no prompt token to run")
        cache = full_cache()
        for index, (keys, values) in enumerate(layers):
            cache.update(keys, values, index)
        self.cache = cache
        self._pending = self._pending[:, length:]

    def prefill_chunk(self, tokens: int) -> None:
        """Run the next `tokens` prompt tokens into this row's own cache, choosing nothing:
        chunked prefill, a long prompt a piece at a time so that the batch's running rows
        decode between the pieces. The cache continues at its length, as after
        `start_from_prefix`; the last piece runs through `step`, which chooses the first
        token. Only before the first step, and at least one prompt token must be left."""
        if not 0 < tokens < self._pending.shape[-1]:
            raise ValueError(
                f"a chunk of {tokens} tokens must leave some of the "
                f"{self._pending.shape[-1]} pending prompt tokens to run"
            )
        with torch.inference_mode():
            self.loaded.model(
                input_ids=self._pending[:, :tokens],
                cache=self.cache,
                use_cache=True,
                **self.loaded.prompt_arguments,
            )
        self._pending = self._pending[:, tokens:]

    def pending_prompt(self) -> torch.Tensor:
        """The prompt ids not yet run (1-D); only before the first step."""
        return self._pending[0]

    def started(self, token_id: int) -> None:
        """Record a token the model produced for this row outside `DecodeBatch`."""
        self._pending = torch.tensor([[token_id]], dtype=torch.long, device=self.loaded.device)
        self.last_token = token_id

    def is_end(self, token_id: int) -> bool:
        return token_id in self.loaded.eos_token_ids

    @property
    def document_finished(self) -> bool:
        """The row's output format is met and nothing may follow: the row ends."""
        return self.constraint is not None and self.constraint.finished

    @property
    def document_incomplete(self) -> bool:
        """The row has an output format its text does not yet meet."""
        return self.constraint is not None and not self.constraint.complete


def prefill(loaded: LoadedModel, rows: Sequence[Decoding]) -> list[int | Exception]:
    """Run the prompts of several new rows in one forward pass; returns each row's first token
    (or the error that row's sampling raised, as `choose_tokens` does).

    The prompts are left-padded to the longest; the attention mask hides the
    padding and explicit position ids keep each row's own positions, as in
    `DecodeBatch`. Every row then refers to the group's cache (its row there,
    `cache_row`, with `padding` columns of padding), ready for a batch's `add`,
    which copies the group once. A single row runs as `Decoding.step` does.
    """
    if len(rows) == 1:
        return [rows[0].step()]
    device = loaded.device
    prompts = [row.pending_prompt() for row in rows]
    width = max(len(prompt) for prompt in prompts)
    ids = torch.zeros((len(rows), width), dtype=torch.long, device=device)
    mask = torch.zeros((len(rows), width), dtype=torch.long, device=device)
    positions = torch.zeros((len(rows), width), dtype=torch.long, device=device)
    for index, prompt in enumerate(prompts):
        start = width - len(prompt)
        ids[index, start:] = prompt
        mask[index, start:] = 1
        positions[index, start:] = torch.arange(len(prompt), device=device)
    joint: Any = full_cache()
    with torch.inference_mode():
        output = loaded.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            cache=joint,
            use_cache=True,
            **loaded.prompt_arguments,
        )
        tokens = choose_tokens(output.logits[:, -1], rows)
    for index, (row, prompt) in enumerate(zip(rows, prompts, strict=True)):
        row.cache, row.cache_row, row.padding = joint, index, width - len(prompt)
    for row, token in zip(rows, tokens, strict=True):
        if not isinstance(token, Exception):
            row.started(token)
    return tokens


def prefill_groups(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Indexes of prompts to prefill together, shortest first.

    A group's padded size (rows x its longest prompt) stays within
    `token_budget`, so one long prompt does not make every short one pay for
    its padding, and a forward pass stays bounded; a prompt longer than the
    budget runs alone.
    """
    groups: list[list[int]] = []
    for index in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        group = groups[-1] if groups else None
        if group is not None and (len(group) + 1) * lengths[index] <= token_budget:
            group.append(index)
        else:
            groups.append([index])
    return groups


@dataclass
class PrefilledGroup:
    """Rows joining a batch that were prefilled together, with their part of the group's cache.

    `layers` holds each layer's keys and values, (rows, heads, width, dim), in
    the order of `rows`; row i's prompt is in its last `width - paddings[i]`
    columns.
    """

    rows: list[Decoding]
    layers: list[tuple[torch.Tensor, torch.Tensor]]
    paddings: list[int]


def prefilled_groups(joiners: Sequence[Decoding]) -> list[PrefilledGroup]:
    """The joiners by the prefill cache they share: one copy per group, not one per row.

    A group's rows normally all join at once, in their cache's order, and the
    cache is taken as it is; rows missing or reordered are selected.
    """
    by_cache: dict[int, list[Decoding]] = {}
    for row in joiners:
        by_cache.setdefault(id(row.cache), []).append(row)
    groups = []
    for rows in by_cache.values():
        layers = rows[0].cache.layers
        order = [row.cache_row for row in rows]
        if order == list(range(layers[0].keys.shape[0])):
            parts = [(layer.keys, layer.values) for layer in layers]
        else:
            index = torch.tensor(order, dtype=torch.long, device=layers[0].keys.device)
            parts = [
                (layer.keys.index_select(0, index), layer.values.index_select(0, index))
                for layer in layers
            ]
        groups.append(PrefilledGroup(rows, parts, [row.padding for row in rows]))
    return groups


def handed_over(groups: Sequence[PrefilledGroup]) -> list[Decoding]:
    """The groups' rows, in order, let go of their prefill cache: a batch now holds a copy."""
    rows = [row for group in groups for row in group.rows]
    for row in rows:
        row.cache = None
    return rows


# Spare columns a batch's cache keeps past its longest row: decoding that many
# tokens writes in place before the buffers have to grow (and be copied) again.
SPARE_COLUMNS = 64


class _BufferedLayer:
    """One layer of a batch's cache: keys and values in buffers with spare columns.

    `DynamicCache`'s own layers concatenate every new token onto the whole
    cache, a copy of all of it per layer per step; here a step writes its
    column in place. `keys`/`values` are views of the used columns, which is
    what the attention reads. Duck-types the parts of a transformers cache
    layer that a decoder forward pass uses.
    """

    is_sliding = False
    is_compileable = False
    is_initialized = True

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
        self._key_buffer, self._value_buffer, self._length = keys, values, length
        self.device, self.dtype = keys.device, keys.dtype

    @property
    def keys(self) -> torch.Tensor:
        return self._key_buffer[:, :, : self._length]

    @property
    def values(self) -> torch.Tensor:
        return self._value_buffer[:, :, : self._length]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        end = self._length + key_states.shape[-2]
        if end > self._key_buffer.shape[-2]:
            spare = end + SPARE_COLUMNS
            self._key_buffer = _with_capacity(self.keys, spare)
            self._value_buffer = _with_capacity(self.values, spare)
        self._key_buffer[:, :, self._length : end] = key_states
        self._value_buffer[:, :, self._length : end] = value_states
        self._length = end
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self._length + query_length, 0

    def get_max_length(self) -> int:
        return -1


def _with_capacity(tensor: torch.Tensor, columns: int) -> torch.Tensor:
    """A copy of `tensor` (batch, heads, length, dim) in a buffer `columns` long."""
    buffer = tensor.new_empty((*tensor.shape[:2], columns, tensor.shape[-1]))
    buffer[:, :, : tensor.shape[-2]] = tensor
    return buffer


class DecodeBatch:
    """Step-level batching: the running requests decode together, one forward per step.

    Rows join after their prefill and leave when they finish, at any step.
    Their caches are left-padded to a common length; the attention mask hides
    the padding and explicit position ids keep each row's own positions, so a
    row decodes as it would alone. The cache has spare columns, so a step
    appends in place (`_BufferedLayer`). A row that leaves is dropped from the
    cache once, before the next step, together with every other row that left
    meanwhile; columns that are padding in every remaining row are trimmed
    then, so the batch never grows past its longest row.
    """

    def __init__(self, loaded: LoadedModel) -> None:
        self.loaded = loaded
        self.rows: list[Decoding] = []
        self._cache: Any = None
        self._mask: torch.Tensor | None = None
        self._slots: list[Decoding] = []  # the row each cache row belongs to, departed or not

    def __len__(self) -> int:
        return len(self.rows)

    @torch.inference_mode()
    def add(self, *joiners: Decoding) -> None:
        """Add rows that hold their prompt in their own cache: one copy into new buffers.

        Everything new is allocated before anything changes: an allocation
        that fails half-way leaves the batch as it was.
        """
        if not joiners:
            return
        from transformers import DynamicCache
        from transformers.cache_utils import CacheLayerMixin

        CacheLayerMixin.register(_BufferedLayer)  # what the cache checks a layer is; idempotent
        self._compact()
        device = self.loaded.device
        parts: list[tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]] = []
        if self._cache is not None and self._mask is not None:
            parts.append(([(layer.keys, layer.values) for layer in self._cache.layers], self._mask))
        groups = prefilled_groups(joiners)
        for group in groups:
            length = group.layers[0][0].shape[-2]
            mask = torch.ones((len(group.rows), length), dtype=torch.long, device=device)
            for index, padding in enumerate(group.paddings):
                mask[index, :padding] = 0
            parts.append((group.layers, mask))
        layer_count = len(parts[0][0])
        if any(len(layers) != layer_count for layers, _ in parts):
            raise ValueError("rows with different layer counts cannot share a batch")
        width = max(mask.shape[1] for _, mask in parts)
        height = sum(mask.shape[0] for _, mask in parts)
        merged_mask = torch.zeros((height, width), dtype=torch.long, device=device)
        layers = []
        for index in range(layer_count):
            first = parts[0][0][index][0]
            shape = (height, first.shape[1], width + SPARE_COLUMNS, first.shape[-1])
            keys, values = first.new_zeros(shape), first.new_zeros(shape)
            top = 0
            for part_layers, mask in parts:
                rows, length = mask.shape
                keys[top : top + rows, :, width - length : width] = part_layers[index][0]
                values[top : top + rows, :, width - length : width] = part_layers[index][1]
                top += rows
            layers.append(_BufferedLayer(keys, values, width))
        top = 0
        for _, mask in parts:
            merged_mask[top : top + mask.shape[0], width - mask.shape[1] :] = mask
            top += mask.shape[0]
        cache: Any = DynamicCache(config=self.loaded.model.config)
        cache.layers = layers
        self._cache, self._mask = cache, merged_mask
        joined = handed_over(groups)
        self.rows = [*self.rows, *joined]
        self._slots = [*self._slots, *joined]

    def release(self) -> None:
        """Nothing to drop: the cache goes with the last row (`remove`)."""

    def remove(self, row: Decoding) -> None:
        """The row leaves now; its cache row is dropped before the next step (no allocation)."""
        if row not in self.rows:
            return
        self.rows = [member for member in self.rows if member is not row]
        if not self.rows:
            self._cache, self._mask, self._slots = None, None, []

    @torch.inference_mode()
    def _compact(self) -> None:
        """Drop the cache rows of departed rows, and the columns no remaining row uses."""
        if self._cache is None or self._mask is None or len(self._slots) == len(self.rows):
            return
        present = {id(row) for row in self.rows}
        keep = [slot for slot, row in enumerate(self._slots) if id(row) in present]
        index = torch.tensor(keep, dtype=torch.long, device=self.loaded.device)
        mask = self._mask.index_select(0, index)
        used = torch.nonzero(mask.any(dim=0))
        start = int(used[0].item()) if used.numel() else 0
        layers = []
        for layer in self._cache.layers:
            length = layer.get_seq_length()
            keys = layer.keys.index_select(0, index)[:, :, start:]
            values = layer.values.index_select(0, index)[:, :, start:]
            layers.append(
                _BufferedLayer(
                    _with_capacity(keys, length - start + SPARE_COLUMNS),
                    _with_capacity(values, length - start + SPARE_COLUMNS),
                    length - start,
                )
            )
        self._cache.layers = layers
        self._mask = mask[:, start:]
        self._slots = [self._slots[slot] for slot in keep]

    def step(self) -> list[int | Exception]:
        """One forward pass for every row; returns each row's next token, or its sampling error
        (that row must leave the batch)."""
        self._compact()
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
            tokens = choose_tokens(output.logits[:, -1], self.rows)
        self._mask = mask
        for row, token in zip(self.rows, tokens, strict=True):
            if not isinstance(token, Exception):
                row.last_token = token
                row.position += 1
        return tokens
