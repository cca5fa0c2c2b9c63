"""The model's context window, and the token limits that must fit in it.

Why: `--max-input-tokens` and `--max-new-tokens` are the server's own
limits, but the model has one of its own: the positions it was built for
(`max_position_embeddings` in its config.json). A prompt plus its new tokens
beyond that is not a request the model can serve: a llama-style model just
computes garbage there, with HTTP 200. So the limits are fitted to the
window once at start (a misfit that a user asked for stops the server with
exit 2 and a message naming the settings and the window), and every request
is checked against the window (400 `context_length_exceeded`, as OpenAI and
vLLM answer).

A limit at its declared default (4096 prompt tokens, 1024 new tokens) is a
ceiling, not a promise: it shrinks to fit the window, and the request check
guards the sum. The operator renders the CRD's defaults into the pod, so
"at the default" is read from the value, not from whether it was given. A
limit set to anything else is a promise that every request within it is
served, so the two such limits must fit the window together.

A sliding window (Mistral, Gemma 2) does not bound the context: it bounds
how far back a layer attends, and both batches apply it in their attention
masks (the zoo's per-family tests hold them to transformers past the
window, docs/decisions/model-zoo.md), so the window is the positions'.

The reading (`read_context_window`) is the only I/O here; the rest is pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from fusebox_server.config import ConfigError
from fusebox_server.control.early_checks import read_model_config
from fusebox_server.errors import ContextLengthExceeded

# The config.json keys that name a model's positions, in the order transformers' own
# configs use them (llama/mistral/qwen, gpt2, older gpt2 exports, mpt/falcon, chatglm).
POSITION_KEYS: Final = (
    "max_position_embeddings",
    "n_positions",
    "n_ctx",
    "max_sequence_length",
    "seq_length",
)
SPEC_FIELDS: Final = "InferenceService spec.server.maxInputTokens and maxNewTokens"


@dataclass(frozen=True)
class ContextWindow:
    """How many tokens (prompt plus generated) the model can attend over, and where it says so."""

    tokens: int
    source: str  # e.g. "max_position_embeddings in /models/chat/config.json"


@dataclass(frozen=True)
class TokenLimits:
    max_input_tokens: int
    max_new_tokens: int


def window_of(model_config: Mapping[str, Any], config_path: str) -> ContextWindow | None:
    """The window a model's config.json declares, or None when it declares none."""
    text_config = model_config.get("text_config")
    if isinstance(text_config, Mapping):  # a multimodal model: its language model decides
        model_config = text_config
    found: ContextWindow | None = None
    for key in POSITION_KEYS:
        value = model_config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            found = ContextWindow(value, f"{key} in {config_path}")
            break
    return found


def read_context_window(model_dir: Path, flag: str = "--model-dir") -> ContextWindow | None:
    """The window of the model in `model_dir` (its config.json, read as the start-up
    checks read it), or None when it names none."""
    return window_of(read_model_config(model_dir, flag), str(model_dir / "config.json"))


def narrowest(windows: list[ContextWindow | None]) -> ContextWindow | None:
    """The smallest of the variants' windows: either variant may serve any request."""
    known = [window for window in windows if window is not None]
    return min(known, key=lambda window: window.tokens) if known else None


def fit_token_limits(
    requested: TokenLimits, defaults: TokenLimits, window: ContextWindow
) -> TokenLimits:
    """The limits to serve with: default ones shrink into the window, chosen ones must fit.

    Raises ConfigError, naming both settings and the window, when limits set
    to other than their defaults cannot fit.
    """
    limit_in, limit_new = requested.max_input_tokens, requested.max_new_tokens
    if limit_in + limit_new <= window.tokens:
        return requested
    chose_in = limit_in != defaults.max_input_tokens
    chose_new = limit_new != defaults.max_new_tokens
    # A default limit leaves a chosen one all the room it needs but one token of its own.
    fitted_in = (
        limit_in if chose_in else min(limit_in, window.tokens - (limit_new if chose_new else 1))
    )
    fitted_new = (
        limit_new if chose_new else min(limit_new, window.tokens - (limit_in if chose_in else 1))
    )
    if (chose_in and chose_new) or fitted_in < 1 or fitted_new < 1:
        raise ConfigError(
            f"--max-input-tokens {limit_in} + --max-new-tokens {limit_new} = "
            f"{limit_in + limit_new} tokens do not fit the model's context window of "
            f"{window.tokens} tokens ({window.source}); lower them so their sum is at most "
            f"{window.tokens} ({SPEC_FIELDS})"
        )
    return TokenLimits(fitted_in, fitted_new)


def generation_budget(
    prompt_tokens: int,
    requested_max_tokens: int | None,
    max_new_tokens: int,
    window_tokens: int | None,
    param: str,
) -> int:
    """The new tokens a request may generate: what it asked for, else as many as the window
    leaves up to `max_new_tokens` (as OpenAI and vLLM default `max_tokens`).

    Raises ContextLengthExceeded (400) when the prompt and the asked-for tokens
    do not fit the window, or the prompt leaves no room for one new token.
    """
    wanted = max_new_tokens if requested_max_tokens is None else requested_max_tokens
    if window_tokens is None:
        return wanted
    room = window_tokens - prompt_tokens
    if requested_max_tokens is None and room >= 1:
        return min(wanted, room)
    if wanted > room:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {window_tokens} tokens. However, you "
            f"requested {prompt_tokens + wanted} tokens ({prompt_tokens} in the {param}, "
            f"{wanted} in the completion). Please reduce the length of the {param} or "
            "completion.",
            param=param,
        )
    return wanted
