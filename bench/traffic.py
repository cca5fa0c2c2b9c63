"""Send a workload (bench/workload.py) to an OpenAI-compatible server and record every response.

Why: closed-loop and open-loop load are two ways of sending the same
requests, and both must time a response the same way (serving_metrics.py
says what is measured). Requests are streamed chat completions, greedy,
with `stream_options.include_usage`, so the client sees the first token
when it leaves the server, and counts only the tokens the server reports.
One asyncio loop drives every client: a thread per client would compete
with the servers for the same two cores.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from typing import Any

import httpx

from bench.serving_metrics import ResponseRecord
from bench.workload import WorkloadRequest

REQUEST_TIMEOUT_SECONDS = 900.0


def chat_body(model: str, request: WorkloadRequest) -> dict[str, Any]:
    """The request as sent: greedy, streamed, with a usage chunk at the end."""
    return {
        "model": model,
        "messages": request.messages(),
        "max_tokens": request.max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def stream_one(
    client: httpx.AsyncClient, model: str, request: WorkloadRequest, record: ResponseRecord
) -> None:
    """Send one request and fill `record` as its chunks arrive; errors go into the record."""
    pieces: list[str] = []
    record.sent = time.perf_counter()
    try:
        async with client.stream(
            "POST", "/v1/chat/completions", json=chat_body(model, request)
        ) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode(errors="replace")
                record.error = f"HTTP {response.status_code}: {body[:300]}"
                return
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[len("data:") :].strip()
                if data == "[DONE]":
                    break
                _take_chunk(json.loads(data), record, pieces, time.perf_counter())
    except (httpx.HTTPError, ValueError) as error:
        record.error = repr(error)
    finally:
        record.finished = time.perf_counter()
        record.text = "".join(pieces)


def _take_chunk(
    chunk: dict[str, Any], record: ResponseRecord, pieces: list[str], now: float
) -> None:
    if "error" in chunk:
        record.error = f"stream error: {chunk['error']}"
        return
    for choice in chunk.get("choices") or []:
        content = (choice.get("delta") or {}).get("content")
        if content:
            record.chunk_times.append(now)
            pieces.append(content)
        if choice.get("finish_reason"):
            record.finish_reason = choice["finish_reason"]
    usage = chunk.get("usage")
    if usage:
        record.prompt_tokens = usage.get("prompt_tokens")
        record.completion_tokens = usage.get("completion_tokens")


async def _closed_loop(
    url: str, model: str, requests: Sequence[WorkloadRequest], clients: int
) -> list[ResponseRecord]:
    records: list[ResponseRecord] = []
    queue = list(reversed(requests))
    limits = httpx.Limits(max_connections=clients + 4)
    timeout = httpx.Timeout(REQUEST_TIMEOUT_SECONDS)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as client:

        async def one_client() -> None:
            while queue:
                request = queue.pop()
                record = ResponseRecord(request.index, scheduled=time.perf_counter())
                records.append(record)
                await stream_one(client, model, request, record)

        await asyncio.gather(*(one_client() for _ in range(clients)))
    return sorted(records, key=lambda record: record.index)


async def _open_loop(
    url: str, model: str, requests: Sequence[WorkloadRequest], send_times: Sequence[float]
) -> list[ResponseRecord]:
    timeout = httpx.Timeout(REQUEST_TIMEOUT_SECONDS)
    limits = httpx.Limits(max_connections=len(requests) + 4)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as client:
        start = time.perf_counter()
        records = [
            ResponseRecord(request.index, scheduled=start + offset)
            for request, offset in zip(requests, send_times, strict=True)
        ]

        async def at_its_time(request: WorkloadRequest, record: ResponseRecord) -> None:
            await asyncio.sleep(max(0.0, record.scheduled - time.perf_counter()))
            await stream_one(client, model, request, record)

        await asyncio.gather(
            *(
                at_its_time(request, record)
                for request, record in zip(requests, records, strict=True)
            )
        )
    return records


def complete_unstreamed(
    url: str, model: str, request: WorkloadRequest, client: httpx.Client | None = None
) -> ResponseRecord:
    """One request without streaming: the whole answer in one body (its latency alone).

    `client`: one kept across requests, as an SDK keeps its own, so the latency
    is the request's, not a new client's setup."""
    body = chat_body(model, request) | {"stream": False}
    del body["stream_options"]
    post = client.post if client is not None else httpx.post
    record = ResponseRecord(request.index, scheduled=time.perf_counter())
    record.sent = record.scheduled
    try:
        response = post(f"{url}/v1/chat/completions", json=body, timeout=REQUEST_TIMEOUT_SECONDS)
        record.finished = time.perf_counter()
        if response.status_code != 200:
            record.error = f"HTTP {response.status_code}: {response.text[:300]}"
            return record
        answer = response.json()
        choice = answer["choices"][0]
        record.text = choice["message"].get("content") or ""
        record.finish_reason = choice.get("finish_reason")
        usage = answer.get("usage") or {}
        record.prompt_tokens = usage.get("prompt_tokens")
        record.completion_tokens = usage.get("completion_tokens")
    except (httpx.HTTPError, ValueError, KeyError) as error:
        record.finished = time.perf_counter()
        record.error = repr(error)
    return record


def closed_loop(
    url: str, model: str, requests: Sequence[WorkloadRequest], clients: int
) -> list[ResponseRecord]:
    """`clients` clients, each sending its next request as soon as its last one ended."""
    return asyncio.run(_closed_loop(url, model, requests, clients))


def open_loop(
    url: str, model: str, requests: Sequence[WorkloadRequest], send_times: Sequence[float]
) -> list[ResponseRecord]:
    """Each request sent at its own time (seconds from the start), however the server keeps up."""
    return asyncio.run(_open_loop(url, model, requests, send_times))
