"""The model zoo: every family builds a release that transformers loads as that family."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fusebox_server.zoo.__main__ import main
from fusebox_server.zoo.families import FAMILIES, Family
from fusebox_server.zoo.release import INDEX, ensure_zoo_model

NAMES = sorted(FAMILIES)
# Chinese, an emoji in the corpus, one that is not (byte-level pieces or byte fallback), digits.
TEXT = "The weather today: 天气很好 ☀️ 🚀 🦀 at 12345 feet"
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Bye"},
]
# Each family's documented turn format: system prompt, two user turns, one answer, and the
# prompt for the next answer.
RENDERED = {
    "llama3": "<|begin_of_text|>"
    "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "qwen2.5": "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
    "<|im_start|>assistant\n",
    "mistral": "<s>[INST] Be brief.\n\nHi [/INST] Hello!</s>[INST] Bye [/INST]",
    "gemma2": "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
    "<start_of_turn>model\nHello!<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n"
    "<start_of_turn>model\n",
    "phi3": "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello!<|end|>\n"
    "<|user|>\nBye<|end|>\n<|assistant|>\n",
}
RENDERED["qwen3"] = RENDERED["qwen2_moe"] = RENDERED["qwen2.5"]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.fixture(scope="module", params=NAMES)
def release(request: pytest.FixtureRequest) -> tuple[Family, Path]:
    return FAMILIES[request.param], ensure_zoo_model(request.param)


def _tokenizer(directory: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)


def test_a_release_is_laid_out_as_released(release: tuple[Family, Path]) -> None:
    family, directory = release
    index = json.loads((directory / INDEX).read_text(encoding="utf-8"))
    shards = set(index["weight_map"].values())
    assert len(shards) >= 2 and all((directory / shard).is_file() for shard in shards)
    assert not (directory / "model.safetensors").exists()
    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    assert config["torch_dtype"] == "float32" and "dtype" not in config
    assert config["vocab_size"] == family.vocab_size
    assert "auto_map" not in config
    generation = json.loads((directory / "generation_config.json").read_text(encoding="utf-8"))
    assert generation["eos_token_id"] == list(family.generation_eos)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (directory / name).is_file(), name
    specials = json.loads((directory / "special_tokens_map.json").read_text(encoding="utf-8"))
    assert specials["eos_token"] == family.eos_token


def test_transformers_loads_the_release_as_the_family(release: tuple[Family, Path]) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    family, directory = release
    config: Any = AutoConfig.from_pretrained(str(directory), local_files_only=True)
    assert type(config).__name__ == family.config_class
    for key in ("num_attention_heads", "num_key_value_heads", "head_dim", "sliding_window"):
        if key in family.config:
            assert getattr(config, key) == family.config[key], key
    assert config.rope_parameters["rope_type"] == family.config["rope_parameters"]["rope_type"]
    assert config.tie_word_embeddings == family.config["tie_word_embeddings"]
    model: Any = AutoModelForCausalLM.from_pretrained(str(directory), local_files_only=True)
    assert model.get_output_embeddings().weight.shape[0] == family.vocab_size
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert tied == family.config["tie_word_embeddings"]


def test_the_special_tokens_sit_at_the_familys_ids(release: tuple[Family, Path]) -> None:
    family, directory = release
    tokenizer = _tokenizer(directory)
    for token, token_id in family.special_tokens.items():
        assert tokenizer.convert_tokens_to_ids(token) == token_id, token
    assert tokenizer.eos_token_id == family.token_id(family.eos_token)
    with_specials = tokenizer.encode("Hi", add_special_tokens=True)
    if family.bos_token is None:
        assert with_specials == tokenizer.encode("Hi", add_special_tokens=False)
    else:
        assert with_specials[0] == family.token_id(family.bos_token)


def test_only_special_tokens_are_dropped_when_decoding_skips_specials(
    release: tuple[Family, Path],
) -> None:
    """A server decodes with skip_special_tokens: Qwen's `<tool_call>` markers must stay in
    the text (its call parser reads them), as its releases mark them not special."""
    family, directory = release
    tokenizer = _tokenizer(directory)
    for token, token_id in family.special_tokens.items():
        kept = tokenizer.decode([token_id], skip_special_tokens=True)
        assert kept == (token if token in family.plain_tokens else ""), token
    if family.name.startswith("qwen"):
        assert family.plain_tokens == {"<tool_call>", "</tool_call>"}


def test_text_with_chinese_and_emoji_round_trips(release: tuple[Family, Path]) -> None:
    family, directory = release
    tokenizer = _tokenizer(directory)
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    assert tokenizer.decode(ids) == TEXT
    assert max(ids) < family.vocab_size
    if family.tokenizer_kind == "sentencepiece":
        # The crab is not in the corpus: its four UTF-8 bytes fall back to byte tokens.
        crab = tokenizer.encode("🦀", add_special_tokens=False)
        assert [token - family.byte_tokens_at for token in crab[-4:]] == list("🦀".encode())


def test_the_template_renders_a_system_prompt_and_two_turns(release: tuple[Family, Path]) -> None:
    family, directory = release
    tokenizer = _tokenizer(directory)
    rendered = tokenizer.apply_chat_template(
        CONVERSATION, tokenize=False, add_generation_prompt=family.name != "mistral"
    )
    assert rendered == RENDERED[family.name]


def test_qwen_25_adds_its_default_system_prompt_and_qwen3_does_not() -> None:
    turn = [{"role": "user", "content": "Hi"}]
    qwen25 = _tokenizer(ensure_zoo_model("qwen2.5")).apply_chat_template(turn, tokenize=False)
    qwen3 = _tokenizer(ensure_zoo_model("qwen3")).apply_chat_template(turn, tokenize=False)
    assert qwen25.startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.")
    assert qwen3 == "<|im_start|>user\nHi<|im_end|>\n"


@pytest.mark.parametrize("name", ["qwen2.5", "qwen3", "llama3"])
def test_a_tool_round_trip_renders_in_the_familys_tool_format(name: str) -> None:
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
    messages = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": '{"temperature": 3}'},
    ]
    rendered = _tokenizer(ensure_zoo_model(name)).apply_chat_template(
        messages, tools=[WEATHER_TOOL], tokenize=False, add_generation_prompt=True
    )
    assert '"name": "get_weather"' in rendered and '"city": "Oslo"' in rendered
    if name == "llama3":
        assert "Environment: ipython" in rendered
        assert '<|start_header_id|>ipython<|end_header_id|>\n\n{"temperature": 3}' in rendered
    else:
        assert "<tools>\n" in rendered and "<tool_call>\n" in rendered
        assert '<tool_response>\n{"temperature": 3}\n</tool_response>' in rendered


def test_the_cli_names_an_unknown_family_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["build", "llama3", "gpt5"]) == 2
    assert "unknown family: gpt5" in capsys.readouterr().err


def test_the_cli_builds_into_the_cache_and_prints_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cached = ensure_zoo_model("mistral")  # the suite's cache
    monkeypatch.setenv("FUSEBOX_CACHE", str(tmp_path))
    assert main(["build", "mistral"]) == 0
    printed = capsys.readouterr().out.strip()
    directory = Path(printed.removeprefix("mistral: "))
    assert directory.parent == tmp_path / "models" and (directory / INDEX).is_file()
    # The same bytes every time: this build's weights are the suite cache's.
    assert cached != directory
    for shard in sorted(directory.glob("*.safetensors")):
        assert (cached / shard.name).read_bytes() == shard.read_bytes()
