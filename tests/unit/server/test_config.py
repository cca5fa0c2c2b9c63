"""Flags and FUSEBOX_* environment variables."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fusebox_server.config import ConfigError, env_name, parse_config


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
        ["--model-dir", "/m", "--max-concurrency", "0"],
        ["--model-dir", "/m", "--request-timeout", "-1"],
        ["--model-dir", "/m", "--device", "tpu"],
        ["--model-dir", "/m", "--quality-sample-rate", "2"],
    ],
)
def test_invalid_settings_are_refused(argv: list[str]) -> None:
    with pytest.raises(ConfigError):
        parse_config(argv, {})


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
