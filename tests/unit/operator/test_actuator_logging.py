"""actuator: how loudly a failed runtime-state call is logged.

A pod that is not ready yet (its server still loading while the native sidecar
already answers the scrape) refuses the admin call on every tick until it
listens; that is expected and retried, so it is logged at INFO. The same failure
on a ready pod is a WARNING. Real sockets: the admin port is a local port that
nothing listens on.
"""

from __future__ import annotations

import asyncio
import logging
import socket

import aiohttp
import pytest

from fusebox_contract.names import BreakerState
from fusebox_operator.actuator import Actuator, RuntimeCall
from fusebox_operator.observations import PodView
from fusebox_operator.rollout import Degradation


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def pod(ready: bool) -> PodView:
    return PodView("p", "uid-p", "127.0.0.1", "Running", ready, True, True, 0, False, False)


def set_state(ready: bool) -> RuntimeCall:
    async def call() -> RuntimeCall:
        async with aiohttp.ClientSession() as session:
            actuator = Actuator(session, None, admin_port=closed_port())
            target = (BreakerState.CLOSED, 100, Degradation(0))
            return await actuator.reconcile_runtime(pod(ready), "t", target, None, {})

    return asyncio.run(call())


@pytest.mark.parametrize(("ready", "level"), [(False, logging.INFO), (True, logging.WARNING)])
def test_a_refused_runtime_call_is_a_warning_only_for_a_ready_pod(
    ready: bool, level: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="fusebox_operator.actuator")
    told = set_state(ready)
    assert told.reached is False and "Cannot connect" in told.error
    (record,) = [r for r in caplog.records if "runtime state of p not set" in r.getMessage()]
    assert record.levelno == level
