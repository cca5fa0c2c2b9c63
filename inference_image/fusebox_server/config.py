"""Command-line flags of the server; every flag is also an environment variable.

Why: the operator configures pods through env vars (from the
InferenceService spec) while people run the server by hand with flags. Each
`--some-flag` reads `FUSEBOX_SOME_FLAG` as its default, so both work and the
flag wins. Parsing is pure: `parse_config(argv, environ)`.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path


class ConfigError(ValueError):
    """A flag or a file named by a flag is invalid; the server refuses to start."""


@dataclass(frozen=True)
class ServerConfig:
    model_dir: Path
    fallback_dir: Path | None = None
    fallback_quantization: str = "int8"
    model_name: str = "model"
    host: str = "0.0.0.0"
    port: int = 8000
    admin_port: int = 8001
    admin_token_file: Path | None = None
    stats_file: Path = Path("/run/fusebox/stats.json")
    max_concurrency: int = 8
    max_queue: int = 64
    max_input_tokens: int = 4096
    max_new_tokens: int = 1024
    request_timeout_seconds: float = 60.0
    tokenizer_cache_size: int = 10000
    templates: tuple[str, ...] = ()
    canned_answers: Mapping[str, str] = field(default_factory=dict)
    device: str = "auto"
    max_body_bytes: int = 1 << 20
    quality_sample_rate: float = 0.1
    quality_max_output_input_ratio: float = 100.0
    quality_blocked_terms: tuple[str, ...] = ()
    heartbeat_timeout_seconds: float = 10.0
    memory_guard_ratio: float = 0.95
    latency_window_seconds: float = 60.0
    log_level: str = "info"
    torch_threads: int = 0


_FLAGS: list[tuple[str, type, str]] = [
    ("model-dir", str, "directory of the primary model (loaded with local_files_only)"),
    ("fallback-dir", str, "directory of the fallback model; default: the primary, quantized"),
    ("fallback-quantization", str, "int8|none: quantize the fallback on load"),
    ("model-name", str, "id served as the OpenAI `model`"),
    ("host", str, "address both ports bind"),
    ("port", int, "API port"),
    ("admin-port", int, "admin port"),
    ("admin-token-file", str, "file holding the admin bearer token"),
    ("stats-file", str, "stats file written every second (docs/stats-file.md)"),
    ("max-concurrency", int, "generations running at once"),
    ("max-queue", int, "requests waiting; beyond it 429"),
    ("max-input-tokens", int, "prompt length limit in tokens"),
    ("max-new-tokens", int, "limit and default for max_tokens"),
    ("request-timeout", float, "deadline in seconds covering queue wait and generation"),
    ("tokenizer-cache-size", int, "LRU entries of prompt encodings; 0 disables"),
    ("templates-file", str, "JSON list of prompts pre-encoded at start"),
    ("canned-answers-file", str, "JSON object prompt -> answer used at degradation level 3"),
    ("device", str, "auto|cpu|cuda|cuda:N"),
    ("max-body-bytes", int, "request body limit; beyond it 413"),
    ("quality-sample-rate", float, "share of responses checked for quality (0..1)"),
    ("quality-max-output-input-ratio", float, "output/input token ratio counted as a failure"),
    ("quality-blocked-terms-file", str, "JSON list of terms whose presence is a failure"),
    ("heartbeat-timeout", float, "seconds after which a heartbeat fails /healthz"),
    ("memory-guard-ratio", float, "share of the memory limit at which new requests are refused"),
    ("latency-window", float, "seconds of the sliding window for latency and quality figures"),
    ("log-level", str, "debug|info|warning|error"),
    ("torch-threads", int, "torch intra-op CPU threads; 0 keeps torch's default"),
]


def env_name(flag: str) -> str:
    return "FUSEBOX_" + flag.replace("-", "_").upper()


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m fusebox_server",
        description="Hardened OpenAI-compatible inference server. Every flag is also an "
        "environment variable FUSEBOX_<FLAG> (dashes as underscores, upper case).",
    )
    for flag, kind, text in _FLAGS:
        default = environ.get(env_name(flag))
        parser.add_argument(
            f"--{flag}", type=kind, default=default, help=f"{text} [{env_name(flag)}]"
        )
    return parser


def _read_json(path: str, what: str) -> object:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ConfigError(f"{what} {path}: {error}") from error


def _string_list(path: str | None, what: str) -> tuple[str, ...]:
    if not path:
        return ()
    value = _read_json(path, what)
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ConfigError(f"{what} {path}: expected a JSON list of strings")
    return tuple(value)


def _string_map(path: str | None, what: str) -> dict[str, str]:
    if not path:
        return {}
    value = _read_json(path, what)
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ConfigError(f"{what} {path}: expected a JSON object of strings to strings")
    return dict(value)


def _typed(raw: object, kind: type, flag: str) -> object:
    try:
        return kind(raw)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"--{flag}: {error}") from error


def parse_config(argv: Sequence[str], environ: Mapping[str, str]) -> ServerConfig:
    """Flags (falling back to FUSEBOX_* variables, then defaults) -> ServerConfig."""
    args = vars(build_parser(environ).parse_args(list(argv)))
    values = {
        flag: _typed(args[flag.replace("-", "_")], kind, flag)
        for flag, kind, _ in _FLAGS
        if args[flag.replace("-", "_")] is not None
    }
    if "model-dir" not in values:
        raise ConfigError("--model-dir (or FUSEBOX_MODEL_DIR) is required")
    defaults = ServerConfig(model_dir=Path("."))
    config = ServerConfig(
        model_dir=Path(str(values["model-dir"])),
        fallback_dir=Path(str(values["fallback-dir"])) if values.get("fallback-dir") else None,
        fallback_quantization=str(values.get("fallback-quantization", "int8")),
        model_name=str(values.get("model-name", defaults.model_name)),
        host=str(values.get("host", defaults.host)),
        port=int(str(values.get("port", defaults.port))),
        admin_port=int(str(values.get("admin-port", defaults.admin_port))),
        admin_token_file=(
            Path(str(values["admin-token-file"])) if values.get("admin-token-file") else None
        ),
        stats_file=Path(str(values.get("stats-file", defaults.stats_file))),
        max_concurrency=int(str(values.get("max-concurrency", defaults.max_concurrency))),
        max_queue=int(str(values.get("max-queue", defaults.max_queue))),
        max_input_tokens=int(str(values.get("max-input-tokens", defaults.max_input_tokens))),
        max_new_tokens=int(str(values.get("max-new-tokens", defaults.max_new_tokens))),
        request_timeout_seconds=float(
            str(values.get("request-timeout", defaults.request_timeout_seconds))
        ),
        tokenizer_cache_size=int(
            str(values.get("tokenizer-cache-size", defaults.tokenizer_cache_size))
        ),
        templates=_string_list(_opt(values, "templates-file"), "templates file"),
        canned_answers=_string_map(_opt(values, "canned-answers-file"), "canned answers file"),
        device=str(values.get("device", defaults.device)),
        max_body_bytes=int(str(values.get("max-body-bytes", defaults.max_body_bytes))),
        quality_sample_rate=float(
            str(values.get("quality-sample-rate", defaults.quality_sample_rate))
        ),
        quality_max_output_input_ratio=float(
            str(
                values.get(
                    "quality-max-output-input-ratio", defaults.quality_max_output_input_ratio
                )
            )
        ),
        quality_blocked_terms=_string_list(
            _opt(values, "quality-blocked-terms-file"), "blocked terms file"
        ),
        heartbeat_timeout_seconds=float(
            str(values.get("heartbeat-timeout", defaults.heartbeat_timeout_seconds))
        ),
        memory_guard_ratio=float(
            str(values.get("memory-guard-ratio", defaults.memory_guard_ratio))
        ),
        latency_window_seconds=float(
            str(values.get("latency-window", defaults.latency_window_seconds))
        ),
        log_level=str(values.get("log-level", defaults.log_level)),
        torch_threads=int(str(values.get("torch-threads", defaults.torch_threads))),
    )
    validate(config)
    return config


def _opt(values: Mapping[str, object], flag: str) -> str | None:
    value = values.get(flag)
    return str(value) if value else None


def validate(config: ServerConfig) -> None:
    if config.fallback_quantization not in ("int8", "none"):
        raise ConfigError("--fallback-quantization must be int8 or none")
    for name in ("max_concurrency", "max_input_tokens", "max_new_tokens", "max_body_bytes"):
        if getattr(config, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("max_queue", "tokenizer_cache_size"):
        if getattr(config, name) < 0:
            raise ConfigError(f"--{name.replace('_', '-')} must not be negative")
    if not (config.request_timeout_seconds > 0 and math.isfinite(config.request_timeout_seconds)):
        raise ConfigError("--request-timeout must be a positive number of seconds")
    if not 0.0 <= config.quality_sample_rate <= 1.0:
        raise ConfigError("--quality-sample-rate must be within 0..1")
    if not 0.0 < config.memory_guard_ratio <= 1.0:
        raise ConfigError("--memory-guard-ratio must be within (0, 1]")
    if config.device != "auto" and not (
        config.device == "cpu" or config.device == "cuda" or config.device.startswith("cuda:")
    ):
        raise ConfigError("--device must be auto, cpu, cuda or cuda:N")
