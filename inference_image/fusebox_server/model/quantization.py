"""Which quantizations this device can serve, and applying one to a loaded model.

Why: a quantization the device cannot run must be found before it matters.
`--check-config` asks `refusal` and exits 2 with its reason; the running
server asks it too and, instead of crash-looping, serves the primary and
reports the fallback unavailable with that reason. All three are torchao
weight-only configurations, applied after the weights are on the device:
int8 (CPU and CUDA), int4 (CUDA: tinygemm's bfloat16 kernel, so the
variant loads in bfloat16) and fp8; the compute capability each needs is the
contract's `Quantization.min_compute_capability`, the operator's table too
(int4 >= 8.0: torchao refuses below it at swap time; fp8 >= 8.9).

fp8 scales each output row by its largest weight, and torchao 0.18 divides by
that scale unguarded: a row of zeros (unused vocabulary rows of an lm_head
are often zero) becomes 0/0, NaN logits, and on CUDA a device-side assert in
sampling that poisons the process. Such layers keep the primary dtype;
`quantize` returns their names so the load can say so.
"""

from __future__ import annotations

from typing import Any, Final

import torch

from fusebox_contract.names import Dtype, Quantization

# tinygemm's int4 kernel takes bfloat16 activations and groups of 128 input features.
INT4_DTYPE: Final = torch.bfloat16
INT4_GROUP_SIZE: Final = 128

TORCH_DTYPES: Final = {
    Dtype.BFLOAT16: torch.bfloat16,
    Dtype.FLOAT16: torch.float16,
    Dtype.FLOAT32: torch.float32,
}


def refusal(quantization: Quantization, device: torch.device) -> str | None:
    """Why `device` cannot serve `quantization`, or None when it can."""
    needed = quantization.min_compute_capability
    if needed is None:
        return None
    if device.type != "cuda":
        return (
            f"{quantization.value} quantization needs a CUDA device; this server runs on {device}"
        )
    capability = torch.cuda.get_device_capability(device)
    if capability < needed:
        name = torch.cuda.get_device_name(device)
        return (
            f"{quantization.value} quantization needs compute capability >= "
            f"{needed[0]}.{needed[1]}; {name} has {capability[0]}.{capability[1]}"
        )
    return None


def load_dtype(dtype: Dtype, quantization: Quantization) -> torch.dtype | str:
    """The `dtype` to pass to from_pretrained: as asked, except what a kernel requires."""
    if quantization == Quantization.INT4:
        return INT4_DTYPE
    return TORCH_DTYPES.get(dtype, "auto")


def has_zero_row(weight: torch.Tensor) -> bool:
    """Whether some output row of a linear weight is all zeros (per-row fp8 cannot scale it)."""
    return bool((weight.detach().abs().amax(dim=1) == 0).any())


def quantize(model: Any, quantization: Quantization, device: torch.device) -> tuple[str, ...]:
    """Quantize the linear layers' weights in place (weight-only, with torchao).

    Returns the linear layers left in the model's dtype (fp8: those with a zero row).
    """
    if quantization == Quantization.NONE:
        return ()
    from torchao.quantization import (
        Float8WeightOnlyConfig,
        Int4WeightOnlyConfig,
        Int8WeightOnlyConfig,
        quantize_,
    )

    config: Any
    if quantization == Quantization.INT8:
        config = Int8WeightOnlyConfig()
    elif quantization == Quantization.INT4:
        config = Int4WeightOnlyConfig(
            group_size=INT4_GROUP_SIZE, int4_packing_format="tile_packed_to_4d"
        )
    else:
        config = Float8WeightOnlyConfig()
    linears = {
        name: module
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear)
    }
    kept = tuple(
        name
        for name, module in linears.items()
        if quantization == Quantization.FP8 and has_zero_row(module.weight)
    )
    quantize_(
        model,
        config,
        filter_fn=lambda module, name: name in linears and name not in kept,
        device=device,
    )
    return kept
