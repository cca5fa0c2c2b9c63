"""The public API (port 8000): OpenAI-compatible routes, health and readiness.

Why: routes only — parse, validate, check, admit, then relay the worker's
events. Every refusal happens before queueing and is an OpenAI-shaped
error from `errors.py`; torch is never touched here. Responses that carry a
generation are a small ASGI class (`GenerationResponse`) that listens for
the client's disconnect while it waits, so a dropped client cancels its
generation within one decoding step, and that sends each decoded piece as
its own SSE event with no buffering of its own.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

import structlog
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from fusebox_server.errors import (
    BodyTooLarge,
    DeadlineExceeded,
    GenerationFailed,
    InputTooLong,
    InvalidRequest,
    MethodNotAllowed,
    ModelNotFound,
    NotFound,
    ServerError,
    error_body,
    error_headers,
)
from fusebox_server.openai_schema import (
    ChatRequest,
    CompletionRequest,
    parse_chat_request,
    parse_completion_request,
    parse_json_body,
)
from fusebox_server.quality import check_response
from fusebox_server.runtime import Generation, Runtime
from fusebox_server.worker import Failed, Finished, Piece

log = structlog.get_logger("fusebox_server.requests")

REQUEST_ID_PATTERN = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def request_id_of(request: Request) -> str:
    supplied = request.headers.get("x-request-id", "")
    return supplied if REQUEST_ID_PATTERN.match(supplied) else uuid.uuid4().hex


async def read_body(request: Request, limit_bytes: int) -> bytes:
    """The body, refusing more than limit_bytes by Content-Length or by what arrives."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            declared_bytes = int(declared)
        except ValueError:
            raise InvalidRequest("Content-Length is not a number") from None
        if declared_bytes > limit_bytes:
            raise BodyTooLarge(f"request body of {declared_bytes} bytes exceeds {limit_bytes}")
    chunks: list[bytes] = []
    received = 0
    async for chunk in request.stream():
        received += len(chunk)
        if received > limit_bytes:
            raise BodyTooLarge(f"request body exceeds {limit_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def error_response(error: ServerError, request_id: str | None = None) -> JSONResponse:
    headers = error_headers(error)
    if request_id:
        headers["X-Request-Id"] = request_id
    return JSONResponse(error_body(error), status_code=error.status, headers=headers)


def sse(data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n".encode()


@dataclass
class Prepared:
    """A validated request, ready to be admitted."""

    kind: str  # "chat" | "completion"
    request_id: str
    arrival_monotonic: float
    created: int
    stream: bool
    include_usage: bool
    wants_json: bool
    max_tokens: int
    input_length: int = 0


def canned_key(parsed: ChatRequest | CompletionRequest) -> str:
    """The text a canned answer must match exactly: the prompt, or the lone user turn."""
    if isinstance(parsed, CompletionRequest):
        return parsed.prompt
    users = [m for m in parsed.messages if m.role == "user"]
    others = [m for m in parsed.messages if m.role not in ("user", "system", "developer")]
    if len(users) == 1 and not others:
        return users[0].content
    return "\x00no-canned-match"


class Api:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.config = runtime.config

    # ----- bookkeeping -----
    def log_request(
        self,
        prepared: Prepared | None,
        request_id: str,
        endpoint: str,
        status: int,
        arrival: float,
        output_length: int = 0,
        **extra: Any,
    ) -> None:
        log.info(
            "request",
            request_id=request_id,
            endpoint=endpoint,
            model_name=self.config.model_name,
            variant=self.runtime.variant,
            input_length=prepared.input_length if prepared else None,
            output_length=output_length,
            gpu_device_id=self.runtime.gpu_device_id,
            latency_seconds=round(time.monotonic() - arrival, 6),
            status=status,
            stream=prepared.stream if prepared else None,
            **extra,
        )

    # ----- routes -----
    async def chat_completions(self, request: Request) -> Response:
        return await self._generate(request, "chat")

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, "completion")

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
        ready = self.runtime.ready and self.runtime.model_loaded
        body = {"ready": ready, "variant": self.runtime.variant}
        return JSONResponse(body, status_code=200 if ready else 503)

    # ----- the generation path -----
    async def _generate(self, request: Request, kind: str) -> Response:
        arrival = time.monotonic()
        request_id = request_id_of(request)
        endpoint = request.url.path
        prepared: Prepared | None = None
        try:
            body = await read_body(request, self.config.max_body_bytes)
            data = parse_json_body(body)
            parsed = parse_chat_request(data) if kind == "chat" else parse_completion_request(data)
            prepared = self._prepare(parsed, kind, request_id, arrival)
            if self.runtime.degradation_level >= 3:
                answer = self.config.canned_answers.get(canned_key(parsed))
                if answer is not None:
                    self.runtime.count_outcome(200)
                    self.log_request(
                        prepared, request_id, endpoint, 200, arrival, served_by="canned"
                    )
                    return self._canned_response(prepared, answer)
            self.runtime.check_available()
            prompt_ids = await self._encode(parsed)
            prepared.input_length = len(prompt_ids)
            if len(prompt_ids) > self.config.max_input_tokens:
                raise InputTooLong(
                    f"the prompt has {len(prompt_ids)} tokens, more than the limit of "
                    f"{self.config.max_input_tokens} tokens",
                    param="messages" if kind == "chat" else "prompt",
                )
            generation = await self.runtime.start_generation(
                request_id,
                prompt_ids,
                parsed.sampling,
                prepared.max_tokens,
                arrival + self.config.request_timeout_seconds,
            )
        except ServerError as error:
            self.runtime.count_refusal(error)
            self.log_request(
                prepared, request_id, endpoint, error.status, arrival, error=error.code
            )
            return error_response(error, request_id)
        return GenerationResponse(self, prepared, generation, endpoint)  # type: ignore[return-value]

    def _prepare(
        self, parsed: ChatRequest | CompletionRequest, kind: str, request_id: str, arrival: float
    ) -> Prepared:
        if parsed.model != self.config.model_name:
            raise ModelNotFound(
                f"the model {parsed.model!r} does not exist; this server serves "
                f"{self.config.model_name!r}",
                param="model",
            )
        max_tokens = parsed.sampling.max_tokens or self.config.max_new_tokens
        if max_tokens > self.config.max_new_tokens:
            raise InvalidRequest(
                f"max_tokens is {max_tokens}, more than the limit of "
                f"{self.config.max_new_tokens} new tokens",
                param="max_tokens",
            )
        return Prepared(
            kind=kind,
            request_id=request_id,
            arrival_monotonic=arrival,
            created=int(time.time()),
            stream=parsed.stream and self.runtime.degradation_level < 1,
            include_usage=parsed.include_usage,
            wants_json=parsed.wants_json,
            max_tokens=max_tokens,
        )

    async def _encode(self, parsed: ChatRequest | CompletionRequest) -> tuple[int, ...]:
        if isinstance(parsed, CompletionRequest):
            if not parsed.prompt:
                raise InvalidRequest("'prompt' must not be empty", param="prompt")
            return await self.runtime.encode_prompt(parsed.prompt, True)
        try:
            text = self.runtime.encoder().render_chat(parsed.messages)
        except Exception as error:  # a template that rejects these messages
            raise InvalidRequest(f"the chat template rejected the messages: {error}") from None
        return await self.runtime.encode_prompt(text, False)

    def _canned_response(self, prepared: Prepared, answer: str) -> Response:
        body = completion_body(prepared, self.config.model_name, answer, "stop", 0)
        return JSONResponse(
            body, headers={"X-Request-Id": prepared.request_id, "X-Fusebox-Served-By": "canned"}
        )


def completion_body(
    prepared: Prepared, model: str, text: str, finish_reason: str, completion_tokens: int
) -> dict[str, Any]:
    usage = {
        "prompt_tokens": prepared.input_length,
        "completion_tokens": completion_tokens,
        "total_tokens": prepared.input_length + completion_tokens,
    }
    if prepared.kind == "chat":
        return {
            "id": f"chatcmpl-{prepared.request_id}",
            "object": "chat.completion",
            "created": prepared.created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": None,
                    "finish_reason": finish_reason,
                }
            ],
            "usage": usage,
        }
    return {
        "id": f"cmpl-{prepared.request_id}",
        "object": "text_completion",
        "created": prepared.created,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}],
        "usage": usage,
    }


def chunk_body(
    prepared: Prepared, model: str, text: str | None, finish_reason: str | None, first: bool
) -> dict[str, Any]:
    if prepared.kind == "chat":
        delta: dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice: dict[str, Any] = {
            "index": 0,
            "delta": delta,
            "logprobs": None,
            "finish_reason": finish_reason,
        }
        return {
            "id": f"chatcmpl-{prepared.request_id}",
            "object": "chat.completion.chunk",
            "created": prepared.created,
            "model": model,
            "choices": [choice],
        }
    return {
        "id": f"cmpl-{prepared.request_id}",
        "object": "text_completion",
        "created": prepared.created,
        "model": model,
        "choices": [
            {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        ],
    }


class GenerationResponse:
    """Relays one generation to the client, streaming (SSE) or as one JSON body."""

    def __init__(self, api: Api, prepared: Prepared, generation: Generation, endpoint: str) -> None:
        self.api = api
        self.runtime = api.runtime
        self.prepared = prepared
        self.generation = generation
        self.endpoint = endpoint
        self.model = api.config.model_name
        self.status = 200
        self.finish_reason: str | None = None
        self.completion_tokens = 0
        self.text_parts: list[str] = []
        self.cuda_at_entry: dict[str, int | None] = {}
        self._last_piece_at: float | None = None
        self._itl: list[float] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        listener = asyncio.ensure_future(self._watch_disconnect(receive))
        try:
            if self.prepared.stream:
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
            self.generation.cancel()
            self._account()

    def _client_gone(self) -> None:
        self.generation.cancel()
        if self.finish_reason is None:
            self.status = 499
            self.finish_reason = "cancelled"

    async def _watch_disconnect(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.generation.cancel()
                return

    def _headers(self, content_type: str) -> list[tuple[bytes, bytes]]:
        return [
            (b"content-type", content_type.encode()),
            (b"x-request-id", self.prepared.request_id.encode()),
            (b"x-fusebox-served-by", self.generation.job.variant.encode()),
        ]

    def _on_piece(self, piece: Piece) -> None:
        now = time.monotonic()
        if self._last_piece_at is None:
            self.runtime.latency["ttft"].add(now - self.prepared.arrival_monotonic)
        else:
            self._itl.append(now - self._last_piece_at)
        self._last_piece_at = now
        self.completion_tokens = piece.completion_tokens
        self.text_parts.append(piece.text)

    async def _next_event(self) -> Piece | Finished | Failed:
        try:
            async with asyncio.timeout_at(
                self.prepared.arrival_monotonic + self.api.config.request_timeout_seconds
            ):
                return await self.generation.events.get()
        except TimeoutError:
            self.generation.cancel()
            raise DeadlineExceeded("the request outlived its deadline") from None

    async def _complete(self, send: Send) -> None:
        while True:
            try:
                event = await self._next_event()
            except DeadlineExceeded as error:
                return await self._send_error(send, error)
            if isinstance(event, Piece):
                self._on_piece(event)
            elif isinstance(event, Failed):
                return await self._send_error(send, event.error)
            else:
                self._on_finished(event)
                if event.reason == "cancelled":
                    return
                body = completion_body(
                    self.prepared,
                    self.model,
                    "".join(self.text_parts),
                    event.reason,
                    self.completion_tokens,
                )
                payload = json.dumps(body, ensure_ascii=False).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 200,
                        "headers": [
                            *self._headers("application/json"),
                            (b"content-length", str(len(payload)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": payload})
                return

    async def _send_error(self, send: Send, error: ServerError) -> None:
        self.status = error.status
        self.finish_reason = "error"
        payload = json.dumps(error_body(error)).encode()
        headers = [(b"content-type", b"application/json")]
        headers += [(k.lower().encode(), v.encode()) for k, v in error_headers(error).items()]
        headers.append((b"x-request-id", self.prepared.request_id.encode()))
        await send({"type": "http.response.start", "status": error.status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    def _on_finished(self, event: Finished) -> None:
        self.finish_reason = event.reason
        self.completion_tokens = event.completion_tokens
        self.cuda_at_entry = event.cuda_at_entry
        if event.reason == "cancelled":
            self.status = 499

    async def _stream(self, send: Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    *self._headers("text/event-stream; charset=utf-8"),
                    (b"cache-control", b"no-cache"),
                    (b"x-accel-buffering", b"no"),
                ],
            }
        )
        first = True
        while True:
            try:
                event = await self._next_event()
            except DeadlineExceeded as error:
                return await self._stream_error(send, error)
            if isinstance(event, Piece):
                self._on_piece(event)
                chunk = chunk_body(self.prepared, self.model, event.text, None, first)
                first = False
                await send({"type": "http.response.body", "body": sse(chunk), "more_body": True})
            elif isinstance(event, Failed):
                return await self._stream_error(send, event.error)
            else:
                self._on_finished(event)
                if event.reason == "cancelled":
                    return
                final = chunk_body(
                    self.prepared, self.model, None if not first else "", event.reason, first
                )
                body = sse(final)
                if self.prepared.include_usage:
                    usage = completion_body(
                        self.prepared, self.model, "", event.reason, self.completion_tokens
                    )["usage"]
                    tail = chunk_body(self.prepared, self.model, None, None, False)
                    tail["choices"] = []
                    tail["usage"] = usage
                    body += sse(tail)
                body += sse("[DONE]")
                await send({"type": "http.response.body", "body": body, "more_body": False})
                return

    async def _stream_error(self, send: Send, error: ServerError) -> None:
        self.status = error.status
        self.finish_reason = "error"
        await send(
            {"type": "http.response.body", "body": sse(error_body(error)), "more_body": False}
        )

    def _account(self) -> None:
        runtime = self.runtime
        if self.status == 200:
            runtime.latency["e2e"].add(time.monotonic() - self.prepared.arrival_monotonic)
            runtime.latency["itl"].add_many(self._itl)
            self._sample_quality()
        if self.status != 499:
            runtime.count_outcome(self.status)
        else:
            runtime.counters.cancelled_total += 1
        self.api.log_request(
            self.prepared,
            self.prepared.request_id,
            self.endpoint,
            self.status,
            self.prepared.arrival_monotonic,
            output_length=self.completion_tokens,
            finish_reason=self.finish_reason,
            served_by=self.generation.job.variant,
            cuda_allocated_bytes_at_entry=self.cuda_at_entry.get("allocated_bytes"),
            cuda_reserved_bytes_at_entry=self.cuda_at_entry.get("reserved_bytes"),
        )

    def _sample_quality(self) -> None:
        runtime = self.runtime
        if not runtime.quality.should_sample():
            return
        config = runtime.config
        verdict = check_response(
            "".join(self.text_parts),
            self.prepared.wants_json,
            self.prepared.input_length,
            self.completion_tokens,
            config.quality_max_output_input_ratio,
            config.quality_blocked_terms,
        )
        runtime.quality.record(verdict)
        if not verdict.ok:
            log.info(
                "quality_failure", request_id=self.prepared.request_id, reasons=verdict.reasons
            )


async def http_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return error_response(NotFound(f"no route {request.url.path}"))
    if exc.status_code == 405:
        return error_response(MethodNotAllowed(f"{request.method} is not allowed here"))
    error = ServerError(str(exc.detail))
    error.status = exc.status_code
    return error_response(error)


async def unexpected_error_handler(request: Request, exc: Exception) -> Response:
    structlog.get_logger("fusebox_server").error(
        "unhandled_error", path=request.url.path, error=repr(exc)
    )
    return error_response(GenerationFailed("internal error"))


def build_api_app(runtime: Runtime) -> Starlette:
    api = Api(runtime)
    return Starlette(
        routes=[
            Route("/v1/chat/completions", api.chat_completions, methods=["POST"]),
            Route("/v1/completions", api.completions, methods=["POST"]),
            Route("/v1/models", api.models, methods=["GET"]),
            Route("/healthz", api.healthz, methods=["GET"]),
            Route("/readyz", api.readyz, methods=["GET"]),
        ],
        exception_handlers={HTTPException: http_error_handler, Exception: unexpected_error_handler},
    )
