"""kopf's session to the apiserver holds a bounded pool (kube.api_session, the login in
__main__): kopf's own pool has no limit, and every idle connection in it kept a 256 KiB
TLS buffer, the operator's largest memory per service (docs/decisions/operator-memory.md)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web

from fusebox_operator.kube import KOPF_REQUEST_CONNECTIONS, api_session, kopf_connection_limit
from fusebox_operator.settings import OperatorSettings


async def _connections_seen(connections: int | None, requests: int) -> tuple[int, int]:
    """(distinct client connections the server saw, answers 200) for `requests` sent at
    once through api_session, each held by the server a moment so they overlap."""
    peers: set[Any] = set()

    async def slow(request: web.Request) -> web.Response:
        peers.add(request.transport.get_extra_info("peername") if request.transport else None)
        await asyncio.sleep(0.05)
        return web.Response(text="{}")

    app = web.Application()
    app.router.add_get("/", slow)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    session = api_session(False, {"Authorization": "Bearer t"}, connections)
    try:

        async def get() -> int:
            async with session.get(f"http://127.0.0.1:{port}/") as response:
                return response.status

        statuses = await asyncio.gather(*(get() for _ in range(requests)))
    finally:
        await session.close()
        await runner.cleanup()
    return len(peers), sum(1 for s in statuses if s == 200)


def test_kopf_requests_share_at_most_the_bound_of_connections() -> None:
    seen, answered = asyncio.run(_connections_seen(4, 40))
    assert answered == 40  # over the bound they wait their turn, none fails
    assert seen <= 4


def test_without_a_bound_a_burst_opens_a_connection_per_request() -> None:
    # What kopf's own session does: the reason for the bound.
    seen, answered = asyncio.run(_connections_seen(None, 40))
    assert answered == 40
    assert seen > 4


@pytest.mark.parametrize(
    ("env", "limit"),
    [
        ({"FUSEBOX_PEERING": "standalone"}, KOPF_REQUEST_CONNECTIONS + 1),
        ({"FUSEBOX_OPERATOR_REPLICAS": "2"}, KOPF_REQUEST_CONNECTIONS + 2),
        (
            {"FUSEBOX_WATCH_NAMESPACES": "a,b,c", "FUSEBOX_PEERING": "standalone"},
            KOPF_REQUEST_CONNECTIONS + 3,
        ),
        (
            {"FUSEBOX_WATCH_NAMESPACES": "a,b,c", "FUSEBOX_OPERATOR_REPLICAS": "2"},
            KOPF_REQUEST_CONNECTIONS + 6,
        ),
    ],
)
def test_every_watch_stream_keeps_a_connection_beside_the_requests(
    env: dict[str, str], limit: int
) -> None:
    assert kopf_connection_limit(OperatorSettings.from_env(env)) == limit


def test_namespace_globs_leave_kopf_unbounded() -> None:
    # kopf watches every matching namespace: streams not known at startup.
    settings = OperatorSettings.from_env({"FUSEBOX_WATCH_NAMESPACES": "team-*"})
    assert kopf_connection_limit(settings) is None


def test_the_login_hands_kopf_a_bounded_session(monkeypatch: pytest.MonkeyPatch) -> None:
    import kopf

    from fusebox_operator.__main__ import bounded_login

    info = kopf.ConnectionInfo(server="https://api.example:6443", token="secret-token")
    monkeypatch.setattr(kopf, "login_via_client", lambda **_: info)

    async def login() -> Any:
        credentials = await bounded_login(7)(logger=None, settings=None)
        try:
            return (
                credentials.server,
                credentials.aiohttp_session.connector.limit,
                credentials.aiohttp_session.headers["Authorization"],
            )
        finally:
            await credentials.aiohttp_session.close()

    assert asyncio.run(login()) == ("https://api.example:6443", 7, "Bearer secret-token")
