"""OpenAI response bodies as pure functions: completion, chat, stream chunks, errors.

Why: what a client parses must not depend on which route or which code path
produced it (a canned answer and a generated one are the same shape). Every
body the API sends is built here from plain values, with no I/O, and golden
JSON files pin each shape (tests/unit/server/golden/).
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

from fusebox_server.errors import ServerError


class Kind(enum.StrEnum):
    CHAT = "chat"
    COMPLETION = "completion"


@dataclass(frozen=True)
class Reply:
    """What every body of one response shares."""

    kind: Kind
    request_id: str
    created: int
    model: str

    @property
    def id(self) -> str:
        prefix = "chatcmpl" if self.kind == Kind.CHAT else "cmpl"
        return f"{prefix}-{self.request_id}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_body(
    reply: Reply, text: str, finish_reason: str, prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    """The whole answer: `chat.completion` or `text_completion`."""
    if reply.kind == Kind.CHAT:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish_reason,
        }
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    return {
        "id": reply.id,
        "object": obj,
        "created": reply.created,
        "model": reply.model,
        "choices": [choice],
        "usage": usage(prompt_tokens, completion_tokens),
    }


def chunk_body(
    reply: Reply, text: str | None, finish_reason: str | None, first: bool
) -> dict[str, Any]:
    """One streamed piece; the first chat chunk carries the role."""
    if reply.kind == Kind.CHAT:
        delta: dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        return {
            "id": reply.id,
            "object": "chat.completion.chunk",
            "created": reply.created,
            "model": reply.model,
            "choices": [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            ],
        }
    return {
        "id": reply.id,
        "object": "text_completion",
        "created": reply.created,
        "model": reply.model,
        "choices": [
            {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        ],
    }


def usage_chunk(reply: Reply, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """The extra last chunk `stream_options.include_usage` asks for: no choices, the usage."""
    chunk = chunk_body(reply, None, None, False)
    chunk["choices"] = []
    chunk["usage"] = usage(prompt_tokens, completion_tokens)
    return chunk


def whole_answer_events(
    reply: Reply, text: str, finish_reason: str, usage_tokens: tuple[int, int] | None
) -> bytes:
    """A stream's events for an answer complete before the first event (the no-streaming
    tier, a canned answer): one chunk with all the text, the chunk with the finish reason,
    the usage chunk when `usage_tokens` (prompt, completion) are given, then `[DONE]`."""
    events = sse(chunk_body(reply, text, None, True))
    events += sse(chunk_body(reply, None, finish_reason, False))
    if usage_tokens is not None:
        events += sse(usage_chunk(reply, *usage_tokens))
    return events + sse("[DONE]")


def error_body(error: ServerError) -> dict[str, Any]:
    """The OpenAI error object."""
    return {
        "error": {
            "message": error.message,
            "type": error.error_type,
            "param": error.param,
            "code": error.code,
        }
    }


def error_headers(error: ServerError) -> dict[str, str]:
    if error.retry_after_seconds is None:
        return {}
    return {"Retry-After": str(error.retry_after_seconds)}


def sse(data: dict[str, Any] | str) -> bytes:
    """One server-sent event; a string (`[DONE]`) goes as it is."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n".encode()


def json_bytes(body: dict[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False).encode()
