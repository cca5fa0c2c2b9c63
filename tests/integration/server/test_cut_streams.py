"""1,000 streams cut mid-generation leak no task, slot, batch row or memory.

Each request is a streamed chat from the real `openai` client that reads the
first few chunks and closes its response, which closes the connection
mid-generation. The server must cancel each generation, free its admission
slot and its row in the decode batch, end the request's tasks, and give back
the memory it used.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai
import pytest
from fusebox_server_harness import MODEL_NAME, ServerProcess

from fusebox_contract.admin import ServerState
from fusebox_contract.names import RequestOutcome

STREAMS = 1000
WARM_UP_STREAMS = 100
CONCURRENCY = 16
CHUNKS_READ = 3
MAX_TOKENS = 400  # far more than is read
# RSS may grow this much over the 1,000 streams after the warm-up (allocator arenas,
# the latency windows); a leak of even 100 KiB per stream would pass 100 MiB.
RSS_GROWTH_LIMIT_BYTES = 48 * 1024 * 1024


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


@pytest.fixture(scope="module")
def stream_server(start_server: Any) -> ServerProcess:
    server: ServerProcess = start_server(
        flags={"max-concurrency": 8, "max-queue": 64, "max-new-tokens": MAX_TOKENS}
    )
    return server


async def _cut_one(client: openai.AsyncOpenAI, number: int) -> int:
    """Read CHUNKS_READ chunks of a long stream, then close it; returns the chunks read."""
    stream = await client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": f"Tell me a long story, number {number}"}],
        max_tokens=MAX_TOKENS,
        temperature=0,  # the tiny model then always runs to max_tokens: every stream is cut
        stream=True,
        extra_headers={"X-Request-Id": f"cut-{number}"},
    )
    read = 0
    try:
        async for _chunk in stream:
            read += 1
            if read >= CHUNKS_READ:
                break
    finally:
        await stream.close()
    return read


async def _cut_streams(url: str, count: int, first: int) -> list[int]:
    gate = asyncio.Semaphore(CONCURRENCY)

    async with openai.AsyncOpenAI(
        base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120
    ) as client:

        async def bounded(number: int) -> int:
            async with gate:
                return await _cut_one(client, number)

        return await asyncio.gather(*(bounded(first + n) for n in range(count)))


def _settled(server: ServerProcess, idle_tasks: int) -> ServerState | None:
    state = server.state()
    quiet = (
        state.running == 0
        and state.queue_length == 0
        and state.worker_active == 0
        and state.asyncio_tasks <= idle_tasks
    )
    return state if quiet else None


def test_a_thousand_streams_cut_mid_generation_leak_nothing(
    stream_server: ServerProcess,
) -> None:
    server = stream_server
    idle = server.state()
    assert idle.running == 0 and idle.asyncio_tasks > 0

    # Warm-up: the allocator, the tokenizer cache and the latency windows reach their size.
    asyncio.run(_cut_streams(server.url, WARM_UP_STREAMS, 0))
    server.wait_for(lambda: _settled(server, idle.asyncio_tasks), what="idle after warm-up")
    rss_before = rss_bytes(server.pid)

    chunks = asyncio.run(_cut_streams(server.url, STREAMS, WARM_UP_STREAMS))
    assert chunks == [CHUNKS_READ] * STREAMS  # every stream was cut after its first chunks

    state = server.wait_for(
        lambda: _settled(server, idle.asyncio_tasks),
        timeout=60,
        what="no request running, queued or decoding, and the idle task count",
    )
    assert state.threads <= idle.threads
    assert state.debug.batch_rows == 0
    assert state.debug.inbox == 0
    rss_after = rss_bytes(server.pid)
    print(f"\nRSS before {rss_before / 2**20:.1f} MiB, after {rss_after / 2**20:.1f} MiB")
    assert rss_after - rss_before < RSS_GROWTH_LIMIT_BYTES

    # Every cut stream was counted once, as cancelled, its generation stopped far short
    # of its length.
    assert state.requests[RequestOutcome.CANCELLED] == STREAMS + WARM_UP_STREAMS, state.requests
    assert state.requests[RequestOutcome.FAILED] == 0
    lines = [json.loads(line) for line in server.log_text().splitlines() if '"cut-' in line]
    requests = [line for line in lines if line.get("event") == "request"]
    assert len(requests) == STREAMS + WARM_UP_STREAMS
    assert {line["finish_reason"] for line in requests} == {"cancelled"}
    # None ran to its length; typically the cut is seen within a few tokens. On a busy
    # 2-core machine one stream in a thousand was seen 208 tokens in: the median
    # says whether cuts stop generations, the maximum that none was missed.
    lengths = sorted(line["output_length"] for line in requests)
    assert lengths[-1] < MAX_TOKENS
    assert lengths[len(lengths) // 2] < MAX_TOKENS // 4, lengths

    # The next request is served in full.
    response = server.chat("Hello, world.", max_tokens=8)
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"]
