"""`python -m fusebox_server --check-config`: validate a configuration before deploying it.

Why: a configuration the server would refuse must be found by whoever
writes it (`helm template`-style), not by a pod in CrashLoopBackOff. This
checks everything the server checks at start except what needs the model
in memory or the ports: the flags and env, the JSON files, the model
directories (present, with a config.json naming an architecture transformers
knows, and no code of their own: `model_refusal`), the token limits against the
models' context window, the admin token file, the device `--device`
resolves to, and whether that device can serve the fallback's quantization.
It imports torch (to see the device) but loads no weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

import torch

from fusebox_contract import settings as contract
from fusebox_server.config import ConfigError, ServerConfig
from fusebox_server.control.context_window import (
    TokenLimits,
    fit_token_limits,
    narrowest,
    read_context_window,
)
from fusebox_server.control.early_checks import read_model_config
from fusebox_server.model.engine import pick_device
from fusebox_server.model.quantization import refusal

# The declared defaults: a limit at its default shrinks to fit the window (context_window.py).
DEFAULT_TOKEN_LIMITS: Final = TokenLimits(
    int(str(contract.MAX_INPUT_TOKENS.default)), int(str(contract.MAX_NEW_TOKENS.default))
)


def model_refusal(model_config: Mapping[str, Any]) -> str | None:
    """Why the server will not load the model of this config.json, or None.

    A config with `auto_map` ships its own modelling code, which runs only
    with `trust_remote_code`: Fusebox never sets it (only code in the image
    runs), so such a model is refused by name rather than failing in the
    loader. An architecture transformers does not know as a causal language
    model is refused the same way, with the transformers version that
    does not know it.
    """
    from transformers import __version__ as transformers_version
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    auto_map = model_config.get("auto_map")
    if auto_map:
        names = ", ".join(sorted(auto_map)) if isinstance(auto_map, Mapping) else str(auto_map)
        return (
            f"config.json has auto_map ({names}): the model needs its own code "
            "(trust_remote_code), which Fusebox never runs"
        )
    known = {name for name in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values() if isinstance(name, str)}
    architectures = model_config.get("architectures") or []
    unknown = [str(name) for name in architectures if name not in known]
    if unknown or not architectures:
        model_type = model_config.get("model_type")
        if not architectures and model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
            return None
        named = ", ".join(unknown) if unknown else f"none (model_type {model_type!r})"
        return (
            f"architecture {named} is not a causal language model that transformers "
            f"{transformers_version} knows"
        )
    return None


def _model_dir(path: Path, flag: str) -> Mapping[str, Any]:
    """The directory's config.json, once it is a model the server will load."""
    model_config = read_model_config(path, flag)
    reason = model_refusal(model_config)
    if reason is not None:
        raise ConfigError(f"{flag} {path}: {reason}")
    return model_config


def check_model_dirs(config: ServerConfig) -> None:
    """Raise ConfigError naming the flag whose model directory is absent or not a model.

    The server runs this at start too: a path missing from the volume is a
    configuration error (exit 2, this message), not transformers' guess that the
    path is a hub repository id.
    """
    _model_dir(config.model_dir, "--model-dir")
    if config.fallback_dir is not None:
        _model_dir(config.fallback_dir, "--fallback-dir")


def fit_to_context_window(config: ServerConfig) -> ServerConfig:
    """The config with its token limits fitted to the models' context window.

    The narrower window of the primary and the fallback counts: either may
    serve. Raises ConfigError (exit 2) when limits a user chose cannot fit;
    see `context_window.fit_token_limits`. Run after `check_model_dirs`.
    """
    model_dirs = [("--model-dir", config.model_dir)]
    if config.fallback_dir is not None:
        model_dirs.append(("--fallback-dir", config.fallback_dir))
    window = narrowest([read_context_window(path, flag) for flag, path in model_dirs])
    if window is None:
        return config
    requested = TokenLimits(config.max_input_tokens, config.max_new_tokens)
    fitted = fit_token_limits(requested, DEFAULT_TOKEN_LIMITS, window)
    return replace(
        config,
        max_input_tokens=fitted.max_input_tokens,
        max_new_tokens=fitted.max_new_tokens,
        context_window_tokens=window.tokens,
    )


def resolve_device(requested: str) -> torch.device:
    device = pick_device(requested)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {requested}: no CUDA device is available here")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(
                f"--device {requested}: only {torch.cuda.device_count()} CUDA device(s) here"
            )
    return device


def check_config(config: ServerConfig) -> str:
    """The one-line summary of a valid configuration; raises ConfigError with the reason."""
    check_model_dirs(config)
    architectures = _model_dir(config.model_dir, "--model-dir").get("architectures") or []
    config = fit_to_context_window(config)
    if config.admin_token_file is not None:
        try:
            token = config.admin_token_file.read_text(encoding="utf-8").strip()
        except OSError as error:
            raise ConfigError(f"--admin-token-file: {error}") from error
        if not token:
            raise ConfigError(f"--admin-token-file {config.admin_token_file}: empty")
    device = resolve_device(config.device)
    reason = refusal(config.fallback_quantization, device)
    if reason is not None:
        raise ConfigError(f"--fallback-quantization {config.fallback_quantization.value}: {reason}")
    if config.fallback_configured:
        fallback = (
            f"{config.fallback_dir or 'the primary'} quantized {config.fallback_quantization.value}"
        )
    else:
        fallback = "none"
    return (
        f"model {config.model_name} ({', '.join(map(str, architectures)) or 'unnamed'}) "
        f"from {config.model_dir}"
        f"{' @ ' + config.model_revision if config.model_revision else ''}, "
        f"dtype {config.dtype.value}, device {device}, fallback {fallback}, "
        f"max body {config.max_body_bytes} bytes, "
        f"context window {config.context_window_tokens or 'unknown'} tokens, "
        f"max input {config.max_input_tokens} + max new {config.max_new_tokens} tokens"
    )
