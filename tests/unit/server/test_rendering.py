"""OpenAI bodies from pure functions, pinned by golden JSON files.

Regenerate after an intended change with FUSEBOX_UPDATE_GOLDEN=1 and review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from fusebox_server.errors import DeadlineExceeded, ModelNotFound, QueueFull
from fusebox_server.http.rendering import (
    Kind,
    Reply,
    chunk_body,
    completion_body,
    error_body,
    error_headers,
    sse,
    usage_chunk,
)

GOLDEN = Path(__file__).parent / "golden"
CHAT = Reply(Kind.CHAT, "req-1", 1_700_000_000, "chat")
COMPLETION = Reply(Kind.COMPLETION, "req-2", 1_700_000_000, "chat")

BODIES: dict[str, Any] = {
    "chat_completion": completion_body(CHAT, "你好！", "stop", 5, 3),
    "text_completion": completion_body(COMPLETION, "Paris.", "length", 7, 2),
    "chat_chunk_first": chunk_body(CHAT, "Hel", None, True),
    "chat_chunk_next": chunk_body(CHAT, "lo", None, False),
    "chat_chunk_final": chunk_body(CHAT, None, "stop", False),
    "completion_chunk": chunk_body(COMPLETION, "Par", None, True),
    "chat_usage_chunk": usage_chunk(CHAT, 5, 3),
    "error_queue_full": error_body(QueueFull("2 running and 2 waiting; retry later")),
    "error_model_not_found": error_body(ModelNotFound("no model 'x'", param="model")),
}


@pytest.mark.parametrize("name", sorted(BODIES))
def test_each_body_matches_its_golden_file(name: str) -> None:
    path = GOLDEN / f"{name}.json"
    rendered = json.dumps(BODIES[name], ensure_ascii=False, indent=2, sort_keys=True) + "\n"
    if os.environ.get("FUSEBOX_UPDATE_GOLDEN") == "1":
        path.write_text(rendered, encoding="utf-8")
    assert rendered == path.read_text(encoding="utf-8")


def test_retry_after_comes_only_with_errors_that_ask_for_it() -> None:
    assert error_headers(QueueFull("full")) == {"Retry-After": "1"}
    assert error_headers(DeadlineExceeded("late")) == {}


def test_sse_frames_json_and_the_done_marker() -> None:
    assert sse({"a": "你"}) == 'data: {"a": "你"}\n\n'.encode()
    assert sse("[DONE]") == b"data: [DONE]\n\n"
