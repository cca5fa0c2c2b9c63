"""CPU fast paths: linear weights packed once for oneDNN, sibling projections fused into
one product, and attention for one new token.

Why: on CPU a decode step is a few dozen small matrix products (one row
per running request), and the default kernels are poor at that shape.
Measured on the 2-core bench machine with the `small` model and 16 rows
(docs/decisions/speed.md): `F.linear` reached 26 GFLOP/s, about a
quarter of the core's AVX-512 peak and a seventh of its memory bandwidth,
while the same products with the weight reordered once into oneDNN's
blocked layout took 40% less time; and SDPA's CPU flash kernel spent
0.6 ms per layer on a single query row, where a plain matmul, softmax,
matmul does it in a fraction. A lone request's step is one-row products,
which oneDNN runs slower than four-row ones on the same weight, so they are
padded to four (a 1-row step 1.19x faster in all); and one wide product of
q, k and v stacked (and of gate and up) beats several narrow ones. Which of
the plain and the packed weight is faster for one row depends on the shape
and on the host's CPU (the llama3 zoo's 64 x 128,256 vocabulary projection:
equal on the 2026-12-02 host, 1.8x faster plain on the 2026-12-06 one), so
each layer is timed both ways as it is packed, and keeps its plain weight
for a lone row's product where that is clearly faster (`SingleRowChoice`,
within a memory budget). All keep
the model's arithmetic (greedy outputs are unchanged; the products differ
from `F.linear` by rounding, about 1e-6), so every variant still decodes as
in-process transformers.

What is left as it was: quantized layers (torchao tensor subclasses have
their own kernels), tied weights (packing would copy the embedding), and
any device other than CPU. `pack_for_cpu` says what it did, for the log.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

import torch
from torch import nn

from fusebox_server.model.kernel_caches import KERNEL_CACHE_ENVS

# The row count oneDNN is told to expect; the packed weight serves any row count.
PACK_ROWS_HINT: Final = 16
# oneDNN builds and caches a kernel per row count, larger for more rows
# (kernel_caches.py): a prompt's rows go in calls of at most this many, so
# the row counts a model ever sees are 4..64 (with MIN_ROWS_PER_CALL) and
# every cached kernel is small.
# Measured: a 350-row product takes the same time in 64-row calls.
MAX_ROWS_PER_CALL: Final = 64
# oneDNN's kernels for one to three rows run slower than its four-row one, on
# the same packed weight (1 row: 12.3 ms, 4 rows: 9.5 ms for a decode step's
# products): fewer rows are padded to this many, the extra rows' output dropped.
MIN_ROWS_PER_CALL: Final = 4
ATTENTION: Final = "fusebox_cpu"
# A packed layer keeps its plain weight for one-row products where, timed as it is packed,
# the padded packed product takes at least this many times as long (`SingleRowChoice`).
SINGLE_ROW_MARGIN: Final = 1.2
# The most bytes of plain weights kept beside the packed ones, over the whole model.
SINGLE_ROW_BUDGET_BYTES: Final = 256 << 20
# Calls timed each way (after one warm-up call): the fastest counts.
SINGLE_ROW_TIMED_CALLS: Final = 5
# The candidates' plain weights stay only if the one-token forward with them takes at most
# this share of its time without them (the fastest of each, over these many alternations).
SINGLE_ROW_FORWARD_SHARE: Final = 0.95
SINGLE_ROW_FORWARD_ROUNDS: Final = 4
SINGLE_ROW_FORWARD_CALLS: Final = 3
# Untimed rounds each way first: a just-loaded model's first forwards fault its pages in.
SINGLE_ROW_FORWARD_WARMUPS: Final = 1
# Projections of one module that read the same input (Llama-family names).
SIBLING_PROJECTIONS: Final = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class PackedLinear(nn.Module):
    """A linear layer whose weight oneDNN reordered once; the original weight is dropped,
    unless `single_rows` keeps it for one-row products (`SingleRowChoice`)."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        single_rows: SingleRowChoice | None = None,
    ) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        # An opaque oneDNN tensor: not a parameter (it has no storage to save or move).
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_ROWS_HINT)
        self.bias = bias
        self.min_rows = MIN_ROWS_PER_CALL
        # The plain weight, for a lone row's product; not a parameter either (never saved).
        self.single_row_weight: torch.Tensor | None = None
        if single_rows is not None and single_rows.keeps(weight.detach(), self):
            self.single_row_weight = weight.detach()

    @classmethod
    def of(cls, linear: nn.Linear, single_rows: SingleRowChoice | None = None) -> PackedLinear:
        return cls(linear.weight, linear.bias, single_rows)

    @classmethod
    def stacked(
        cls, linears: Sequence[nn.Linear], single_rows: SingleRowChoice | None = None
    ) -> PackedLinear:
        """One packed product of several layers' weights stacked: their outputs side by side."""
        weight = torch.cat([linear.weight.detach() for linear in linears])
        biases = [linear.bias.detach() for linear in linears if linear.bias is not None]
        return cls(weight, torch.cat(biases) if biases else None, single_rows)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        rows = inputs.reshape(-1, self.in_features)
        if rows.shape[0] == 1 and self.single_row_weight is not None:
            output = torch.nn.functional.linear(rows, self.single_row_weight, self._bias())
        else:
            parts = [self._product(chunk) for chunk in torch.split(rows, MAX_ROWS_PER_CALL)]
            output = parts[0] if len(parts) == 1 else torch.cat(parts)
        return output.view(*inputs.shape[:-1], self.out_features)

    def _bias(self) -> torch.Tensor | None:
        return None if self.bias is None else self.bias.detach()

    def _product(self, rows: torch.Tensor) -> torch.Tensor:
        """One oneDNN call; fewer than `min_rows` rows are padded with zeros to that many."""
        count = rows.shape[0]
        if count < self.min_rows:
            padded = rows.new_zeros((self.min_rows, self.in_features))
            padded[:count] = rows
            rows = padded
        output: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
            rows, self.packed, self._bias(), "none", [], ""
        )
        return output[:count]

    def extra_repr(self) -> str:
        kept = ", plain weight kept for one row" if self.single_row_weight is not None else ""
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, oneDNN-packed{kept}"
        )


SingleRowTimer = Callable[[torch.Tensor, PackedLinear], tuple[float, float]]


def time_single_row(weight: torch.Tensor, layer: PackedLinear) -> tuple[float, float]:
    """Seconds of a one-row product through the plain `weight` and through `layer`'s packed
    one (padded as it pads): the fastest of a few calls each, after a warm-up call."""
    row = weight.new_zeros((1, layer.in_features))
    bias = layer._bias()

    def fastest(product: Callable[[], object]) -> float:
        product()
        best = float("inf")
        for _ in range(SINGLE_ROW_TIMED_CALLS):
            started = time.perf_counter()
            product()
            best = min(best, time.perf_counter() - started)
        return best

    with torch.inference_mode():
        plain = fastest(lambda: torch.nn.functional.linear(row, weight, bias))
        packed = fastest(lambda: layer._product(row))
    return plain, packed


def time_one_row_forward(model: Any) -> float:
    """Seconds of the model's forward over one token without a cache, where every product
    has one row: the fastest of a few calls, after a warm-up call."""
    token = torch.zeros((1, 1), dtype=torch.long, device=model.device)
    best = float("inf")
    with torch.inference_mode():
        model(input_ids=token, use_cache=False)
        for _ in range(SINGLE_ROW_FORWARD_CALLS):
            started = time.perf_counter()
            model(input_ids=token, use_cache=False)
            best = min(best, time.perf_counter() - started)
    return best


class SingleRowChoice:
    """Which packed layers also keep their plain weight, for a lone row's product.

    From a few rows up oneDNN's packed product is the faster one, but for one
    row (a lone request's decode step) the plain weight can be much faster:
    on the llama3 zoo's vocabulary projection, 64 x 128,256 on one thread,
    1.15-1.28 ms through `F.linear` against 2.0-2.2 ms packed and padded to
    four rows, most of a 5.5 ms step (2026-12-06; on 2026-12-02's host the
    two were equal). It depends on the shape and the host's CPU, so it is
    measured on the thread that loads the model (the inference worker, with
    its thread count), in two stages:

    - as each layer is packed, a one-row product is timed both ways
      (`keeps`); the layer is a candidate where the packed one takes
      `SINGLE_ROW_MARGIN` times as long or more, while the candidates' plain
      weights fit `SINGLE_ROW_BUDGET_BYTES`, taken in the model's order;
    - a layer timed alone has its weight in the CPU's caches, which a real
      step, going through every layer, does not: on the `small` model each
      layer timed faster plain, and the whole one-row step was 1.25x slower
      that way. So once the model is packed, its one-token forward is timed
      with the candidates' plain weights and without, alternated (`confirm`),
      and they are all kept only if the forward takes at most
      `SINGLE_ROW_FORWARD_SHARE` of its time without them; else all dropped.

    A kept weight costs its size again in memory; the load's log line says
    how many layers, how many bytes, and the two forward times
    (`pack_for_cpu`). Either product is the layer's own arithmetic: greedy
    outputs are those of transformers.
    """

    def __init__(
        self,
        budget_bytes: int = SINGLE_ROW_BUDGET_BYTES,
        timer: SingleRowTimer | None = None,
        forward_timer: Callable[[Any], float] | None = None,
    ) -> None:
        self.budget_left = budget_bytes
        self.timer = timer or time_single_row
        self.forward_timer = forward_timer or time_one_row_forward
        self.candidates: list[tuple[PackedLinear, torch.Tensor]] = []

    @property
    def layers(self) -> int:
        return len(self.candidates)

    @property
    def bytes(self) -> int:
        return sum(weight.numel() * weight.element_size() for _, weight in self.candidates)

    def keeps(self, weight: torch.Tensor, layer: PackedLinear) -> bool:
        """Whether `layer` (packing `weight`) is a candidate; it then holds the weight."""
        size = weight.numel() * weight.element_size()
        if size > self.budget_left:
            return False
        plain, packed = self.timer(weight, layer)
        if packed < plain * SINGLE_ROW_MARGIN:
            return False
        self.budget_left -= size
        self.candidates.append((layer, weight))
        return True

    def confirm(self, model: Any) -> dict[str, Any]:
        """Keep the candidates' plain weights only if the whole one-row forward is faster
        with them (see the class); the forward's milliseconds both ways, for the log."""
        if not self.candidates:
            return {}
        with_plain: list[float] = []
        packed_only: list[float] = []
        try:
            for on in (True, False):
                self._switch(on)
                for _ in range(SINGLE_ROW_FORWARD_WARMUPS):
                    self.forward_timer(model)
            for _ in range(SINGLE_ROW_FORWARD_ROUNDS):
                self._switch(on=True)
                with_plain.append(self.forward_timer(model))
                self._switch(on=False)
                packed_only.append(self.forward_timer(model))
        except Exception as error:  # a model whose bare forward fails keeps none: nothing measured
            self._drop()
            return {"single_row_check_failed": repr(error)}
        plain, packed = min(with_plain), min(packed_only)
        if plain <= packed * SINGLE_ROW_FORWARD_SHARE:
            self._switch(on=True)
        else:
            self._drop()
        return {
            "single_row_forward_ms": {
                "plain_where_faster": round(plain * 1e3, 3),
                "packed": round(packed * 1e3, 3),
            }
        }

    def _switch(self, on: bool) -> None:
        for layer, weight in self.candidates:
            layer.single_row_weight = weight if on else None

    def _drop(self) -> None:
        self._switch(on=False)
        self.candidates = []


class SharedProduct:
    """Sibling projections that read the same input, as one packed product per input.

    A decoder layer's q, k and v projections (and its MLP's gate and up) all
    read the same hidden states; one product of their stacked weights reads
    that input once, and oneDNN runs one wide product faster than several
    narrow ones (docs/decisions/speed.md). Each sibling's module becomes a
    `ProjectionSlice` that takes its own columns. The product is held only
    until every sibling has taken its columns of that input; a sibling called
    with another input, or twice, gets a fresh product, so each returns what
    its own layer computes whatever the model does in between.
    """

    def __init__(
        self, linears: Sequence[nn.Linear], single_rows: SingleRowChoice | None = None
    ) -> None:
        self.product = PackedLinear.stacked(linears, single_rows)
        ends = list(itertools.accumulate(linear.out_features for linear in linears))
        self.columns = [
            (end - linear.out_features, end) for linear, end in zip(linears, ends, strict=True)
        ]
        self._input: torch.Tensor | None = None
        self._output: torch.Tensor | None = None
        self._unserved: set[int] = set()

    def for_sibling(self, sibling: int, inputs: torch.Tensor) -> torch.Tensor:
        if inputs is not self._input or sibling not in self._unserved:
            self._input, self._output = inputs, self.product(inputs)
            self._unserved = set(range(len(self.columns)))
        output = self._output
        assert output is not None
        self._unserved.discard(sibling)
        if not self._unserved:  # every sibling served: hold nothing between steps
            self._input = self._output = None
        start, end = self.columns[sibling]
        return output[..., start:end].contiguous()  # the layout a plain layer returns


class ProjectionSlice(nn.Module):
    """One sibling's place in a `SharedProduct`: its own columns of the shared product."""

    def __init__(self, shared: SharedProduct, sibling: int) -> None:
        super().__init__()
        self.shared, self.sibling = shared, sibling  # a plain object: not a submodule
        start, end = shared.columns[sibling]
        self.in_features, self.out_features = shared.product.in_features, end - start

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.shared.for_sibling(self.sibling, inputs)

    def extra_repr(self) -> str:
        start, end = self.shared.columns[self.sibling]
        return f"in_features={self.in_features}, columns {start}:{end} of a shared product"


def _packable(linear: nn.Linear, tied: set[int]) -> bool:
    weight = linear.weight
    if type(weight) not in (torch.Tensor, nn.Parameter) or weight.device.type != "cpu":
        return False  # a quantized tensor subclass, or not on the CPU
    if id(weight) in tied:
        return False
    if weight.dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return weight.dtype == torch.float32


def _tied_weights(model: nn.Module) -> set[int]:
    input_embeddings = getattr(model, "get_input_embeddings", None)
    embeddings = input_embeddings() if callable(input_embeddings) else None
    return {id(embeddings.weight)} if isinstance(embeddings, nn.Embedding) else set()


def _stackable(siblings: Sequence[object], tied: set[int]) -> list[nn.Linear] | None:
    """The siblings as packable layers of one input width, dtype and bias-ness, or None."""
    linears = [s for s in siblings if isinstance(s, nn.Linear) and _packable(s, tied)]
    if len(linears) != len(siblings):
        return None
    first = linears[0]
    alike = all(
        linear.in_features == first.in_features
        and linear.weight.dtype == first.weight.dtype
        and (linear.bias is None) == (first.bias is None)
        for linear in linears
    )
    return linears if alike else None


def fuse_sibling_projections(model: nn.Module, single_rows: SingleRowChoice | None = None) -> int:
    """Serve each group of `SIBLING_PROJECTIONS` from one `SharedProduct`; how many groups."""
    tied = _tied_weights(model)
    groups = 0
    for parent in list(model.modules()):
        for names in SIBLING_PROJECTIONS:
            linears = _stackable([getattr(parent, name, None) for name in names], tied)
            if linears is None:
                continue
            shared = SharedProduct(linears, single_rows)
            for sibling, name in enumerate(names):
                setattr(parent, name, ProjectionSlice(shared, sibling))
            groups += 1
    return groups


def pack_linear_layers(model: nn.Module, single_rows: SingleRowChoice | None = None) -> int:
    """Replace every packable `nn.Linear` by a `PackedLinear`; how many were replaced."""
    tied = _tied_weights(model)
    packed = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and _packable(child, tied):
                setattr(parent, name, PackedLinear.of(child, single_rows))
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
    reshape, never a copy. A prompt's queries go to SDPA, by its own grouped-query
    path where it takes the case (`grouped_prompt_attention`), else unchanged.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    special = dropout != 0.0 or any(
        kwargs.get(name) is not None for name in ("softcap", "position_bias", "is_causal")
    )
    if query.shape[2] != 1 and not special:
        grouped = grouped_prompt_attention(module, query, key, value, attention_mask, scaling)
        if grouped is not None:
            return grouped, None
    if query.shape[2] != 1 or special:
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


def grouped_prompt_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None,
) -> torch.Tensor | None:
    """A prompt's queries (batch, heads, length, dim) over fewer key/value heads, by SDPA's
    `enable_gqa`; (batch, length, heads, dim), or None where this does not apply.

    Why: on the CPU, transformers' SDPA path repeats the key/value heads up to
    the query heads (`repeat_kv`) whenever there is a mask: a copy of the whole
    cache, per layer, per forward pass. A chunked prefill runs a pass per chunk
    over a growing cache, so on the llama3 zoo shape (32 query heads over 8)
    that copy was most of a chunk's time: a 16-token chunk at position 1,000
    took 40 ms with it and 11 ms without (decisions/chunked-prefill.md). Only
    with a mask, or with none over a whole prompt (causal, as many keys as
    queries); anything else keeps transformers' own path.
    """
    if key.shape[1] == query.shape[1]:
        return None  # no grouped heads: nothing is repeated
    is_causal = False
    if attention_mask is None:
        if key.shape[-2] != query.shape[-2] or not getattr(module, "is_causal", True):
            return None
        is_causal = True
    else:
        attention_mask = attention_mask[:, :, :, : key.shape[-2]]
    output = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        scale=scaling,
        is_causal=is_causal,
        enable_gqa=True,
    )
    return output.transpose(1, 2).contiguous()


def single_query_refusal(config: Any) -> str | None:
    """Why `single_query_attention` must not serve this model's attention, or None.

    It computes plain scaled dot-product attention under the model's mask
    (which carries a sliding window, so Mistral's and Gemma 2's windows are
    kept). It does not soft-cap scores (Gemma 2's `attn_logit_softcapping`),
    so such a model keeps its own attention, as does one that asked for a
    kernel other than SDPA (Gemma 2 asks for eager).
    """
    if getattr(config, "attn_logit_softcapping", None) is not None:
        return "attention logits are soft-capped"
    implementation = getattr(config, "_attn_implementation", None)
    if implementation != "sdpa":
        return f"the model uses {implementation} attention"
    return None


def use_single_query_attention(model: Any) -> bool:
    """Route the model's attention through `single_query_attention`; False where it declines."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if single_query_refusal(model.config) is not None:
        return False  # the model keeps its own attention
    AttentionInterface.register(ATTENTION, single_query_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    model.set_attn_implementation(ATTENTION)
    return True


def pack_for_cpu(model: Any, device: torch.device) -> dict[str, Any]:
    """Switch a loaded model on the CPU to the fast paths above; what was done, for the log."""
    mkldnn = torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
    if device.type != "cpu" or not mkldnn:
        return {
            "fused_projection_groups": 0,
            "packed_linear_layers": 0,
            "single_row_plain_layers": 0,
            "single_row_plain_bytes": 0,
            "single_query_attention": False,
            "single_query_attention_declined": f"not on the CPU with oneDNN ({device.type})",
        }
    declined = single_query_refusal(model.config)  # before the switch changes the answer
    single_rows = SingleRowChoice()
    done: dict[str, Any] = {
        "fused_projection_groups": fuse_sibling_projections(model, single_rows),
        "packed_linear_layers": pack_linear_layers(model, single_rows),
        "single_query_attention": use_single_query_attention(model),
        "single_query_attention_declined": declined,
    }
    checked = single_rows.confirm(model)  # the whole forward, as it will run
    return done | {
        # Of the packed products (fused ones included), those that keep their plain weight.
        "single_row_plain_layers": single_rows.layers,
        "single_row_plain_bytes": single_rows.bytes,
        **checked,
        # The bounds torch loaded with (kernel_caches.py); None: oneDNN's default, 1,024.
        "kernel_cache_entries": {name: os.environ.get(name) for name in KERNEL_CACHE_ENVS},
    }
