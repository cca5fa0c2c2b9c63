"""Variants on the real tiny model: no fallback unless configured, int8 halves the
weights, dtype and torch threads are applied, and degradation converges in one task."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import structlog
import torch

from fusebox_contract.admin import ActionResult, ServerState
from fusebox_contract.names import (
    ActionType,
    DegradationLevel,
    Dtype,
    Quantization,
    Variant,
)
from fusebox_server.config import ServerConfig
from fusebox_server.control.runtime import Runtime
from fusebox_server.errors import FallbackUnavailable
from fusebox_server.model import engine
from fusebox_server.model.load_order import MemoryRoom
from fusebox_server.model.quantization import quantize, refusal

from .runtime_runs import run_with_runtime, settled


def test_quantizations_the_cpu_cannot_serve_are_refused_with_a_reason() -> None:
    cpu = torch.device("cpu")
    assert refusal(Quantization.INT8, cpu) is None
    assert refusal(Quantization.NONE, cpu) is None
    for quantization in (Quantization.INT4, Quantization.FP8):
        reason = refusal(quantization, cpu)
        assert reason is not None and "CUDA" in reason


def test_without_a_configured_fallback_level_2_swaps_nothing(tiny_model_dir: Path) -> None:
    config = ServerConfig(model_dir=tiny_model_dir, torch_threads=1)

    async def scenario(runtime: Runtime) -> ServerState:
        result = runtime.set_degradation(DegradationLevel.FALLBACK_MODEL)
        assert not result.converging and result.target_variant is Variant.PRIMARY
        with pytest.raises(FallbackUnavailable, match="no fallback is configured"):
            await runtime.run_action("s1", ActionType.SWAP, None)
        return runtime.state()

    state = run_with_runtime(config, scenario)
    assert state.variant == "primary" and state.model_loaded
    assert state.degradation_level == 2
    assert state.fallback_configured is False


def test_level_2_converges_on_an_int8_fallback_half_the_size_in_one_load(
    tiny_model_dir: Path,
) -> None:
    config = ServerConfig(
        model_dir=tiny_model_dir, fallback_quantization=Quantization.INT8, torch_threads=1
    )

    async def scenario(runtime: Runtime) -> tuple[int | None, ServerState, list[Any]]:
        primary_bytes = runtime.state().parameter_bytes
        runtime.variants.memory_rooms = lambda: [MemoryRoom("host", 0, 1 << 50)]
        with structlog.testing.capture_logs() as logs:
            first = runtime.set_degradation(DegradationLevel.FALLBACK_MODEL)
            assert first.converging and first.target_variant is Variant.FALLBACK
            await asyncio.sleep(0)  # the convergence task starts
            assert runtime.ready  # room for both: the primary serves while the fallback loads
            second = runtime.set_degradation(DegradationLevel.CANNED_ANSWERS)
            assert second.converging and second.target_variant is Variant.FALLBACK
            await settled(runtime)
        return primary_bytes, runtime.state(), logs

    primary_bytes, state, logs = run_with_runtime(config, scenario)
    assert state.variant == "fallback" and state.quantization == "int8" and state.ready
    assert state.parameter_bytes is not None and primary_bytes is not None
    assert state.parameter_bytes < 0.5 * primary_bytes
    assert [e["variant"] for e in logs if e["event"] == "model_loaded"] == ["fallback"]


def test_dtype_and_torch_threads_apply_before_the_model_runs(tiny_model_dir: Path) -> None:
    config = ServerConfig(model_dir=tiny_model_dir, dtype=Dtype.BFLOAT16, torch_threads=1)

    async def scenario(runtime: Runtime) -> tuple[set[torch.dtype], int]:
        loaded = runtime.variants.loaded
        assert loaded is not None
        dtypes = {p.dtype for p in loaded.model.parameters()}
        threads = await runtime.on_worker(torch.get_num_threads)
        return dtypes, int(threads)

    dtypes, threads = run_with_runtime(config, scenario)
    assert dtypes == {torch.bfloat16}
    assert threads == 1


def test_a_load_action_during_convergence_on_the_same_variant_does_not_load_again(
    tiny_model_dir: Path,
) -> None:
    config = ServerConfig(
        model_dir=tiny_model_dir, fallback_quantization=Quantization.INT8, torch_threads=1
    )

    async def scenario(runtime: Runtime) -> tuple[ActionResult, list[Any]]:
        with structlog.testing.capture_logs() as logs:
            assert runtime.set_degradation(DegradationLevel.FALLBACK_MODEL).converging
            await asyncio.sleep(0)  # the convergence task holds the model lock
            result = await runtime.run_action("load-1", ActionType.LOAD, Variant.FALLBACK)
            await settled(runtime)
        return result, logs

    result, logs = run_with_runtime(config, scenario)
    assert result.variant == "fallback" and result.model_loaded
    assert [e["variant"] for e in logs if e["event"] == "model_loaded"] == ["fallback"]


def test_fp8_leaves_layers_with_a_zero_row_unquantized_so_its_logits_stay_finite() -> None:
    # Per-row fp8 scales a row by its largest weight: a zero row would be 0/0 (NaN).
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 32))
    with torch.no_grad():
        model[1].weight[3].zero_()
    x = torch.randn(2, 64)

    kept = quantize(model, Quantization.FP8, torch.device("cpu"))

    assert kept == ("1",)
    assert type(model[0].weight).__name__ == "Float8Tensor"
    assert type(model[1].weight) is torch.nn.Parameter
    with torch.no_grad():
        assert bool(torch.isfinite(model(x)).all())


def test_a_fallback_that_computes_nan_is_refused_and_the_primary_serves_on(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_quantize = engine.quantize

    def quantize_into_nan(model: Any, quantization: Quantization, device: torch.device) -> Any:
        kept = real_quantize(model, quantization, device)
        if quantization != Quantization.NONE:
            with torch.no_grad():
                model.model.norm.weight.fill_(float("nan"))  # what a broken kernel would leave
        return kept

    monkeypatch.setattr(engine, "quantize", quantize_into_nan)
    config = ServerConfig(
        model_dir=tiny_model_dir, fallback_quantization=Quantization.INT8, torch_threads=1
    )

    async def scenario(runtime: Runtime) -> tuple[ServerState, ServerState]:
        with pytest.raises(FallbackUnavailable, match="non-finite logits"):
            await runtime.run_action("swap-1", ActionType.SWAP, Variant.FALLBACK)
        after_swap = runtime.state()
        with pytest.raises(FallbackUnavailable, match="non-finite logits"):
            await runtime.run_action("swap-2", ActionType.SWAP, Variant.FALLBACK)
        return after_swap, runtime.state()

    after_swap, after_retry = run_with_runtime(config, scenario)
    assert after_swap.variant == "primary" and after_swap.ready
    assert after_swap.model_loaded and after_swap.quantization == "none"
    assert "non-finite logits" in (after_swap.fallback_unavailable_reason or "")
    assert after_retry.variant == "primary" and after_retry.ready


def test_cuda_attention_leaves_out_cudnn_and_the_cpu_changes_nothing() -> None:
    # cuDNN plans each new shape; a server sees new shapes every step (speed.md).
    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        engine.configure_attention(torch.device("cpu"))
        assert torch.backends.cuda.cudnn_sdp_enabled()
        engine.configure_attention(torch.device("cuda"))
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


def test_every_load_configures_attention_for_its_device(
    tiny_model_dir: Path, tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[torch.device] = []
    monkeypatch.setattr(engine, "configure_attention", seen.append)
    engine.load_model(
        "primary", tiny_model_dir, Quantization.NONE, torch.device("cpu"), tiny_tokenizer
    )
    assert seen == [torch.device("cpu")]
