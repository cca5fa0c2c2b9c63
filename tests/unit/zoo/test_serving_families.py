"""The server takes every zoo family's release, and refuses models it must not run, by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fusebox_server.config import ConfigError, ServerConfig
from fusebox_server.control.preflight import check_config, check_model_dirs
from fusebox_server.http.server import main
from fusebox_server.zoo.families import FAMILIES
from fusebox_server.zoo.release import ensure_zoo_model


def _with_config(directory: Path, into: Path, **changes: object) -> Path:
    """The release with config.json changed; the other files linked."""
    into.mkdir()
    for path in directory.iterdir():
        if path.name != "config.json":
            (into / path.name).symlink_to(path)
    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    config.update(changes)
    (into / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return into


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_check_config_takes_every_familys_release_and_names_its_architecture(name: str) -> None:
    directory = ensure_zoo_model(name)
    summary = check_config(ServerConfig(model_dir=directory, device="cpu"))
    architecture = json.loads((directory / "config.json").read_text())["architectures"][0]
    assert f"({architecture}) from {directory}" in summary
    window = FAMILIES[name].config["max_position_embeddings"]
    assert f"context window {window} tokens" in summary


def test_a_model_with_its_own_code_is_refused_naming_auto_map(tmp_path: Path) -> None:
    remote = _with_config(
        ensure_zoo_model("llama3"),
        tmp_path / "remote",
        auto_map={"AutoModelForCausalLM": "modeling_custom.CustomForCausalLM"},
    )
    with pytest.raises(ConfigError, match=r"auto_map \(AutoModelForCausalLM\).*trust_remote_code"):
        check_model_dirs(ServerConfig(model_dir=remote))


def test_an_unknown_architecture_is_refused_by_name(tmp_path: Path) -> None:
    unknown = _with_config(
        ensure_zoo_model("mistral"), tmp_path / "unknown", architectures=["FooForCausalLM"]
    )
    with pytest.raises(ConfigError, match="architecture FooForCausalLM is not a causal language"):
        check_model_dirs(ServerConfig(model_dir=ensure_zoo_model("qwen3"), fallback_dir=unknown))


def test_the_server_exits_2_naming_a_refused_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    unknown = _with_config(
        ensure_zoo_model("qwen3"), tmp_path / "unknown", architectures=["FooForCausalLM"]
    )
    assert main(["--model-dir", str(unknown), "--device", "cpu"]) == 2
    error = capsys.readouterr().err
    assert f"--model-dir {unknown}: architecture FooForCausalLM" in error


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_streamed_pieces_are_whole_characters_for_every_tokenizer(name: str) -> None:
    from fusebox_server.model.tokenization import IncrementalDecoder, load_tokenizer

    tokenizer = load_tokenizer(ensure_zoo_model(name))
    # Byte-level pieces of Chinese and emoji; byte-fallback tokens for the crab (not learned).
    text = "天气很好 ☀️ and a 🦀 walks by 🚀"
    decoder = IncrementalDecoder(tokenizer)
    pieces = [decoder.push(token) for token in tokenizer.encode(text, add_special_tokens=False)]
    pieces.append(decoder.flush())
    assert "".join(pieces) == text
    assert not any("\ufffd" in piece for piece in pieces)


@pytest.mark.parametrize("name", ["gemma2", "phi3", "qwen2_moe"])
def test_the_int8_fallback_loads_and_answers_in_a_batch(name: str) -> None:
    # The layouts least like Llama's: tied embeddings, fused projections, routed experts.
    import torch

    from fusebox_server.model.decode_settings import DecodeSettings
    from fusebox_server.model.engine import Decoding, check_logits_finite, load_model, prefill
    from fusebox_server.model.slot_batch import SlotBatch
    from fusebox_server.model.tokenization import load_tokenizer

    directory = ensure_zoo_model(name)
    tokenizer = load_tokenizer(directory)
    loaded = load_model("fallback", directory, "int8", torch.device("cpu"), tokenizer)
    prompt = tuple(tokenizer.encode("Hello there, 你好", add_special_tokens=True))
    check_logits_finite(loaded, prompt)
    greedy = DecodeSettings(max_new_tokens=4, temperature=0.0, top_p=1.0, seed=None, stop=())
    rows = [Decoding(loaded, prompt, greedy), Decoding(loaded, prompt[:3], greedy)]
    assert all(isinstance(token, int) for token in prefill(loaded, rows))
    batch = SlotBatch(loaded, graphs=False)
    batch.add(*rows)
    for _ in range(2):
        assert all(isinstance(token, int) for token in batch.step())
    assert loaded.quantization == "int8" and loaded.kernels["packed_linear_layers"] == 0
