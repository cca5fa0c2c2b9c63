"""The model's context window bounds the token limits at start and every request."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fusebox_server.config import ConfigError, ServerConfig
from fusebox_server.control.context_window import (
    ContextWindow,
    TokenLimits,
    fit_token_limits,
    generation_budget,
    read_context_window,
    window_of,
)
from fusebox_server.control.preflight import DEFAULT_TOKEN_LIMITS, fit_to_context_window
from fusebox_server.errors import ContextLengthExceeded

WINDOW_64 = ContextWindow(64, "max_position_embeddings in /m/config.json")
WINDOW_4K = ContextWindow(4096, "max_position_embeddings in /m/config.json")


def test_the_window_is_max_position_embeddings_or_its_older_names() -> None:
    assert window_of({"max_position_embeddings": 4096}, "c.json") == ContextWindow(
        4096, "max_position_embeddings in c.json"
    )
    assert window_of({"n_positions": 1024}, "c.json") == ContextWindow(
        1024, "n_positions in c.json"
    )
    assert window_of({"text_config": {"max_position_embeddings": 8192}}, "c.json") == (
        ContextWindow(8192, "max_position_embeddings in c.json")
    )
    assert window_of({"hidden_size": 8}, "c.json") is None


def test_a_sliding_window_does_not_bound_the_context() -> None:
    # The batches slide (tests/unit/zoo/test_family_decoding.py): the positions are the window.
    mistral = {"max_position_embeddings": 32768, "sliding_window": 4096}
    assert window_of(mistral, "c.json") == ContextWindow(32768, "max_position_embeddings in c.json")


def test_the_defaults_shrink_into_a_small_window_each_leaving_room_for_the_other() -> None:
    assert fit_token_limits(DEFAULT_TOKEN_LIMITS, DEFAULT_TOKEN_LIMITS, WINDOW_4K) == (
        TokenLimits(4095, 1024)
    )
    assert fit_token_limits(DEFAULT_TOKEN_LIMITS, DEFAULT_TOKEN_LIMITS, WINDOW_64) == (
        TokenLimits(63, 63)
    )


def test_a_default_limit_gives_way_to_a_chosen_one() -> None:
    chosen_new = TokenLimits(DEFAULT_TOKEN_LIMITS.max_input_tokens, 16)
    assert fit_token_limits(chosen_new, DEFAULT_TOKEN_LIMITS, WINDOW_64) == TokenLimits(48, 16)
    chosen_input = TokenLimits(40, DEFAULT_TOKEN_LIMITS.max_new_tokens)
    assert fit_token_limits(chosen_input, DEFAULT_TOKEN_LIMITS, WINDOW_64) == TokenLimits(40, 24)


def test_limits_that_fit_are_kept_as_they_are() -> None:
    assert fit_token_limits(TokenLimits(32, 32), DEFAULT_TOKEN_LIMITS, WINDOW_64) == (
        TokenLimits(32, 32)
    )


@pytest.mark.parametrize(
    "asked",
    [
        pytest.param(TokenLimits(256, 512), id="both-chosen"),
        pytest.param(TokenLimits(64, DEFAULT_TOKEN_LIMITS.max_new_tokens), id="input-fills-it"),
        pytest.param(TokenLimits(DEFAULT_TOKEN_LIMITS.max_input_tokens, 80), id="new-over-it"),
    ],
)
def test_chosen_limits_that_cannot_fit_are_refused_naming_both_and_the_window(
    asked: TokenLimits,
) -> None:
    with pytest.raises(ConfigError) as refused:
        fit_token_limits(asked, DEFAULT_TOKEN_LIMITS, WINDOW_64)
    message = str(refused.value)
    assert f"--max-input-tokens {asked.max_input_tokens}" in message
    assert f"--max-new-tokens {asked.max_new_tokens}" in message
    assert "context window of 64 tokens" in message
    assert "max_position_embeddings in /m/config.json" in message


def test_without_max_tokens_a_request_gets_the_room_the_window_leaves() -> None:
    assert generation_budget(30, None, 63, 64, "prompt") == 34
    assert generation_budget(3, None, 16, 64, "prompt") == 16
    assert generation_budget(3, None, 16, None, "prompt") == 16  # no window known


def test_a_request_beyond_the_window_is_refused_like_openai_does() -> None:
    with pytest.raises(ContextLengthExceeded) as refused:
        generation_budget(30, 50, 63, 64, "messages")
    error = refused.value
    assert (error.status, error.code, error.param) == (400, "context_length_exceeded", "messages")
    assert error.message == (
        "This model's maximum context length is 64 tokens. However, you requested 80 tokens "
        "(30 in the messages, 50 in the completion). Please reduce the length of the messages "
        "or completion."
    )
    assert generation_budget(30, 34, 63, 64, "messages") == 34  # exactly the window
    with pytest.raises(ContextLengthExceeded):
        generation_budget(64, None, 63, 64, "prompt")  # no room for one new token


def _model_dir(tmp_path: Path, name: str, model_config: object) -> Path:
    directory = tmp_path / name
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(model_config))
    return directory


def test_the_narrower_window_of_primary_and_fallback_counts(tmp_path: Path) -> None:
    primary = _model_dir(tmp_path, "primary", {"max_position_embeddings": 4096})
    fallback = _model_dir(tmp_path, "fallback", {"max_position_embeddings": 64})
    config = fit_to_context_window(ServerConfig(model_dir=primary, fallback_dir=fallback))
    assert config.context_window_tokens == 64
    assert (config.max_input_tokens, config.max_new_tokens) == (63, 63)


def test_a_model_that_names_no_window_leaves_the_limits_alone(tmp_path: Path) -> None:
    config = ServerConfig(model_dir=_model_dir(tmp_path, "m", {"hidden_size": 8}))
    assert fit_to_context_window(config) == config


def test_an_unreadable_config_json_is_a_configuration_error(tmp_path: Path) -> None:
    directory = tmp_path / "m"
    directory.mkdir()
    (directory / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="config.json"):
        read_context_window(directory)
