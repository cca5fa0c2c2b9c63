"""The server's runtime state and the operations both ports share.

Why: the API port and the admin port run in one process and one event loop
and must agree on one truth: which variant serves, the breaker state, the
degradation level, the memory guard, counters and latency windows. This
module composes the concerns that hold that truth (`variants`, `actions`,
`accounting`, `admission`, `breaker`, `live_files`) and holds what is left:
the memory guard, heartbeats, the admin actions' memory figures, and the
views (`state`, `stats_document`). The two Starlette apps are thin layers
over it. Model work is always handed to the inference worker.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final

import structlog
import torch

from fusebox_contract.admin import (
    ActionResult,
    BreakerView,
    DegradationResult,
    ServerState,
    SwapMemory,
    WorkerDebug,
)
from fusebox_contract.metrics import LatencyHistogram
from fusebox_contract.names import (
    ActionType,
    DegradationLevel,
    DegradationTier,
    Fault,
    HeartbeatThread,
    LatencyMetric,
    Variant,
    engaged_tiers,
)
from fusebox_server.config import ServerConfig, prefill_chunk_tokens_for
from fusebox_server.control.accounting import RequestAccounting
from fusebox_server.control.actions import ActionLog
from fusebox_server.control.admission import Admission
from fusebox_server.control.breaker import Breaker
from fusebox_server.control.guard import (
    MemoryReading,
    next_guard_state,
    pressure_ratio,
    sheds_prefix_cache,
)
from fusebox_server.control.live_files import FileWatcher, LiveSettings, watched_files
from fusebox_server.control.quality import QualitySampler
from fusebox_server.control.recorder import Recorder
from fusebox_server.control.stats import (
    LatencyWindow,
    StatsDocument,
    TokenCounter,
    compose_document,
    latency_counters,
    runtime_state,
)
from fusebox_server.errors import BreakerOpen, MemoryPressure, ModelUnavailable
from fusebox_server.model import engine, memory
from fusebox_server.model.decode_settings import DecodeSettings
from fusebox_server.model.faults import Faults
from fusebox_server.model.tokenization import PromptEncoder, load_tokenizer
from fusebox_server.model.variants import Variants
from fusebox_server.model.worker import (
    ControlJob,
    EncodeAgain,
    Event,
    Failed,
    Finished,
    GenerationJob,
    InferenceWorker,
)

log = structlog.get_logger("fusebox_server")

LONG_PROMPT_CHARS: Final = 8192
# Admission re-reads memory at most this often (the stats thread does every second).
GUARD_RECHECK_SECONDS: Final = 0.05


def malloc_trim() -> None:
    """Return freed heap pages to the OS (glibc); RSS otherwise keeps them."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


@dataclass
class Generation:
    """The loop side of one running generation: its events arrive on `events`, tagged with
    its choice's index (the n generations of one request share one queue)."""

    job: GenerationJob
    release_slot: Callable[[], None]
    events: asyncio.Queue[tuple[int, Event]] = field(default_factory=asyncio.Queue)
    finished: bool = False

    def cancel(self) -> None:
        if not self.finished:
            self.job.cancelled.set()

    def end(self) -> None:
        """The worker is done with the job: its admission slot is freed, once."""
        if not self.finished:
            self.finished = True
            self.release_slot()

    def give_up(self) -> None:
        """The caller stops waiting (its deadline passed). The job is cancelled; if the
        worker has already let go of it, its final event was lost on the way (a failed
        allocation) and the slot is freed here, else it is when the worker reports."""
        self.cancel()
        if self.job.ended.is_set():
            self.end()


@dataclass
class Choices:
    """The generations of one request (`n` of them), in choice order, and their one queue."""

    generations: list[Generation]
    events: asyncio.Queue[tuple[int, Event]]

    @property
    def variant(self) -> str:
        return self.generations[0].job.variant

    @property
    def prompt_tokens(self) -> int:
        """The prompt's length as the generating variant reads it: encoded again when the
        job moved to a variant with another tokenizer (`worker._move_to`)."""
        return len(self.generations[0].job.prompt_ids)

    def cancel(self) -> None:
        for generation in self.generations:
            generation.cancel()

    def give_up(self) -> None:
        for generation in self.generations:
            generation.give_up()


def _delivered(generation: Generation, index: int, event: Event) -> None:
    """A worker event, on the loop: tagged with its choice; a final one frees the slot."""
    if isinstance(event, Finished | Failed):
        generation.end()
    generation.events.put_nowait((index, event))


class Runtime:
    def __init__(self, config: ServerConfig, faults: Faults) -> None:
        self.config = config
        self.faults = faults
        self.device = engine.pick_device(config.device)
        if config.torch_threads > 0:
            # Before any model loads; the worker thread sets it again for itself.
            torch.set_num_threads(config.torch_threads)
        primary = PromptEncoder(
            load_tokenizer(config.model_dir), config.tokenizer_cache_size, config.templates
        )
        self.encoders: dict[Variant, PromptEncoder] = {
            Variant.PRIMARY: primary,
            Variant.FALLBACK: primary,
        }
        if config.fallback_dir is not None and config.fallback_dir != config.model_dir:
            self.encoders[Variant.FALLBACK] = PromptEncoder(
                load_tokenizer(config.fallback_dir), config.tokenizer_cache_size, config.templates
            )
        self.live = LiveSettings(config.templates, dict(config.canned_answers), config.quality)
        self.file_watcher = FileWatcher(watched_files(config, self.live, self._set_templates))
        self.admission = Admission(config.max_concurrency, config.max_queue)
        self.breaker = Breaker()
        self.quality = QualitySampler(config.latency_window_seconds)
        self.latency_counters = latency_counters()  # histograms since start
        self.latency = {
            metric: LatencyWindow(
                config.latency_window_seconds, self.latency_counters[LatencyHistogram.of(metric)]
            )
            for metric in LatencyMetric
        }
        self.tokens = TokenCounter()
        # What the routes hand every finished generation to (tokens, latency, quality).
        self.recorder = Recorder(self.tokens, self.latency, self.quality, self.live)
        self.accounting = RequestAccounting()
        self.actions = ActionLog()
        self.variants = Variants(
            config,
            self.device,
            self.encoders,
            self.on_worker,
            self._release_memory,
            load_delay_seconds=lambda: float(self.faults.value(Fault.LOAD_DELAY)),
        )
        self.degradation_level = DegradationLevel.NONE
        self.degradation_tiers: frozenset[DegradationTier] = frozenset()
        self._degraded_to_fallback = False
        self.memory_guard_active = False
        self.memory_pressure_ratio: float | None = None  # at the last guard evaluation
        self.loop_heartbeat = time.time()
        self.stopping = False  # told to stop (SIGTERM): answers say Connection: close
        self.started_at = time.time()
        self.nvml = memory.Nvml()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.worker: InferenceWorker | None = None
        self._guard_lock = threading.Lock()
        self._guard_checked_at = 0.0

    # ----- lifecycle -----
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.worker = InferenceWorker(
            loop,
            self.faults,
            self.config.max_concurrency + 64,
            self.config.torch_threads,
            self.config.prefix_cache_bytes,
            prefill_chunk_tokens_for(self.device.type, self.config.prefill_chunk_tokens),
        )
        self.variants.worker = self.worker
        self.worker.start()
        self.file_watcher.start()

    def stop(self) -> None:
        self.file_watcher.stop()
        if self.worker is not None:
            self.worker.stop()

    def _set_templates(self, templates: tuple[str, ...]) -> None:
        for encoder in {id(e): e for e in self.encoders.values()}.values():
            encoder.set_templates(templates)

    # ----- views shared with the stats file -----
    @property
    def variant(self) -> Variant:
        return self.variants.current

    @property
    def ready(self) -> bool:
        return self.variants.ready and self.model_loaded and not self.stopping

    @property
    def fallback_configured(self) -> bool:
        return self.config.fallback_configured

    @property
    def model_loaded(self) -> bool:
        return self.variants.loaded is not None

    @property
    def gpu_device_id(self) -> int | None:
        if self.device.type != "cuda":
            return None
        return self.device.index if self.device.index is not None else torch.cuda.current_device()

    def encoder(self, variant: Variant | None = None) -> PromptEncoder:
        """The prompt encoder of `variant`, by default of the one serving now."""
        return self.encoders[self.variant if variant is None else variant]

    def vocabulary_size(self) -> int:
        """Token ids below this are ones the serving tokenizer has and the model scores."""
        known = len(self.encoder().tokenizer)
        loaded = self.variants.loaded
        scored = loaded.model.config.vocab_size if loaded is not None else known
        return min(known, int(scored))

    # ----- the worker as an awaitable -----
    async def on_worker(self, action: Callable[[], Any]) -> Any:
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
        if not self.ready:
            raise ModelUnavailable("the model is not loaded; retry later")

    async def encode_prompt(
        self, text: str, add_special_tokens: bool, variant: Variant | None = None
    ) -> tuple[int, ...]:
        """`text` in token ids of `variant`'s tokenizer (by default the serving one's)."""
        encoder = self.encoder(variant)
        if len(text) > LONG_PROMPT_CHARS:
            # Long prompts are encoded off the loop and not cached (they are rarely repeated).
            return await asyncio.to_thread(encoder.encode_uncached, text, add_special_tokens)
        return encoder.encode(text, add_special_tokens)

    async def cut_to_tokens(self, text: str, limit: int) -> tuple[str, int]:
        """`text` cut to at most `limit` tokens of the serving tokenizer, and its count
        (`PromptEncoder.cut_to_tokens`); a long text off the loop, as a long prompt."""
        encoder = self.encoder()
        if len(text) > LONG_PROMPT_CHARS:
            return await asyncio.to_thread(encoder.cut_to_tokens, text, limit)
        return encoder.cut_to_tokens(text, limit)

    async def start_generations(
        self,
        request_id: str,
        prompt_ids: tuple[int, ...],
        choices: Sequence[DecodeSettings],
        deadline_monotonic: float,
        variant: Variant | None = None,
        encode_again: EncodeAgain | None = None,
    ) -> Choices:
        """Admit (maybe wait) one running slot per choice, all at once, and hand the
        generations to the worker; each frees its own slot when the worker is done.

        `variant` is the one whose tokenizer encoded `prompt_ids` (by default the one
        serving now): a swap while the request waits for its slot leaves the jobs named
        after it, so the worker sees the change and encodes the prompt again
        (`encode_again`) for the variant that generates.
        """
        encoded_by = self.variant if variant is None else variant
        queued_at = time.monotonic()
        await self.admission.acquire(deadline_monotonic - queued_at, len(choices))
        submitted = 0
        generations: list[Generation] = []
        try:  # until the worker has a job, an error (a failed allocation too) frees its slot
            self.latency_counters[LatencyHistogram.QUEUE].observe([time.monotonic() - queued_at])
            assert self.worker is not None
            events: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
            for index, settings in enumerate(choices):
                job = GenerationJob(
                    request_id=request_id,
                    variant=encoded_by,
                    prompt_ids=prompt_ids,
                    settings=settings,
                    deadline_monotonic=deadline_monotonic,
                    tokenizer=self.encoders[encoded_by].tokenizer,
                    deliver=lambda event: None,
                    encode_again=encode_again,
                )
                generation = Generation(job, self.admission.release, events)
                job.deliver = partial(_delivered, generation, index)
                if generations:  # one request: its prefix-cache use is counted once
                    job.first_choice = generations[0].job
                generations.append(generation)
            # Everything is allocated: nothing between a submit and its count can fail.
            for generation in generations:
                self.worker.submit(generation.job)
                submitted += 1
        except BaseException:
            self.admission.release(len(choices) - submitted)
            for generation in generations[:submitted]:
                generation.cancel()
            raise
        return Choices(generations, events)

    # ----- heartbeats -----
    async def beat_loop(self) -> None:
        while True:
            self.loop_heartbeat = time.time()
            await asyncio.sleep(0.5)

    def heartbeat_ages(self, now: float | None = None) -> dict[str, float]:
        now = time.time() if now is None else now
        worker = self.worker.effective_heartbeat(now) if self.worker is not None else now
        return {
            HeartbeatThread.LOOP.value: now - self.loop_heartbeat,
            HeartbeatThread.WORKER.value: now - worker,
        }

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
            self.memory_pressure_ratio = ratio
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
        """Stats-thread tick: evaluate, and while engaged run gc and empty_cache; short of
        the guard, memory nearing it empties the prefix cache first (`sheds_prefix_cache`)."""
        if self.evaluate_memory_guard():
            self._release_memory()
        elif self.worker is not None and sheds_prefix_cache(
            self.memory_pressure_ratio, self.config.memory_guard_ratio
        ):
            if self.worker.prefix_cache.bytes:
                log.info("prefix_cache_shed", pressure_ratio=self.memory_pressure_ratio)
                self.worker.release_prefix_cache()

    def _release_memory(self) -> None:
        if self.worker is not None:
            self.worker.release_idle_batch()
            self.worker.release_prefix_cache()
        self.faults.leaks.release_caches()
        engine.release_memory(self.device)
        malloc_trim()
        self.faults.leaks.allocators_emptied()

    # ----- the primary at start -----
    async def load_primary(self) -> None:
        await self.variants.load(Variant.PRIMARY)

    # ----- admin actions -----
    async def run_action(
        self, action_id: str, action_type: ActionType, variant: Variant | None
    ) -> ActionResult:
        """Run an admin action once per id; a repeated id gets the recorded result."""
        asked = f"{action_type.value} {variant.value}" if variant else action_type.value
        return await self.actions.run_once(
            action_id, asked, lambda: self._act(action_id, action_type, variant)
        )

    async def _act(
        self, action_id: str, action_type: ActionType, variant: Variant | None
    ) -> ActionResult:
        started = time.monotonic()
        before = await self.on_worker(lambda: memory.memory_snapshot(self.device))
        summary_before = await self.on_worker(self._memory_summary)
        leaks_before = await self.on_worker(self.faults.leaks.figures)
        previous_variant = self.variant
        if action_type == ActionType.GC:
            await self.on_worker(gc.collect)
        elif action_type == ActionType.EMPTY_CACHE:
            await self.on_worker(self._release_memory)
        elif action_type == ActionType.UNLOAD:
            await self.variants.unload()
        elif action_type == ActionType.LOAD:
            await self.variants.ensure(variant or self.variant)
        else:  # swap
            target = variant or (
                Variant.FALLBACK if self.variant == Variant.PRIMARY else Variant.PRIMARY
            )
            self.variants.source(target)  # refuse an unavailable fallback before unloading
            self.variants.target = target
            await self.variants.load(target)
        after = await self.on_worker(lambda: memory.memory_snapshot(self.device))
        summary_after = await self.on_worker(self._memory_summary)
        swap_memory = None
        if action_type == ActionType.SWAP and summary_before is not None:
            after_stats = summary_after[1] if summary_after else {}
            swap_memory = SwapMemory(
                summary_before=summary_before[0],
                summary_after=summary_after[0] if summary_after else None,
                stats_diff={
                    key: after_stats.get(key, 0) - value
                    for key, value in summary_before[1].items()
                    if after_stats.get(key, 0) != value
                },
            )
        armed = self.faults.armed  # what each leak kind held before and after: what this freed
        result = ActionResult(
            id=action_id,
            type=action_type,
            variant=self.variant,
            previous_variant=previous_variant,
            model_loaded=self.model_loaded,
            memory_before=before,
            memory_after=after,
            duration_seconds=round(time.monotonic() - started, 4),
            leaks_before=leaks_before if armed else None,
            leaks_after=await self.on_worker(self.faults.leaks.figures) if armed else None,
            swap_memory=swap_memory,
        )
        log.info(
            "admin_action",
            action_id=action_id,
            action_type=action_type.value,
            variant=self.variant.value,
            rss_before=before.rss_bytes,
            rss_after=after.rss_bytes,
        )
        return result

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

    # ----- degradation -----
    def set_degradation(
        self, level: DegradationLevel, tiers: Iterable[DegradationTier] | None = None
    ) -> DegradationResult:
        """Set the level now; converge on its variant in the background.

        The level switches on the service's `tiers` at or below it (every tier
        up to it when none are given). An engaged fallback-model tier declares
        the fallback (when one is available); leaving it declares the primary
        again if the tier is what moved to the fallback (a swap the memory
        ladder made stays).
        """
        self.degradation_level = level
        self.degradation_tiers = engaged_tiers(level, tiers)
        to_fallback = DegradationTier.FALLBACK_MODEL in self.degradation_tiers
        if to_fallback and self.variants.fallback_available:
            self._degraded_to_fallback = True
            self.variants.converge_to(Variant.FALLBACK)
        elif not to_fallback and self._degraded_to_fallback:
            self._degraded_to_fallback = False
            self.variants.converge_to(Variant.PRIMARY)
        log.info(
            "degradation_set",
            degradation_level=int(level),
            tiers=self.degradation_tier_names(),
            variant=self.variant.value,
            target_variant=self.variants.target_variant.value,
        )
        return DegradationResult(
            level,
            self.engaged_tiers_in_order(),
            self.variant,
            self.variants.target_variant,
            self.variants.converging,
        )

    # ----- views -----
    def engaged_tiers_in_order(self) -> tuple[DegradationTier, ...]:
        return tuple(sorted(self.degradation_tiers, key=lambda t: t.level))

    def degradation_tier_names(self) -> list[str]:
        """The engaged tiers in level order, as the API spells them."""
        return [tier.value for tier in self.engaged_tiers_in_order()]

    def state(self, debug: WorkerDebug | None = None) -> ServerState:
        """`GET /admin/v1/state` (with the worker's `debug` figures) and the breaker's answer."""
        loaded = self.variants.loaded
        return ServerState(
            model_name=self.config.model_name,
            model_revision=self.config.model_revision,
            variant=self.variant,
            target_variant=self.variants.target_variant,
            converging=self.variants.converging,
            convergence_error=self.variants.last_convergence_error,
            model_loaded=loaded is not None,
            ready=self.ready,
            fallback_configured=self.fallback_configured,
            fallback_unavailable_reason=self.variants.unavailable_reason,
            quantization=loaded.quantization if loaded else None,
            dtype=loaded.dtype if loaded else None,
            parameter_bytes=loaded.parameter_bytes if loaded else None,
            leaked_bytes=sum(t.numel() * t.element_size() for t in loaded.leaked) if loaded else 0,
            model_loads=self.variants.loads_total,
            leaks=self.faults.leaks.figures() if self.faults.armed else None,
            breaker=BreakerView(self.breaker.state, self.breaker.admit_percent),
            degradation_level=self.degradation_level,
            degradation_tiers=self.engaged_tiers_in_order(),
            memory_guard_active=self.memory_guard_active,
            requests=dict(self.accounting.totals()),
            running=self.admission.running,
            queue_length=self.admission.waiting,
            worker_active=self.worker.active_count if self.worker else 0,
            torch_threads=self.worker.torch_threads if self.worker else None,
            asyncio_tasks=len(asyncio.all_tasks()),
            threads=threading.active_count(),
            tokenizer_cache_entries=self.encoder().cache_entries,
            faults=self.faults.snapshot() if self.faults.armed else None,
            device=str(self.device),
            pid=os.getpid(),
            debug=debug,
        )

    def stats_document(self) -> StatsDocument:
        """The stats file (docs/stats-file.md), composed on the stats thread."""
        now = time.time()
        cgroup = memory.cgroup_memory()
        encoder = self.encoder()
        worker = self.worker
        variants = self.variants
        loaded = variants.loaded
        return compose_document(
            written_at=now,
            started_at=self.started_at,
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
            requests=self.accounting.totals(),
            latency={name: window.summary() for name, window in self.latency.items()},
            histograms={name: c.counts() for name, c in self.latency_counters.items()},
            tokens=self.tokens.totals(),
            prefix_cache=worker.prefix_cache_figures() if worker else None,
            quality_sampled_total=self.quality.sampled_total,
            quality_failed_total=self.quality.failed_total,
            quality_failure_ratio=self.quality.failure_ratio(),
            heartbeats={
                HeartbeatThread.LOOP: self.loop_heartbeat,
                HeartbeatThread.WORKER: worker.effective_heartbeat(now) if worker else None,
            },
            state=runtime_state(
                breaker=self.breaker.state,
                admit_percent=self.breaker.admit_percent,
                degradation_level=self.degradation_level,
                variant=self.variant,
                model_loaded=self.model_loaded,
                memory_guard_active=self.memory_guard_active,
                model_revision=self.config.model_revision,
                dtype=loaded.dtype if loaded is not None else None,
                quantization=loaded.quantization if loaded is not None else None,
                fallback_configured=self.fallback_configured,
                fallback_unavailable_reason=variants.unavailable_reason,
                target_variant=variants.target_variant,
                converging=variants.converging,
            ),
        )
