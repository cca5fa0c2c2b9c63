"""The CPU fast paths: oneDNN-packed linear layers, fused sibling projections, and
the single-query attention.

They must change speed only: the same products up to rounding, the same
attention as SDPA, and a loaded model that decodes what plain transformers
decodes. Quantized layers are left to their own kernels.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fusebox_server.model import cpu_kernels
from fusebox_server.model.cpu_kernels import (
    ATTENTION,
    PackedLinear,
    ProjectionSlice,
    SingleRowChoice,
    fuse_sibling_projections,
    pack_for_cpu,
    single_query_attention,
    time_single_row,
)
from fusebox_server.model.decode_settings import DecodeSettings
from fusebox_server.model.engine import DecodeBatch, Decoding, LoadedModel, load_model, prefill
from fusebox_server.model.kernel_caches import (
    KERNEL_CACHE_ENTRIES,
    KERNEL_CACHE_ENVS,
    bound_kernel_caches,
)

CPU = torch.device("cpu")
GREEDY = DecodeSettings(max_new_tokens=12, temperature=0.0, top_p=1.0, seed=None, stop=())


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("leading", [(1,), (2,), (1, 3), (16,), (3, 7), (65,)])
def test_a_packed_linear_computes_what_linear_does_for_any_row_count(
    bias: bool, leading: tuple[int, ...]
) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(96, 40, bias=bias)
    inputs = torch.randn(*leading, 96)
    with torch.inference_mode():
        expected = linear(inputs)
        packed = PackedLinear.of(linear)
        got = packed(inputs)
    assert got.shape == expected.shape == (*leading, 40)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert not any(name == "weight" for name, _ in packed.named_parameters())


def test_onednn_sees_between_four_and_64_rows_per_call(monkeypatch: pytest.MonkeyPatch) -> None:
    # Its 1-3 row kernels are the slow ones, and every row count is a cached kernel.
    layer = PackedLinear.of(nn.Linear(32, 8, bias=False))
    seen = _onednn_row_counts(monkeypatch)
    with torch.inference_mode():
        for count in (1, 2, 3, 65, 130):
            assert layer(torch.randn(count, 32)).shape == (count, 8)
    assert seen == [4, 4, 4, 64, 4, 64, 64, 4]


def _onednn_row_counts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The row counts of every oneDNN product from now on."""
    product = torch.ops.mkldnn._linear_pointwise
    seen: list[int] = []

    def counting(rows: torch.Tensor, *args: Any) -> torch.Tensor:
        seen.append(rows.shape[0])
        return product(rows, *args)

    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", counting)
    return seen


def _timed(plain: float, packed: float) -> Any:
    """A timer that reports these seconds for any layer (the real one is host-dependent)."""
    return lambda weight, layer: (plain, packed)


@pytest.mark.parametrize("bias", [False, True])
def test_a_layer_timed_faster_plain_takes_one_row_through_its_plain_weight(
    bias: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(64, 48, bias=bias)
    choice = SingleRowChoice(timer=_timed(plain=1.0, packed=1.2))  # exactly the margin
    layer = PackedLinear.of(linear, choice)
    assert layer.single_row_weight is not None
    assert (choice.layers, choice.bytes) == (1, 64 * 48 * 4)
    seen = _onednn_row_counts(monkeypatch)
    with torch.inference_mode():
        lone = torch.randn(1, 1, 64)
        assert torch.equal(layer(lone), F.linear(lone, linear.weight, linear.bias))
        assert seen == []  # a lone row never reached oneDNN
        several = torch.randn(3, 64)
        torch.testing.assert_close(layer(several), linear(several), rtol=1e-5, atol=1e-5)
    assert seen == [4]
    assert "plain weight kept for one row" in repr(layer)


def test_a_layer_not_clearly_faster_plain_keeps_only_its_packed_weight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    choice = SingleRowChoice(timer=_timed(plain=1.0, packed=1.19))
    layer = PackedLinear.of(nn.Linear(64, 48), choice)
    assert layer.single_row_weight is None and (choice.layers, choice.bytes) == (0, 0)
    seen = _onednn_row_counts(monkeypatch)
    with torch.inference_mode():
        layer(torch.randn(1, 64))
    assert seen == [4]


def test_kept_plain_weights_stay_within_the_budget_in_the_models_order() -> None:
    timed: list[tuple[int, int]] = []

    def timer(weight: torch.Tensor, layer: PackedLinear) -> tuple[float, float]:
        timed.append(tuple(weight.shape))
        return 1.0, 2.0

    size = 32 * 16 * 4
    choice = SingleRowChoice(budget_bytes=size * 2 + size // 2, timer=timer)
    layers = [PackedLinear.of(nn.Linear(16, 32), choice) for _ in range(3)]
    kept = [layer.single_row_weight is not None for layer in layers]
    assert kept == [True, True, False]
    assert (choice.layers, choice.bytes, choice.budget_left) == (2, 2 * size, size // 2)
    assert len(timed) == 2  # a layer past the budget is not timed at all


def test_fused_siblings_are_timed_and_kept_as_one_stacked_weight() -> None:
    torch.manual_seed(0)
    module = _Siblings(bias=False)
    choice = SingleRowChoice(timer=_timed(plain=1.0, packed=3.0))
    assert fuse_sibling_projections(module, choice) == 1
    assert isinstance(module.q_proj, ProjectionSlice)
    stacked = module.q_proj.shared.product
    assert stacked.single_row_weight is not None
    assert stacked.single_row_weight.shape == (stacked.out_features, stacked.in_features)
    assert choice.layers == 1


def test_the_real_timer_times_both_products_of_a_layer() -> None:
    layer = PackedLinear.of(nn.Linear(64, 256))
    plain, packed = time_single_row(torch.randn(256, 64), layer)
    assert plain > 0 and packed > 0  # seconds of each, whatever their order on this host


def _packed_products(model: nn.Module) -> list[PackedLinear]:
    """Every packed product of a model: layers packed alone and fused siblings' products."""
    products = {id(m): m for m in model.modules() if isinstance(m, PackedLinear)}
    for module in model.modules():
        if isinstance(module, ProjectionSlice):
            products[id(module.shared.product)] = module.shared.product
    return list(products.values())


def _forward_faster_plain(model: nn.Module) -> float:
    """A forward timer: 1 s with the plain weights switched on, 2 s without."""
    return 1.0 if any(p.single_row_weight is not None for p in _packed_products(model)) else 2.0


@pytest.fixture
def plain_kept(
    monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path, tiny_tokenizer: Any
) -> LoadedModel:
    """The tiny model loaded where every layer, and the whole forward, timed faster plain."""
    monkeypatch.setattr(cpu_kernels, "time_single_row", _timed(plain=1.0, packed=2.0))
    monkeypatch.setattr(cpu_kernels, "time_one_row_forward", _forward_faster_plain)
    return load_model("primary", tiny_model_dir, "none", CPU, tiny_tokenizer)


def test_pack_for_cpu_keeps_the_plain_weights_when_the_whole_forward_is_faster(
    plain_kept: LoadedModel,
) -> None:
    loaded = plain_kept
    every = _packed_products(loaded.model)
    assert every and all(layer.single_row_weight is not None for layer in every)
    assert loaded.kernels["single_row_plain_layers"] == len(every)
    kept_bytes = sum(layer.in_features * layer.out_features * 4 for layer in every)
    assert loaded.kernels["single_row_plain_bytes"] == kept_bytes
    assert loaded.kernels["single_row_forward_ms"] == {
        "plain_where_faster": 1000.0,
        "packed": 2000.0,
    }
    assert loaded.footprint_bytes == loaded.parameter_bytes + kept_bytes


@pytest.mark.parametrize("packed_seconds", [1.0, 1.05])  # not faster; under 5% faster
def test_plain_weights_faster_layer_by_layer_but_not_in_the_whole_forward_are_dropped(
    monkeypatch: pytest.MonkeyPatch,
    tiny_model_dir: Path,
    tiny_tokenizer: Any,
    packed_seconds: float,
) -> None:
    # A layer timed alone has its weight in the caches: the whole forward is what counts.
    monkeypatch.setattr(cpu_kernels, "time_single_row", _timed(plain=1.0, packed=2.0))

    def forward(model: nn.Module) -> float:
        return 1.0 if _forward_faster_plain(model) == 1.0 else packed_seconds

    monkeypatch.setattr(cpu_kernels, "time_one_row_forward", forward)
    loaded = load_model("primary", tiny_model_dir, "none", CPU, tiny_tokenizer)
    assert all(layer.single_row_weight is None for layer in _packed_products(loaded.model))
    assert loaded.kernels["single_row_plain_layers"] == 0
    assert loaded.kernels["single_row_plain_bytes"] == 0
    assert loaded.kernels["single_row_forward_ms"]["packed"] == packed_seconds * 1e3
    assert loaded.footprint_bytes == loaded.parameter_bytes


def test_a_forward_that_fails_drops_the_plain_weights_and_says_why() -> None:
    choice = SingleRowChoice(timer=_timed(plain=1.0, packed=2.0))
    layer = PackedLinear.of(nn.Linear(16, 8), choice)

    def failing(model: Any) -> float:
        raise RuntimeError("no bare forward")

    choice.forward_timer = failing
    assert choice.confirm(object()) == {
        "single_row_check_failed": "RuntimeError('no bare forward')"
    }
    assert layer.single_row_weight is None and choice.layers == 0 and choice.bytes == 0


def test_the_real_forward_timer_times_a_one_token_forward(
    tiny_model_dir: Path, tiny_tokenizer: Any
) -> None:
    loaded = load_model("primary", tiny_model_dir, "none", CPU, tiny_tokenizer)
    assert cpu_kernels.time_one_row_forward(loaded.model) > 0
    ran = loaded.kernels.get("single_row_forward_ms")  # present when a layer was a candidate
    assert ran is None or (ran["plain_where_faster"] > 0 and ran["packed"] > 0)


def test_a_lone_row_through_kept_plain_weights_decodes_what_transformers_decodes(
    plain_kept: LoadedModel, tiny_model_dir: Path, tiny_tokenizer: Any
) -> None:
    loaded = plain_kept
    assert loaded.kernels["single_row_plain_layers"] > 0
    prompt = tuple(tiny_tokenizer.backend_tokenizer.encode("A lone request.").ids)
    row = Decoding(loaded, prompt, GREEDY)
    produced = prefill(loaded, [row])
    batch = DecodeBatch(loaded)
    batch.add(row)
    for _ in range(GREEDY.max_new_tokens - 1):
        produced += batch.step()
    assert produced == _transformers_greedy(tiny_model_dir, prompt, GREEDY.max_new_tokens)


class _Siblings(nn.Module):
    """An attention-shaped module: three projections of one input, as Llama names them."""

    def __init__(self, bias: bool, widths: tuple[int, int, int] = (24, 8, 8)) -> None:
        super().__init__()
        self.q_proj = nn.Linear(32, widths[0], bias=bias)
        self.k_proj = nn.Linear(32, widths[1], bias=bias)
        self.v_proj = nn.Linear(32, widths[2], bias=bias)


@pytest.mark.parametrize("bias", [False, True])
def test_fused_siblings_return_what_each_layer_computes_in_any_call_order(bias: bool) -> None:
    torch.manual_seed(2)
    module = _Siblings(bias)
    plain = {name: getattr(module, name) for name in ("q_proj", "k_proj", "v_proj")}
    first, second = torch.randn(5, 32), torch.randn(2, 3, 32)
    with torch.inference_mode():
        expected = {
            (n, i): layer(x) for n, layer in plain.items() for i, x in enumerate((first, second))
        }
        assert fuse_sibling_projections(module) == 1
        fused = {name: getattr(module, name) for name in plain}
        assert all(isinstance(layer, ProjectionSlice) for layer in fused.values())
        calls = [  # in order, out of order, one sibling twice, inputs interleaved
            ("q_proj", 0), ("k_proj", 0), ("v_proj", 0),
            ("v_proj", 1), ("q_proj", 1), ("q_proj", 1), ("k_proj", 0), ("k_proj", 1),
        ]  # fmt: skip
        for name, index in calls:
            got = fused[name]((first, second)[index])
            assert got.is_contiguous()
            torch.testing.assert_close(got, expected[(name, index)], rtol=1e-5, atol=1e-5)


def test_a_fused_product_is_held_only_until_every_sibling_took_its_columns() -> None:
    module = _Siblings(bias=False)
    original = weakref.ref(module.q_proj.weight)
    fuse_sibling_projections(module)
    gc.collect()
    assert original() is None  # the stacked, packed weight replaced the three
    shared = module.q_proj.shared
    with torch.inference_mode():
        hidden = torch.randn(4, 32)
        module.q_proj(hidden)
        module.k_proj(hidden)
        assert shared._output is not None  # v_proj has not read its columns yet
        module.v_proj(hidden)
    assert shared._input is None and shared._output is None


def test_siblings_that_cannot_share_a_product_stay_separate_layers() -> None:
    mixed_bias = _Siblings(bias=False)
    mixed_bias.v_proj = nn.Linear(32, 8, bias=True)
    wider_input = _Siblings(bias=False)
    wider_input.k_proj = nn.Linear(40, 8, bias=False)
    missing = _Siblings(bias=False)
    del missing.v_proj
    for module in (mixed_bias, wider_input, missing):
        assert fuse_sibling_projections(module) == 0
        assert not any(isinstance(m, ProjectionSlice) for m in module.modules())


def _attention_inputs(heads: int, kv_heads: int) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(1)
    batch, length, dim = 3, 9, 16
    query = torch.randn(batch, heads, 1, dim)
    key = torch.randn(batch, kv_heads, length, dim)
    value = torch.randn(batch, kv_heads, length, dim)
    mask = torch.ones(batch, 1, 1, length, dtype=torch.bool)
    mask[1, ..., :4] = False  # a left-padded row
    mask[2, ..., :1] = False
    return query, key, value, mask


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 2)])
def test_single_query_attention_is_sdpa_for_padded_and_grouped_heads(
    heads: int, kv_heads: int
) -> None:
    query, key, value, mask = _attention_inputs(heads, kv_heads)
    module = nn.Module()
    got, _ = single_query_attention(module, query, key, value, mask, scaling=0.25)
    repeat = heads // kv_heads
    expected = F.scaled_dot_product_attention(
        query,
        key.repeat_interleave(repeat, dim=1),
        value.repeat_interleave(repeat, dim=1),
        attn_mask=mask,
        scale=0.25,
    ).transpose(1, 2)
    assert got.shape == expected.shape == (3, 1, heads, 16)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_single_query_attention_takes_an_additive_mask_and_no_mask() -> None:
    query, key, value, mask = _attention_inputs(4, 4)
    additive = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    with_bool, _ = single_query_attention(nn.Module(), query, key, value, mask)
    with_float, _ = single_query_attention(nn.Module(), query, key, value, additive)
    torch.testing.assert_close(with_bool, with_float)
    unmasked, _ = single_query_attention(nn.Module(), query, key, value, None)
    expected = F.scaled_dot_product_attention(query, key, value).transpose(1, 2)
    torch.testing.assert_close(unmasked, expected, rtol=1e-5, atol=1e-5)


def _transformers_greedy(model_dir: Path, prompt: tuple[int, ...], count: int) -> list[int]:
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True)
    with torch.inference_mode():
        output = model.generate(
            torch.tensor([prompt]), max_new_tokens=count, do_sample=False, min_new_tokens=count
        )
    return [int(token) for token in output[0, len(prompt) :]]


def test_a_model_loaded_on_cpu_is_packed_and_decodes_what_transformers_decodes(
    tiny_model_dir: Path, tiny_tokenizer: Any
) -> None:
    loaded = load_model("primary", tiny_model_dir, "none", CPU, tiny_tokenizer)
    linears = [m for m in loaded.model.modules() if isinstance(m, (nn.Linear, PackedLinear))]
    assert linears and all(isinstance(m, PackedLinear) for m in linears)
    assert loaded.kernels["packed_linear_layers"] == len(linears)
    layers = loaded.model.config.num_hidden_layers
    assert loaded.kernels["fused_projection_groups"] == 2 * layers  # q/k/v and gate/up
    assert loaded.kernels["single_query_attention"] is True
    assert loaded.model.config._attn_implementation == ATTENTION
    prompts = [
        tuple(tiny_tokenizer.backend_tokenizer.encode(text).ids)
        for text in ("Hello, world.", "A longer prompt about the sea at night.", "Hi")
    ]
    rows = [Decoding(loaded, prompt, GREEDY) for prompt in prompts]
    produced = [[token] for token in prefill(loaded, rows)]
    batch = DecodeBatch(loaded)
    batch.add(*rows)  # left-padded rows: the attention's mask is exercised
    for _ in range(GREEDY.max_new_tokens - 1):
        for tokens, token in zip(produced, batch.step(), strict=True):
            tokens.append(token)
    expected = [_transformers_greedy(tiny_model_dir, p, GREEDY.max_new_tokens) for p in prompts]
    assert produced == expected


def test_quantized_layers_keep_their_own_kernels(tiny_model_dir: Path, tiny_tokenizer: Any) -> None:
    loaded = load_model("fallback", tiny_model_dir, "int8", CPU, tiny_tokenizer)
    assert loaded.kernels["packed_linear_layers"] == 0
    assert loaded.kernels["fused_projection_groups"] == 0
    assert not any(isinstance(m, PackedLinear) for m in loaded.model.modules())
    decoding = Decoding(loaded, (5, 6, 7), GREEDY)
    assert all(isinstance(decoding.step(), int) for _ in range(3))


def test_nothing_is_packed_off_the_cpu() -> None:
    model = nn.Sequential(nn.Linear(8, 8))
    assert pack_for_cpu(model, torch.device("meta")) == {
        "fused_projection_groups": 0,
        "packed_linear_layers": 0,
        "single_row_plain_layers": 0,
        "single_row_plain_bytes": 0,
        "single_query_attention": False,
        "single_query_attention_declined": "not on the CPU with oneDNN (meta)",
    }
    assert isinstance(model[0], nn.Linear)


KERNEL_CACHE_PROBE = """
import os, sys
from fusebox_server.model.kernel_caches import bound_kernel_caches
if sys.argv[1] == "server":
    bound_kernel_caches(os.environ)
import torch
from fusebox_server.model.cpu_kernels import PackedLinear
torch.set_num_threads(1)
def rss_mib():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
layer = PackedLinear.of(torch.nn.Linear(512, 1408, bias=False))
if sys.argv[1] == "server":
    product = layer
else:  # one oneDNN call whatever the row count, caches at oneDNN's defaults
    linear = torch.ops.mkldnn._linear_pointwise
    product = lambda rows: linear(rows, layer.packed, None, "none", [], "")
rows = torch.randn(600, 512)
with torch.inference_mode():
    product(rows[:3])
    before = rss_mib()
    for count in range(20, 600, 3):  # about 190 prompt lengths
        product(rows[:count])
print(rss_mib() - before)
"""


def _kernel_cache_growth_mib(mode: str) -> float:
    environ = {k: v for k, v in os.environ.items() if k not in KERNEL_CACHE_ENVS}
    result = subprocess.run(
        [sys.executable, "-c", KERNEL_CACHE_PROBE, mode],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return float(result.stdout.strip().splitlines()[-1])


def test_new_prompt_lengths_do_not_grow_the_servers_memory_through_kernel_caches() -> None:
    unbounded = _kernel_cache_growth_mib("one-call-per-product")
    server = _kernel_cache_growth_mib("server")
    # oneDNN keeps a kernel per row count, about 1 MiB each at these sizes, 1,024 of them.
    assert unbounded > 100
    assert server < 0.3 * unbounded


def test_kernel_cache_bounds_keep_a_value_the_user_set() -> None:
    environ = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "128"}
    assert bound_kernel_caches(environ) is None
    assert environ == {
        "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "128",
        "LRU_CACHE_CAPACITY": str(KERNEL_CACHE_ENTRIES),
    }


@pytest.mark.parametrize("value", ["abc", "", "-5", "1.5", " 32"])
def test_a_kernel_cache_bound_that_is_not_a_whole_number_is_refused_by_name(value: str) -> None:
    refusal = bound_kernel_caches({"LRU_CACHE_CAPACITY": value})
    assert refusal is not None and "LRU_CACHE_CAPACITY" in refusal and repr(value) in refusal
