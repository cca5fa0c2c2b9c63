"""actuator: what it sends to the admin API and how it reads the answers.

A small loopback HTTP server stands in for fusebox_server and answers with
bodies the contract's classes encode (or with ones they cannot parse), so
these tests show the operator's side of the contract: request bodies as the
server has always read them, a result line from the typed result, and an
answer that does not parse reported as a failed, settled call.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp
from aiohttp import web

from fusebox_contract.admin import (
    ActionResult,
    AdminPath,
    DegradationResult,
    ErrorAnswer,
    MemoryFigures,
    ServerState,
)
from fusebox_contract.names import ActionType, BreakerState, DegradationLevel, Variant
from fusebox_operator.actuator import ActionResult as Outcome
from fusebox_operator.actuator import Actuator
from fusebox_operator.observations import PodView
from fusebox_operator.policy_state import Action, ActionKind
from fusebox_operator.rollout import Degradation

MIB = 1024 * 1024
POD = PodView("p", "uid-p", "127.0.0.1", "Running", True, True, True, 0, False, False)
UNLOADED = ActionResult(
    id="r-unload",
    type=ActionType.UNLOAD,
    variant=Variant.PRIMARY,
    previous_variant=Variant.PRIMARY,
    model_loaded=False,
    memory_before=MemoryFigures(rss_bytes=900 * MIB),
    memory_after=MemoryFigures(rss_bytes=300 * MIB),
    duration_seconds=0.2,
)
LOADED = replace(
    UNLOADED,
    id="r-load",
    type=ActionType.LOAD,
    model_loaded=True,
    memory_before=MemoryFigures(rss_bytes=300 * MIB),
    memory_after=MemoryFigures(rss_bytes=500 * MIB),
)


@dataclass
class FakeAdmin:
    """Answers each path with the next (status, body) queued for it; records requests."""

    answers: dict[str, list[tuple[int, Any]]]
    seen: list[tuple[str, str, Any]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else None
        self.seen.append((request.method, request.path, body))
        status, answer = self.answers[request.path].pop(0)
        text = answer if isinstance(answer, str) else json.dumps(answer)
        return web.Response(status=status, text=text, content_type="application/json")


def against(fake: FakeAdmin, call: Callable[[Actuator], Awaitable[Any]]) -> Any:
    async def run() -> Any:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", fake.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with aiohttp.ClientSession() as session:
                return await call(Actuator(session, None, admin_port=port))
        finally:
            await runner.cleanup()

    return asyncio.run(run())


def execute(fake: FakeAdmin, kind: ActionKind, variant: Variant = Variant.PRIMARY) -> Outcome:
    action = Action("r", kind, "p", "test", 0.0, variant)
    outcome: Outcome = against(fake, lambda actuator: actuator.execute("ns", POD, "t", action))
    return outcome


def test_a_reload_sends_unload_then_load_and_reports_the_whole_move() -> None:
    fake = FakeAdmin({AdminPath.ACTIONS: [(200, UNLOADED.encode()), (200, LOADED.encode())]})
    outcome = execute(fake, ActionKind.RELOAD)
    assert [body for _, _, body in fake.seen] == [
        {"id": "r-unload", "type": "unload"},
        {"id": "r-load", "type": "load", "variant": "primary"},
    ]
    assert {method for method, _, _ in fake.seen} == {"POST"}
    assert outcome == Outcome("RSS 900.0Mi -> 500.0Mi (freed 400.0Mi); variant primary")


def test_a_reload_is_replayed_only_when_both_calls_were() -> None:
    half = FakeAdmin(
        {AdminPath.ACTIONS: [(200, UNLOADED.replay().encode()), (200, LOADED.encode())]}
    )
    assert execute(half, ActionKind.RELOAD).replayed is False
    both = FakeAdmin(
        {AdminPath.ACTIONS: [(200, UNLOADED.replay().encode()), (200, LOADED.replay().encode())]}
    )
    outcome = execute(both, ActionKind.RELOAD)
    assert outcome.replayed and outcome.text.endswith("; replayed")


def test_an_answer_the_contract_cannot_parse_is_a_failed_settled_call() -> None:
    broken = {**LOADED.encode(), "memory_after": {"rss_bytes": "lots"}}
    fake = FakeAdmin({AdminPath.ACTIONS: [(200, broken)]})
    outcome = execute(fake, ActionKind.GC)
    assert outcome.settled
    assert outcome.text.startswith("failed: POST /admin/v1/actions: AdminBodyError")
    assert "'memory_after.rss_bytes' must be an integer" in outcome.text


def test_a_refusal_reports_the_server_s_message() -> None:
    refusal = ErrorAnswer("no fallback is configured", "invalid_request_error", "variant")
    fake = FakeAdmin({AdminPath.ACTIONS: [(409, refusal.encode())]})
    outcome = execute(fake, ActionKind.SWAP_FALLBACK, Variant.FALLBACK)
    assert outcome == Outcome(
        "failed: POST /admin/v1/actions -> HTTP 409 no fallback is configured"
    )
    assert fake.seen[0][2] == {"id": "r", "type": "swap", "variant": "fallback"}


LEVEL_0 = DegradationResult(DegradationLevel(0), (), Variant.PRIMARY, Variant.PRIMARY, False)


def test_runtime_state_goes_out_in_the_contract_s_bodies() -> None:
    degraded = replace(LEVEL_0, level=DegradationLevel(1))
    fake = FakeAdmin(
        {
            AdminPath.BREAKER: [(200, ServerState(variant=Variant.PRIMARY).encode())],
            AdminPath.DEGRADATION: [(200, degraded.encode())],
        }
    )
    target = (BreakerState.HALF_OPEN, 20, Degradation(1))
    told = against(fake, lambda a: a.reconcile_runtime(POD, "t", target, None, {}))
    assert (told.changed, told.reached) == (True, True)
    assert fake.seen == [
        ("PUT", "/admin/v1/breaker", {"state": "half_open", "admitPercent": 20}),
        (
            "PUT",
            "/admin/v1/degradation",
            {"level": 1, "tiers": ["no-streaming", "fallback-model", "canned-answers"]},
        ),
    ]


def test_runtime_state_is_not_recorded_as_applied_when_the_answer_is_not_a_state() -> None:
    fake = FakeAdmin(
        {
            AdminPath.BREAKER: [(200, {"variant": "third"})],
            AdminPath.DEGRADATION: [(200, LEVEL_0.encode())],
        }
    )
    applied: dict[str, Any] = {}
    target = (BreakerState.OPEN, 0, Degradation(0))
    told = against(fake, lambda a: a.reconcile_runtime(POD, "t", target, None, applied))
    assert not told.changed and told.reached is False and told.error
    assert applied == {}
    assert [path for _, path, _ in fake.seen] == [AdminPath.BREAKER]  # stopped at the bad one


def test_a_token_the_pod_refuses_is_reported_once_so_the_secret_is_read_again() -> None:
    refusal = ErrorAnswer("invalid admin token", "authentication_error", None)
    fake = FakeAdmin({AdminPath.ACTIONS: [(401, refusal.encode()), (409, refusal.encode())]})
    action = Action("r", ActionKind.GC, "p", "test", 0.0)

    async def twice(actuator: Actuator) -> tuple[bool, bool, bool]:
        await actuator.execute("ns", POD, "old-token", action)
        refused = actuator.token_refused("old-token")
        asked_again = actuator.token_refused("old-token")  # forgotten once asked
        await actuator.execute("ns", POD, "old-token", action)  # a 409 is no refusal
        return refused, asked_again, actuator.token_refused("old-token")

    assert against(fake, twice) == (True, False, False)
