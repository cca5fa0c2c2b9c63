"""Hung sidecars, however many, never cost a healthy pod its scrape nor an action.

Each pod is a loopback address of its own (127.65.x.y) reaching one listening
socket; the handlers hang for the addresses marked hung, as a wedged sidecar
that accepts a connection and never answers does. The operator's own pools
(telemetry.scrape_session, actuator.admin_session) are used as startup makes
them. With the pool of 100 connections that scrapes and admin calls used to
share, more hung pods than that made the healthy pod's scrape time out waiting
for a connection, and an action wait behind the scrapes.
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "operator"))

from fusebox_contract import admin  # noqa: E402
from fusebox_contract.metrics import Metric  # noqa: E402
from fusebox_contract.names import Variant  # noqa: E402
from fusebox_operator.actuator import Actuator, admin_session  # noqa: E402
from fusebox_operator.observations import PodSample, PodView  # noqa: E402
from fusebox_operator.policy_state import Action, ActionKind  # noqa: E402
from fusebox_operator.telemetry import scrape_all, scrape_session  # noqa: E402

pytestmark = pytest.mark.integration

HUNG = [f"127.65.{i // 200}.{i % 200 + 1}" for i in range(150)]  # above aiohttp's 100
HEALTHY = "127.65.9.9"
HANG_SECONDS = 60.0  # longer than any timeout here: only the client ends a hung request
SCRAPE_TIMEOUT_SECONDS = 2.0  # the CRD's default scrapeTimeoutSeconds


def pod(ip: str) -> PodView:
    return PodView("pod-" + ip, "uid-" + ip, ip, "Running", True, True, True, 0, False, False)


class FakePods:
    """One listener for every fake pod's sidecar and admin API, hanging for the hung ones."""

    def __init__(self) -> None:
        self.arrived: Counter[str] = Counter()  # requests seen per address
        self.in_flight: Counter[str] = Counter()
        self.most_in_flight: Counter[str] = Counter()
        self.hung_requests = 0
        self.runner: web.AppRunner | None = None

    async def _hang_unless_healthy(self, request: web.Request) -> None:
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        address = sockname[0] if sockname else ""
        self.arrived[address] += 1
        self.in_flight[address] += 1
        self.most_in_flight[address] = max(self.most_in_flight[address], self.in_flight[address])
        try:
            if address != HEALTHY:
                self.hung_requests += 1
                await asyncio.sleep(HANG_SECONDS)
        finally:
            self.in_flight[address] -= 1

    async def metrics(self, request: web.Request) -> web.Response:
        await self._hang_unless_healthy(request)
        return web.Response(text=f"{Metric.PROCESS_RESIDENT_MEMORY_BYTES.sample} 1024\n")

    async def action(self, request: web.Request) -> web.Response:
        await self._hang_unless_healthy(request)
        asked = admin.ActionRequest.parse(await request.json())
        result = admin.ActionResult(
            id=asked.id,
            type=asked.type,
            variant=Variant.PRIMARY,
            previous_variant=Variant.PRIMARY,
            model_loaded=True,
            memory_before=admin.MemoryFigures(),
            memory_after=admin.MemoryFigures(),
            duration_seconds=0.0,
        )
        return web.json_response(result.encode())

    async def start(self) -> int:
        app = web.Application(handler_args={"tcp_keepalive": False})
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post(str(admin.AdminPath.ACTIONS), self.action)
        self.runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self.runner.setup()
        await web.TCPSite(self.runner, "0.0.0.0", 0).start()
        return int(self.runner.addresses[0][1])

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


async def hung_scrapes_in_flight(
    fake: FakePods, session: aiohttp.ClientSession, port: int
) -> asyncio.Task[list[PodSample]]:
    """Every hung pod's scrape started (other services' pods, whose scrape timeout
    outlasts the rest of the test) and at least 100 of them, a whole default pool's
    worth, held by the fake pods, which is all the old shared pool let through."""
    targets = [pod(ip) for ip in HUNG]
    storm = asyncio.create_task(scrape_all(session, targets, HANG_SECONDS / 2, "ttft", port))
    while fake.hung_requests < 100 and not storm.done():
        await asyncio.sleep(0.05)
    return storm


async def stop(storm: asyncio.Task[list[PodSample]]) -> None:
    storm.cancel()
    await asyncio.gather(storm, return_exceptions=True)


async def scrape_behind_hung_pods(ticks: int) -> tuple[list[PodSample], int]:
    fake = FakePods()
    port = await fake.start()
    try:
        async with scrape_session() as session:
            storm = await hung_scrapes_in_flight(fake, session, port)
            held = fake.hung_requests
            samples = []
            for _ in range(ticks):
                ticked = await scrape_all(
                    session, [pod(HEALTHY)], SCRAPE_TIMEOUT_SECONDS, "ttft", port=port
                )
                samples.extend(ticked)
            await stop(storm)
    finally:
        await fake.stop()
    return samples, held


def test_a_healthy_pod_is_scraped_every_tick_while_150_hung_pods_hold_connections() -> None:
    samples, held = asyncio.run(scrape_behind_hung_pods(ticks=3))
    assert held >= 100
    assert [s.ok for s in samples] == [True, True, True], [s.error for s in samples]
    assert all(s.rss_bytes == 1024 for s in samples)


async def act_during_a_scrape_storm() -> tuple[str, int]:
    """A gc on the healthy pod while the hung pods' scrapes are in flight, each of them
    longer than the action's own timeout (ADMIN_TIMEOUT_SECONDS, 10 s): an action that
    waited for a scrape's connection would end "in flight", not done."""
    fake = FakePods()
    port = await fake.start()
    try:
        async with scrape_session() as scrapes, admin_session() as calls:
            storm = await hung_scrapes_in_flight(fake, scrapes, port)
            held = fake.hung_requests
            actuator = Actuator(calls, None, admin_port=port)
            action = Action("gc-1", ActionKind.GC, "pod-" + HEALTHY, "test", 0.0)
            result = await actuator.execute("ns", pod(HEALTHY), "token", action)
            await stop(storm)
    finally:
        await fake.stop()
    return result.text, held


def test_an_action_is_not_held_up_by_a_scrape_storm_of_hung_sidecars() -> None:
    text, held = asyncio.run(act_during_a_scrape_storm())
    assert held >= 100
    assert text == "variant primary"  # the server's answer: not "in flight: TimeoutError"


async def act_behind_hung_model_loads() -> tuple[str, int]:
    """A gc on the healthy pod while 150 hung pods' reloads are in flight, each allowed
    LOAD_TIMEOUT_SECONDS (300 s) against the gc's 10 s: behind a pool-wide limit of 100
    the gc would wait for a connection until its own timeout."""
    fake = FakePods()
    port = await fake.start()
    try:
        async with admin_session() as calls:
            actuator = Actuator(calls, None, admin_port=port)
            reloads = asyncio.gather(
                *(
                    actuator.execute(
                        "ns", pod(ip), "token", Action(f"r-{ip}", ActionKind.RELOAD, ip, "t", 0.0)
                    )
                    for ip in HUNG
                )
            )
            while fake.hung_requests < 100:
                await asyncio.sleep(0.05)
            held = fake.hung_requests
            action = Action("gc-2", ActionKind.GC, "pod-" + HEALTHY, "test", 0.0)
            result = await actuator.execute("ns", pod(HEALTHY), "token", action)
            reloads.cancel()
            await asyncio.gather(reloads, return_exceptions=True)
    finally:
        await fake.stop()
    return result.text, held


def test_an_action_is_not_held_up_by_a_hundred_hung_model_loads() -> None:
    text, held = asyncio.run(act_behind_hung_model_loads())
    assert held >= 100
    assert text == "variant primary"


async def scrape_one_hung_pod_twice() -> tuple[list[bool], int]:
    fake = FakePods()
    port = await fake.start()
    try:
        async with scrape_session() as session:
            twice = [pod(HUNG[0]), pod(HUNG[0])]
            samples = await scrape_all(session, twice, 0.5, "ttft", port=port)
    finally:
        await fake.stop()
    return [s.ok for s in samples], fake.most_in_flight[HUNG[0]]


def test_a_hung_sidecar_is_asked_one_scrape_at_a_time() -> None:
    ok, most_at_once = asyncio.run(scrape_one_hung_pod_twice())
    assert ok == [False, False]  # the second timed out waiting on the first, as it should
    assert most_at_once == 1
