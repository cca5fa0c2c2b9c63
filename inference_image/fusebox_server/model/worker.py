"""The inference worker: the one thread where torch runs.

Why: torch on the event loop would stall every connection, health checks
included. The loop hands admitted requests and admin actions to this thread
through a bounded queue; the thread interleaves the running requests one
decoding step each (so a request that is cancelled, or past its deadline,
stops within one step), and sends every token and the final result back with
`loop.call_soon_threadsafe`. Any exception inside one request goes to that
request's caller; the thread itself never dies. It stamps a heartbeat on
every turn, idle or not, which `/healthz` and the stats file read.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import structlog
import torch

from fusebox_contract.names import Fault
from fusebox_server.errors import (
    DeadlineExceeded,
    GenerationFailed,
    InvalidRequest,
    MemoryExhausted,
    ModelUnavailable,
    ServerError,
    memory_exhausted,
)
from fusebox_server.model.decode_settings import DecodeSettings, earliest_stop
from fusebox_server.model.engine import (
    DecodeBatch,
    Decoding,
    LoadedModel,
    prefill,
    prefill_groups,
    release_memory,
)
from fusebox_server.model.faults import Faults
from fusebox_server.model.memory import cuda_memory
from fusebox_server.model.prefix_cache import PrefixCache, PrefixCacheFigures
from fusebox_server.model.prefix_kv import PrefixKV, leading, new_prefix_cache, prompt_kv
from fusebox_server.model.slot_batch import SlotBatch, new_batch
from fusebox_server.model.structured_output import UnsupportedSchema, vocabulary_of
from fusebox_server.model.token_choice import TokenScore
from fusebox_server.model.tokenization import IncrementalDecoder, encodes_alike, token_text

IDLE_WAIT_SECONDS = 0.2
CONTROL_ACTION_GRACE_SECONDS = 900.0
# A result the loop could not take (an allocation failed) is offered again this often.
POST_ATTEMPTS = 200
POST_RETRY_SECONDS = 0.005
# What a request or an admin action ends with when the loop could not take a piece of its
# answer, or its result, for all those attempts.
PIECE_LOST_MESSAGE = (
    "the server could not allocate memory to send part of the answer, so the answer is "
    "incomplete; it keeps running, retry later"
)
RESULT_LOST_MESSAGE = (
    "the server could not allocate memory to report this action's result: the action ran "
    "but its result is lost; the server keeps running"
)
# Joiners' prompts run together up to this many (padded) tokens per forward pass.
PREFILL_TOKEN_BUDGET = 2048
# How much of an error a log line quotes.
ERROR_LOG_CHARS = 300
GENERATION_FAILED_MESSAGE = (
    "the server failed while generating this answer; the error is in its log"
)

log = structlog.get_logger("fusebox_server")


@dataclass(frozen=True)
class ScoredToken:
    """A generated token as text and bytes (`tokenization.token_text`), its log-probability
    and the most likely tokens at its position (themselves without alternatives)."""

    text: str
    raw: bytes
    logprob: float
    alternatives: tuple[ScoredToken, ...] = ()


@dataclass(frozen=True)
class Piece:
    """New text from the model (one decoded piece).

    `scores` are the tokens generated since the last piece, when the settings
    ask for scores: a token whose text is held back (a partial character, a
    possible stop) is scored with the piece that finally carries its text,
    and a piece may be empty text with scores only (the last tokens' text was
    cut by a stop sequence).
    """

    text: str
    completion_tokens: int
    scores: tuple[ScoredToken, ...] = ()


@dataclass(frozen=True)
class Finished:
    """The generation ended: `stop`, `length` or `cancelled`."""

    reason: str
    completion_tokens: int
    cuda_at_entry: dict[str, int | None]


@dataclass(frozen=True)
class Failed:
    """The generation failed; the caller maps the error to a status."""

    error: ServerError
    completion_tokens: int


Event = Piece | Finished | Failed


@dataclass(frozen=True)
class EncodeAgain:
    """How the request's prompt is encoded again for another variant (its tokenizer and
    chat template), built by the route. Two steps, so that a prompt refused for its new
    length is still counted in the new variant's tokens (the access log's `input_length`)."""

    encode: Callable[[str], tuple[int, ...]]
    """The prompt's token ids for the variant named; raises the request's error (a
    `ServerError`) when the request cannot be carried over to it."""
    fit: Callable[[int], int]
    """The new tokens a prompt of that many tokens may generate; raises the admission's
    400 when it no longer fits."""


@dataclass
class GenerationJob:
    request_id: str
    variant: str
    prompt_ids: tuple[int, ...]
    settings: DecodeSettings
    deadline_monotonic: float
    tokenizer: Any
    deliver: Callable[[Event], None]
    cancelled: threading.Event = field(default_factory=threading.Event)
    # Set by the worker when it lets go of the job, before its final event is posted.
    ended: threading.Event = field(default_factory=threading.Event)
    decoding: Decoding | None = None
    decoder: IncrementalDecoder | None = None
    completion_tokens: int = 0
    text: str = ""
    emitted_chars: int = 0
    pending_scores: list[ScoredToken] = field(default_factory=list)
    cuda_at_entry: dict[str, int | None] = field(default_factory=dict)
    # Prompt tokens whose keys and values came from the prefix cache (0: a miss).
    reused_prefix_tokens: int = 0
    # A request's `n` choices are one job each; the runtime points the later ones to the
    # first, which holds whether the request's prefix-cache use is counted (`_count_prefix`).
    first_choice: GenerationJob | None = None
    prefix_counted: bool = False
    # How to encode the prompt again if the variant changes to one with another tokenizer
    # before the job starts (`_move_to`); None: such a job is refused with a 503.
    encode_again: EncodeAgain | None = None


@dataclass
class ControlJob:
    action: Callable[[], Any]
    deliver: Callable[[Any, BaseException | None], None]


def scored_token(tokenizer: Any, score: TokenScore, first: bool) -> ScoredToken:
    """The score with each token id as its text and bytes; `first`: the generation's first
    token (its text starts the answer)."""
    return ScoredToken(
        *token_text(tokenizer, score.token_id, first),
        score.logprob,
        tuple(
            ScoredToken(*token_text(tokenizer, token_id, first), logprob)
            for token_id, logprob in score.alternatives
        ),
    )


def _held_back_chars(text: str, stops: tuple[str, ...]) -> int:
    """How many trailing chars could start a stop sequence (kept until decided).

    Per stop, only the last len(stop) - 1 chars can start it: the longest of
    their suffixes that is a prefix of the stop is found with the
    Knuth-Morris-Pratt automaton, in time linear in the stop's length.
    """
    return max((_partial_stop_chars(text, stop) for stop in stops), default=0)


def _partial_stop_chars(text: str, stop: str) -> int:
    pattern = stop[:-1]  # a whole stop in the text ends it; only a proper prefix is held
    if not pattern or not text:
        return 0
    failure = [0] * len(pattern)  # failure[i]: longest proper border of pattern[: i + 1]
    border = 0
    for index in range(1, len(pattern)):
        while border and pattern[index] != pattern[border]:
            border = failure[border - 1]
        if pattern[index] == pattern[border]:
            border += 1
        failure[index] = border
    matched = 0
    for char in text[-len(pattern) :]:
        while matched and (matched == len(pattern) or char != pattern[matched]):
            matched = failure[matched - 1]
        if char == pattern[matched]:
            matched += 1
    return matched


class InferenceWorker(threading.Thread):
    def __init__(
        self,
        loop: Any,
        faults: Faults,
        inbox_size: int,
        torch_threads: int = 0,
        prefix_cache_bytes: int = 0,
        prefill_chunk_tokens: int = 0,
    ) -> None:
        super().__init__(name="fusebox-inference", daemon=True)
        self._loop = loop
        self._faults = faults
        self._inbox: queue.Queue[GenerationJob | ControlJob] = queue.Queue(maxsize=inbox_size)
        self._active: list[GenerationJob] = []
        self._stopping = threading.Event()
        self.loaded: LoadedModel | None = None
        self.heartbeat = time.time()
        self.control_started_at: float | None = None
        self._torch_threads = torch_threads
        self.torch_threads: int | None = None
        self._batch: DecodeBatch | SlotBatch | None = None
        self._release_idle_batch = threading.Event()
        # Prompt prefixes' keys and values, of the model in `loaded` only (`_prefix_cache_of`).
        self.prefix_cache = new_prefix_cache(prefix_cache_bytes)
        self._prefix_cache_model: LoadedModel | None = None
        self._release_prefix_cache = threading.Event()
        # Prompts longer than this run a chunk per turn (0: whole, in one forward pass).
        self._prefill_chunk_tokens = prefill_chunk_tokens
        # Started jobs whose prompts run in chunks, oldest first (`_prefill_next_chunk`).
        self._chunked: list[GenerationJob] = []
        # The last pair of tokenizers compared for a job moved to another variant, and whether
        # they encode alike (`_encodes_alike`).
        self._alike: tuple[Any, Any, bool] | None = None
        # Admin actions' answers the loop could not take: offered again every turn.
        self._undelivered: list[Callable[[], None]] = []

    # ----- called from the event loop -----
    def submit(self, job: GenerationJob | ControlJob) -> None:
        self._inbox.put_nowait(job)

    def stop(self) -> None:
        self._stopping.set()

    @property
    def active_count(self) -> int:
        return len(self._active)

    @property
    def batch_rows(self) -> int:
        """Rows in the decode batch: each holds its KV cache, so a leaked one holds memory."""
        batch = self._batch
        return len(batch) if batch is not None else 0

    @property
    def inbox_length(self) -> int:
        return self._inbox.qsize()

    def release_idle_batch(self) -> None:
        """Ask for the decode batch's cache to be dropped while no request decodes.

        A CUDA `SlotBatch` keeps its slot cache and graphs between bursts;
        memory release (the `empty_cache` action, the memory guard) asks for
        them back. On this thread (an admin action) it happens at once, from
        another at the start of the worker's next turn.
        """
        self._release_idle_batch.set()
        if threading.current_thread() is self:
            self._drop_idle_batch()

    def release_prefix_cache(self) -> None:
        """Ask for the prefix cache to be emptied (the `empty_cache` action, the memory
        guard, or memory nearing it): at once on this thread, else at the next turn."""
        self._release_prefix_cache.set()
        if threading.current_thread() is self:
            self._drop_prefix_cache()

    def prefix_cache_figures(self) -> PrefixCacheFigures:
        return self.prefix_cache.figures()

    def _drop_prefix_cache(self) -> None:
        if self._release_prefix_cache.is_set():
            self._release_prefix_cache.clear()
            self.prefix_cache.shed()

    def _drop_idle_batch(self) -> None:
        if not self._release_idle_batch.is_set():
            return
        self._release_idle_batch.clear()
        if self._batch is not None:
            self._batch.release()

    # ----- the thread -----
    def run(self) -> None:
        if self._torch_threads > 0:
            # Per thread under OpenMP: set it where torch runs.
            torch.set_num_threads(self._torch_threads)
        self.torch_threads = torch.get_num_threads()  # what this thread really uses
        while not self._stopping.is_set():
            try:
                self.heartbeat = time.time()
                self._turn()
            except BaseException as error:  # the worker must outlive anything
                self._recover(error)

    def _recover(self, error: BaseException) -> None:
        """A turn failed outside any one job: fail the running jobs, pause, go on.

        Itself guarded: when memory is short, failing the jobs can fail too; they
        stay active and the next turn carries on with them.
        """
        try:
            self._fail_all(memory_exhausted(error) or self._unexpected(error, "inference_worker"))
        except MemoryError:
            pass
        time.sleep(IDLE_WAIT_SECONDS)

    def _turn(self) -> None:
        self._redeliver()
        self._drop_idle_batch()
        self._drop_prefix_cache()
        self._take_inbox(block=not self._active)
        for job in list(self._active):
            self._guarded(job, partial(self._check_alive, job))
        self._prefill_joiners([job for job in self._active if job.decoding is None])
        self._prefill_next_chunk()
        if self._batch is not None and len(self._batch):
            self._batched_step()

    def _guarded(self, job: GenerationJob, action: Callable[[], object]) -> None:
        """Run one job's part of a turn; its errors go to its caller, never up."""
        try:
            action()
        except ServerError as error:
            self._finish(job, Failed(error, job.completion_tokens))
        except Exception as error:
            failure = self._generation_error(error, [job])
            self._finish(job, Failed(failure, job.completion_tokens))

    def _generation_error(self, error: Exception, jobs: list[GenerationJob]) -> ServerError:
        """An allocation failure is a 503 (and frees what the allocator caches); a schema
        this tokenizer's matcher refuses is a 400; anything else a 500 that says nothing
        of the error (the log has it)."""
        if isinstance(error, UnsupportedSchema):
            return InvalidRequest(
                f"the output format (response_format, or the forced tool call's parameters) "
                f"cannot be enforced: {error.reason}"
            )
        exhausted = memory_exhausted(error)
        if exhausted is None:
            return self._unexpected(error, "generation", [job.request_id for job in jobs])
        if isinstance(error, torch.OutOfMemoryError):
            release_memory(self.loaded.device if self.loaded else torch.device("cpu"))
        return exhausted

    @staticmethod
    def _unexpected(
        error: BaseException, where: str, request_ids: list[str] | None = None
    ) -> GenerationFailed:
        """A 500 whose message is generic: a library's text (a path, a backtrace) stays in
        the server log."""
        try:
            log.error(
                "generation_error",
                where=where,
                request_ids=request_ids,
                error=repr(error)[:ERROR_LOG_CHARS],
            )
        except Exception:  # logging allocates too: a lost line must not lose the answer
            pass
        return GenerationFailed(GENERATION_FAILED_MESSAGE)

    def _check_alive(self, job: GenerationJob) -> None:
        if job.cancelled.is_set():
            self._finish(job, Finished("cancelled", job.completion_tokens, job.cuda_at_entry))
        elif time.monotonic() > job.deadline_monotonic:
            raise DeadlineExceeded("the request outlived its deadline during generation")

    def _prefill_joiners(self, joiners: list[GenerationJob]) -> None:
        """Start new jobs: their prompts run together (in groups), then they join the batch.

        A group whose forward pass fails is retried one job at a time, so the
        error reaches only the job that caused it (a prompt the model rejects)
        and the others start as if alone.
        """
        for job in joiners:
            self._guarded(job, partial(self._start, job))
        started = [job for job in joiners if job.decoding is not None]
        for job in started:
            self._guarded(job, partial(self._reuse_prefix, job))
        started = [job for job in started if job.decoding is not None]
        # A prompt longer than a chunk runs a chunk per turn (`_prefill_next_chunk`).
        chunked = {id(job) for job in started if self._runs_in_chunks(job)}
        self._chunked.extend(job for job in started if id(job) in chunked)
        started = [job for job in started if id(job) not in chunked]
        # A row that starts from a cached prefix runs its own rest; the group's prefill
        # runs whole prompts from position 0.
        for job in [job for job in started if job.reused_prefix_tokens]:
            self._guarded(job, partial(self._prefill_alone, job))
        started = [job for job in started if not job.reused_prefix_tokens]
        lengths = [len(job.prompt_ids) for job in started]
        for indexes in prefill_groups(lengths, PREFILL_TOKEN_BUDGET):
            group = [started[index] for index in indexes]
            if len(group) > 1:
                decodings = [job.decoding for job in group if job.decoding is not None]
                try:
                    tokens = prefill(decodings[0].loaded, decodings)
                except Exception:
                    pass
                else:
                    self._joined(group, tokens)
                    continue
            for job in group:
                self._guarded(job, partial(self._prefill_alone, job))

    def _runs_in_chunks(self, job: GenerationJob) -> bool:
        chunk = self._prefill_chunk_tokens
        return (
            bool(chunk)
            and job.decoding is not None
            and (len(job.decoding.pending_prompt()) > chunk)
        )

    def _prefill_next_chunk(self) -> None:
        """Chunked prefill: one chunk of the oldest prompt that runs in chunks, so the
        batch's rows take their step this turn too (a 2,048-token prompt whole is one
        forward pass every running stream waits for). The last chunk runs as a whole
        prompt's rest does: it chooses the first token and the job joins the batch. One
        chunk per turn, whatever the number of such prompts, bounds what a step waits
        for; they take their turns oldest first."""
        if self._chunked:
            job = self._chunked[0]
            self._guarded(job, partial(self._run_chunk, job))

    def _run_chunk(self, job: GenerationJob) -> None:
        decoding = job.decoding
        assert decoding is not None
        if len(decoding.pending_prompt()) > self._prefill_chunk_tokens:
            decoding.prefill_chunk(self._prefill_chunk_tokens)
            return
        self._chunked = [other for other in self._chunked if other is not job]
        self._prefill_alone(job)

    def _count_prefix(self, job: GenerationJob) -> None:
        """Count the request's prefix-cache hit (the tokens its prefill started from) or
        miss, once per request, when its first token is generated: as the prompt tokens are
        counted (`Recorder.finished`), so the reused tokens are a share of those."""
        first = job.first_choice or job
        if first.prefix_counted or not self.prefix_cache.enabled:
            return
        first.prefix_counted = True
        self.prefix_cache.count(job.reused_prefix_tokens)

    def _prefix_cache_of(self, loaded: LoadedModel) -> PrefixCache[PrefixKV]:
        """The prefix cache, emptied first if it holds another model's keys and values."""
        if self._prefix_cache_model is not loaded:
            self.prefix_cache.clear()
            self._prefix_cache_model = loaded
        return self.prefix_cache

    def _reuse_prefix(self, job: GenerationJob) -> None:
        """Start the job from the longest cached prefix of its prompt, if any.

        The cache is an optimisation, never a request's error: a match or a copy
        that fails (on the CPU a failed allocation is a plain RuntimeError) leaves
        the job as on a miss, its prompt to run whole (`_skip_prefix_cache`).
        """
        decoding = job.decoding
        assert decoding is not None
        cache = self._prefix_cache_of(decoding.loaded)
        if not cache.enabled:
            return
        try:
            found = cache.match(job.prompt_ids)  # copies the shared part of a partial match
            if found is None:
                return
            decoding.start_from_prefix(leading(found.value, found.length))
        except Exception as error:
            self._skip_prefix_cache("reuse", job, cache, error)
            return
        job.reused_prefix_tokens = found.length

    def _keep_prefixes(self, group: list[GenerationJob]) -> None:
        """Cache the prompts a prefill just computed in full (not the ones that started
        from a prefix: their shared part is cached already). A copy that cannot be made
        is skipped: the cache is an optimisation, never a request's error; the rows
        decode on, uncached."""
        for job in group:
            decoding = job.decoding
            if decoding is None or job.reused_prefix_tokens or decoding.cache is None:
                continue
            cache = self._prefix_cache_of(decoding.loaded)
            if not cache.enabled:
                return
            try:
                cache.insert(job.prompt_ids, prompt_kv(decoding))
            except Exception as error:
                self._skip_prefix_cache("keep", job, cache, error)
                return

    def _skip_prefix_cache(
        self, step: str, job: GenerationJob, cache: PrefixCache[PrefixKV], error: Exception
    ) -> None:
        """Log a prefix-cache step that failed; when memory ran short, empty the cache too
        (its entries are what can be given back; `shed` counts them as evictions)."""
        exhausted = memory_exhausted(error) is not None or isinstance(error, torch.OutOfMemoryError)
        if exhausted:
            cache.shed()
        try:
            log.warning(
                "prefix_cache_skipped",
                step=step,
                request_id=job.request_id,
                memory_exhausted=exhausted,
                error=repr(error)[:ERROR_LOG_CHARS],
            )
        except Exception:  # logging allocates too: a lost line must not fail the request
            pass

    def _prefill_alone(self, job: GenerationJob) -> None:
        assert job.decoding is not None
        self._joined([job], [job.decoding.step()])

    def _joined(self, group: list[GenerationJob], tokens: list[int | Exception]) -> None:
        """After a prefill: the group joins the batch, then each takes its first token."""
        decodings = [job.decoding for job in group if job.decoding is not None]
        loaded = decodings[0].loaded
        self._keep_prefixes(group)
        batch = self._batch
        if batch is None or batch.loaded is not loaded:
            batch = self._batch = new_batch(loaded)
        try:
            batch.add(*decodings)
        except Exception as error:  # e.g. the merge's allocation failed: the batch is unchanged
            failure = self._generation_error(error, group)
            for job in group:
                job.decoding = None
                self._finish(job, Failed(failure, job.completion_tokens))
            return
        for job, token_id in zip(group, tokens, strict=True):
            if job in self._active:
                self._guarded(job, partial(self._on_token, job, token_id))

    def _batched_step(self) -> None:
        batch = self._batch
        assert batch is not None
        jobs = {id(job.decoding): job for job in self._active if job.decoding is not None}
        members: list[GenerationJob] = []
        for row in list(batch.rows):
            member = jobs.get(id(row))
            if member is None:
                batch.remove(row)  # an orphan row would decode for nobody
            else:
                members.append(member)
        if not members:
            return
        try:
            tokens = batch.step()
        except Exception as error:  # the batch is lost; its members fail, the worker goes on
            self._batch = None
            failure = self._generation_error(error, members)
            for job in members:
                job.decoding = None
                self._finish(job, Failed(failure, job.completion_tokens))
            return
        self._slow_fault(members)
        for job, token_id in zip(members, tokens, strict=True):
            if job in self._active:
                self._guarded(job, partial(self._on_token, job, token_id))

    def _on_token(self, job: GenerationJob, token_id: int | Exception) -> bool:
        """Decode, emit, and finish the job if this token ends it; True when it ended.

        An error in the token's place is this row's sampling failure: raised here, it
        fails this job alone (`_guarded`), and the batch's other rows go on.
        """
        if isinstance(token_id, Exception):
            raise token_id
        assert job.decoding is not None and job.decoder is not None
        if job.decoding.is_end(token_id):
            # An output format ends its row itself; an end token before its document is
            # whole means no token could go on (`ConstrainedRow.choose`).
            reason = "length" if job.decoding.document_incomplete else "stop"
            self._complete(job, reason, job.decoder.flush())
            return True
        job.completion_tokens += 1
        if job.completion_tokens == 1:
            self._count_prefix(job)
        score = job.decoding.last_score
        if job.settings.top_alternatives is not None and score is not None:
            first = job.completion_tokens == 1
            job.pending_scores.append(scored_token(job.tokenizer, score, first))
        piece = job.decoder.push(token_id)
        if job.decoding.document_finished:
            self._complete(job, "stop", piece + job.decoder.flush())
            return True
        if job.completion_tokens >= job.settings.max_new_tokens:
            self._complete(job, "length", piece + job.decoder.flush())
            return True
        if self._append(job, piece, final=False):
            self._finish(job, Finished("stop", job.completion_tokens, job.cuda_at_entry))
            return True
        return False

    def _take_inbox(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=IDLE_WAIT_SECONDS) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            if isinstance(item, ControlJob):
                self._run_control(item)
            else:
                self._active.append(item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _run_control(self, job: ControlJob) -> None:
        # Made before the action: when its result cannot be handed over, memory is short.
        answer_lost = partial(job.deliver, None, MemoryExhausted(RESULT_LOST_MESSAGE))
        self.control_started_at = time.time()
        try:
            result = job.action()
        except BaseException as error:
            delivered = self._post(job.deliver, None, error)
        else:
            delivered = self._post(job.deliver, result, None)
        finally:
            self.control_started_at = None
            self.heartbeat = time.time()
        if not delivered:
            # The action's caller would wait forever, and so would a retry with its id
            # (`ActionLog`): it gets an error instead, offered again every turn until taken.
            self._undelivered.append(answer_lost)

    def _redeliver(self) -> None:
        """Offer the loop, once each, the admin actions' answers it could not take before."""
        while self._undelivered:
            try:
                self._loop.call_soon_threadsafe(self._undelivered[0])
            except MemoryError:
                return  # memory is still short: next turn
            except RuntimeError:
                pass  # the loop is closed: nobody waits any more
            self._undelivered.pop(0)

    def effective_heartbeat(self, now: float) -> float:
        """The heartbeat, counting a model load or swap in progress as alive (up to a limit).

        Loading a large model takes minutes on this thread; liveness must not
        kill the pod for it. A control action running longer than
        CONTROL_ACTION_GRACE_SECONDS is treated as a hang.
        """
        started = self.control_started_at
        if started is not None and now - started < CONTROL_ACTION_GRACE_SECONDS:
            return now
        return self.heartbeat

    def _post(self, callback: Callable[..., None], *args: Any) -> bool:
        """Hand a result to the loop, retrying a failed allocation for a while; False when
        the loop did not take it.

        What the caller does about a loss: a lost piece of text fails its request
        (`_emit`), a lost admin answer becomes an error offered again every turn
        (`_run_control`). A final event lost all the same is made good at the
        request's deadline (runtime.Generation.give_up: the job has ended, its
        slot is freed).
        """
        for _ in range(POST_ATTEMPTS):
            try:
                self._loop.call_soon_threadsafe(callback, *args)
                return True
            except RuntimeError:
                return False  # the loop is closed: the process is shutting down
            except MemoryError:
                time.sleep(POST_RETRY_SECONDS)
        return False

    def _finish(self, job: GenerationJob, event: Event) -> None:
        if job in self._active:
            self._active.remove(job)
        self._chunked = [other for other in self._chunked if other is not job]
        job.ended.set()
        decoding, job.decoding = job.decoding, None
        if decoding is not None and self._batch is not None:
            try:
                self._batch.remove(decoding)
            except Exception:  # e.g. MemoryError: the next step prunes the orphan row
                pass
        self._post(job.deliver, event)

    def _fail_all(self, error: ServerError) -> None:
        for job in list(self._active):
            self._finish(job, Failed(error, job.completion_tokens))

    def abort_active(self, error: ServerError) -> None:
        """Called on this thread by unload/swap: running requests lose their model.

        Jobs not started yet hold nothing of it: they stay, and start on the model
        that serves after the change (`_start`), or fail there if none does.
        """
        for job in list(self._active):
            if job.decoding is not None:
                self._finish(job, Failed(error, job.completion_tokens))
        self._chunked = []
        self._batch = None
        self.prefix_cache.clear()  # keys and values of the model that goes
        self._prefix_cache_model = None

    def _emit(self, job: GenerationJob, text: str) -> None:
        """Post new text, with the scores of the tokens since the last piece (if any).

        A piece the loop could not take ends the request with a 503: sent on, the
        answer would reach the client with a hole in it, reported as a success.
        """
        if text or job.pending_scores:
            scores, job.pending_scores = tuple(job.pending_scores), []
            if not self._post(job.deliver, Piece(text, job.completion_tokens, scores)):
                raise MemoryExhausted(PIECE_LOST_MESSAGE)

    def _slow_fault(self, jobs: list[GenerationJob]) -> None:
        """The `slow` fault: N ms per token, in slices so a cancel or a change takes effect."""
        started = time.monotonic()
        while not self._stopping.is_set() and not all(job.cancelled.is_set() for job in jobs):
            left = self._faults.value(Fault.SLOW) / 1000.0 - (time.monotonic() - started)
            if left <= 0:
                return
            time.sleep(min(left, 0.05))

    def _start(self, job: GenerationJob) -> None:
        loaded = self.loaded
        if loaded is None:
            raise ModelUnavailable("the model was unloaded before generation started")
        if loaded.variant != job.variant:
            self._move_to(job, loaded)
        job.cuda_at_entry = cuda_memory(loaded.device)
        self._faults.grow_leaks(loaded)
        vocabulary = vocabulary_of(job.tokenizer) if job.settings.output_format else None
        job.decoding = Decoding(loaded, job.prompt_ids, job.settings, vocabulary)
        job.decoder = IncrementalDecoder(job.tokenizer)

    def _move_to(self, job: GenerationJob, loaded: LoadedModel) -> None:
        """The variant changed while the job waited: it runs on the one that serves now.

        A load-first change keeps the pod ready, so jobs named after the old
        variant queue behind the load; they wait and are then served
        (docs/decisions/fallback-swap.md), under the new variant's name (the
        response headers, the access log). A model with another tokenizer reads
        the prompt's token ids as other text, so the prompt is encoded again with
        its tokenizer and chat template (`encode_again`, which also checks the
        limits again, and may refuse); a job that cannot be encoded again is
        refused with a 503.

        The job takes the new variant's name before anything can refuse it: a
        refusal here is the new variant's (the access log names it, and counts the
        prompt in its tokens once encoded).
        """
        alike = self._encodes_alike(job.tokenizer, loaded.tokenizer)
        job.variant = loaded.variant
        job.tokenizer = loaded.tokenizer
        if alike:
            return
        if job.encode_again is None:
            raise ModelUnavailable(
                "the model was swapped for one with another tokenizer before generation started"
            )
        job.prompt_ids = job.encode_again.encode(loaded.variant)
        max_new_tokens = job.encode_again.fit(len(job.prompt_ids))
        job.settings = replace(job.settings, max_new_tokens=max_new_tokens)

    def _encodes_alike(self, first: Any, second: Any) -> bool:
        """`tokenization.encodes_alike`, remembered for the last pair (it serialises both)."""
        if first is second:
            return True
        known = self._alike
        if known is not None and known[0] is first and known[1] is second:
            return known[2]
        alike = second is not None and encodes_alike(first, second)
        self._alike = (first, second, alike)
        return alike

    def _append(self, job: GenerationJob, piece: str, final: bool) -> bool:
        """Add text; emit what is safe; returns True when a stop sequence ended it."""
        job.text += piece
        stops = job.settings.stop
        index = earliest_stop(job.text, stops, job.emitted_chars)
        if index is not None:
            self._emit(job, job.text[job.emitted_chars : index])
            job.text = job.text[:index]
            job.emitted_chars = index
            return True
        safe_end = len(job.text) if final else len(job.text) - _held_back_chars(job.text, stops)
        if safe_end > job.emitted_chars:
            self._emit(job, job.text[job.emitted_chars : safe_end])
            job.emitted_chars = safe_end
        return False

    def _complete(self, job: GenerationJob, reason: str, rest: str) -> None:
        if self._append(job, rest, final=True):
            reason = "stop"
        self._emit(job, "")  # scores of tokens whose text was empty
        self._finish(job, Finished(reason, job.completion_tokens, job.cuda_at_entry))
