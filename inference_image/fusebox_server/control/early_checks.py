"""The start-up checks that need neither torch nor transformers, run before either loads.

Why: importing torch takes seconds of CPU, tens of seconds under a small CPU
limit. A pod whose flags are wrong or whose model directory is missing from
its volume (a typo in `model.source`, a PVC without the model) should exit
with its reason at once: the kubelet's back-off then starts from the first
second, and the service's Ready (PodsFailing) names the cause in the time a
pod takes to start, not after a torch import per crash. The full checks
(preflight.py: the architecture transformers must know, the context window,
the device) still run after the import; these are the subset that costs
nothing, with the same messages.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fusebox_server.config import ConfigError, parse_command_line


def read_model_config(path: Path, flag: str) -> Mapping[str, Any]:
    """The model directory's config.json; ConfigError naming `flag` when the directory
    is absent, has no config.json or the file is not a JSON object."""
    if not path.is_dir():
        raise ConfigError(f"{flag} {path}: not a directory")
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ConfigError(f"{flag} {path}: no config.json (not a transformers model directory)")
    try:
        model_config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ConfigError(f"{flag} {config_path}: {error}") from error
    if not isinstance(model_config, Mapping):
        raise ConfigError(f"{flag} {config_path}: expected a JSON object")
    return model_config


def refusal_before_torch(argv: Sequence[str], environ: Mapping[str, str]) -> str | None:
    """Why the server would refuse to start, as far as flags, env and the model
    directories tell without torch; None when they pass (or `--check-config`, which
    runs every check itself and prints its summary)."""
    try:
        config, check_only = parse_command_line(argv, environ)
        if check_only:
            return None
        read_model_config(config.model_dir, "--model-dir")
        if config.fallback_dir is not None:
            read_model_config(config.fallback_dir, "--fallback-dir")
    except (ConfigError, ValueError, OSError) as error:
        return str(error)
    return None
