"""Requests admitted before a swap to a fallback with another tokenizer, on a real server.

The fallback is the tiny model's weights with another tokenizer (its BPE without
merges, so a prompt takes more tokens) and another chat template. With one slot
and the `slow` fault, a runner holds the slot while two requests wait at
admission, their prompts encoded by the primary; the swap takes the runner's
model, and the two start on the fallback, where their prompts are encoded again.
The access log must name the variant each ended on, as the response headers do.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from fusebox_server_harness import MODEL_NAME, ServerProcess
from test_openai_parameters import request_line

from fusebox_contract.names import ActionType, Variant
from fusebox_server.model.tokenization import load_tokenizer

MESSAGES = [{"role": "user", "content": "Hello there, how are you today?"}]


@pytest.fixture(scope="module")
def other_tokenizer_dir(tiny_model_dir: Path, server_workdir: Path) -> Path:
    directory = server_workdir / f"other-tokenizer-fallback-{uuid.uuid4().hex[:6]}"
    directory.mkdir()
    for path in tiny_model_dir.iterdir():
        if path.name not in ("tokenizer.json", "chat_template.jinja"):
            (directory / path.name).symlink_to(path)
    definition = json.loads((tiny_model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    definition["model"]["merges"] = []
    (directory / "tokenizer.json").write_text(json.dumps(definition), encoding="utf-8")
    template = (tiny_model_dir / "chat_template.jinja").read_text(encoding="utf-8")
    (directory / "chat_template.jinja").write_text("Fallback speaking.\n" + template)
    return directory


def prompt_tokens(model_dir: Path) -> int:
    tokenizer = load_tokenizer(model_dir)
    ids = tokenizer.apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return len(ids)


@pytest.fixture
def swapping(
    start_server: Any, tiny_model_dir: Path, other_tokenizer_dir: Path
) -> Iterator[ServerProcess]:
    """One slot; MESSAGES fit --max-input-tokens in the primary's tokens, not the fallback's."""
    assert prompt_tokens(other_tokenizer_dir) > prompt_tokens(tiny_model_dir)
    server = start_server(
        flags={
            "device": "cpu",
            "fallback-dir": str(other_tokenizer_dir),
            "max-concurrency": 1,
            "max-queue": 4,
            "max-input-tokens": prompt_tokens(tiny_model_dir),
        },
        env={"FUSEBOX_FAULTS": "slow:0"},
    )
    yield server
    server.stop()


def read_one_chunk_and_leave(server: ServerProcess, request_id: str) -> str:
    """A streamed completion read to its first chunk, then closed; its variant header."""
    body = {"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 30, "stream": True}
    with httpx.Client(base_url=server.url, timeout=60) as client:
        headers = {"X-Request-Id": request_id}
        with client.stream("POST", "/v1/completions", json=body, headers=headers) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    break
            return response.headers["x-fusebox-variant"]


def test_requests_admitted_before_a_swap_to_another_tokenizer_are_logged_as_the_fallbacks(
    swapping: ServerProcess, other_tokenizer_dir: Path
) -> None:
    server = swapping
    server.set_faults(slow=300)  # the runner holds the one slot while the others queue
    chat = {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 6, "temperature": 0}
    runner_body = {"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 40}
    try:
        with ThreadPoolExecutor(3) as pool, httpx.Client(base_url=server.url, timeout=60) as client:
            runner = pool.submit(client.post, "/v1/completions", json=runner_body)
            server.wait_for(lambda: server.state().running == 1, what="the runner")
            refused = pool.submit(
                client.post, "/v1/chat/completions", json=chat, headers={"X-Request-Id": "refused"}
            )
            server.wait_for(lambda: server.state().queue_length == 1, what="the first to queue")
            cut = pool.submit(read_one_chunk_and_leave, server, "cut")
            server.wait_for(lambda: server.state().queue_length == 2, what="the second")
            assert server.act(ActionType.SWAP, Variant.FALLBACK).variant is Variant.FALLBACK
            refusal = refused.result(timeout=60)
            cut_variant = cut.result(timeout=60)
            runner.result(timeout=60)
    finally:
        server.set_faults(slow=0)

    # Encoded again by the fallback, the prompt no longer fits: the admission's 400.
    assert refusal.status_code == 400, refusal.text
    assert refusal.json()["error"]["code"] == "context_length_exceeded"
    assert refusal.headers["x-fusebox-variant"] == Variant.FALLBACK.value
    line = request_line(server, "refused")
    assert (line["status"], line["outcome"]) == (400, "invalid")
    assert line["variant"] == line["served_by"] == Variant.FALLBACK.value
    assert line["input_length"] == prompt_tokens(other_tokenizer_dir)  # as the message says
    assert f"{line['input_length']} tokens" in refusal.json()["error"]["message"]

    # A stream cut after its first chunk from the fallback is the fallback's too.
    assert cut_variant == Variant.FALLBACK.value
    line = request_line(server, "cut")
    assert (line["status"], line["outcome"]) == (499, "cancelled")
    assert line["variant"] == line["served_by"] == Variant.FALLBACK.value
