"""The server's runtime state and the operations both ports share.

Why: the API port and the admin port run in one process and one event loop
and must agree on one truth: which variant is loaded, the breaker state,
the degradation level, the memory guard, counters and latency windows. This
module holds that state and the operations on it (admit a generation, run
an admin action, compose the stats document); the two Starlette apps are
thin layers over it. Model work is always handed to the inference worker.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import structlog
import torch

from fusebox_server import engine, memory
from fusebox_server.admission import Admission
from fusebox_server.breaker import Breaker
from fusebox_server.config import ServerConfig
from fusebox_server.errors import (
    BreakerOpen,
    Conflict,
    InvalidRequest,
    MemoryPressure,
    ModelUnavailable,
    ServerError,
)
from fusebox_server.faults import Faults
from fusebox_server.guard import MemoryReading, next_guard_state, pressure_ratio
from fusebox_server.openai_schema import Sampling
from fusebox_server.quality import QualitySampler
from fusebox_server.stats import (
    LatencyWindow,
    StatsDocument,
    compose_document,
    runtime_state,
)
from fusebox_server.tokenization import PromptEncoder, load_tokenizer
from fusebox_server.worker import (
    ControlJob,
    Event,
    Failed,
    Finished,
    GenerationJob,
    InferenceWorker,
)

log = structlog.get_logger("fusebox_server")

VARIANTS = ("primary", "fallback")
ACTION_TYPES = ("gc", "empty_cache", "unload", "load", "swap")
MAX_RECORDED_ACTIONS = 1000
WARMUP_PROMPT = "Hello"
LONG_PROMPT_CHARS = 8192
# Admission re-reads memory at most this often (the stats thread does every second).
GUARD_RECHECK_SECONDS = 0.05


def malloc_trim() -> None:
    """Return freed heap pages to the OS (glibc); RSS otherwise keeps them."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


@dataclass
class Counters:
    succeeded_total: int = 0
    failed_total: int = 0
    rejected_total: int = 0
    timed_out_total: int = 0
    cancelled_total: int = 0


@dataclass
class Generation:
    """The loop side of one running generation: events arrive on `events`."""

    job: GenerationJob
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    finished: bool = False

    def cancel(self) -> None:
        if not self.finished:
            self.job.cancelled.set()


class Runtime:
    def __init__(self, config: ServerConfig, faults: Faults) -> None:
        self.config = config
        self.faults = faults
        self.device = engine.pick_device(config.device)
        if config.torch_threads > 0:
            torch.set_num_threads(config.torch_threads)
        primary_tokenizer = load_tokenizer(config.model_dir)
        primary = PromptEncoder(primary_tokenizer, config.tokenizer_cache_size, config.templates)
        self.encoders: dict[str, PromptEncoder] = {"primary": primary, "fallback": primary}
        if config.fallback_dir is not None and config.fallback_dir != config.model_dir:
            self.encoders["fallback"] = PromptEncoder(
                load_tokenizer(config.fallback_dir), config.tokenizer_cache_size, config.templates
            )
        self.admission = Admission(config.max_concurrency, config.max_queue)
        self.breaker = Breaker()
        self.quality = QualitySampler(config.quality_sample_rate, config.latency_window_seconds)
        self.latency = {
            name: LatencyWindow(config.latency_window_seconds) for name in ("ttft", "itl", "e2e")
        }
        self.counters = Counters()
        self.variant = "primary"
        self.ready = False
        self.degradation_level = 0
        self.degraded_to_fallback = False
        self.memory_guard_active = False
        self.loop_heartbeat = time.time()
        self.started_at = time.time()
        self.nvml = memory.Nvml()
        self._actions: OrderedDict[str, asyncio.Future[dict[str, Any]]] = OrderedDict()
        self._model_lock: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.worker: InferenceWorker | None = None
        self._guard_lock = threading.Lock()
        self._guard_checked_at = 0.0

    # ----- lifecycle -----
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._model_lock = asyncio.Lock()
        self.worker = InferenceWorker(
            loop, self.faults, self.config.max_concurrency + 64, self.config.torch_threads
        )
        self.worker.start()

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()

    @property
    def fallback_configured(self) -> bool:
        return self.config.fallback_dir is not None or self.config.fallback_quantization != "none"

    @property
    def model_loaded(self) -> bool:
        return self.worker is not None and self.worker.loaded is not None

    @property
    def gpu_device_id(self) -> int | None:
        if self.device.type != "cuda":
            return None
        return self.device.index if self.device.index is not None else torch.cuda.current_device()

    def encoder(self) -> PromptEncoder:
        return self.encoders[self.variant]

    # ----- the worker as an awaitable -----
    async def on_worker(self, action: Any) -> Any:
        assert self.worker is not None and self._loop is not None
        future: asyncio.Future[Any] = self._loop.create_future()

        def deliver(result: Any, error: BaseException | None) -> None:
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

        self.worker.submit(ControlJob(action=action, deliver=deliver))
        return await future

    # ----- admission checks -----
    def check_available(self) -> None:
        """503s, in the order an operator would want to read them."""
        if time.monotonic() - self._guard_checked_at > GUARD_RECHECK_SECONDS:
            self.evaluate_memory_guard()
        if self.memory_guard_active:
            raise MemoryPressure("memory above the guard threshold; refusing new requests")
        if not self.breaker.admit():
            raise BreakerOpen(f"circuit breaker is {self.breaker.state}; retry later")
        if not self.model_loaded or not self.ready:
            raise ModelUnavailable("the model is not loaded; retry later")

    async def encode_prompt(self, text: str, add_special_tokens: bool) -> tuple[int, ...]:
        encoder = self.encoder()
        if len(text) > LONG_PROMPT_CHARS:
            # Long prompts are encoded off the loop and not cached (they are rarely repeated).
            return await asyncio.to_thread(encoder.encode_uncached, text, add_special_tokens)
        return encoder.encode(text, add_special_tokens)

    async def start_generation(
        self,
        request_id: str,
        prompt_ids: tuple[int, ...],
        sampling: Sampling,
        max_tokens: int,
        deadline_monotonic: float,
    ) -> Generation:
        """Admit (maybe wait) and hand a generation to the worker."""
        remaining = deadline_monotonic - time.monotonic()
        try:
            await self.admission.acquire(remaining)
        except ServerError as error:
            self.count_refusal(error)
            raise
        assert self.worker is not None
        variant = self.variant
        holder: list[Generation] = []

        def deliver(event: Event) -> None:
            generation = holder[0]
            if isinstance(event, Finished | Failed) and not generation.finished:
                generation.finished = True
                self.admission.release()
            generation.events.put_nowait(event)

        job = GenerationJob(
            request_id=request_id,
            variant=variant,
            prompt_ids=prompt_ids,
            sampling=sampling,
            max_tokens=max_tokens,
            deadline_monotonic=deadline_monotonic,
            tokenizer=self.encoders[variant].tokenizer,
            deliver=deliver,
        )
        generation = Generation(job=job)
        holder.append(generation)
        try:
            self.worker.submit(job)
        except Exception:
            generation.finished = True
            self.admission.release()
            raise
        return generation

    def count_refusal(self, error: ServerError) -> None:
        if error.status in (429, 503):
            self.counters.rejected_total += 1
        elif error.status == 504:
            self.counters.timed_out_total += 1

    def count_outcome(self, status: int) -> None:
        if status == 200:
            self.counters.succeeded_total += 1
        elif status == 504:
            self.counters.timed_out_total += 1
        elif status in (429, 503):
            self.counters.rejected_total += 1
        elif status >= 500:
            self.counters.failed_total += 1

    # ----- heartbeats -----
    async def beat_loop(self) -> None:
        while True:
            self.loop_heartbeat = time.time()
            await asyncio.sleep(0.5)

    def heartbeat_ages(self, now: float | None = None) -> dict[str, float]:
        now = time.time() if now is None else now
        worker = self.worker.effective_heartbeat(now) if self.worker is not None else now
        return {"loop": now - self.loop_heartbeat, "worker": now - worker}

    # ----- memory guard (stats thread) -----
    def memory_reading(self) -> MemoryReading:
        cgroup = memory.cgroup_memory()
        cuda = memory.cuda_memory(self.device)
        return MemoryReading(
            rss_bytes=memory.rss_bytes(),
            cgroup_usage_bytes=cgroup.usage_bytes,
            cgroup_limit_bytes=cgroup.limit_bytes,
            cuda_reserved_bytes=cuda["reserved_bytes"],
            cuda_total_bytes=memory.cuda_total_bytes(self.device),
        )

    def evaluate_memory_guard(self) -> bool:
        """Read memory and update the guard state; cheap enough for every admission."""
        with self._guard_lock:
            self._guard_checked_at = time.monotonic()
            reading = self.memory_reading()
            ratio = pressure_ratio(reading)
            was_active = self.memory_guard_active
            active = next_guard_state(was_active, ratio, self.config.memory_guard_ratio)
            self.memory_guard_active = active
        if active and not was_active:
            log.warning(
                "memory_guard_engaged",
                pressure_ratio=ratio,
                rss_bytes=reading.rss_bytes,
                cgroup_usage_bytes=reading.cgroup_usage_bytes,
                cgroup_limit_bytes=reading.cgroup_limit_bytes,
                cuda_reserved_bytes=reading.cuda_reserved_bytes,
            )
        elif was_active and not active:
            log.info("memory_guard_released", pressure_ratio=ratio)
        return active

    def check_memory_guard(self) -> None:
        """Stats-thread tick: evaluate, and while engaged run gc and empty_cache."""
        if self.evaluate_memory_guard():
            engine.release_memory(self.device)
            malloc_trim()

    # ----- model variants (run on the worker) -----
    def _variant_source(self, variant: str) -> tuple[Any, str]:
        if variant == "primary":
            return self.config.model_dir, "none"
        if not self.fallback_configured:
            raise Conflict("no fallback is configured (--fallback-dir or --fallback-quantization)")
        source = self.config.fallback_dir or self.config.model_dir
        return source, self.config.fallback_quantization

    def _unload_on_worker(self) -> None:
        assert self.worker is not None
        self.worker.abort_active(ModelUnavailable("the model was unloaded"))
        self.worker.loaded = None
        engine.release_memory(self.device)
        malloc_trim()

    def _load_on_worker(self, variant: str) -> None:
        assert self.worker is not None
        model_dir, quantization = self._variant_source(variant)
        encoder = self.encoders[variant]
        loaded = engine.load_model(variant, model_dir, quantization, self.device, encoder.tokenizer)
        # Warm-up: readiness means the model really generates, not just that it loaded.
        prompt = encoder.encode(WARMUP_PROMPT, True)
        decoding = engine.Decoding(loaded, prompt, Sampling(2, 0.0, 1.0, None, ()))
        for _ in range(2):
            decoding.step()
        self.worker.loaded = loaded

    async def load_variant(self, variant: str) -> None:
        """Load `variant` (unloading whatever is loaded first) and warm it up."""
        assert self._model_lock is not None
        async with self._model_lock:
            self.ready = False

            def action() -> None:
                if self.worker is not None and self.worker.loaded is not None:
                    self._unload_on_worker()
                self._load_on_worker(variant)

            try:
                await self.on_worker(action)
            except BaseException:
                if self.worker is not None and self.worker.loaded is not None:
                    self.ready = True
                raise
            self.variant = variant
            self.ready = True
            log.info("model_loaded", variant=variant, model_name=self.config.model_name)

    async def unload(self) -> None:
        assert self._model_lock is not None
        async with self._model_lock:
            self.ready = False
            await self.on_worker(self._unload_on_worker)
            log.info("model_unloaded", variant=self.variant)

    # ----- admin actions -----
    async def run_action(
        self, action_id: str, action_type: str, variant: str | None
    ) -> dict[str, Any]:
        """Run an admin action once per id; a repeated id gets the recorded result."""
        if action_type not in ACTION_TYPES:
            raise InvalidRequest(f"'type' must be one of {', '.join(ACTION_TYPES)}", param="type")
        if variant is not None and variant not in VARIANTS:
            raise InvalidRequest("'variant' must be primary or fallback", param="variant")
        recorded = self._actions.get(action_id)
        if recorded is not None:
            result = dict(await asyncio.shield(recorded))
            result["replayed"] = True
            return result
        assert self._loop is not None
        future: asyncio.Future[dict[str, Any]] = self._loop.create_future()
        self._actions[action_id] = future
        while len(self._actions) > MAX_RECORDED_ACTIONS:
            self._actions.popitem(last=False)
        try:
            result = await self._act(action_id, action_type, variant)
        except BaseException as error:
            future.set_exception(error)
            future.exception()  # mark retrieved: replays re-raise it
            raise
        future.set_result(result)
        return dict(result)

    async def _act(self, action_id: str, action_type: str, variant: str | None) -> dict[str, Any]:
        started = time.monotonic()
        before = await self.on_worker(lambda: memory.memory_snapshot(self.device))
        summary_before = await self.on_worker(self._memory_summary)
        previous_variant = self.variant
        if action_type == "gc":
            await self.on_worker(gc.collect)
        elif action_type == "empty_cache":
            await self.on_worker(self._empty_cache_on_worker)
        elif action_type == "unload":
            await self.unload()
        elif action_type == "load":
            target = variant or self.variant
            if not (self.model_loaded and self.variant == target):
                await self.load_variant(target)
        else:  # swap
            target = variant or ("fallback" if self.variant == "primary" else "primary")
            await self.load_variant(target)
        after = await self.on_worker(lambda: memory.memory_snapshot(self.device))
        summary_after = await self.on_worker(self._memory_summary)
        result: dict[str, Any] = {
            "id": action_id,
            "type": action_type,
            "variant": self.variant,
            "previous_variant": previous_variant,
            "model_loaded": self.model_loaded,
            "memory_before": before,
            "memory_after": after,
            "duration_seconds": round(time.monotonic() - started, 4),
            "replayed": False,
        }
        if action_type == "swap" and summary_before is not None:
            result["memory_summary_before"] = summary_before[0]
            result["memory_summary_after"] = summary_after[0] if summary_after else None
            after_stats = summary_after[1] if summary_after else {}
            result["memory_stats_diff"] = {
                key: after_stats.get(key, 0) - value
                for key, value in summary_before[1].items()
                if after_stats.get(key, 0) != value
            }
        log.info(
            "admin_action",
            action_id=action_id,
            action_type=action_type,
            variant=self.variant,
            rss_before=before["rss_bytes"],
            rss_after=after["rss_bytes"],
        )
        return result

    def _empty_cache_on_worker(self) -> None:
        engine.release_memory(self.device)
        malloc_trim()

    def _memory_summary(self) -> tuple[str, dict[str, int]] | None:
        """torch.cuda.memory_summary and the numeric memory_stats behind it (CUDA only)."""
        if self.device.type != "cuda" or not memory.cuda_initialized():
            return None
        stats = {
            key: int(value)
            for key, value in torch.cuda.memory_stats(self.device).items()
            if isinstance(value, int | float)
        }
        return str(torch.cuda.memory_summary(self.device, abbreviated=True)), stats

    async def set_degradation(self, level: int) -> None:
        """Level 2+ serves the fallback variant; going back under 2 restores the primary."""
        self.degradation_level = level
        if level >= 2 and self.variant != "fallback" and self.fallback_configured:
            await self.load_variant("fallback")
            self.degraded_to_fallback = True
        elif level < 2 and self.degraded_to_fallback:
            self.degraded_to_fallback = False
            if self.variant == "fallback":
                await self.load_variant("primary")

    # ----- views -----
    def state(self) -> dict[str, Any]:
        loaded = self.worker.loaded if self.worker is not None else None
        return {
            "model_name": self.config.model_name,
            "variant": self.variant,
            "model_loaded": loaded is not None,
            "ready": self.ready,
            "quantization": loaded.quantization if loaded else None,
            "parameter_bytes": loaded.parameter_bytes if loaded else None,
            "leaked_bytes": sum(t.numel() * t.element_size() for t in loaded.leaked)
            if loaded
            else 0,
            "breaker": {"state": self.breaker.state, "admit_percent": self.breaker.admit_percent},
            "degradation_level": self.degradation_level,
            "memory_guard_active": self.memory_guard_active,
            "running": self.admission.running,
            "queue_length": self.admission.waiting,
            "worker_active": self.worker.active_count if self.worker else 0,
            "asyncio_tasks": len(asyncio.all_tasks()),
            "threads": threading.active_count(),
            "tokenizer_cache_entries": self.encoder().cache_entries,
            "faults": self.faults.snapshot() if self.faults.armed else None,
            "device": str(self.device),
            "pid": os.getpid(),
        }

    def stats_document(self) -> StatsDocument:
        """The stats file (docs/stats-file.md), composed on the stats thread."""
        now = time.time()
        cgroup = memory.cgroup_memory()
        encoder = self.encoder()
        worker = self.worker
        loaded = worker.loaded if worker is not None else None
        variants = getattr(self, "variants", None)  # None before the variants refactor
        accounting = getattr(self, "accounting", None)  # None before the accounting refactor
        if accounting is not None:
            requests = accounting.totals()
        else:
            counters = self.counters
            requests = {
                outcome: getattr(counters, f"{outcome}_total")
                for outcome in ("succeeded", "failed", "rejected", "timed_out", "cancelled")
            }
        return compose_document(
            written_at=now,
            pid=os.getpid(),
            model_name=self.config.model_name,
            rss_bytes=memory.rss_bytes(),
            cgroup_usage_bytes=cgroup.usage_bytes,
            cgroup_limit_bytes=cgroup.limit_bytes,
            cuda=memory.cuda_stats(self.device),
            nvml=self.nvml.devices(),
            queue_length=self.admission.waiting,
            running=self.admission.running,
            tokenizer_cache_entries=encoder.cache_entries,
            tokenizer_cache_hits_total=encoder.cache_hits_total,
            tokenizer_template_hits_total=encoder.template_hits_total,
            requests=requests,
            latency={str(name): window.summary(now) for name, window in self.latency.items()},
            quality_sampled_total=self.quality.sampled_total,
            quality_failed_total=self.quality.failed_total,
            quality_failure_ratio=self.quality.failure_ratio(now),
            heartbeats={
                "loop": self.loop_heartbeat,
                "worker": worker.effective_heartbeat(now) if worker is not None else None,
            },
            state=runtime_state(
                breaker=self.breaker.state,
                admit_percent=self.breaker.admit_percent,
                degradation_level=self.degradation_level,
                variant=self.variant,
                model_loaded=self.model_loaded,
                memory_guard_active=self.memory_guard_active,
                model_revision=getattr(self.config, "model_revision", None),
                dtype=getattr(loaded, "dtype", None),
                quantization=getattr(loaded, "quantization", None),
                fallback_configured=self.fallback_configured,
                target_variant=variants.target_variant if variants is not None else self.variant,
                converging=variants.converging if variants is not None else None,
            ),
        )
