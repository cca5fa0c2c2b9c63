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

A change of variant is a transaction: it ends with the new variant serving
or the old one serving again, never with none. Where both fit in memory
the new one loads beside the old one, which is released only once the new
one is warm; else the old one is released first and loaded again when the
new one fails (`load_order.py` decides which). A fallback that fails to
load, for any reason, is marked unavailable with the error: the stats file
says so, the operator posts FallbackUnavailable and moves on, and a second
attempt is refused at once instead of taking the primary down again.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import structlog
import torch

from fusebox_contract.names import Quantization, Variant
from fusebox_server.config import ServerConfig
from fusebox_server.errors import FallbackUnavailable, ModelUnavailable
from fusebox_server.model import engine, load_order
from fusebox_server.model.decode_settings import DecodeSettings
from fusebox_server.model.load_order import LoadOrder, MemoryRoom
from fusebox_server.model.quantization import refusal
from fusebox_server.model.tokenization import PromptEncoder
from fusebox_server.model.worker import InferenceWorker

log = structlog.get_logger("fusebox_server")

WARMUP_PROMPT: Final = "Hello"
NO_FALLBACK: Final = (
    "no fallback is configured (neither --fallback-dir nor --fallback-quantization)"
)

# How much of a failed load's error the fallback's unavailable reason quotes.
REASON_ERROR_CHARS: Final = 300

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
        # What each variant's weights measured when it was last loaded (the load order's need).
        self.footprint_bytes: dict[Variant, int] = {}
        # The memories a load fills, read before each change of variant (replaceable in tests).
        self.memory_rooms: Callable[[], list[MemoryRoom]] = lambda: load_order.rooms(device)
        self.last_load_order: LoadOrder | None = None

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

    def _load_on_worker(self, variant: Variant, source: VariantSource, order: LoadOrder) -> None:
        """Load and warm up `variant`, then serve it; the old model goes first or last by `order`.

        Load-first: the old model stays loaded until the new one is warm (the
        pod stays ready; requests wait for this worker meanwhile), and a
        failure leaves it untouched. Either way, what a failed load allocated
        is released before the error leaves the worker: its traceback's frames
        are cleared, or they would hold the half-loaded weights.
        """
        assert self.worker is not None
        if order is LoadOrder.RELEASE_FIRST and self.worker.loaded is not None:
            self._unload_on_worker()
        try:
            loaded = self._warm_model_on_worker(variant, source)
        except BaseException as error:
            traceback.clear_frames(error.__traceback__)
            self._release()
            raise
        if self.worker.loaded is not None:
            self._unload_on_worker()
        self.worker.loaded = loaded
        self.footprint_bytes[variant] = loaded.footprint_bytes
        self.loads_total += 1  # every completed load, the first one included

    def _warm_model_on_worker(self, variant: Variant, source: VariantSource) -> engine.LoadedModel:
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
        decoding = engine.Decoding(loaded, prompt, DecodeSettings(2, 0.0, 1.0, None, ()))
        for _ in range(2):
            decoding.step()
        return loaded

    def _order_for(self, variant: Variant, source: VariantSource) -> LoadOrder:
        """Load-first when both fit (`load_order.py`); release-first when nothing is loaded,
        and under the load_delay fault, which stands for a model too large to load twice."""
        if self.loaded is None or self._load_delay_seconds() > 0:
            return LoadOrder.RELEASE_FIRST
        needed = self.footprint_bytes.get(variant)
        if needed is None:
            needed = load_order.weights_on_disk_bytes(source.model_dir)
        return load_order.load_order(needed, self.memory_rooms(), self.config.memory_guard_ratio)

    # ----- operations -----
    async def load(self, variant: Variant, *, unless_loaded: bool = False) -> None:
        """Make `variant` the one that serves, warmed up; on failure the previous one serves.

        `unless_loaded`: decided under the lock, so a load that waited for
        another one to end does not repeat it. Not ready while nothing can
        serve: during a release-first load, never during a load-first one.
        """
        source = self.source(variant)
        async with self._lock:
            if unless_loaded and self.loaded is not None and self.current == variant:
                return
            previous = self.current if self.loaded is not None else None
            order = self._order_for(variant, source)
            self.last_load_order = order
            if order is LoadOrder.RELEASE_FIRST:
                self.ready = False
            try:
                await self._on_worker(lambda: self._load_on_worker(variant, source, order))
            except Exception as error:
                await self._recover(variant, previous, order, error)
            finally:
                self.ready = self.loaded is not None
            self.current = variant
            log.info(
                "model_loaded",
                variant=variant.value,
                model_name=self.config.model_name,
                quantization=source.quantization.value,
                load_order=order.value,
                unquantized_layers=len(self.loaded.unquantized_layers) if self.loaded else 0,
                **(self.loaded.kernels if self.loaded is not None else {}),
            )

    async def _recover(
        self, variant: Variant, previous: Variant | None, order: LoadOrder, error: Exception
    ) -> None:
        """After a failed load (under the lock): a failed fallback is unavailable from now on,
        the previous variant serves again (loaded anew if it was released first), and the
        caller gets the error: FallbackUnavailable (409) for the fallback."""
        if variant == Variant.FALLBACK:
            detail = (
                str(error)
                if isinstance(error, engine.UnsoundVariant)
                else (f"loading it failed: {type(error).__name__}: {error}")
            )
            self.unavailable_reason = (
                f"the fallback is unavailable: {detail.splitlines()[0][:REASON_ERROR_CHARS]}"
            )
        restore = previous if previous is not None and previous != variant else None
        if restore is None and previous is not None and variant == Variant.FALLBACK:
            restore = Variant.PRIMARY  # a failed reload of the fallback: the primary serves
        log.error(
            "variant_load_failed",
            variant=variant.value,
            load_order=order.value,
            restore=restore.value if restore else None,
            error=repr(error)[:REASON_ERROR_CHARS],
            fallback_unavailable_reason=self.unavailable_reason,
        )
        if restore is not None:
            self.target = restore if self.target == variant else self.target
            if self.loaded is None:  # released first: bring the previous variant back
                back = self.source(restore)
                await self._on_worker(
                    lambda: self._load_on_worker(restore, back, LoadOrder.RELEASE_FIRST)
                )
            self.current = restore
            log.info("variant_restored", variant=restore.value, load_order=order.value)
        if variant == Variant.FALLBACK:
            raise FallbackUnavailable(str(self.unavailable_reason), param="variant") from error
        raise error

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
