"""One hung sidecar, or many, never costs a healthy pod its scrape.

Each pod is a loopback address of its own (127.65.x.y) on one listening
socket; the handler hangs for the addresses marked hung, as a wedged sidecar
that accepts a connection and never answers does. More hung pods than the
session has connections (aiohttp's default: 100) must not make the healthy
pod's scrape time out while it waits for a connection.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "operator"))

from fusebox_contract.metrics import Metric  # noqa: E402
from fusebox_operator.observations import PodView  # noqa: E402
from fusebox_operator.telemetry import scrape_all  # noqa: E402

pytestmark = pytest.mark.integration

HUNG = [f"127.65.{i // 200}.{i % 200 + 1}" for i in range(150)]
HEALTHY = "127.65.9.9"
TIMEOUT_SECONDS = 1.0


def pod(ip: str) -> PodView:
    return PodView("pod-" + ip, "uid-" + ip, ip, "Running", True, True, True, 0, False, False)


async def metrics(request: web.Request) -> web.Response:
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    if sockname and sockname[0] != HEALTHY:
        await asyncio.sleep(30)  # the scraper's timeout ends it
    return web.Response(text=f"{Metric.PROCESS_RESIDENT_MEMORY_BYTES.sample} 1024\n")


async def scrape_behind_hung_pods() -> dict[str, bool]:
    app = web.Application(handler_args={"tcp_keepalive": False})
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "0.0.0.0", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession() as session:  # the operator's: 100 connections
            pods = [pod(ip) for ip in HUNG] + [pod(HEALTHY)]
            samples = await scrape_all(session, pods, TIMEOUT_SECONDS, "ttft", port=port)
    finally:
        await runner.cleanup()
    return {sample.pod: sample.ok for sample in samples}


def test_a_healthy_pod_is_scraped_while_more_pods_hang_than_the_session_has_connections() -> None:
    ok = asyncio.run(scrape_behind_hung_pods())
    assert ok["pod-" + HEALTHY] is True
    assert not any(ok["pod-" + ip] for ip in HUNG)  # each hung pod failed on its own timeout
