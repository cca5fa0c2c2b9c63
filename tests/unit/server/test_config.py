"""Flags and FUSEBOX_* environment variables, all from the contract's one declaration."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fusebox_contract.names import Dtype, Quantization
from fusebox_contract.settings import SERVER_SETTINGS, body_limit_bytes
from fusebox_server.config import (
    ConfigError,
    QualitySettings,
    ServerConfig,
    build_parser,
    config_field_names,
    env_name,
    field_name,
    flags_table,
    parse_command_line,
    parse_config,
    prefill_chunk_tokens_for,
)

DOCS = Path(__file__).resolve().parents[3] / "docs" / "server.md"


def test_every_flag_reads_its_environment_variable() -> None:
    config = parse_config(
        [],
        {
            "FUSEBOX_MODEL_DIR": "/models/chat",
            "FUSEBOX_MAX_CONCURRENCY": "3",
            "FUSEBOX_REQUEST_TIMEOUT": "2.5",
            "FUSEBOX_FALLBACK_QUANTIZATION": "none",
            "FUSEBOX_ADMIN_PORT": "9001",
        },
    )
    assert config.model_dir == Path("/models/chat")
    assert config.max_concurrency == 3
    assert config.request_timeout_seconds == 2.5
    assert config.fallback_quantization == "none"
    assert config.admin_port == 9001
    assert config.port == 8000
    assert config.stats_file == Path("/run/fusebox/stats.json")


def test_a_flag_wins_over_the_environment() -> None:
    config = parse_config(
        ["--max-queue", "5"], {"FUSEBOX_MODEL_DIR": "/m", "FUSEBOX_MAX_QUEUE": "9"}
    )
    assert config.max_queue == 5


def test_env_names_follow_the_flag_names() -> None:
    assert env_name("tokenizer-cache-size") == "FUSEBOX_TOKENIZER_CACHE_SIZE"


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--model-dir", "/m", "--fallback-quantization", "int3"],
        ["--model-dir", "/m", "--fallback-quantization", "awq"],
        ["--model-dir", "/m", "--dtype", "float8"],
        ["--model-dir", "/m", "--torch-threads", "-1"],
        ["--model-dir", "/m", "--port", "70000"],
        ["--model-dir", "/m", "--max-concurrency", "0"],
        ["--model-dir", "/m", "--request-timeout", "-1"],
        ["--model-dir", "/m", "--device", "tpu"],
    ],
)
def test_invalid_settings_are_refused(argv: list[str]) -> None:
    with pytest.raises(ConfigError):
        parse_config(argv, {})


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("heartbeat-timeout", "-1"),  # /healthz would be 503 forever
        ("heartbeat-timeout", "nan"),
        ("heartbeat-timeout", "0"),
        ("latency-window", "-5"),
        ("latency-window", "nan"),
        ("latency-window", "inf"),
        ("request-timeout", "nan"),
        ("log-level", "verbose"),  # once read as info without a word
        ("log-level", ""),
        ("model-name", ""),
        ("model-name", "  "),
        ("host", ""),
        ("stats-file", ""),
        ("memory-guard-ratio", "nan"),
        ("prefix-cache-bytes", "-1"),
        ("prefill-chunk-tokens", "-1"),
        ("prefill-chunk-tokens", "1.5"),
    ],
)
def test_a_setting_out_of_its_documented_range_is_refused_by_name(flag: str, value: str) -> None:
    for argv in (
        ["--model-dir", "/m", f"--{flag}", value],
        ["--check-config", "--model-dir", "/m"],
    ):
        environ = (
            {} if f"--{flag}" in argv else {f"FUSEBOX_{flag.replace('-', '_').upper()}": value}
        )
        with pytest.raises(ConfigError, match=f"--{flag}"):
            parse_command_line(argv, environ)


def test_the_log_level_takes_each_documented_choice() -> None:
    for level in ("debug", "info", "warning", "error"):
        assert parse_config(["--model-dir", "/m", "--log-level", level], {}).log_level == level


def test_templates_and_canned_answers_are_read_from_json(tmp_path: Path) -> None:
    templates = tmp_path / "t.json"
    templates.write_text(json.dumps(["你好", "hi"]))
    canned = tmp_path / "c.json"
    canned.write_text(json.dumps({"你好": "你好！"}))
    config = parse_config(
        [
            "--model-dir",
            "/m",
            "--templates-file",
            str(templates),
            "--canned-answers-file",
            str(canned),
        ],
        {},
    )
    assert config.templates == ("你好", "hi")
    assert config.canned_answers == {"你好": "你好！"}
    canned.write_text("[1]")
    with pytest.raises(ConfigError, match="canned"):
        parse_config(["--model-dir", "/m", "--canned-answers-file", str(canned)], {})


def test_the_quality_file_sets_each_key_and_defaults_the_rest(tmp_path: Path) -> None:
    quality = tmp_path / "quality.json"
    quality.write_text(json.dumps({"sampleRate": 1, "blockedTerms": ["secret"]}))
    config = parse_config(["--model-dir", "/m", "--quality-file", str(quality)], {})
    assert config.quality == QualitySettings(1.0, 100.0, ("secret",))
    assert parse_config(["--model-dir", "/m"], {}).quality == QualitySettings()


@pytest.mark.parametrize(
    ("content", "named"),
    [
        ({"sampleRate": 2}, "sampleRate must be within 0..1"),
        ({"sampleRate": "all"}, "sampleRate must be a number"),
        ({"sampleRate": True}, "sampleRate must be a number"),
        ({"maxOutputInputRatio": 0}, "maxOutputInputRatio must be a positive number"),
        ({"blockedTerms": "secret"}, "blockedTerms must be a list of strings"),
        ({"sample_rate": 0.5}, "unknown key sample_rate"),
        (["secret"], "expected a JSON object"),
    ],
)
def test_a_bad_quality_file_is_refused_naming_the_key(
    tmp_path: Path, content: object, named: str
) -> None:
    quality = tmp_path / "quality.json"
    quality.write_text(json.dumps(content))
    with pytest.raises(ConfigError, match=named):
        parse_config(["--model-dir", "/m", "--quality-file", str(quality)], {})


def test_every_declared_setting_is_a_flag_an_env_fallback_and_a_config_field() -> None:
    parser_flags = {a.option_strings[0] for a in build_parser({})._actions if a.option_strings}
    fields = set(config_field_names())
    for setting in SERVER_SETTINGS:
        assert f"--{setting.flag}" in parser_flags
        assert field_name(setting) in fields
    # Nothing in ServerConfig that the contract does not declare, but the files' content
    # and the model's context window (read from its config.json at start).
    declared = {field_name(s) for s in SERVER_SETTINGS}
    assert fields - declared == {"templates", "canned_answers", "quality", "context_window_tokens"}


def test_every_declared_default_reaches_the_config() -> None:
    config = parse_config(["--model-dir", "/m"], {})
    for setting in SERVER_SETTINGS:
        if setting.default is None:
            continue
        value = getattr(config, field_name(setting))
        assert str(value) == str(setting.default) or value == setting.kind(setting.default)


def test_the_defaults_have_no_fallback_and_load_as_saved() -> None:
    config = parse_config(["--model-dir", "/m"], {})
    assert config.fallback_quantization is Quantization.NONE
    assert config.fallback_configured is False
    assert config.dtype is Dtype.AUTO
    assert parse_config(["--model-dir", "/m", "--fallback-dir", "/f"], {}).fallback_configured
    quantized = parse_config(["--model-dir", "/m", "--fallback-quantization", "int4"], {})
    assert quantized.fallback_configured and quantized.fallback_quantization is Quantization.INT4


def test_new_settings_read_their_variables() -> None:
    config = parse_config(
        [],
        {
            "FUSEBOX_MODEL_DIR": "/m",
            "FUSEBOX_DTYPE": "bfloat16",
            "FUSEBOX_MODEL_REVISION": "v1.2",
            "FUSEBOX_TORCH_THREADS": "3",
            "FUSEBOX_FALLBACK_QUANTIZATION": "fp8",
        },
    )
    assert config.dtype is Dtype.BFLOAT16
    assert config.model_revision == "v1.2"
    assert config.torch_threads == 3
    assert config.fallback_quantization is Quantization.FP8


def test_the_body_limit_follows_max_input_tokens_unless_set() -> None:
    derived = parse_config(["--model-dir", "/m", "--max-input-tokens", "1048576"], {})
    assert derived.max_body_bytes == body_limit_bytes(1048576)
    assert derived.max_body_bytes > 1 << 20
    explicit = parse_config(
        ["--model-dir", "/m", "--max-input-tokens", "1048576", "--max-body-bytes", "2048"], {}
    )
    assert explicit.max_body_bytes == 2048
    assert ServerConfig(model_dir=Path("/m")).max_body_bytes == body_limit_bytes(4096)


def test_files_can_be_left_unread_for_a_rendered_pod() -> None:
    config = parse_config(
        [],
        {"FUSEBOX_MODEL_DIR": "/m", "FUSEBOX_TEMPLATES_FILE": "/nowhere/t.json"},
        read_files=False,
    )
    assert config.templates_file == Path("/nowhere/t.json")
    with pytest.raises(ConfigError, match="templates"):
        parse_config([], {"FUSEBOX_MODEL_DIR": "/m", "FUSEBOX_TEMPLATES_FILE": "/nowhere/t.json"})


def test_the_flags_table_in_the_docs_is_generated_from_the_settings() -> None:
    text = DOCS.read_text(encoding="utf-8")
    match = re.search(
        r"<!-- flags-table:begin -->\n(.*?)\n<!-- flags-table:end -->", text, re.DOTALL
    )
    assert match, "docs/server.md lacks the generated flags table markers"
    assert match.group(1) == flags_table(), (
        "docs/server.md's flags table is stale: paste fusebox_server.config.flags_table()"
    )


def test_an_unset_prefill_chunk_is_64_on_the_cpu_and_whole_prompts_on_cuda() -> None:
    """No GPU has measured a chunk size: CUDA keeps whole prefills unless told."""
    unset = parse_config([], {"FUSEBOX_MODEL_DIR": "/m"}, read_files=False)
    assert unset.prefill_chunk_tokens is None
    assert prefill_chunk_tokens_for("cpu", unset.prefill_chunk_tokens) == 64
    assert prefill_chunk_tokens_for("cuda", unset.prefill_chunk_tokens) == 0
    for device in ("cpu", "cuda"):
        assert prefill_chunk_tokens_for(device, 512) == 512
        assert prefill_chunk_tokens_for(device, 0) == 0
