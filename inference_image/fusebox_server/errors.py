"""Domain errors of the server, each naming the HTTP status it becomes.

Why: the engine, the worker, admission and validation raise errors that mean
something to a caller ("the queue is full"), not HTTP codes; `app.py` and
`admin.py` raise them and one handler table (`edge.py`) renders each as the
OpenAI error shape (`rendering.error_body`), so a client never gets a 500
for its own mistakes. Each class names its status in its docstring; the
request's counted outcome follows from the class too (`accounting.py`).
"""

from __future__ import annotations

import errno
from typing import Final

# How a failed allocation is worded when it comes as a plain RuntimeError: "can't allocate"
# from torch's c10 CPU allocator ("... can't allocate memory") and from CPython's locks
# ("can't allocate lock", "can't allocate read lock"), a failed C++ operator new, and
# CUDA's caching allocator.
ALLOCATION_FAILURE_MARKERS: Final = ("can't allocate", "std::bad_alloc", "CUDA out of memory")
MEMORY_EXHAUSTED_MESSAGE: Final = (
    "the server could not allocate memory for this request; it keeps running, retry later"
)


class ServerError(Exception):
    """Base: an expected failure with a status, an OpenAI error type and code."""

    status = 500
    error_type = "server_error"
    code: str | None = "internal_error"
    retry_after_seconds: int | None = None

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidRequest(ServerError):
    """400: the request is well-formed JSON but asks for something we refuse."""

    status = 400
    error_type = "invalid_request_error"
    code = "invalid_request"


class InvalidJson(InvalidRequest):
    """400: the body is not UTF-8 JSON."""

    code = "invalid_json"


class InputTooLong(InvalidRequest):
    """400: the prompt has more tokens than --max-input-tokens."""

    code = "context_length_exceeded"


class ContextLengthExceeded(InvalidRequest):
    """400: the prompt plus the tokens asked for exceed the model's context window."""

    code = "context_length_exceeded"


class ModelNotFound(ServerError):
    """404: the `model` field names a model this server does not serve."""

    status = 404
    error_type = "invalid_request_error"
    code = "model_not_found"


class SchemaError(ServerError):
    """422: a field has the wrong type or a required field is missing."""

    status = 422
    error_type = "invalid_request_error"
    code = "invalid_schema"


class BodyTooLarge(ServerError):
    """413: the request body exceeds --max-body-bytes."""

    status = 413
    error_type = "invalid_request_error"
    code = "request_too_large"


class QueueFull(ServerError):
    """429: maxConcurrency are running and maxQueue are waiting."""

    status = 429
    error_type = "rate_limit_error"
    code = "queue_full"
    retry_after_seconds = 1


class Unavailable(ServerError):
    """503: the server refuses new work for now (breaker, model unloaded, memory guard)."""

    status = 503
    error_type = "service_unavailable"
    code = "unavailable"
    retry_after_seconds = 5


class BreakerOpen(Unavailable):
    """503: the circuit breaker is open, or half-open and this request was not admitted."""

    code = "breaker_open"


class ModelUnavailable(Unavailable):
    """503: no model is loaded (unloaded by the operator, or still loading)."""

    code = "model_unavailable"


class MemoryPressure(Unavailable):
    """503: the local memory guard refuses new requests (memory above the guard ratio)."""

    code = "memory_pressure"


class MemoryExhausted(Unavailable):
    """503: an allocation failed while this request was handled (MemoryError, std::bad_alloc,
    a torch allocator out of memory); the process lives on and the next request may succeed.

    Counted as `failed`, not `rejected`: the request was admitted and the server could not
    finish it, so the operator's breaker sees it as a failed call (`accounting.outcome_of`).
    """

    code = "out_of_memory"


class DeadlineExceeded(ServerError):
    """504: the request outlived --request-timeout (queue wait plus generation)."""

    status = 504
    error_type = "timeout_error"
    code = "timeout"


class Unauthorized(ServerError):
    """401: the admin bearer token is missing or wrong."""

    status = 401
    error_type = "authentication_error"
    code = "invalid_token"


class Forbidden(ServerError):
    """403: the admin call is not allowed in this process (faults not armed at start)."""

    status = 403
    error_type = "permission_error"
    code = "forbidden"


class Conflict(ServerError):
    """409: the admin action cannot run in the current state (e.g. no fallback configured)."""

    status = 409
    error_type = "invalid_request_error"
    code = "conflict"


class ActionIdReused(Conflict):
    """409: an admin action id already named a different action."""

    code = "action_id_reused"


class FallbackUnavailable(Conflict):
    """409: the fallback variant was asked for, but none is configured or this device cannot
    serve its quantization (the message says which)."""

    code = "fallback_unavailable"


class ClientDisconnected(ServerError):
    """499 (nginx's "client closed request"): the caller went away before the answer ended.

    Never sent (there is nobody to send it to); it names the outcome in logs and counters.
    """

    status = 499
    error_type = "client_closed_request"
    code = "client_disconnected"


class NotFound(ServerError):
    """404: no such route."""

    status = 404
    error_type = "invalid_request_error"
    code = "not_found"


class MethodNotAllowed(ServerError):
    """405: the route exists but not for this method."""

    status = 405
    error_type = "invalid_request_error"
    code = "method_not_allowed"


class GenerationFailed(ServerError):
    """500: the model raised while generating (a server fault, never the caller's)."""

    status = 500
    error_type = "server_error"
    code = "generation_failed"


def memory_exhausted(error: BaseException) -> MemoryExhausted | None:
    """The 503 for an allocation failure (MemoryError, ENOMEM, or the words above), else None."""
    if (
        isinstance(error, MemoryError)
        or (isinstance(error, OSError) and error.errno == errno.ENOMEM)
        or (
            isinstance(error, RuntimeError)
            and any(marker in str(error) for marker in ALLOCATION_FAILURE_MARKERS)
        )
    ):
        return MemoryExhausted(MEMORY_EXHAUSTED_MESSAGE)
    return None
