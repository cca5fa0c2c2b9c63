"""The fleet simulator answers the operator's own telemetry and actuator code at a
fake pod's loopback address, told apart from its neighbours by that address alone."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "operator"))

from bench.fleet.curves import CurveSettings, Shape  # noqa: E402
from bench.fleet.simulator import Fleet, Simulator  # noqa: E402
from fusebox_operator.actuator import Actuator  # noqa: E402
from fusebox_operator.observations import PodView  # noqa: E402
from fusebox_operator.policy_state import Action, ActionKind  # noqa: E402
from fusebox_operator.telemetry import scrape_all  # noqa: E402

pytestmark = pytest.mark.integration

LEAKING, STEADY = "127.64.0.4", "127.64.0.1"  # plan.shape_of draws leak / steady for these


def pod(name: str, ip: str) -> PodView:
    return PodView(name, "uid-" + name, ip, "Running", True, True, True, 0, False, False)


async def exercise() -> tuple[list[float | None], str, str, dict[str, int]]:
    fleet = Fleet(CurveSettings())
    simulator = Simulator(fleet)
    runners, ports = [], []
    for app in (simulator.metrics_app(), simulator.admin_app()):
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "0.0.0.0", 0)
        await site.start()
        runners.append(runner)
        ports.append(runner.addresses[0][1])
    try:
        async with aiohttp.ClientSession() as session:
            pods = [pod("a", LEAKING), pod("b", STEADY)]
            samples = await scrape_all(session, pods, 5.0, "ttft", port=ports[0])
            actuator = Actuator(session, None, admin_port=ports[1])
            action = Action("act-1", ActionKind.RELOAD, "a", "test", 0.0)
            first = await actuator.execute("ns", pods[0], "token", action)
            again = await actuator.execute("ns", pods[0], "token", action)
    finally:
        for runner in runners:
            await runner.cleanup()
    actions = {address: len(p.actions) for address, p in fleet.pods.items()}
    return [s.rss_bytes for s in samples], first.text, again.text, actions


def test_the_operators_scrape_and_reload_reach_one_fake_pod_by_its_address() -> None:
    assert Fleet(CurveSettings()).pod(LEAKING, 0.0).curve.shape is Shape.LEAK  # type: ignore[union-attr]
    rss, first, again, actions = asyncio.run(exercise())
    assert all(value is not None and value > 0 for value in rss)
    assert "variant primary" in first and "replayed" not in first
    assert "replayed" in again  # the same action id runs once
    assert actions == {LEAKING: 2, STEADY: 0}  # unload + load, on the leaking pod only
