"""The public API (port 8000): OpenAI-compatible routes, health and readiness.

Why: routes only — parse, validate, check, admit, then relay the worker's
events. Every refusal is a domain error raised before queueing; the edge
(`edge.py`) renders it and settles the request's outcome, so no route
catches anything. Bodies come from `rendering.py`. Responses that carry a
generation are a small ASGI class (`GenerationResponse`) that listens for
the client's disconnect while it waits, so a dropped client cancels its
generation within one decoding step, and that sends each decoded piece as
its own SSE event with no buffering of its own.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

import structlog
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from fusebox_contract.names import DegradationTier, Variant
from fusebox_contract.wiring import (
    REQUEST_ID_HEADER,
    SERVED_BY_HEADER,
    VARIANT_HEADER,
    HttpPath,
)
from fusebox_server.control.accounting import RequestRecord
from fusebox_server.control.context_window import generation_budget
from fusebox_server.control.recorder import GenerationOutcome
from fusebox_server.control.runtime import Choices, Runtime
from fusebox_server.errors import (
    ClientDisconnected,
    DeadlineExceeded,
    InputTooLong,
    InvalidRequest,
    ModelNotFound,
    ModelUnavailable,
)
from fusebox_server.http.edge import (
    EXCEPTION_HANDLERS,
    CountRequests,
    VariantHeader,
    read_body,
    record_of,
)
from fusebox_server.http.openai_parameters import check_query
from fusebox_server.http.openai_schema import (
    ChatRequest,
    CompletionRequest,
    OpenAISampling,
    check_logit_bias,
    parse_chat_request,
    parse_completion_request,
    parse_json_body,
)
from fusebox_server.http.rendering import (
    Choice,
    Kind,
    Reply,
    chat_logprobs,
    choices_body,
    chunk_body,
    completion_body,
    completion_logprobs,
    error_body,
    error_headers,
    json_bytes,
    sse,
    usage_chunk,
    whole_answer_events,
    whole_choices_events,
)
from fusebox_server.http.tool_calls import (
    CallFormat,
    StreamSplitter,
    ToolUse,
    check_json_answer,
    forced_format,
    format_of_template,
    message_calls,
    new_call_id,
    read_reply,
)
from fusebox_server.model.decode_settings import (
    DecodeSettings,
    RepeatPenalties,
    choice_seed,
    earliest_stop,
)
from fusebox_server.model.tokenization import PromptEncoder
from fusebox_server.model.worker import EncodeAgain, Failed, Finished, Piece, ScoredToken

CHAT_PATH: Final = "/v1/chat/completions"
COMPLETIONS_PATH: Final = "/v1/completions"
SERVED_BY_CANNED: Final = "canned"
NO_CANNED_MATCH: Final = "\x00no-canned-match"
EVENT_STREAM: Final = "text/event-stream; charset=utf-8"
TEMPLATE_ERROR_CHARS: Final = 300
"""How much of a chat template's own error message a 400 quotes."""
_PATH: Final = re.compile(r"(?:[A-Za-z]:)?(?:[\\/][\w.~-]+){2,}[\\/]?")
"""Something that looks like a file system path (two or more segments)."""


@dataclass
class Prepared:
    """A validated request, ready to be admitted."""

    reply: Reply
    record: RequestRecord
    stream: bool  # answered as SSE, as the request asked
    incremental: bool  # one event per piece; False under the no-streaming tier
    include_usage: bool
    wants_json: bool
    max_new_tokens: int  # the request's cap, before the context window is applied
    choices: int = 1  # `n`
    logprobs: bool = False  # whether each choice reports its tokens' log-probabilities
    input_length: int = 0
    tool_use: ToolUse | None = None  # the request's tools: replies are read for calls
    call_format: CallFormat | None = None  # how the serving model writes a call

    @property
    def arrival_monotonic(self) -> float:
        return self.record.arrival_monotonic


SCHEMA_FIELDS: Final = frozenset({"response_format"})
"""Body fields whose parse may compile a JSON schema, which runs off the event loop (a
forced tool call's schema is compiled later, `forced_settings`, off the loop too)."""


def canned_key(parsed: ChatRequest | CompletionRequest) -> str:
    """The text a canned answer must match exactly: the prompt, or the lone user turn."""
    if isinstance(parsed, CompletionRequest):
        return parsed.prompt
    users = [m for m in parsed.messages if m.role == "user"]
    others = [m for m in parsed.messages if m.role not in ("user", "system", "developer")]
    if len(users) == 1 and not others:
        return users[0].content
    return NO_CANNED_MATCH


def template_refusal(error: Exception) -> InvalidRequest:
    """A chat template that raised while rendering these messages (`raise_exception` on a
    role it does not take, or an error inside it): a 400 naming `messages`, with the
    template's own message on one line, cut short, any path in it replaced; never a
    traceback."""
    said = _PATH.sub("<path>", " ".join(str(error).split()))
    if len(said) > TEMPLATE_ERROR_CHARS:
        said = said[: TEMPLATE_ERROR_CHARS - 3] + "..."
    reason = said or f"{type(error).__name__} (no message)"
    return InvalidRequest(
        f"the model's chat template rejected the messages: {reason}", param="messages"
    )


def prompt_text(encoder: PromptEncoder, parsed: ChatRequest | CompletionRequest) -> str:
    """The text the model reads: the completion prompt, or the messages (and tools)
    rendered by the encoder's chat template."""
    if isinstance(parsed, CompletionRequest):
        if not parsed.prompt:
            raise InvalidRequest("'prompt' must not be empty", param="prompt")
        return parsed.prompt
    tools = parsed.tool_use.tools if parsed.tool_use is not None else ()
    try:
        if tools or any(
            m.tool_calls or m.tool_call_id or m.name is not None for m in parsed.messages
        ):
            return encoder.render_conversation(
                [message.template_message() for message in parsed.messages],
                [tool.template_entry() for tool in tools],
            )
        return encoder.render_chat(parsed.messages)
    except Exception as error:  # a chat template that rejects these messages
        raise template_refusal(error) from None


def choice_settings(sampling: OpenAISampling, max_new_tokens: int) -> list[DecodeSettings]:
    """The engine's inputs, one per choice: the body's sampling fields, with the budget
    already resolved; choice i of a seeded request samples with `choice_seed(seed, i)`."""
    return [
        DecodeSettings(
            max_new_tokens=max_new_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            seed=None if sampling.seed is None else choice_seed(sampling.seed, index),
            stop=sampling.stop,
            top_alternatives=sampling.logprobs,
            repeat_penalties=RepeatPenalties(sampling.presence_penalty, sampling.frequency_penalty),
            token_bias=sampling.logit_bias,
            output_format=sampling.output_format,
        )
        for index in range(sampling.n)
    ]


def forced_settings(settings: list[DecodeSettings], use: ToolUse) -> list[DecodeSettings]:
    """A forced call (`required`, a named function): every choice's output is constrained
    to the call's JSON (`tool_calls.forced_schema`)."""
    if any(item.output_format is not None for item in settings):
        raise InvalidRequest(
            "'tool_choice' forces a call, which cannot be combined with a JSON "
            "'response_format': both constrain the output",
            param="tool_choice",
        )
    output_format = forced_format(use)
    return [replace(item, output_format=output_format) for item in settings]


async def _wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(receive: Receive, admitted: Awaitable[Choices]) -> Choices:
    """Admission (maybe a wait in the queue) unless the client goes away first.

    The body has been read, so the next message is the disconnect. A client
    that leaves while queued gives up its place at once (`Admission.acquire`
    drops the waiter when cancelled), instead of holding it until its deadline
    while live clients get 429. The outcome is `cancelled`.
    """
    admission = asyncio.ensure_future(admitted)
    gone = asyncio.ensure_future(_wait_for_disconnect(receive))
    try:
        await asyncio.wait((admission, gone), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this request's task was cancelled (the server is stopping)
        admission.cancel()
        gone.cancel()
        raise
    if not gone.done():
        gone.cancel()
        return admission.result()
    if not gone.cancelled():
        gone.exception()  # retrieved: a receive that failed means the connection is gone too
    admission.cancel()
    await asyncio.wait((admission,))  # let Admission.acquire give the place back
    if not admission.cancelled() and admission.exception() is None:
        admission.result().cancel()  # admitted at the same moment: the worker drops it
    raise ClientDisconnected("the client went away while waiting in the queue")


class Api:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.config = runtime.config

    # ----- routes -----
    async def chat_completions(self, request: Request) -> Response:
        return await self._generate(request, Kind.CHAT)

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, Kind.COMPLETION)

    async def models(self, request: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.config.model_name,
                        "object": "model",
                        "created": int(self.runtime.started_at),
                        "owned_by": "fusebox",
                        "revision": self.config.model_revision,
                    }
                ],
            }
        )

    async def healthz(self, request: Request) -> Response:
        ages = self.runtime.heartbeat_ages()
        healthy = all(age < self.config.heartbeat_timeout_seconds for age in ages.values())
        body = {"status": "ok" if healthy else "stale", "heartbeat_age_seconds": ages}
        return JSONResponse(body, status_code=200 if healthy else 503)

    async def readyz(self, request: Request) -> Response:
        ready = self.runtime.ready
        body = {"ready": ready, "variant": self.runtime.variant.value}
        return JSONResponse(body, status_code=200 if ready else 503)

    # ----- the generation path -----
    async def _generate(self, request: Request, kind: Kind) -> Response:
        record = record_of(request)
        assert record is not None  # CountRequests covers both generation routes
        record.fields.update(model_name=self.config.model_name, variant=self.runtime.variant)
        check_query(request.query_params)
        data = parse_json_body(await read_body(request, self.config.max_body_bytes))
        if kind == Kind.COMPLETION:
            parsed: ChatRequest | CompletionRequest = parse_completion_request(data)
        elif SCHEMA_FIELDS.isdisjoint(data):
            parsed = parse_chat_request(data)
        else:  # a schema is compiled (bounded, `json_grammar.MAX_SCHEMA_BYTES`): off the loop
            parsed = await asyncio.to_thread(parse_chat_request, data)
        record.fields.update(parsed.identifiers)
        prepared = self._prepare(parsed, kind, record)
        # A canned answer is one free text with no scores or calls: n > 1, logprobs, tools,
        # a response_format (the stored text may not be JSON) and logit_bias (a bias would
        # change the text) go to the model.
        plain = (
            prepared.choices == 1
            and not prepared.logprobs
            and prepared.tool_use is None
            and parsed.sampling.output_format is None
            and not parsed.sampling.logit_bias
        )
        if plain and DegradationTier.CANNED_ANSWERS in self.runtime.degradation_tiers:
            answer = self.runtime.live.canned_answers.get(canned_key(parsed))
            if answer is not None:
                return await self._canned_response(parsed, prepared, answer)
        self.runtime.check_available()
        check_logit_bias(parsed.sampling.logit_bias, self.runtime.vocabulary_size())
        # The variant whose tokenizer encodes the prompt: the jobs are named after it, so a
        # swap before they start is seen, and the prompt encoded again (`_encode_again`).
        variant = self.runtime.variant
        encoder = self.runtime.encoder(variant)
        if isinstance(parsed, ChatRequest):
            prepared.call_format = self._check_tools(parsed, encoder)
        prompt_ids = await self._encode(parsed, variant)
        prepared.input_length = len(prompt_ids)
        record.fields["input_length"] = len(prompt_ids)
        max_new_tokens = self._fitted_budget(parsed, prepared, len(prompt_ids))
        settings = choice_settings(parsed.sampling, max_new_tokens)
        if prepared.tool_use is not None and prepared.tool_use.forced:
            settings = await asyncio.to_thread(forced_settings, settings, prepared.tool_use)
        choices = await _unless_disconnected(
            request.receive,
            self.runtime.start_generations(
                record.request_id,
                prompt_ids,
                settings,
                record.arrival_monotonic + self.config.request_timeout_seconds,
                variant,
                self._encode_again(parsed, prepared),
            ),
        )
        return GenerationResponse(self.runtime, prepared, choices)  # type: ignore[return-value]

    def _fitted_budget(
        self, parsed: ChatRequest | CompletionRequest, prepared: Prepared, prompt_tokens: int
    ) -> int:
        """The new tokens the request may generate, once its prompt is counted: a 400
        `context_length_exceeded` when the prompt is over `--max-input-tokens`, or it and
        the tokens asked for do not fit the context window."""
        prompt_param = "messages" if prepared.reply.kind == Kind.CHAT else "prompt"
        if prompt_tokens > self.config.max_input_tokens:
            raise InputTooLong(
                f"the prompt has {prompt_tokens} tokens, more than the limit of "
                f"{self.config.max_input_tokens} tokens",
                param=prompt_param,
            )
        return generation_budget(
            prompt_tokens,
            parsed.sampling.max_tokens,
            prepared.max_new_tokens,
            self.config.context_window_tokens,
            prompt_param,
        )

    def _encode_again(
        self, parsed: ChatRequest | CompletionRequest, prepared: Prepared
    ) -> EncodeAgain:
        """How the worker encodes the prompt again when the request's jobs move, before
        they start, to a variant with another tokenizer (a swap to a fallback of another
        family): from the request's own text or messages, through that variant's chat
        template, with the limits checked again as at admission (the same 400 when the
        prompt no longer fits). Runs on the inference thread, once per variant for all
        the request's choices; uncached (the LRU belongs to the event loop).

        A request that names token ids (`logit_bias`) or whose tool calls the new
        variant writes in another format cannot be carried over: 503, retry.
        """
        encoded: dict[str, tuple[int, ...]] = {}

        def encode(variant_name: str) -> tuple[int, ...]:
            if variant_name in encoded:
                return encoded[variant_name]
            if parsed.sampling.logit_bias:
                raise ModelUnavailable(
                    "the model was swapped for one with another tokenizer before generation "
                    "started, and 'logit_bias' names token ids of the previous one; retry"
                )
            encoder = self.runtime.encoder(Variant(variant_name))
            if isinstance(parsed, ChatRequest):
                call_format = self._check_tools(parsed, encoder)
                if parsed.tool_use is not None and call_format != prepared.call_format:
                    raise ModelUnavailable(
                        "the model was swapped for one that writes tool calls in another "
                        "format before generation started; retry"
                    )
            text = prompt_text(encoder, parsed)
            ids = encoder.encode_uncached(text, isinstance(parsed, CompletionRequest))
            encoded[variant_name] = ids
            return ids

        def fit(prompt_tokens: int) -> int:
            return self._fitted_budget(parsed, prepared, prompt_tokens)

        return EncodeAgain(encode, fit)

    def _prepare(
        self, parsed: ChatRequest | CompletionRequest, kind: Kind, record: RequestRecord
    ) -> Prepared:
        if parsed.model != self.config.model_name:
            raise ModelNotFound(
                f"the model {parsed.model!r} does not exist; this server serves "
                f"{self.config.model_name!r}",
                param="model",
            )
        max_tokens = parsed.sampling.max_tokens or self.config.max_new_tokens
        if max_tokens > self.config.max_new_tokens:
            param = parsed.sampling.max_tokens_param
            raise InvalidRequest(
                f"{param} is {max_tokens}, more than the limit of "
                f"{self.config.max_new_tokens} new tokens",
                param=param,
            )
        if parsed.sampling.n > self.config.max_concurrency:
            raise InvalidRequest(
                f"n is {parsed.sampling.n}, more than the {self.config.max_concurrency} "
                "generations this server runs at once (each choice is one)",
                param="n",
            )
        # no-streaming still answers a stream as a stream (a client that asked for SSE
        # reads only SSE), with the whole text in one event once it is complete.
        incremental = DegradationTier.NO_STREAMING not in self.runtime.degradation_tiers
        record.fields["stream"] = parsed.stream
        return Prepared(
            reply=Reply(kind, record.request_id, int(time.time()), self.config.model_name),
            record=record,
            stream=parsed.stream,
            incremental=incremental,
            include_usage=parsed.include_usage,
            wants_json=parsed.wants_json,
            max_new_tokens=max_tokens,
            choices=parsed.sampling.n,
            logprobs=parsed.sampling.logprobs is not None,
            tool_use=parsed.tool_use if isinstance(parsed, ChatRequest) else None,
        )

    def _check_tools(self, parsed: ChatRequest, encoder: PromptEncoder) -> CallFormat | None:
        """The encoder's model's call format; a 400 when its template cannot carry the
        request's tools or calls (the model would get prose and never learn of them)."""
        use = parsed.tool_use
        if not encoder.template_takes_tools:
            if use is not None:
                raise InvalidRequest(
                    "'tools' is not supported by this model: its chat template has no tool "
                    "format, so the model cannot be told of the tools",
                    param="tools",
                )
            for index, message in enumerate(parsed.messages):
                if message.tool_calls:
                    raise InvalidRequest(
                        "this model's chat template has no tool format to render earlier "
                        "tool calls",
                        param=f"messages[{index}].tool_calls",
                    )
            return None
        call_format = format_of_template(encoder.template_source)
        if use is not None and use.parses_calls and not use.forced and call_format is None:
            raise InvalidRequest(
                "'tools' is not supported by this model: its chat template takes tools but "
                "writes calls in no format this server can read (Hermes <tool_call>, "
                "Llama 3 JSON, Mistral [TOOL_CALLS])",
                param="tools",
            )
        if parsed.sampling.output_format is not None:
            check_json_answer(use, call_format)
        return call_format

    async def _encode(
        self, parsed: ChatRequest | CompletionRequest, variant: Variant | None = None
    ) -> tuple[int, ...]:
        """The prompt in token ids of `variant` (by default the one serving now)."""
        text = prompt_text(self.runtime.encoder(variant), parsed)
        return await self.runtime.encode_prompt(
            text, isinstance(parsed, CompletionRequest), variant
        )

    async def _canned_response(
        self, parsed: ChatRequest | CompletionRequest, prepared: Prepared, answer: str
    ) -> Response:
        """The canned answer, as JSON or (when the request asked to stream) as one SSE event.

        Cut as a generated text is: at its earliest stop sequence, and to `max_tokens`
        tokens of the serving variant's tokenizer (`finish_reason: "length"`, never inside
        a character).

        Its usage is counted with that tokenizer, which needs no model: the prompt as the
        model would have read it, and the answer's tokens.
        """
        prepared.record.fields["served_by"] = SERVED_BY_CANNED
        stop_index = earliest_stop(answer, parsed.sampling.stop)
        answer = answer if stop_index is None else answer[:stop_index]
        prompt_tokens = len(await self._encode(parsed))
        whole = answer
        answer, completion_tokens = await self.runtime.cut_to_tokens(
            answer, prepared.max_new_tokens
        )
        finish_reason = "stop" if answer == whole else "length"
        prepared.input_length = prompt_tokens
        prepared.record.fields.update(
            input_length=prompt_tokens,
            output_length=completion_tokens,
            finish_reason=finish_reason,
        )
        headers = {
            REQUEST_ID_HEADER: prepared.reply.request_id,
            SERVED_BY_HEADER: SERVED_BY_CANNED,
            VARIANT_HEADER: self.runtime.variant.value,
        }
        if prepared.stream:
            events = whole_answer_events(
                prepared.reply,
                answer,
                finish_reason,
                (prompt_tokens, completion_tokens) if prepared.include_usage else None,
            )
            return Response(events, media_type=EVENT_STREAM, headers=headers)
        body = completion_body(
            prepared.reply, answer, finish_reason, prompt_tokens, completion_tokens
        )
        return JSONResponse(body, headers=headers)


@dataclass
class ChoiceState:
    """What one choice has produced so far."""

    text_parts: list[str] = field(default_factory=list)
    scores: list[ScoredToken] = field(default_factory=list)
    completion_tokens: int = 0
    finish_reason: str | None = None
    started: bool = False  # a chunk of it was streamed (the first carries the role)
    text_offset: int = 0  # characters of scored tokens streamed (completions' `text_offset`)
    splitter: StreamSplitter | None = None  # a tools request's stream: content and calls


class GenerationResponse:
    """Relays a request's generations (its `n` choices) to the client, streaming (SSE) or
    as one JSON body; under the no-streaming tier a stream request gets SSE too, the whole
    answer in one event per choice once all are complete (and an error before it, its
    status and JSON body, as unstreamed). A failure of any choice ends the response and
    cancels the others; a disconnect cancels all of them.

    It never settles the outcome itself: it stores what ended the request on
    the request's record, and the edge settles it once this call returns.

    The response starts (status and headers) only with the first event of the
    generation, streamed or not: by then the variant that generates is known (a
    swap while the request waited moves it to the new one, `worker._move_to`), so
    `X-Fusebox-Variant` names it, and a failure before the first piece (a prompt
    that no longer fits the new variant, a deadline) gets its own status and JSON
    body, as unstreamed.
    """

    def __init__(self, runtime: Runtime, prepared: Prepared, choices: Choices) -> None:
        self.runtime = runtime
        self.prepared = prepared
        self.record = prepared.record
        self.reply = prepared.reply
        self.generations = choices
        self.states = [ChoiceState() for _ in choices.generations]
        if prepared.tool_use is not None and prepared.stream:
            for state in self.states:
                state.splitter = StreamSplitter(prepared.tool_use, prepared.call_format)
        self.failed = False
        self.cuda_at_entry: dict[str, int | None] = {}
        self._last_piece_at: float | None = None
        self._ttft: float | None = None
        self._itl: list[float] = []

    @property
    def prompt_tokens(self) -> int:
        """The prompt's tokens as the generating variant read them: what usage reports."""
        return self.generations.prompt_tokens

    @property
    def completion_tokens(self) -> int:
        """All choices' tokens: what usage reports."""
        return sum(state.completion_tokens for state in self.states)

    @property
    def finish_reason(self) -> str | None:
        """The log's `finish_reason`: "error" after a failure, else choice 0's."""
        return "error" if self.failed else self.states[0].finish_reason

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        listener = asyncio.ensure_future(self._watch_disconnect(receive))
        try:
            if self.prepared.stream and self.prepared.incremental:
                await self._stream(send)
            else:
                await self._complete(send)
        except OSError:
            self._client_gone()
        except asyncio.CancelledError:
            self._client_gone()
            raise
        finally:
            listener.cancel()
            self.generations.cancel()
            self._account()

    def _client_gone(self) -> None:
        self.generations.cancel()
        self.record.fail(ClientDisconnected("the client went away during the generation"))

    async def _watch_disconnect(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.generations.cancel()
                return

    def _headers(self, content_type: str, index: int | None = 0) -> list[tuple[bytes, bytes]]:
        """The response's headers; `X-Fusebox-Variant` and `-Served-By` name the variant
        that generated choice `index` (all choices run on one), or, with None (an error),
        are left to the edge, which names the variant serving now."""
        headers = [
            (b"content-type", content_type.encode()),
            (REQUEST_ID_HEADER.lower().encode(), self.reply.request_id.encode()),
        ]
        if index is not None:
            variant = self.generations.generations[index].job.variant.encode()
            headers += [
                (SERVED_BY_HEADER.lower().encode(), variant),
                (VARIANT_HEADER.lower().encode(), variant),
            ]
        return headers

    def _on_piece(self, index: int, piece: Piece) -> None:
        now = time.monotonic()
        if self._last_piece_at is None:
            self._ttft = now - self.prepared.arrival_monotonic  # recorded if it succeeds
        else:
            self._itl.append(now - self._last_piece_at)
        self._last_piece_at = now
        state = self.states[index]
        state.completion_tokens = piece.completion_tokens
        state.text_parts.append(piece.text)
        state.scores.extend(piece.scores)

    def _logprobs(self, scores: Sequence[ScoredToken], text_offset: int) -> dict[str, Any] | None:
        if not self.prepared.logprobs:
            return None
        if self.reply.kind == Kind.CHAT:
            return chat_logprobs(scores)
        return completion_logprobs(scores, text_offset)

    async def _next_event(self) -> tuple[int, Piece | Finished | Failed]:
        try:
            async with asyncio.timeout_at(
                self.prepared.arrival_monotonic + self.runtime.config.request_timeout_seconds
            ):
                return await self.generations.events.get()
        except TimeoutError:
            self.generations.give_up()
            return 0, Failed(DeadlineExceeded("the request outlived its deadline"), 0)

    def _on_finished(self, index: int, event: Finished) -> None:
        state = self.states[index]
        state.finish_reason = event.reason
        state.completion_tokens = event.completion_tokens
        self.cuda_at_entry = self.cuda_at_entry or event.cuda_at_entry
        if event.reason == "cancelled":
            self.record.fail(ClientDisconnected("the client went away during the generation"))

    def _on_failed(self, event: Failed) -> None:
        """One choice failed: the request fails, and the other choices stop."""
        self.generations.cancel()
        self.record.fail(event.error)
        self.failed = True

    def _finished_choices(self) -> list[Choice]:
        return [self._finished_choice(index, state) for index, state in enumerate(self.states)]

    def _finished_choice(self, index: int, state: ChoiceState) -> Choice:
        text = "".join(state.text_parts)
        finish_reason = state.finish_reason or "stop"
        logprobs = self._logprobs(state.scores, 0)
        use = self.prepared.tool_use
        if use is None:
            return Choice(index, text, finish_reason, logprobs)
        reply = read_reply(text, self.prepared.call_format, use)
        if not reply.calls:
            return Choice(index, text, finish_reason, logprobs)
        calls = message_calls(reply.calls, [new_call_id() for _ in reply.calls])
        return Choice(index, reply.content, reply.finish_reason(finish_reason), logprobs, calls)

    async def _complete(self, send: Send) -> None:
        pending = len(self.states)
        while pending:
            index, event = await self._next_event()
            if isinstance(event, Piece):
                self._on_piece(index, event)
                continue
            if isinstance(event, Failed):
                return await self._send_error(send, event)
            self._on_finished(index, event)
            if event.reason == "cancelled":
                return
            pending -= 1
        choices = self._finished_choices()
        tokens = (self.prompt_tokens, self.completion_tokens)
        if self.prepared.stream:  # the no-streaming tier: each whole choice in one event
            usage_tokens = tokens if self.prepared.include_usage else None
            payload = whole_choices_events(self.reply, choices, usage_tokens)
            headers = self._headers(EVENT_STREAM)
            headers += [(b"cache-control", b"no-cache")]
        else:
            payload = json_bytes(choices_body(self.reply, choices, *tokens))
            headers = self._headers("application/json")
        headers.append((b"content-length", str(len(payload)).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    async def _send_error(self, send: Send, event: Failed) -> None:
        """An error before anything was sent: the usual status and OpenAI body."""
        self._on_failed(event)
        error = event.error
        payload = json_bytes(error_body(error))
        headers = self._headers("application/json", None)
        headers += [(k.lower().encode(), v.encode()) for k, v in error_headers(error).items()]
        await send({"type": "http.response.start", "status": error.status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    def _piece_chunk(self, index: int, piece: Piece) -> bytes:
        """The piece's chunk; a tools request's held text (a call being written) sends
        nothing until it ends, unless the piece carries log-probabilities."""
        state = self.states[index]
        logprobs = self._logprobs(piece.scores, state.text_offset)
        state.text_offset += sum(len(score.text) for score in piece.scores)
        text: str | None = piece.text
        calls = None
        if state.splitter is not None:
            text, calls = state.splitter.push(piece.text)
            if text is None and calls is None and logprobs is None:
                return b""
        chunk = chunk_body(self.reply, text, None, not state.started, index, logprobs, calls)
        state.started = True
        return sse(chunk)

    def _held_chunk(self, index: int) -> bytes:
        """A tools request's held text at the end of its choice: the calls, or content."""
        state = self.states[index]
        if state.splitter is None:
            return b""
        text, calls = state.splitter.finish()
        if text is None and calls is None:
            return b""
        chunk = chunk_body(self.reply, text, None, not state.started, index, None, calls)
        state.started = True
        return sse(chunk)

    async def _stream(self, send: Send) -> None:
        started = False
        pending = len(self.states)
        while pending:
            index, event = await self._next_event()
            if not started:
                # The headers go with the first event: they name the variant generating.
                if isinstance(event, Failed):
                    return await self._send_error(send, event)
                if isinstance(event, Finished) and event.reason == "cancelled":
                    self._on_finished(index, event)  # the client left: nothing to send
                    return
                headers = self._headers(EVENT_STREAM, index)
                headers += [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                started = True
            if isinstance(event, Piece):
                self._on_piece(index, event)
                body = self._piece_chunk(index, event)
                await send({"type": "http.response.body", "body": body, "more_body": True})
                continue
            if isinstance(event, Failed):
                # Mid-stream: the status is sent; the error is the stream's last event.
                self._on_failed(event)
                body = sse(error_body(event.error))
                await send({"type": "http.response.body", "body": body, "more_body": False})
                return
            self._on_finished(index, event)
            if event.reason == "cancelled":
                return
            pending -= 1
            state = self.states[index]
            final = self._held_chunk(index)
            reason = event.reason
            if state.splitter is not None:
                reason = state.splitter.finish_reason(reason)
            text = "" if not state.started else None
            final += sse(chunk_body(self.reply, text, reason, not state.started, index))
            state.started = True
            more = pending > 0
            if not more:
                if self.prepared.include_usage:
                    final += sse(
                        usage_chunk(self.reply, self.prompt_tokens, self.completion_tokens)
                    )
                final += sse("[DONE]")
            await send({"type": "http.response.body", "body": final, "more_body": more})

    def _account(self) -> None:
        """Hand the generation to the runtime's recorder (tokens, latency, quality) and
        fill the log fields; the edge counts the outcome. The quality check reads choice 0."""
        self.prepared.input_length = self.prompt_tokens
        verdict = self.runtime.recorder.finished(
            GenerationOutcome(
                prompt_tokens=self.prepared.input_length,
                completion_tokens=self.completion_tokens,
                succeeded=self.record.error is None,
                e2e_seconds=time.monotonic() - self.prepared.arrival_monotonic,
                ttft_seconds=self._ttft,
                itl_seconds=self._itl,
                text_parts=self.states[0].text_parts,
                wants_json=self.prepared.wants_json,
            )
        )
        if verdict is not None and not verdict.ok:
            structlog.get_logger("fusebox_server.requests").info(
                "quality_failure", request_id=self.reply.request_id, reasons=verdict.reasons
            )
        variant = self.generations.variant
        self.record.fields.update(
            input_length=self.prompt_tokens,
            output_length=self.completion_tokens,
            finish_reason=self.finish_reason,
            served_by=variant,
            variant=variant,
            gpu_device_id=self.runtime.gpu_device_id,
            cuda_allocated_bytes_at_entry=self.cuda_at_entry.get("allocated_bytes"),
            cuda_reserved_bytes_at_entry=self.cuda_at_entry.get("reserved_bytes"),
        )
        if self.prepared.choices > 1:
            self.record.fields["choices"] = self.prepared.choices


def build_api_app(runtime: Runtime) -> ASGIApp:
    api = Api(runtime)
    app = Starlette(
        routes=[
            Route(CHAT_PATH, api.chat_completions, methods=["POST"]),
            Route(COMPLETIONS_PATH, api.completions, methods=["POST"]),
            Route("/v1/models", api.models, methods=["GET"]),
            Route(HttpPath.HEALTHZ, api.healthz, methods=["GET"]),
            Route(HttpPath.READYZ, api.readyz, methods=["GET"]),
        ],
        middleware=[
            Middleware(
                CountRequests,
                accounting=runtime.accounting,
                paths=(CHAT_PATH, COMPLETIONS_PATH),
            )
        ],
        exception_handlers=dict(EXCEPTION_HANDLERS),
    )
    return VariantHeader(app, lambda: runtime.variant.value, lambda: runtime.stopping)
