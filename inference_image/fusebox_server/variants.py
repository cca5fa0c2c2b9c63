"""The model variants: load, unload, swap, and converging on a declared variant.

Why: the primary and the quantized fallback are one concern with a few
rules that used to be spread over the runtime: a fallback exists only when
configured (`--fallback-dir` or a quantization other than none) and when
the device can serve its quantization; only one load runs at a time; the
server is not ready while a variant loads; and a degradation level declares
which variant should serve without making the caller wait for the load.
`converge_to` records the target and starts (or retargets) one background
task that loads until the served variant is the target, so a second
request during a load never starts a second load. All model work runs on
the inference worker; everything else here is event-loop only.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import structlog
import torch

from fusebox_contract.names import Quantization, Variant
from fusebox_server import engine
from fusebox_server.config import ServerConfig
from fusebox_server.errors import FallbackUnavailable, ModelUnavailable
from fusebox_server.openai_schema import Sampling
from fusebox_server.quantization import refusal
from fusebox_server.tokenization import PromptEncoder
from fusebox_server.worker import InferenceWorker

log = structlog.get_logger("fusebox_server")

WARMUP_PROMPT: Final = "Hello"
NO_FALLBACK: Final = (
    "no fallback is configured (neither --fallback-dir nor --fallback-quantization)"
)

OnWorker = Callable[[Callable[[], Any]], Awaitable[Any]]


@dataclass(frozen=True)
class VariantSource:
    model_dir: Path
    quantization: Quantization


def fallback_refusal(config: ServerConfig, device: torch.device) -> str | None:
    """Why there is no usable fallback here, or None when there is one."""
    if not config.fallback_configured:
        return NO_FALLBACK
    reason = refusal(config.fallback_quantization, device)
    return f"the fallback is unavailable: {reason}" if reason else None


class Variants:
    def __init__(
        self,
        config: ServerConfig,
        device: torch.device,
        encoders: dict[Variant, PromptEncoder],
        on_worker: OnWorker,
        release: Callable[[], None],
        load_delay_seconds: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self.config = config
        self.device = device
        self.encoders = encoders
        self._on_worker = on_worker
        self._release = release
        self._load_delay_seconds = load_delay_seconds
        self.current = Variant.PRIMARY
        self.ready = False
        self.target: Variant | None = None
        self.unavailable_reason = fallback_refusal(config, device)
        self.worker: InferenceWorker | None = None
        self._lock = asyncio.Lock()
        self._converging: asyncio.Task[None] | None = None
        self.last_convergence_error: str | None = None
        self.loads_total = 0  # completed model loads since start (a reload adds one)

    # ----- views -----
    @property
    def fallback_available(self) -> bool:
        return self.unavailable_reason is None

    @property
    def loaded(self) -> engine.LoadedModel | None:
        return self.worker.loaded if self.worker is not None else None

    @property
    def converging(self) -> bool:
        return self._converging is not None and not self._converging.done()

    @property
    def target_variant(self) -> Variant:
        return self.target if self.converging and self.target is not None else self.current

    def source(self, variant: Variant) -> VariantSource:
        if variant == Variant.PRIMARY:
            return VariantSource(self.config.model_dir, Quantization.NONE)
        if self.unavailable_reason is not None:
            raise FallbackUnavailable(self.unavailable_reason, param="variant")
        return VariantSource(
            self.config.fallback_dir or self.config.model_dir, self.config.fallback_quantization
        )

    # ----- on the worker -----
    def _unload_on_worker(self) -> None:
        assert self.worker is not None
        self.worker.abort_active(ModelUnavailable("the model was unloaded"))
        self.worker.loaded = None
        self._release()

    def _load_on_worker(self, variant: Variant, source: VariantSource) -> None:
        assert self.worker is not None
        if self.worker.loaded is not None:
            self._unload_on_worker()
        delay_seconds = self._load_delay_seconds()
        if delay_seconds > 0:
            time.sleep(delay_seconds)  # the load_delay fault: a large model's load time
        encoder = self.encoders[variant]
        loaded = engine.load_model(
            variant,
            source.model_dir,
            source.quantization,
            self.device,
            encoder.tokenizer,
            self.config.dtype,
        )
        # Warm-up: readiness means the model really generates, not just that it loaded.
        prompt = encoder.encode(WARMUP_PROMPT, True)
        engine.check_logits_finite(loaded, prompt)
        decoding = engine.Decoding(loaded, prompt, Sampling(2, 0.0, 1.0, None, ()))
        for _ in range(2):
            decoding.step()
        self.worker.loaded = loaded
        self.loads_total += 1  # every completed load, the first one included

    # ----- operations -----
    async def load(self, variant: Variant, *, unless_loaded: bool = False) -> None:
        """Load `variant` (dropping whatever is loaded) and warm it up; not ready meanwhile.

        `unless_loaded`: decided under the lock, so a load that waited for
        another one to end does not repeat it.
        """
        source = self.source(variant)
        async with self._lock:
            if unless_loaded and self.loaded is not None and self.current == variant:
                return
            self.ready = False
            try:
                await self._on_worker(lambda: self._load_on_worker(variant, source))
            except engine.UnsoundVariant as error:
                if variant != Variant.FALLBACK:
                    raise
                await self._refuse_fallback(str(error))
            finally:
                self.ready = self.loaded is not None
            self.current = variant
            log.info(
                "model_loaded",
                variant=variant.value,
                model_name=self.config.model_name,
                quantization=source.quantization.value,
                unquantized_layers=len(self.loaded.unquantized_layers) if self.loaded else 0,
                **(self.loaded.kernels if self.loaded is not None else {}),
            )

    async def _refuse_fallback(self, reason: str) -> None:
        """The fallback proved unsound: mark it unavailable, serve the primary again, refuse.

        Called under the lock, with nothing loaded (the failed load dropped it).
        """
        self.unavailable_reason = f"the fallback is unavailable: {reason}"
        log.error("fallback_refused", reason=reason)
        primary = self.source(Variant.PRIMARY)
        await self._on_worker(lambda: self._load_on_worker(Variant.PRIMARY, primary))
        self.current = Variant.PRIMARY
        raise FallbackUnavailable(self.unavailable_reason, param="variant")

    async def unload(self) -> None:
        self.target = None  # an unloaded model is what was asked for: stop converging
        async with self._lock:
            self.ready = False
            await self._on_worker(self._unload_on_worker)
            log.info("model_unloaded", variant=self.current.value)

    async def ensure(self, variant: Variant) -> None:
        """Load `variant` unless it is the one loaded; it also becomes the target."""
        self.source(variant)  # refuse an unavailable fallback before anything changes
        self.target = variant
        await self.load(variant, unless_loaded=True)

    def converge_to(self, target: Variant) -> bool:
        """Declare `target`; True while a background load is heading for it."""
        self.source(target)
        self.target = target
        if self.converging:
            return True  # the running task picks up the new target after its load
        if self.loaded is not None and self.current == target:
            return False
        self.last_convergence_error = None
        self._converging = asyncio.get_running_loop().create_task(self._converge())
        return True

    async def _converge(self) -> None:
        while self.target is not None:
            target = self.target
            if self.loaded is not None and self.current == target:
                return
            try:
                await self.load(target, unless_loaded=True)
            except Exception as error:
                self.last_convergence_error = f"{target.value}: {error}"
                log.warning("variant_convergence_failed", target=target.value, error=repr(error))
                return
