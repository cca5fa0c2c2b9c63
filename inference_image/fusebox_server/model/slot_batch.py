"""Decoding on CUDA: a static slot cache, and each decode step replayed as one CUDA graph.

Why: on the H200 a 32-row decode step through transformers' forward took
15.5 ms while the GPU was busy 5.9 ms; the rest was Python launching 959
kernels one by one (bench/results/gpu/profile-eager.md). A CUDA graph records a
step's kernels once and replays them with one launch, but every tensor it
touches must keep its address and shape. So here:

- every row owns a slot of a preallocated cache (per layer: slots x kv heads
  x columns x head dim), and its token at position p sits in column p: no
  left padding, no copying as rows come and go. A row that leaves gives its
  slot to the last row (one copy per layer for all that left, before the
  next step);
- a step runs on the first B slots and the first L columns, B and L rounded
  up to powers of two; the graph of each (B, L) is captured the first time
  a step needs it, and all graphs share one memory pool. The cache grows by
  doubling, which drops the graphs (they hold the old addresses);
- each row writes its new key and value at its own position (a scatter),
  and the mask (column <= position) is computed inside the graph from the
  positions, so a step copies in only the rows' tokens and positions and
  copies out their greedy tokens;
- the cache follows the load down too: once the running rows have needed a
  quarter of its slots or of its columns (or less) for SHRINK_AFTER_SECONDS,
  a step cuts that dimension to twice what they need and gives the memory
  back to the device. A shrink drops the graphs like a growth does; the
  margin and the wait keep a load that comes and goes from paying a capture
  (0.08-0.13 s on the H200) every few steps (docs/decisions/speed.md, "A
  slot cache that shrinks");
- the cache and the graphs stay while the batch is empty, so the next burst
  starts without capturing again; `InferenceWorker.release_idle_batch` (the
  `empty_cache` action, the memory guard) and unload/swap drop them.

Capture is checked before it is trusted: the first replay of every graph
must give the logits the step computed eagerly just before; a capture that
raises or differs switches graphs off for this batch (logged once) and it
decodes eagerly on the same slot cache. Off CUDA (`graphs=False`) the same
code runs eagerly, which is how the unit tests hold it to `Decoding` alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import structlog
import torch

from fusebox_server.model.engine import (
    DecodeBatch,
    Decoding,
    LoadedModel,
    choose_tokens,
    handed_over,
    prefilled_groups,
)

log = structlog.get_logger("fusebox_server")

# The narrowest cache a step attends over; positions past it round up to a power of two.
MIN_COLUMNS = 64
# A dimension this many times what the running rows need, for this long, is cut to
# SHRUNK_MARGIN times it.
SHRINK_AT = 4
SHRUNK_MARGIN = 2
SHRINK_AFTER_SECONDS = 2.0
# How far a graph's logits may be from the eager step's (bfloat16 rounding) and still count.
GRAPH_CHECK_TOLERANCE = 5e-2


def bucket(count: int, floor: int = 1) -> int:
    """The smallest power of two >= count and >= floor."""
    size = max(floor, 1)
    while size < count:
        size *= 2
    return size


def shrunk(size: int, needed: int) -> int:
    """What a cache dimension of `size` keeps when the rows need `needed` (a power of two)."""
    if size >= SHRINK_AT * needed:
        return SHRUNK_MARGIN * needed
    return size


class SlotCache:
    """The cache a decoder's attention layers see during one step of B rows over L columns.

    Duck-types the `update` of a transformers cache: each row's new key and
    value are scattered into its own slot at its own position, and the
    attention reads the first L columns of the first B slots (views, so a
    captured graph reads and writes the batch's buffers in place).
    """

    def __init__(
        self,
        keys: Sequence[torch.Tensor],
        values: Sequence[torch.Tensor],
        positions: torch.Tensor,
        columns: int,
    ) -> None:
        rows = positions.shape[0]
        self._keys = [layer[:rows] for layer in keys]
        self._values = [layer[:rows] for layer in values]
        self._columns = columns
        heads, dim = keys[0].shape[1], keys[0].shape[-1]
        self._at = positions.view(rows, 1, 1, 1).expand(rows, heads, 1, dim)

    def update(
        self,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        layer_idx: int,
        *args: Any,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self._keys[layer_idx], self._values[layer_idx]
        keys.scatter_(2, self._at, key_states.to(keys.dtype))
        values.scatter_(2, self._at, value_states.to(values.dtype))
        return keys[:, :, : self._columns], values[:, :, : self._columns]


class SlotBatch:
    """Step-level batching over a static slot cache; the same interface as `DecodeBatch`.

    `rows` keeps the order rows joined in, as `DecodeBatch` does (a caller
    pairs `step`'s tokens with the rows it read before the step); the slots
    are this class's own order.
    """

    def __init__(
        self, loaded: LoadedModel, graphs: bool, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.loaded = loaded
        self.rows: list[Decoding] = []
        self._slots: list[Decoding] = []  # the row in each occupied slot, departed or not
        self._keys: list[torch.Tensor] = []
        self._values: list[torch.Tensor] = []
        device = loaded.device
        self._inputs = torch.zeros((2, 0, 1), dtype=torch.long, device=device)  # ids, positions
        self._graphs_on = graphs
        self._graphs: dict[tuple[int, int], tuple[Any, tuple[torch.Tensor, torch.Tensor]]] = {}
        self._pool: Any = None
        self._stream: Any = None
        self._clock = clock
        self._oversized_since: float | None = None  # when the rows began to need far less

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def capacity(self) -> tuple[int, int]:
        """(slots, columns) the cache holds now."""
        if not self._keys:
            return 0, 0
        return self._keys[0].shape[0], self._keys[0].shape[2]

    @property
    def graph_count(self) -> int:
        return len(self._graphs)

    @property
    def graphs_on(self) -> bool:
        return self._graphs_on

    def cache_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self._keys, *self._values))

    @torch.inference_mode()
    def add(self, *joiners: Decoding) -> None:
        """Put rows that hold their prompt in a prefill cache into free slots.

        Each prefill group is copied with one gather and one copy per layer.
        A grown cache is allocated and filled before it replaces the old one,
        and rows count as members only at the end: a failed allocation leaves
        the batch as it was.
        """
        if not joiners:
            return
        self._compact()
        groups = prefilled_groups(joiners)
        height = len(self._slots) + sum(len(group.rows) for group in groups)
        width = max(group.layers[0][0].shape[-2] for group in groups)
        self._reserve(height, width, groups[0].layers)
        top = len(self._slots)
        for group in groups:
            rows = len(group.rows)
            length = group.layers[0][0].shape[-2]
            shift = _left_shift(group.paddings, length, self.loaded.device)
            for (keys, values), (slot_keys, slot_values) in zip(
                group.layers, zip(self._keys, self._values, strict=True), strict=True
            ):
                slot_keys[top : top + rows, :, :length] = _gather_columns(keys, shift)
                slot_values[top : top + rows, :, :length] = _gather_columns(values, shift)
            top += rows
        joined = handed_over(groups)
        self.rows = [*self.rows, *joined]
        self._slots = [*self._slots, *joined]

    def remove(self, row: Decoding) -> None:
        """The row leaves now; its slot is refilled before the next step (no allocation)."""
        if row in self.rows:
            self.rows = [member for member in self.rows if member is not row]

    def release(self) -> None:
        """Drop the cache and the graphs; only while no row is left."""
        if self.rows:
            return
        self._slots, self._keys, self._values = [], [], []
        self._graphs, self._pool = {}, None
        self._oversized_since = None

    @torch.inference_mode()
    def _compact(self) -> None:
        """Move the last rows into the slots of rows that left, so members fill slots 0..n-1."""
        if len(self._slots) == len(self.rows):
            return
        present = {id(row) for row in self.rows}
        kept = [slot for slot, row in enumerate(self._slots) if id(row) in present]
        count = len(kept)
        holes = [slot for slot in range(count) if id(self._slots[slot]) not in present]
        movers = [slot for slot in kept if slot >= count]
        if holes:
            device = self.loaded.device
            source = torch.tensor(movers, dtype=torch.long, device=device)
            target = torch.tensor(holes, dtype=torch.long, device=device)
            for buffer in (*self._keys, *self._values):
                buffer.index_copy_(0, target, buffer.index_select(0, source))
        order = list(range(count))
        for hole, mover in zip(holes, movers, strict=True):
            order[hole] = mover
        self._slots = [self._slots[slot] for slot in order]

    def _reserve(
        self, rows: int, columns: int, like: Sequence[tuple[torch.Tensor, torch.Tensor]] = ()
    ) -> None:
        """Grow the cache (doubling) to hold `rows` slots of `columns` columns."""
        slots, width = self.capacity
        needed_slots = bucket(rows, max(slots, 1))
        needed_width = bucket(columns, max(width, MIN_COLUMNS))
        if (needed_slots, needed_width) == (slots, width):
            return
        template = [keys for keys, _ in like] or self._keys
        keys = [
            _grown(layer, needed_slots, needed_width, self._keys, index)
            for index, layer in enumerate(template)
        ]
        values = [
            _grown(layer, needed_slots, needed_width, self._values, index)
            for index, layer in enumerate(template)
        ]
        inputs = self._inputs.new_zeros((2, needed_slots, 1))
        self._keys, self._values, self._inputs = keys, values, inputs
        self._graphs, self._pool = {}, None  # captured over the old buffers' addresses

    def _shrink(self, rows: int, columns: int) -> None:
        """Cut what the running rows have left unused for a while (they fill the first slots,
        after `_compact`), to `rows` x `columns` slots and columns with the margin."""
        slots, width = self.capacity
        kept = (shrunk(slots, rows), shrunk(width, columns))
        if kept == (slots, width):
            self._oversized_since = None
            return
        now = self._clock()
        if self._oversized_since is None:
            self._oversized_since = now
        if now - self._oversized_since < SHRINK_AFTER_SECONDS:
            return
        self._oversized_since = None
        self._keys = [layer[: kept[0], :, : kept[1]].clone() for layer in self._keys]
        self._values = [layer[: kept[0], :, : kept[1]].clone() for layer in self._values]
        self._inputs = self._inputs.new_zeros((2, kept[0], 1))
        self._graphs, self._pool = {}, None
        if self.loaded.device.type == "cuda":  # the old buffers and graph pool, to the device
            torch.cuda.empty_cache()
        log.info("slot_cache_shrunk", slots=kept[0], columns=kept[1], bytes=self.cache_bytes())

    @torch.inference_mode()
    def step(self) -> list[int | Exception]:
        """One decode step for every row; each row's next token, or its sampling error."""
        self._compact()
        slots = self._slots
        count = len(slots)
        rows = bucket(count)
        needed = max(row.position for row in slots) + 1
        columns = bucket(needed, MIN_COLUMNS)
        self._shrink(rows, columns)
        self._reserve(rows, needed)
        padding = [0] * (rows - count)
        staged = torch.tensor(
            [
                [row.last_token for row in slots] + padding,
                [row.position for row in slots] + padding,
            ],
            dtype=torch.long,
        )
        self._inputs[:, :rows, 0].copy_(staged, non_blocking=True)
        logits, greedy = self._run(rows, columns)
        # The graph's argmax serves the rows that take it; the others read their row of the
        # graph's logits (its output buffer, valid until the next replay).
        chosen = choose_tokens(logits[:count], slots, greedy[:count].tolist())
        by_row = {id(row): token for row, token in zip(slots, chosen, strict=True)}
        tokens = [by_row[id(row)] for row in self.rows]  # in the rows' order, not the slots'
        for row, token in zip(self.rows, tokens, strict=True):
            if not isinstance(token, Exception):
                row.last_token = token
                row.position += 1
        return tokens

    def _forward(self, rows: int, columns: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The step itself, as captured: logits and greedy tokens of the first `rows` slots."""
        ids, positions = self._inputs[0, :rows], self._inputs[1, :rows]
        output = self.loaded.model(
            input_ids=ids,
            position_ids=positions,
            attention_mask=step_masks(self.loaded.model.config, positions, columns),
            cache=SlotCache(self._keys, self._values, positions, columns),
            use_cache=True,
            **self.loaded.prompt_arguments,
        )
        logits = output.logits[:, -1]
        return logits, logits.argmax(dim=-1)

    def _run(self, rows: int, columns: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not self._graphs_on:
            return self._forward(rows, columns)
        captured = self._graphs.get((rows, columns))
        if captured is None:
            return self._capture(rows, columns)
        graph, outputs = captured
        graph.replay()
        return outputs

    def _capture(self, rows: int, columns: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the step eagerly, then capture it and check the graph gives the same logits.

        Capturing records kernels without running them, and a replay recomputes
        this step's keys and values from the same inputs, so running the step
        twice writes the cache twice with the same values. On any failure the
        eager result stands and graphs go off for this batch.
        """
        cuda = torch.cuda
        if self._stream is None:
            self._stream = cuda.Stream(device=self.loaded.device)  # type: ignore[no-untyped-call]
        if self._pool is None:
            self._pool = cuda.graph_pool_handle()
        self._stream.wait_stream(cuda.current_stream())
        with cuda.stream(self._stream):  # warm-up where the capture runs (lazy kernel setup)
            eager = self._forward(rows, columns)
        cuda.current_stream().wait_stream(self._stream)
        graph = cuda.CUDAGraph()
        try:
            with cuda.graph(
                graph, pool=self._pool, stream=self._stream, capture_error_mode="thread_local"
            ):
                outputs = self._forward(rows, columns)
            graph.replay()
            difference = float((outputs[0].float() - eager[0].float()).abs().max())
        except Exception as error:
            self._graphs_off(rows, columns, f"capture failed: {error!r}")
            return eager
        if not difference <= GRAPH_CHECK_TOLERANCE:
            self._graphs_off(rows, columns, f"replayed logits differ by {difference}")
            return eager
        self._graphs[(rows, columns)] = (graph, outputs)
        log.info("cuda_graph_captured", rows=rows, columns=columns, graphs=len(self._graphs))
        return outputs

    def _graphs_off(self, rows: int, columns: int, reason: str) -> None:
        self._graphs_on = False
        self._graphs, self._pool = {}, None
        log.warning("cuda_graphs_off", rows=rows, columns=columns, reason=reason)


def step_masks(config: Any, positions: torch.Tensor, columns: int) -> Any:
    """The attention mask of a step whose row r is at `positions[r]`: what the model takes.

    A row attends to its columns up to its position and, in a sliding-window
    layer, only to the last `sliding_window` of them (the position included).
    A 4-D mask is used as given for every layer, so a model whose layers
    differ (`layer_types`: Gemma 2, Qwen 2/3 and their MoE) gets one mask per
    layer type, which those models accept; a model of sliding layers only
    (Mistral, Phi-3, Mixtral) gets the sliding mask. Eager attention adds the
    mask to the scores, so it gets 0 / the dtype's minimum instead of booleans.
    Computed from `positions`, so a captured graph recomputes it each replay.
    """
    rows = positions.shape[0]
    column = torch.arange(columns, device=positions.device)
    full = (column <= positions).view(rows, 1, 1, columns)
    masks = {"full_attention": full}
    window = getattr(config, "sliding_window", None)
    if window is not None:
        masks["sliding_attention"] = full & (column > positions - window).view(rows, 1, 1, columns)
    if getattr(config, "_attn_implementation", None) == "eager":
        dtype = config.dtype if isinstance(config.dtype, torch.dtype) else torch.float32
        masks = {
            kind: torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
                ~mask, torch.finfo(dtype).min
            )
            for kind, mask in masks.items()
        }
    if getattr(config, "layer_types", None) is not None:
        return masks
    return masks.get("sliding_attention", masks["full_attention"])


def _left_shift(paddings: Sequence[int], length: int, device: torch.device) -> torch.Tensor:
    """Per row, the source column of each target column: a row's prompt moves to column 0.

    Columns past a row's prompt repeat its last column (finite values the mask
    hides until the row writes there).
    """
    columns = torch.arange(length, device=device)
    shift = torch.tensor(list(paddings), dtype=torch.long, device=device)
    return (columns[None, :] + shift[:, None]).clamp(max=length - 1)


def _gather_columns(tensor: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    rows, heads, length, dim = tensor.shape
    index = shift.view(rows, 1, length, 1).expand(rows, heads, length, dim)
    return torch.gather(tensor, 2, index)


def _grown(
    template: torch.Tensor, slots: int, columns: int, old: Sequence[torch.Tensor], layer: int
) -> torch.Tensor:
    """A zeroed (slots, heads, columns, dim) buffer holding layer `layer` of `old`, if any.

    Zeros, not empty memory: a masked column is still multiplied by its zero
    weight, and garbage that happens to be NaN would poison the row.
    """
    buffer = template.new_zeros((slots, template.shape[1], columns, template.shape[-1]))
    if old:
        previous = old[layer]
        buffer[: previous.shape[0], :, : previous.shape[2]] = previous
    return buffer


def new_batch(loaded: LoadedModel) -> DecodeBatch | SlotBatch:
    """The decode batch for a loaded model: slots and CUDA graphs on CUDA, else `DecodeBatch`.

    On the CPU the step is bound by the products, not by launching them, and
    `DecodeBatch` is what the CPU kernels were measured with
    (docs/decisions/speed.md).
    """
    if loaded.device.type == "cuda":
        return SlotBatch(loaded, graphs=True)
    return DecodeBatch(loaded)
