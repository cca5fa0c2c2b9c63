"""The server's settings, declared once: flag, env name, type, default, help.

Why: the operator configures pods through env vars, people run the server by
hand with flags, and docs list both. Each comes from one declaration here:
`--some-flag` is `FUSEBOX_SOME_FLAG`, the server builds its argument parser
from `SERVER_SETTINGS`, and the operator renders the pod's env from the same
objects, so a renamed setting cannot leave one side behind. Settings marked
`wired` are the operator's plumbing (paths, ports, device, model wiring):
`server.env` may not override them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from fusebox_contract.wiring import GPU_SELECTION_ENV_NAMES

ENV_PREFIX: Final = "FUSEBOX_"


@dataclass(frozen=True)
class Setting:
    flag: str  # without the leading dashes
    kind: type  # str, int or float: how the flag's text is read
    default: object  # None: no default (optional, or required where validation says so)
    help: str
    wired: bool = False  # the operator sets it from the spec or its own wiring

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.flag.replace("-", "_").upper()

    @property
    def field(self) -> str:
        """The attribute name in the server's config."""
        return self.flag.replace("-", "_")


def _s(flag: str, kind: type, default: object, text: str, wired: bool = True) -> Setting:
    return Setting(flag, kind, default, text, wired)


MODEL_DIR = _s("model-dir", str, None, "directory of the primary model (local files only)")
MODEL_NAME = _s("model-name", str, "model", "id served as the OpenAI `model`")
MODEL_REVISION = _s("model-revision", str, "", "revision of the primary model, reported as-is")
DTYPE = _s("dtype", str, "auto", "auto|bfloat16|float16|float32: dtype the weights load in")
FALLBACK_DIR = _s("fallback-dir", str, None, "directory of the fallback model")
FALLBACK_QUANTIZATION = _s(
    "fallback-quantization",
    str,
    "none",
    "none|int8|int4|fp8: quantize the fallback on load; with neither this nor "
    "--fallback-dir there is no fallback",
)
HOST = _s("host", str, "0.0.0.0", "address both ports bind")
PORT = _s("port", int, 8000, "API port")
ADMIN_PORT = _s("admin-port", int, 8001, "admin port")
ADMIN_TOKEN_FILE = _s("admin-token-file", str, None, "file holding the admin bearer token")
STATS_FILE = _s("stats-file", str, "/run/fusebox/stats.json", "stats file written every second")
DEVICE = _s("device", str, "auto", "auto|cpu|cuda|cuda:N")
TORCH_THREADS = _s("torch-threads", int, 0, "torch intra-op CPU threads; 0 keeps torch's default")
MAX_CONCURRENCY = _s("max-concurrency", int, 8, "generations running at once")
MAX_QUEUE = _s("max-queue", int, 64, "requests waiting; beyond it 429")
MAX_INPUT_TOKENS = _s(
    "max-input-tokens",
    int,
    4096,
    "prompt length limit in tokens; at its default it shrinks to fit the model's context "
    "window, any other value must fit it with max-new-tokens (else exit 2)",
)
MAX_NEW_TOKENS = _s(
    "max-new-tokens",
    int,
    1024,
    "limit and default for max_tokens; at its default it shrinks to fit the model's context "
    "window, any other value must fit it with max-input-tokens (else exit 2)",
)
MAX_BODY_BYTES = _s(
    "max-body-bytes",
    int,
    None,
    "request body limit; beyond it 413 (default: from max-input-tokens)",
)
REQUEST_TIMEOUT = _s(
    "request-timeout", float, 60.0, "deadline in seconds covering queue wait and generation"
)
TOKENIZER_CACHE_SIZE = _s(
    "tokenizer-cache-size", int, 10000, "LRU entries of prompt encodings; 0 disables"
)
PREFIX_CACHE_BYTES = _s(
    "prefix-cache-bytes",
    int,
    1 << 30,
    "bytes of prompt-prefix keys and values kept for reuse across requests (on the model's "
    "device, least recently used out first, emptied before the memory guard trips); 0 disables",
)
PREFILL_CHUNK_TOKENS = _s(
    "prefill-chunk-tokens",
    int,
    None,
    "a prompt longer than this many tokens is prefilled in chunks of it, the running "
    "streams decoding a token between chunks; 0 prefills every prompt whole; unset: "
    "64 on the CPU, whole on CUDA (not measured there yet)",
    wired=False,
)
TEMPLATES_FILE = _s("templates-file", str, None, "JSON list of prompts pre-encoded (re-read live)")
CANNED_ANSWERS_FILE = _s(
    "canned-answers-file", str, None, "JSON object prompt -> answer for level 3 (re-read live)"
)
QUALITY_FILE = _s(
    "quality-file",
    str,
    None,
    "JSON object of the quality check: sampleRate, maxOutputInputRatio, blockedTerms "
    "(re-read live)",
)
HEARTBEAT_TIMEOUT = _s(
    "heartbeat-timeout", float, 10.0, "seconds after which a heartbeat fails /healthz"
)
MEMORY_GUARD_RATIO = _s(
    "memory-guard-ratio",
    float,
    0.95,
    "share of a memory limit at which new requests are refused",
    wired=False,
)
LATENCY_WINDOW = _s(
    "latency-window",
    float,
    60.0,
    "seconds of the sliding window for latency and quality",
    wired=False,
)
LOG_LEVEL = _s("log-level", str, "info", "debug|info|warning|error", wired=False)

SERVER_SETTINGS: Final[tuple[Setting, ...]] = (
    MODEL_DIR,
    MODEL_NAME,
    MODEL_REVISION,
    DTYPE,
    FALLBACK_DIR,
    FALLBACK_QUANTIZATION,
    HOST,
    PORT,
    ADMIN_PORT,
    ADMIN_TOKEN_FILE,
    STATS_FILE,
    DEVICE,
    TORCH_THREADS,
    MAX_CONCURRENCY,
    MAX_QUEUE,
    MAX_INPUT_TOKENS,
    MAX_NEW_TOKENS,
    MAX_BODY_BYTES,
    REQUEST_TIMEOUT,
    TOKENIZER_CACHE_SIZE,
    PREFIX_CACHE_BYTES,
    PREFILL_CHUNK_TOKENS,
    TEMPLATES_FILE,
    CANNED_ANSWERS_FILE,
    QUALITY_FILE,
    HEARTBEAT_TIMEOUT,
    MEMORY_GUARD_RATIO,
    LATENCY_WINDOW,
    LOG_LEVEL,
)

RESERVED_ENV_NAMES: Final = (
    frozenset(s.env for s in SERVER_SETTINGS if s.wired)
    | frozenset({"HOME", "HF_HOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"})
    | GPU_SELECTION_ENV_NAMES
)
"""Env names `spec.server.env` may not set: the operator wires them, or (the GPU
selection names) only the device plugin or DRA driver may."""


def body_limit_bytes(max_input_tokens: int) -> int:
    """The request body limit that a prompt of `max_input_tokens` tokens fits in.

    A token is at most a few characters; JSON may escape each as `\\uXXXX`
    (6 bytes), so 64 bytes a token covers any prompt the token limit admits,
    plus 1 MiB for the rest of the body (messages, parameters).
    """
    return (1 << 20) + 64 * max_input_tokens
