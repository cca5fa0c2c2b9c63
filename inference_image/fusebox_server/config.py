"""The server's configuration, built from the contract's one list of settings.

Why: every setting is declared once, in `fusebox_contract.settings`
(flag, env name, kind, default, help); this module turns that list into the
argument parser, the `FUSEBOX_*` fallbacks and the typed `ServerConfig`, so
neither the operator nor the docs can drift from what the server reads. A
flag wins over its variable, which wins over the declared default. Parsing
is pure: `parse_config(argv, environ)`.
"""

from __future__ import annotations

import argparse
import enum
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Final

from fusebox_contract import settings as contract
from fusebox_contract.names import Dtype, Quantization
from fusebox_contract.settings import SERVER_SETTINGS, Setting
from fusebox_contract.wiring import STATS_FILE, Port, QualityKey

CHECK_CONFIG_FLAG: Final = "check-config"

# The config's attribute names that say their unit; every other field is `Setting.field`.
FIELD_NAMES: Final[Mapping[str, str]] = {
    "request-timeout": "request_timeout_seconds",
    "heartbeat-timeout": "heartbeat_timeout_seconds",
    "latency-window": "latency_window_seconds",
}
PATH_SETTINGS: Final = frozenset(
    {
        contract.MODEL_DIR,
        contract.FALLBACK_DIR,
        contract.ADMIN_TOKEN_FILE,
        contract.STATS_FILE,
        contract.TEMPLATES_FILE,
        contract.CANNED_ANSWERS_FILE,
        contract.QUALITY_FILE,
    }
)


class LogLevel(enum.StrEnum):
    """`--log-level`: the levels its help names (an unknown one is refused, not read as info)."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


ENUM_SETTINGS: Final[Mapping[Setting, type[enum.StrEnum]]] = {
    contract.DTYPE: Dtype,
    contract.FALLBACK_QUANTIZATION: Quantization,
    contract.LOG_LEVEL: LogLevel,
}
# Settings read as seconds: each must be a positive, finite number.
SECONDS_SETTINGS: Final = (
    contract.REQUEST_TIMEOUT,
    contract.HEARTBEAT_TIMEOUT,
    contract.LATENCY_WINDOW,
)
# Text settings that mean nothing when empty.
NON_EMPTY_SETTINGS: Final = (contract.MODEL_NAME, contract.HOST)


class ConfigError(ValueError):
    """A flag or a file named by a flag is invalid; the server refuses to start."""


@dataclass(frozen=True)
class QualitySettings:
    """What the quality check (`quality.py`) applies, from `--quality-file`; replaced whole
    when the file changes. Declared here, with the other settings, so that the config
    needs nothing from the modules that use it."""

    sample_rate: float = 0.1
    max_output_input_ratio: float = 100.0
    blocked_terms: tuple[str, ...] = ()


@dataclass(frozen=True)
class ServerConfig:
    """Typed view of `SERVER_SETTINGS` (a test keeps the two in step) plus the files' content."""

    model_dir: Path
    model_name: str = "model"
    model_revision: str = ""
    dtype: Dtype = Dtype.AUTO
    fallback_dir: Path | None = None
    fallback_quantization: Quantization = Quantization.NONE
    host: str = "0.0.0.0"
    port: int = Port.API.value
    admin_port: int = Port.ADMIN.value
    admin_token_file: Path | None = None
    stats_file: Path = Path(STATS_FILE)
    device: str = "auto"
    torch_threads: int = 0
    max_concurrency: int = 8
    max_queue: int = 64
    max_input_tokens: int = 4096
    max_new_tokens: int = 1024
    max_body_bytes: int = contract.body_limit_bytes(4096)
    request_timeout_seconds: float = 60.0
    tokenizer_cache_size: int = 10000
    prefix_cache_bytes: int = 1 << 30
    prefill_chunk_tokens: int | None = None  # None: the device's default (prefill_chunk_tokens_for)
    templates_file: Path | None = None
    canned_answers_file: Path | None = None
    quality_file: Path | None = None
    heartbeat_timeout_seconds: float = 10.0
    memory_guard_ratio: float = 0.95
    latency_window_seconds: float = 60.0
    log_level: LogLevel = LogLevel.INFO
    # What the three files held at start; the running server re-reads them (live_files.py).
    templates: tuple[str, ...] = ()
    canned_answers: Mapping[str, str] = field(default_factory=dict)
    quality: QualitySettings = QualitySettings()
    # The models' context window in tokens, read from their config.json at start
    # (`preflight.fit_to_context_window`); None when they name none.
    context_window_tokens: int | None = None

    @property
    def fallback_configured(self) -> bool:
        """A fallback exists only when asked for: its own directory or a quantization."""
        return self.fallback_dir is not None or self.fallback_quantization != Quantization.NONE


def field_name(setting: Setting) -> str:
    return FIELD_NAMES.get(setting.flag, setting.field)


def env_name(flag: str) -> str:
    return contract.ENV_PREFIX + flag.replace("-", "_").upper()


def _default_text(setting: Setting) -> str:
    if setting is contract.MAX_BODY_BYTES:
        return "from --max-input-tokens"
    if setting.default is None:
        return "(none)"
    return str(setting.default) or '""'


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m fusebox_server",
        description="Hardened OpenAI-compatible inference server. Every flag is also an "
        "environment variable FUSEBOX_<FLAG> (dashes as underscores, upper case).",
    )
    for setting in SERVER_SETTINGS:
        parser.add_argument(
            f"--{setting.flag}",
            default=environ.get(setting.env),
            help=f"{setting.help} [{setting.env}; default {_default_text(setting)}]",
        )
    parser.add_argument(
        f"--{CHECK_CONFIG_FLAG}",
        action="store_true",
        help="validate the configuration without loading the model or binding ports; "
        "exit 0 (config ok) or 2 (the reason on stderr)",
    )
    return parser


def _read_json(path: Path, what: str) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ConfigError(f"{what} {path}: {error}") from error


def read_string_list(path: Path | None, what: str) -> tuple[str, ...]:
    if path is None:
        return ()
    value = _read_json(path, what)
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ConfigError(f"{what} {path}: expected a JSON list of strings")
    return tuple(value)


def read_string_map(path: Path | None, what: str) -> dict[str, str]:
    if path is None:
        return {}
    value = _read_json(path, what)
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ConfigError(f"{what} {path}: expected a JSON object of strings to strings")
    return dict(value)


def read_quality_settings(path: Path | None, what: str) -> QualitySettings:
    """The quality file: a JSON object of `QualityKey`s, each optional; any other key is refused."""
    if path is None:
        return QualitySettings()
    value = _read_json(path, what)
    if not isinstance(value, dict):
        raise ConfigError(f"{what} {path}: expected a JSON object")
    unknown = sorted(set(value) - {key.value for key in QualityKey})
    if unknown:
        known = ", ".join(key.value for key in QualityKey)
        raise ConfigError(f"{what} {path}: unknown key {', '.join(unknown)} (known: {known})")
    defaults = QualitySettings()
    rate = _json_number(value, QualityKey.SAMPLE_RATE, defaults.sample_rate, what, path)
    if not 0.0 <= rate <= 1.0:
        raise ConfigError(f"{what} {path}: {QualityKey.SAMPLE_RATE} must be within 0..1")
    ratio = _json_number(
        value, QualityKey.MAX_OUTPUT_INPUT_RATIO, defaults.max_output_input_ratio, what, path
    )
    if not (ratio > 0 and math.isfinite(ratio)):
        raise ConfigError(
            f"{what} {path}: {QualityKey.MAX_OUTPUT_INPUT_RATIO} must be a positive number"
        )
    terms = value.get(QualityKey.BLOCKED_TERMS, [])
    if not isinstance(terms, list) or not all(isinstance(term, str) for term in terms):
        raise ConfigError(f"{what} {path}: {QualityKey.BLOCKED_TERMS} must be a list of strings")
    return QualitySettings(rate, ratio, tuple(terms))


def _json_number(
    value: Mapping[str, object], key: QualityKey, default: float, what: str, path: Path
) -> float:
    number = value.get(key, default)
    if isinstance(number, bool) or not isinstance(number, int | float):
        raise ConfigError(f"{what} {path}: {key} must be a number")
    return float(number)


def _typed(setting: Setting, raw: str) -> object:
    try:
        if setting in PATH_SETTINGS:
            return Path(raw) if raw else None
        enum = ENUM_SETTINGS.get(setting)
        if enum is not None:
            return enum(raw)
        return setting.kind(raw)
    except (TypeError, ValueError) as error:
        choices = ""
        if setting in ENUM_SETTINGS:
            choices = f" (one of {', '.join(m.value for m in ENUM_SETTINGS[setting])})"
        raise ConfigError(f"--{setting.flag}: {error}{choices}") from error


def parse_command_line(
    argv: Sequence[str], environ: Mapping[str, str]
) -> tuple[ServerConfig, bool]:
    """The config, and whether `--check-config` asks only for validation."""
    args = vars(build_parser(environ).parse_args(list(argv)))
    return _config_from(args), bool(args[CHECK_CONFIG_FLAG.replace("-", "_")])


def parse_config(
    argv: Sequence[str], environ: Mapping[str, str], *, read_files: bool = True
) -> ServerConfig:
    """Flags (falling back to FUSEBOX_* variables, then the declared defaults) -> ServerConfig.

    `read_files=False` leaves the three JSON files unread (their paths are
    kept): for a caller that validates a rendered pod's settings away from
    the pod's volumes.
    """
    args = vars(build_parser(environ).parse_args(list(argv)))
    return _config_from(args, read_files=read_files)


def _config_from(args: Mapping[str, Any], *, read_files: bool = True) -> ServerConfig:
    values: dict[str, Any] = {}
    for setting in SERVER_SETTINGS:
        raw = args[setting.field]
        if raw is None:
            if setting.default is not None:
                values[field_name(setting)] = _typed(setting, str(setting.default))
            continue
        values[field_name(setting)] = _typed(setting, str(raw))
    if values.get("model_dir") is None:
        raise ConfigError(f"--{contract.MODEL_DIR.flag} (or {contract.MODEL_DIR.env}) is required")
    if "max_body_bytes" not in values:
        values["max_body_bytes"] = contract.body_limit_bytes(
            int(values.get("max_input_tokens", contract.MAX_INPUT_TOKENS.default))
        )
    if read_files:
        values["templates"] = read_string_list(values.get("templates_file"), "templates file")
        values["canned_answers"] = read_string_map(
            values.get("canned_answers_file"), "canned answers file"
        )
        values["quality"] = read_quality_settings(values.get("quality_file"), "quality file")
    config = ServerConfig(**values)
    validate(config)
    return config


CPU_PREFILL_CHUNK_TOKENS = 64
"""The CPU's chunk when --prefill-chunk-tokens is unset: measured on the llama3 zoo model,
it bounds a running stream's stall by one chunk while keeping a 2,048-token joiner's first
token within 1.3-1.5x of a whole prefill (docs/decisions/chunked-prefill.md)."""


def prefill_chunk_tokens_for(device_type: str, configured: int | None) -> int:
    """The chunk the worker prefills long prompts in; 0 prefills them whole.

    Unset, CUDA prefills whole, as before chunking existed: there a chunk is one eager
    forward pass of the whole model, launch-bound at the CPU's size, and no GPU run has
    measured a better one yet. A set value wins on every device."""
    if configured is not None:
        return configured
    return CPU_PREFILL_CHUNK_TOKENS if device_type == "cpu" else 0


def validate(config: ServerConfig) -> None:
    for name in ("max_concurrency", "max_input_tokens", "max_new_tokens", "max_body_bytes"):
        if getattr(config, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("max_queue", "tokenizer_cache_size", "prefix_cache_bytes", "torch_threads"):
        if getattr(config, name) < 0:
            raise ConfigError(f"--{name.replace('_', '-')} must not be negative")
    if config.prefill_chunk_tokens is not None and config.prefill_chunk_tokens < 0:
        raise ConfigError(
            "--prefill-chunk-tokens must not be negative (0 prefills every prompt whole)"
        )
    for name in ("port", "admin_port"):
        if not 0 < getattr(config, name) < 65536:
            raise ConfigError(f"--{name.replace('_', '-')} must be a port number")
    for setting in SECONDS_SETTINGS:
        seconds = getattr(config, field_name(setting))
        if not (seconds > 0 and math.isfinite(seconds)):
            raise ConfigError(f"--{setting.flag} must be a positive number of seconds")
    for setting in NON_EMPTY_SETTINGS:
        if not getattr(config, field_name(setting)).strip():
            raise ConfigError(f"--{setting.flag} must not be empty")
    if config.stats_file is None:
        raise ConfigError(f"--{contract.STATS_FILE.flag} must not be empty")
    if not 0.0 < config.memory_guard_ratio <= 1.0:
        raise ConfigError("--memory-guard-ratio must be within (0, 1]")
    if config.device != "auto" and not (
        config.device == "cpu"
        or config.device == "cuda"
        or (config.device.startswith("cuda:") and config.device[5:].isdigit())
    ):
        raise ConfigError("--device must be auto, cpu, cuda or cuda:N")


def config_field_names() -> tuple[str, ...]:
    """ServerConfig's attributes, for the test that keeps it in step with SERVER_SETTINGS."""
    return tuple(f.name for f in fields(ServerConfig))


def flags_table() -> str:
    """The Markdown table of every flag in docs/server.md (a test keeps it in sync)."""
    rows = ["| flag | env | default | meaning |", "|---|---|---|---|"]
    for setting in SERVER_SETTINGS:
        rows.append(
            f"| `--{setting.flag}` | `{setting.env}` | {_default_text(setting)} "
            f"| {setting.help.replace('|', '&#124;')} |"
        )
    return "\n".join(rows)
