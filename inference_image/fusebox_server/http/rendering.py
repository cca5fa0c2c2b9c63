"""OpenAI response bodies as pure functions: completion, chat, stream chunks, errors.

Why: what a client parses must not depend on which route or which code path
produced it (a canned answer and a generated one are the same shape). Every
body the API sends is built here from plain values, with no I/O, and golden
JSON files pin each shape (tests/unit/server/golden/).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

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


class TokenScores(Protocol):
    """One generated token as the worker scores it (`worker.ScoredToken`)."""

    @property
    def text(self) -> str: ...
    @property
    def raw(self) -> bytes: ...
    @property
    def logprob(self) -> float: ...
    @property
    def alternatives(self) -> Sequence[TokenScores]: ...


def _token_entry(score: TokenScores) -> dict[str, Any]:
    return {"token": score.text, "logprob": score.logprob, "bytes": list(score.raw)}


def chat_logprobs(scores: Sequence[TokenScores]) -> dict[str, Any]:
    """Chat's `logprobs`: a `content` entry per token, its alternatives in `top_logprobs`.
    A token that is part of a character has its bytes escaped as its `token` (`\\xe5`);
    `bytes` of consecutive entries join into the text's UTF-8."""
    content = [
        {
            **_token_entry(score),
            "top_logprobs": [_token_entry(alternative) for alternative in score.alternatives],
        }
        for score in scores
    ]
    return {"content": content, "refusal": None}


def completion_logprobs(scores: Sequence[TokenScores], text_offset: int) -> dict[str, Any]:
    """The legacy completions `logprobs`: parallel lists per token. Each `top_logprobs` map
    holds the alternatives and the chosen token (so up to `logprobs` + 1 entries, as vLLM
    sends); `text_offset` counts characters of the generated text from `text_offset`."""
    offsets: list[int] = []
    for score in scores:
        offsets.append(text_offset)
        text_offset += len(score.text)
    tops = []
    for score in scores:
        top = {alternative.text: alternative.logprob for alternative in score.alternatives}
        top.setdefault(score.text, score.logprob)
        tops.append(top)
    return {
        "tokens": [score.text for score in scores],
        "token_logprobs": [score.logprob for score in scores],
        "top_logprobs": tops,
        "text_offset": offsets,
    }


@dataclass(frozen=True)
class Choice:
    """One finished choice of a whole answer."""

    index: int
    text: str | None
    """None for a chat answer that is only tool calls."""
    finish_reason: str
    logprobs: dict[str, Any] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    """`message.tool_calls` (id, type, function name and arguments) when the model called."""


def completion_body(
    reply: Reply, text: str, finish_reason: str, prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    """The whole answer of one choice: `chat.completion` or `text_completion`."""
    return choices_body(reply, [Choice(0, text, finish_reason)], prompt_tokens, completion_tokens)


def choices_body(
    reply: Reply, choices: Sequence[Choice], prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    """The whole answer with every choice; `completion_tokens` counts all of them."""
    rendered: list[dict[str, Any]] = []
    for choice in choices:
        if reply.kind == Kind.CHAT:
            message: dict[str, Any] = {"role": "assistant", "content": choice.text}
            if choice.tool_calls:
                message["tool_calls"] = choice.tool_calls
            rendered.append(
                {
                    "index": choice.index,
                    "message": message,
                    "logprobs": choice.logprobs,
                    "finish_reason": choice.finish_reason,
                }
            )
        else:
            rendered.append(
                {
                    "index": choice.index,
                    "text": choice.text or "",
                    "logprobs": choice.logprobs,
                    "finish_reason": choice.finish_reason,
                }
            )
    return {
        "id": reply.id,
        "object": "chat.completion" if reply.kind == Kind.CHAT else "text_completion",
        "created": reply.created,
        "model": reply.model,
        "choices": rendered,
        "usage": usage(prompt_tokens, completion_tokens),
    }


def chunk_body(
    reply: Reply,
    text: str | None,
    finish_reason: str | None,
    first: bool,
    index: int = 0,
    logprobs: dict[str, Any] | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One streamed piece of choice `index`; a choice's first chat chunk carries the role.
    `tool_calls` are call deltas (each with its `index` among the choice's calls)."""
    if reply.kind == Kind.CHAT:
        delta: dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        if tool_calls:
            delta["tool_calls"] = tool_calls
        return {
            "id": reply.id,
            "object": "chat.completion.chunk",
            "created": reply.created,
            "model": reply.model,
            "choices": [
                {
                    "index": index,
                    "delta": delta,
                    "logprobs": logprobs,
                    "finish_reason": finish_reason,
                }
            ],
        }
    return {
        "id": reply.id,
        "object": "text_completion",
        "created": reply.created,
        "model": reply.model,
        "choices": [
            {
                "index": index,
                "text": text or "",
                "logprobs": logprobs,
                "finish_reason": finish_reason,
            }
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
    return whole_choices_events(reply, [Choice(0, text, finish_reason)], usage_tokens)


def whole_choices_events(
    reply: Reply, choices: Sequence[Choice], usage_tokens: tuple[int, int] | None
) -> bytes:
    """`whole_answer_events` for several choices: each choice's text (and log-probabilities)
    in one chunk, then its finish reason; then the usage chunk and `[DONE]`."""
    events = b""
    for choice in choices:
        calls = [{"index": i, **call} for i, call in enumerate(choice.tool_calls or [])]
        events += sse(
            chunk_body(reply, choice.text, None, True, choice.index, choice.logprobs, calls)
        )
        events += sse(chunk_body(reply, None, choice.finish_reason, False, choice.index))
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
