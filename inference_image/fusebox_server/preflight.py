"""`python -m fusebox_server --check-config`: validate a configuration before deploying it.

Why: a configuration the server would refuse must be found by whoever
writes it (`helm template`-style), not by a pod in CrashLoopBackOff. This
checks everything the server checks at start except what needs the model
in memory or the ports: the flags and env, the JSON files, the model
directories (present, with a config.json), the admin token file, the device
`--device` resolves to, and whether that device can serve the fallback's
quantization. It imports torch (to see the device) but loads no weights.
"""

from __future__ import annotations

from pathlib import Path

import torch

from fusebox_server.config import ConfigError, ServerConfig
from fusebox_server.engine import pick_device
from fusebox_server.quantization import refusal


def _model_dir(path: Path, flag: str) -> None:
    if not path.is_dir():
        raise ConfigError(f"{flag} {path}: not a directory")
    if not (path / "config.json").is_file():
        raise ConfigError(f"{flag} {path}: no config.json (not a transformers model directory)")


def check_model_dirs(config: ServerConfig) -> None:
    """Raise ConfigError naming the flag whose model directory is absent or not a model.

    The server runs this at start too: a path missing from the volume is a
    configuration error (exit 2, this message), not transformers' guess that the
    path is a hub repository id.
    """
    _model_dir(config.model_dir, "--model-dir")
    if config.fallback_dir is not None:
        _model_dir(config.fallback_dir, "--fallback-dir")


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
        f"model {config.model_name} from {config.model_dir}"
        f"{' @ ' + config.model_revision if config.model_revision else ''}, "
        f"dtype {config.dtype.value}, device {device}, fallback {fallback}, "
        f"max body {config.max_body_bytes} bytes"
    )
