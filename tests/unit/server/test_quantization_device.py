"""The server refuses a quantization its CUDA device is too old for (issue 32, N3).

torchao's int4 kernel needs compute capability 8.0 and refuses below it only when the
swap runs; `--check-config` must say so first. The device is faked at the hardware
edge (torch.cuda's capability and name), as a T4 or an A100 would report them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fusebox_contract.names import Quantization
from fusebox_server.http.server import main
from fusebox_server.model.quantization import refusal

CUDA = torch.device("cuda")


def fake_gpu(monkeypatch: pytest.MonkeyPatch, name: str, capability: tuple[int, int]) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)


@pytest.mark.parametrize(
    ("name", "capability", "refused"),
    [
        ("Tesla T4", (7, 5), {Quantization.INT4, Quantization.FP8}),
        ("Tesla V100-SXM2-16GB", (7, 0), {Quantization.INT4, Quantization.FP8}),
        ("NVIDIA A100-SXM4-80GB", (8, 0), {Quantization.FP8}),
        ("NVIDIA H100 80GB HBM3", (9, 0), set()),
    ],
)
def test_each_quantization_is_refused_below_its_compute_capability(
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    capability: tuple[int, int],
    refused: set[Quantization],
) -> None:
    fake_gpu(monkeypatch, name, capability)
    reasons = {q: refusal(q, CUDA) for q in Quantization}
    assert {q for q, reason in reasons.items() if reason is not None} == refused
    for quantization in refused:
        needed = quantization.min_compute_capability
        assert needed is not None
        assert reasons[quantization] == (
            f"{quantization.value} quantization needs compute capability >= "
            f"{needed[0]}.{needed[1]}; {name} has {capability[0]}.{capability[1]}"
        )


def test_check_config_refuses_int4_on_a_t4_naming_the_flag(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tiny_model_dir: Path
) -> None:
    fake_gpu(monkeypatch, "Tesla T4", (7, 5))
    argv = ["--check-config", "--model-dir", str(tiny_model_dir), "--device", "cuda"]
    assert main([*argv, "--fallback-quantization", "int4"]) == 2
    assert capsys.readouterr().err.strip() == (
        "fusebox_server: --fallback-quantization int4: int4 quantization needs compute "
        "capability >= 8.0; Tesla T4 has 7.5"
    )
    assert main([*argv, "--fallback-quantization", "int8"]) == 0
    assert "fallback the primary quantized int8" in capsys.readouterr().out
