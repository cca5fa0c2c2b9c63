"""Chunked prefill in a real server, through the official openai client.

One stream runs; a long prompt joins. With `--prefill-chunk-tokens` the
joiner's prompt runs a chunk per turn of the worker and the running stream
takes a step between chunks, so it keeps receiving text while the joiner has
none yet; prefilled whole, the prompt is one forward pass the running stream
waits out. What the test reads is the order of the two streams' events (how
many of the running stream's chunks arrive between the joiner's send and its
first text), never a duration. Llama 3's shape: GQA, a 128k vocabulary.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from fusebox_server_harness import MODEL_NAME, ServerProcess

from fusebox_server.zoo.release import ensure_zoo_model

FAMILY = "llama3"
CHUNK_TOKENS = 16
# About 3,600 prompt tokens: some 225 chunks of 16, so some 225 running steps between the
# joiner's send and its first token (177 text chunks arrived in a run; some tokens' text is
# held back). Whole, the joiner costs the running stream only the steps of its trip to the
# worker (a few) and of its own answer's tokens (4): 2 text chunks in a run.
JOINER_LINE = "kubectl drain node-7 --ignore-daemonsets --delete-emptydir-data # 维护窗口 {}\n"
JOINER_LINES = 60
JOINER_TOKENS = 4
RUNNING_TOKENS = 1000
# Far above what a whole prefill lets through, far below what the chunks do.
INTERLEAVED_AT_LEAST = 40


@pytest.fixture(scope="module")
def server(server_workdir: Path) -> Iterator[ServerProcess]:
    workdir = Path(tempfile.mkdtemp(prefix="chunked-prefill-", dir=server_workdir))
    process = ServerProcess(
        workdir,
        ensure_zoo_model(FAMILY),
        {
            "max-new-tokens": RUNNING_TOKENS,
            "prefill-chunk-tokens": CHUNK_TOKENS,
            "prefix-cache-bytes": 0,  # every joiner's prompt runs in full
        },
        {},
    )
    try:
        process.wait_ready()
        yield process
    finally:
        process.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _text_moments(stream: Any, moments: list[float], stop: threading.Event) -> None:
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            moments.append(time.monotonic())
        if stop.is_set():
            break
    stream.close()


def test_a_running_stream_receives_text_between_the_chunks_of_a_joining_prompt(
    server: ServerProcess,
) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    running_moments: list[float] = []
    stop = threading.Event()
    running = client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "Say something about node maintenance."}],
        max_tokens=RUNNING_TOKENS,
        temperature=0,
        stream=True,
    )
    reader = threading.Thread(target=_text_moments, args=(running, running_moments, stop))
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while len(running_moments) < 3:  # the running stream is under way
            assert reader.is_alive() and time.monotonic() < deadline, "the stream did not run"
            time.sleep(0.01)
        prompt = "".join(JOINER_LINE.format(index) for index in range(JOINER_LINES))
        sent = time.monotonic()
        joiner = client.chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=JOINER_TOKENS,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        first_text: float | None = None
        usage = None
        for chunk in joiner:
            if first_text is None and chunk.choices and chunk.choices[0].delta.content:
                first_text = time.monotonic()
            usage = chunk.usage or usage
        # A joiner whose few tokens are held back (bytes of a partial character) shows its
        # text at its end, which is after its prefill all the same.
        joiner_first = first_text if first_text is not None else time.monotonic()
        running_alive = reader.is_alive()
    finally:
        stop.set()
        reader.join(timeout=60)
    assert usage is not None and usage.completion_tokens == JOINER_TOKENS
    assert usage.prompt_tokens > 80 * CHUNK_TOKENS, usage.prompt_tokens
    assert running_alive, "the running stream ended before the joiner started: no interleaving"
    interleaved = sum(1 for moment in running_moments if sent < moment < joiner_first)
    assert interleaved >= INTERLEAVED_AT_LEAST, interleaved


@pytest.mark.parametrize("value", ["-1", "sixteen"])
def test_an_invalid_chunk_size_is_refused_by_name_before_the_model_loads(
    tiny_model_dir: Path, value: str
) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "fusebox_server",
            "--check-config",
            "--model-dir",
            str(tiny_model_dir),
            "--prefill-chunk-tokens",
            value,
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "--prefill-chunk-tokens" in result.stderr
