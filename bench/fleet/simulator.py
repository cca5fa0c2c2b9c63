"""One process that is every fake pod's sidecar and admin API.

    python -m bench.fleet.simulator [--metrics-port 9400] [--admin-port 8001]

Why one process: a few thousand fake pods cannot each run a server on a
2-core machine. kwok gives them loopback addresses (plan.POD_NETWORK), so
this process listens on 0.0.0.0 at the sidecar's and the admin API's ports
and tells the pods apart by the address each connection arrived at (the
socket's local address). It speaks the real wire formats: the sidecar's
Prometheus text with the contract's metric names, and the admin API's bodies
through `fusebox_contract.admin`'s encode/parse. A pod's memory follows its
curve (curves.py); an action changes the curve as a real server would.

Only loopback: a connection to an address outside the pod network is
refused with 404, and nothing here connects anywhere.

`GET /fleet/report` (any address) returns, per leaking pod, when its curve
crossed the threshold and when the first action reached it: the bench turns
that into the ladder's reaction delay.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from bench.fleet.curves import CurveSettings, MemoryCurve, Shape
from bench.fleet.plan import POD_NETWORK, hangs, shape_of
from fusebox_contract import admin
from fusebox_contract.metrics import QUANTITY_LABEL, MeasuredQuantity, Metric
from fusebox_contract.names import (
    ActionType,
    BreakerState,
    DegradationLevel,
    HeartbeatThread,
    LatencyMetric,
    RequestOutcome,
    Variant,
    engaged_tiers,
)
from fusebox_contract.wiring import Port

# Leaks start at a per-pod moment inside this window after the pod's first scrape,
# so crossings spread over time instead of arriving as one burst.
LEAK_SPREAD_SECONDS = 120.0


@dataclass
class FakePod:
    address: str
    curve: MemoryCurve
    breaker: BreakerState = BreakerState.CLOSED
    admit_percent: int = 100
    level: DegradationLevel = DegradationLevel.NONE
    variant: Variant = Variant.PRIMARY
    results: dict[str, admin.ActionResult] = field(default_factory=dict)  # by action id
    actions: list[tuple[float, str]] = field(default_factory=list)  # (at, type)
    scrapes: int = 0
    hung: bool = False  # its /metrics accepts the connection and never answers


def leak_delay_seconds(address: str) -> float:
    """A stable per-pod start of its leak inside LEAK_SPREAD_SECONDS."""
    packed = int(ipaddress.ip_address(address))
    return (packed * 2654435761 % 1000) / 1000 * LEAK_SPREAD_SECONDS


class Fleet:
    """Every fake pod this process has heard from, by address."""

    def __init__(self, settings: CurveSettings, hung_share: float = 0.0) -> None:
        self.settings = settings
        self.hung_share = hung_share
        self.pods: dict[str, FakePod] = {}

    def pod(self, address: str, now: float) -> FakePod | None:
        if ipaddress.ip_address(address) not in POD_NETWORK:
            return None
        found = self.pods.get(address)
        if found is None:
            shape = shape_of(address)
            delay = leak_delay_seconds(address) if shape is Shape.LEAK else 0.0
            curve = MemoryCurve(shape, now, self.settings, leak_starts_after_seconds=delay)
            hung = hangs(address, self.hung_share)
            found = self.pods[address] = FakePod(address, curve, hung=hung)
        return found

    def report(self) -> dict[str, Any]:
        pods, now = [], time.time()
        for pod in self.pods.values():
            crossed = pod.curve.first_crossing(now)
            after = [(at, kind) for at, kind in pod.actions if crossed is None or at >= crossed]
            pods.append(
                {
                    "address": pod.address,
                    "shape": pod.curve.shape.value,
                    "crossed_at": crossed,
                    "first_action_at": after[0][0] if after else None,
                    "first_action": after[0][1] if after else None,
                    "actions": len(pod.actions),
                    "scrapes": pod.scrapes,
                    "hung": pod.hung,
                }
            )
        return {"pods": pods, "at": now}


def metrics_text(pod: FakePod, now: float) -> str:
    """The sidecar's exposition for one fake pod (contract names, absent what a CPU pod
    lacks)."""
    rss = pod.curve.rss_bytes(now)
    lines: list[str] = []

    def gauge(name: Metric, value: float, /, **labels: str) -> None:
        text = ",".join(f'{key}="{val}"' for key, val in labels.items())
        lines.append(f"{name.sample}{{{text}}} {value}" if text else f"{name.sample} {value}")

    gauge(Metric.PROCESS_RESIDENT_MEMORY_BYTES, rss)
    gauge(Metric.MEMORY_LIMIT_BYTES, float(pod.curve.settings.limit_bytes))
    gauge(Metric.CGROUP_MEMORY_USAGE_BYTES, rss)
    gauge(Metric.LATENCY_P99_SECONDS, 0.05, metric=LatencyMetric.TTFT.value)
    gauge(Metric.QUALITY_FAILURE_RATIO, 0.0)
    gauge(Metric.STATS_VALID, 1.0)
    gauge(Metric.SERVER_STATS_AGE_SECONDS, 0.5)
    # RSS follows the curve at this scrape, as a sidecar reading /proc measures it.
    gauge(Metric.SIDECAR_MEASURED, 1.0, **{QUANTITY_LABEL: MeasuredQuantity.RSS.value})
    for thread in HeartbeatThread:
        gauge(Metric.HEARTBEAT_AGE_SECONDS, 0.2, thread=thread.value)
    for outcome in RequestOutcome:
        count = 100.0 * pod.scrapes if outcome is RequestOutcome.SUCCEEDED else 0.0
        gauge(Metric.REQUESTS, count, outcome=outcome.value)
    gauge(Metric.BREAKER_STATE, float(pod.breaker.gauge_value))
    gauge(Metric.DEGRADATION_LEVEL, float(int(pod.level)))
    gauge(Metric.MODEL_LOADED, 1.0)
    gauge(Metric.FALLBACK_ACTIVE, 1.0 if pod.variant is Variant.FALLBACK else 0.0)
    gauge(Metric.FALLBACK_CONFIGURED, 1.0)
    gauge(Metric.FALLBACK_AVAILABLE, 1.0)
    gauge(Metric.VARIANT_CONVERGING, 0.0)
    gauge(Metric.MEMORY_GUARD_ACTIVE, 0.0)
    gauge(Metric.REQUEST_QUEUE_LENGTH, 0.0)
    gauge(Metric.REQUESTS_RUNNING, 1.0)
    return "\n".join(lines) + "\n"


def _address(request: web.Request) -> str:
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    return str(sockname[0]) if sockname else ""


def _refused(message: str, status: int, param: str | None = None) -> web.Response:
    body = admin.ErrorAnswer(message, "invalid_request_error", param).encode()
    return web.json_response(body, status=status)


class Simulator:
    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    async def metrics(self, request: web.Request) -> web.Response:
        now = time.time()
        pod = self.fleet.pod(_address(request), now)
        if pod is None:
            return web.Response(status=404, text="not a fake pod's address\n")
        pod.scrapes += 1
        if pod.hung:
            await asyncio.sleep(3600)  # the scraper's timeout ends it
        return web.Response(text=metrics_text(pod, now), content_type="text/plain")

    async def report(self, request: web.Request) -> web.Response:
        return web.json_response(self.fleet.report())

    def _pod(self, request: web.Request) -> FakePod | web.Response:
        pod = self.fleet.pod(_address(request), time.time())
        if pod is None:
            return _refused("not a fake pod's address", 404)
        if not request.headers.get("Authorization", "").startswith("Bearer "):
            return _refused("missing bearer token", 401)
        return pod

    async def _body(self, request: web.Request) -> object:
        try:
            return await request.json()
        except ValueError:
            return None

    async def action(self, request: web.Request) -> web.Response:
        pod = self._pod(request)
        if isinstance(pod, web.Response):
            return pod
        try:
            asked = admin.ActionRequest.parse(await self._body(request))
        except admin.AdminBodyError as error:
            return _refused(str(error), 400, error.field)
        if asked.id in pod.results:
            return web.json_response(pod.results[asked.id].replay().encode())
        now = time.time()
        pod.actions.append((now, asked.type.value))
        before, after = pod.curve.act(asked.type, now)
        previous = pod.variant
        if asked.type is ActionType.SWAP:
            other = Variant.FALLBACK if previous is Variant.PRIMARY else Variant.PRIMARY
            pod.variant = asked.variant or other
        elif asked.type is ActionType.LOAD and asked.variant is not None:
            pod.variant = asked.variant
        result = admin.ActionResult(
            id=asked.id,
            type=asked.type,
            variant=pod.variant,
            previous_variant=previous,
            model_loaded=asked.type is not ActionType.UNLOAD,
            memory_before=admin.MemoryFigures(rss_bytes=int(before)),
            memory_after=admin.MemoryFigures(rss_bytes=int(after)),
            duration_seconds=0.01,
        )
        pod.results[asked.id] = result
        return web.json_response(result.encode())

    async def breaker(self, request: web.Request) -> web.Response:
        pod = self._pod(request)
        if isinstance(pod, web.Response):
            return pod
        try:
            asked = admin.BreakerRequest.parse(await self._body(request))
        except admin.AdminBodyError as error:
            return _refused(str(error), 400, error.field)
        pod.breaker = asked.state
        if asked.admit_percent is not None:
            pod.admit_percent = asked.admit_percent
        return web.json_response(self._state(pod).encode())

    async def degradation(self, request: web.Request) -> web.Response:
        pod = self._pod(request)
        if isinstance(pod, web.Response):
            return pod
        try:
            asked = admin.DegradationRequest.parse(await self._body(request))
        except admin.AdminBodyError as error:
            return _refused(str(error), 400, error.field)
        pod.level = asked.level
        tiers = engaged_tiers(int(asked.level), asked.tiers)
        result = admin.DegradationResult(
            level=asked.level,
            tiers=tuple(sorted(tiers, key=lambda tier: tier.level)),
            variant=pod.variant,
            target_variant=pod.variant,
            converging=False,
        )
        return web.json_response(result.encode())

    async def state(self, request: web.Request) -> web.Response:
        pod = self._pod(request)
        if isinstance(pod, web.Response):
            return pod
        return web.json_response(self._state(pod).encode())

    def _state(self, pod: FakePod) -> admin.ServerState:
        return admin.ServerState(
            model_name="m",
            variant=pod.variant,
            target_variant=pod.variant,
            converging=False,
            model_loaded=True,
            ready=True,
            model_loads=pod.curve.loads,
            breaker=admin.BreakerView(pod.breaker, pod.admit_percent),
            degradation_level=pod.level,
            device="simulated",
        )

    def metrics_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/fleet/report", self.report)
        return app

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    def admin_app(self) -> web.Application:
        app = web.Application()
        app.router.add_post(admin.AdminPath.ACTIONS, self.action)
        app.router.add_put(admin.AdminPath.BREAKER, self.breaker)
        app.router.add_put(admin.AdminPath.DEGRADATION, self.degradation)
        app.router.add_get(admin.AdminPath.STATE, self.state)
        return app


async def serve(
    metrics_port: int, admin_port: int, settings: CurveSettings, hung_share: float = 0.0
) -> None:
    simulator = Simulator(Fleet(settings, hung_share))
    runners = []
    for app, port in ((simulator.metrics_app(), metrics_port), (simulator.admin_app(), admin_port)):
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        # 0.0.0.0: every loopback address of the pod network lands here.
        await web.TCPSite(runner, "0.0.0.0", port, backlog=4096).start()
        runners.append(runner)
    print(json.dumps({"listening": [metrics_port, admin_port]}), flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        for runner in runners:
            await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--metrics-port", type=int, default=int(Port.METRICS))
    parser.add_argument("--admin-port", type=int, default=int(Port.ADMIN))
    parser.add_argument("--leak-mib-per-minute", type=float, default=1024.0)
    parser.add_argument("--hung-share", type=float, default=0.0, help="pods that never answer")
    args = parser.parse_args()
    settings = CurveSettings(leak_mib_per_minute=args.leak_mib_per_minute)
    asyncio.run(serve(args.metrics_port, args.admin_port, settings, args.hung_share))


if __name__ == "__main__":
    main()
