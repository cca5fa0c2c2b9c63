"""The HTTP edge both apps share: bodies, request ids, the one error table, two middlewares.

Why: routes raise domain errors and never catch them; this module turns
every error into an HTTP answer in one place (Starlette's
`exception_handlers`): a `ServerError` becomes its status and the OpenAI
error body, a Starlette 404/405 the same shape, a failed allocation
(`MemoryError`) a 503 `out_of_memory` with Retry-After (the process lives
on), and anything unexpected a 500 `generation_failed` (logged), never a
traceback. `CountRequests` gives
each generation request its `RequestRecord` and settles it exactly once
when the response is over, whatever ended it. `VariantHeader` stamps every
response with the variant that served it, so a test (or a person with curl)
can tell which variant answered; while the server is stopping it also says
`Connection: close`, so a client leaves its keep-alive connection after this
answer instead of sending the next request down a connection about to close.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Callable, Collection, Mapping
from typing import Any, Final

import structlog
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fusebox_contract.wiring import REQUEST_ID_HEADER, VARIANT_HEADER
from fusebox_server.control.accounting import RequestAccounting, RequestRecord
from fusebox_server.errors import (
    MEMORY_EXHAUSTED_MESSAGE,
    BodyTooLarge,
    ClientDisconnected,
    GenerationFailed,
    InvalidRequest,
    MemoryExhausted,
    MethodNotAllowed,
    NotFound,
    ServerError,
    memory_exhausted,
)
from fusebox_server.http.rendering import error_body, error_headers, sse

log = structlog.get_logger("fusebox_server")

REQUEST_ID_PATTERN: Final = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
RECORD_SCOPE_KEY: Final = "fusebox.request"


def request_id_from(headers: Mapping[str, str]) -> str:
    supplied = headers.get(REQUEST_ID_HEADER.lower(), "")
    return supplied if REQUEST_ID_PATTERN.match(supplied) else uuid.uuid4().hex


def record_of(request: Request) -> RequestRecord | None:
    record = request.scope.get(RECORD_SCOPE_KEY)
    return record if isinstance(record, RequestRecord) else None


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
    try:
        async for chunk in request.stream():
            received += len(chunk)
            if received > limit_bytes:
                raise BodyTooLarge(f"request body exceeds {limit_bytes} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientDisconnected("the client went away while sending the body") from None
    return b"".join(chunks)


def error_response(error: ServerError, request_id: str | None = None) -> JSONResponse:
    headers = error_headers(error)
    if request_id:
        headers[REQUEST_ID_HEADER] = request_id
    return JSONResponse(error_body(error), status_code=error.status, headers=headers)


# ----- the one table -----
async def on_server_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ServerError)
    record = record_of(request)
    if record is not None:
        record.fail(exc)
    return error_response(exc, record.request_id if record else None)


async def on_http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    error: ServerError
    if exc.status_code == 404:
        error = NotFound(f"no route {request.url.path}")
    elif exc.status_code == 405:
        error = MethodNotAllowed(f"{request.method} is not allowed here")
    else:
        error = ServerError(str(exc.detail))
        error.status = exc.status_code
    response = await on_server_error(request, error)
    for name, value in (exc.headers or {}).items():  # a 405's Allow (RFC 9110 requires it)
        response.headers.setdefault(name, value)
    return response


async def on_memory_error(request: Request, exc: Exception) -> Response:
    """A failed allocation is the server's trouble, not a bug: 503 with Retry-After."""
    error = memory_exhausted(exc) or MemoryExhausted(MEMORY_EXHAUSTED_MESSAGE)
    with contextlib.suppress(MemoryError):  # the log line must not cost the answer
        log.warning("memory_exhausted", path=request.url.path, error=repr(exc))
    return await on_server_error(request, error)


async def on_unexpected_error(request: Request, exc: Exception) -> Response:
    if memory_exhausted(exc) is not None:
        # An allocation failed in a handler or outside the routes: still a 503, never a 500.
        return await on_memory_error(request, exc)
    log.error("unhandled_error", path=request.url.path, error=repr(exc))
    return error_response(GenerationFailed("internal error"))


EXCEPTION_HANDLERS: Final[Mapping[Any, Callable[[Request, Exception], Any]]] = {
    ServerError: on_server_error,
    HTTPException: on_http_exception,
    MemoryError: on_memory_error,
    Exception: on_unexpected_error,
}


# ----- middlewares -----
class ResponseProgress:
    """How much of a response has gone out: once it has started, its status is spoken for."""

    def __init__(self) -> None:
        self.started = False
        self.complete = False
        self.event_stream = False

    def watch(self, send: Send) -> Send:
        async def watched(message: Message) -> None:
            if message["type"] == "http.response.start":
                # Handed to the server, the status is spoken for, even if sending it fails.
                self.started = True
                await send(message)
                self.event_stream = any(
                    name.lower() == b"content-type" and value.startswith(b"text/event-stream")
                    for name, value in message.get("headers", [])
                )
                return
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                self.complete = True

        return watched


class CountRequests:
    """Give each request to `paths` a RequestRecord; settle it once, when it is over.

    It also answers for errors that escape after the response started, which the
    handler table can no longer turn into a status: after a complete response the
    client has its answer (the error is logged, nothing else); in the middle of an
    event stream the stream ends with an OpenAI error event, as a generation error
    would end it; in the middle of a JSON body nothing can be said, and uvicorn
    closes the connection.
    """

    def __init__(self, app: ASGIApp, accounting: RequestAccounting, paths: Collection[str]):
        self.app = app
        self.accounting = accounting
        self.paths = frozenset(paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        record = RequestRecord(request_id_from(headers), scope["path"])
        scope[RECORD_SCOPE_KEY] = record
        progress = ResponseProgress()
        try:
            await self.app(scope, receive, progress.watch(send))
        except Exception as error:
            if not await self._settle_escaped_error(record, progress, error, send):
                raise
        except BaseException as error:
            record.fail(error)
            raise
        finally:
            self.accounting.settle(record)

    async def _settle_escaped_error(
        self, record: RequestRecord, progress: ResponseProgress, error: Exception, send: Send
    ) -> bool:
        """Settle an error that escaped the handler table; True when it is fully answered."""
        # Starlette reports a late error as RuntimeError("... response already started")
        # from the real one.
        cause = error.__cause__ if progress.started and error.__cause__ else error
        domain = memory_exhausted(cause)
        if progress.complete:
            with contextlib.suppress(MemoryError):
                log.error("error_after_response", request_id=record.request_id, error=repr(cause))
            return True
        record.fail(domain or cause)
        if not progress.started:
            return False
        if not progress.event_stream:
            with contextlib.suppress(MemoryError):
                log.error("response_cut", request_id=record.request_id, error=repr(cause))
            return False
        last = sse(error_body(domain or GenerationFailed("internal error")))
        with contextlib.suppress(Exception):
            await send({"type": "http.response.body", "body": last, "more_body": False})
        return True


class VariantHeader:
    """Add `X-Fusebox-Variant: <variant now serving>` to any response that lacks one, and
    `Connection: close` to every response while `stopping()`."""

    def __init__(
        self, app: ASGIApp, current: Callable[[], str], stopping: Callable[[], bool] = lambda: False
    ):
        self.app = app
        self.current = current
        self.stopping = stopping
        self._name = VARIANT_HEADER.lower().encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def stamped(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                if not any(name.lower() == self._name for name, _ in headers):
                    headers.append((self._name, self.current().encode()))
                if self.stopping():
                    headers = [(n, v) for n, v in headers if n.lower() != b"connection"]
                    headers.append((b"connection", b"close"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, stamped)
