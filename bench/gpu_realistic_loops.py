"""Closed and open loops of streamed requests against a server, each with its deadlines.

Why apart from the script: bench/traffic.py streams one request; a round on
a lent device must also stop sending when its share is spent and cut a
request that would outlive it (marked with `TIMEOUT`, so the figures tell
the budget's cuts from the server's failures).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import httpx

from bench import traffic
from bench.gpu_realistic_traffic import TIMEOUT
from bench.serving_metrics import ResponseRecord
from bench.workload import WorkloadRequest


async def _timed(
    client: httpx.AsyncClient,
    model: str,
    request: WorkloadRequest,
    record: ResponseRecord,
    timeout_seconds: float,
) -> None:
    try:
        await asyncio.wait_for(traffic.stream_one(client, model, request, record), timeout_seconds)
    except TimeoutError:
        record.error = f"{TIMEOUT} no end within {timeout_seconds:.0f} s"


async def _closed_loop(
    url: str,
    model: str,
    requests: Sequence[WorkloadRequest],
    clients: int,
    stop_sending_at: float,
    timeout_seconds: float,
) -> list[ResponseRecord]:
    records: list[ResponseRecord] = []
    queue = list(reversed(requests))
    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(
        base_url=url, limits=limits, timeout=httpx.Timeout(timeout_seconds)
    ) as client:

        async def one_client() -> None:
            while queue and time.perf_counter() < stop_sending_at:
                request = queue.pop()
                record = ResponseRecord(request.index, scheduled=time.perf_counter())
                records.append(record)
                await _timed(client, model, request, record, timeout_seconds)

        await asyncio.gather(*(one_client() for _ in range(clients)))
    return sorted(records, key=lambda record: record.index)


async def _open_loop(
    url: str,
    model: str,
    requests: Sequence[WorkloadRequest],
    send_times: Sequence[float],
    stop_sending_at: float,
    timeout_seconds: float,
) -> list[ResponseRecord]:
    limits = httpx.Limits(max_connections=len(requests) + 4)
    async with httpx.AsyncClient(
        base_url=url, limits=limits, timeout=httpx.Timeout(timeout_seconds)
    ) as client:
        start = time.perf_counter()
        due = [
            (request, ResponseRecord(request.index, scheduled=start + offset))
            for request, offset in zip(requests, send_times, strict=True)
            if start + offset < stop_sending_at
        ]

        async def at_its_time(request: WorkloadRequest, record: ResponseRecord) -> None:
            await asyncio.sleep(max(0.0, record.scheduled - time.perf_counter()))
            await _timed(client, model, request, record, timeout_seconds)

        await asyncio.gather(*(at_its_time(request, record) for request, record in due))
    return [record for _, record in due]


def closed_loop(
    url: str,
    model: str,
    requests: Sequence[WorkloadRequest],
    clients: int,
    seconds: float,
    timeout_seconds: float,
) -> list[ResponseRecord]:
    """`clients` clients send `requests` in turn; none is sent after `seconds`."""
    stop_at = time.perf_counter() + seconds
    return asyncio.run(_closed_loop(url, model, requests, clients, stop_at, timeout_seconds))


def open_loop(
    url: str,
    model: str,
    requests: Sequence[WorkloadRequest],
    send_times: Sequence[float],
    seconds: float,
    timeout_seconds: float,
) -> list[ResponseRecord]:
    """Each request at its own time; those due after `seconds` are not sent."""
    stop_at = time.perf_counter() + seconds
    return asyncio.run(_open_loop(url, model, requests, send_times, stop_at, timeout_seconds))
