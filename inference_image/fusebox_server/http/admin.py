"""The admin API (port 8001): how the operator acts on one server.

Why a separate port: the NetworkPolicy opens it to the operator only, and
the public API can never reach an admin route. Every call needs
`Authorization: Bearer <token>` (the token file comes from a Secret),
compared in constant time; headers are never logged. Actions carry an id
and run once per id (`actions.py`). `PUT` on the degradation path answers at
once: the level is set, and a variant change it implies converges in the
background (202 while it does). Paths and bodies are the contract's
(`fusebox_contract.admin`): a route parses its request there, and a body
that does not fit is a domain error (422 missing or mistyped, 400 refused);
the edge's one table renders them.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final, TypeVar

import structlog
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from fusebox_contract.admin import (
    ActionRequest,
    AdminBodyError,
    AdminPath,
    BreakerRequest,
    DegradationRequest,
    FaultsRequest,
    FaultsResult,
    WorkerDebug,
)
from fusebox_contract.names import Fault
from fusebox_server.control.runtime import Runtime
from fusebox_server.errors import InvalidRequest, SchemaError, Unauthorized
from fusebox_server.http.edge import EXCEPTION_HANDLERS, VariantHeader, error_response, read_body
from fusebox_server.http.openai_schema import parse_json_body

log = structlog.get_logger("fusebox_server.admin")

ADMIN_BODY_LIMIT_BYTES: Final = 64 * 1024

_Body = TypeVar("_Body")


def read_token(path: Path | None) -> str | None:
    if path is None:
        return None
    token = path.read_text(encoding="utf-8").strip()
    return token or None


def token_matches(header: str | None, token: str) -> bool:
    """Constant-time check of an `Authorization: Bearer <token>` header."""
    if not header:
        return False
    scheme, _, supplied = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(supplied.strip().encode(), token.encode())


class RequireToken:
    """ASGI middleware: 401 unless the bearer token matches. No token file: admin is closed."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = None
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                header = value.decode("latin-1")
        if self.token is None or not token_matches(header, self.token):
            await error_response(Unauthorized("missing or invalid admin token"))(
                scope, receive, send
            )
            return
        await self.app(scope, receive, send)


async def _request_body(request: Request, parse: Callable[[object], _Body]) -> _Body:
    """The request's body as the contract's class, or the domain error a bad one is."""
    raw = parse_json_body(await read_body(request, ADMIN_BODY_LIMIT_BYTES))
    try:
        return parse(raw)
    except AdminBodyError as error:
        kind = SchemaError if error.malformed else InvalidRequest
        raise kind(str(error), param=error.field) from None


class Admin:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    async def actions(self, request: Request) -> Response:
        asked = await _request_body(request, ActionRequest.parse)
        result = await self.runtime.run_action(asked.id, asked.type, asked.variant)
        return JSONResponse(result.encode())

    async def breaker(self, request: Request) -> Response:
        asked = await _request_body(request, BreakerRequest.parse)
        self.runtime.breaker.set(asked.state, asked.admit_percent)
        log.info(
            "breaker_set", state=asked.state.value, admit_percent=self.runtime.breaker.admit_percent
        )
        return JSONResponse(self.runtime.state().encode())

    async def degradation(self, request: Request) -> Response:
        asked = await _request_body(request, DegradationRequest.parse)
        result = self.runtime.set_degradation(asked.level, asked.tiers)
        return JSONResponse(result.encode(), status_code=202 if result.converging else 200)

    async def state(self, request: Request) -> Response:
        return JSONResponse(self.runtime.state(self._debug()).encode())

    def _debug(self) -> WorkerDebug:
        worker = self.runtime.worker
        return WorkerDebug(
            batch_rows=worker.batch_rows if worker else 0,
            inbox=worker.inbox_length if worker else 0,
        )

    async def faults(self, request: Request) -> Response:
        if not self.runtime.faults.armed:
            # Refuse before reading anything: faults cannot exist in this process.
            self.runtime.faults.update({})
        asked = await _request_body(request, FaultsRequest.parse)
        values = self.runtime.faults.update(asked.values)
        if asked.values.get(Fault.WEDGE):
            wedge_event_loop_soon()
        log.warning("faults_set", faults={fault.value: value for fault, value in values.items()})
        return JSONResponse(FaultsResult(values).encode())


def wedge_event_loop_soon() -> None:
    """The `wedge` fault: block the event loop for good, after this response is sent."""

    def block() -> None:
        log.warning("event_loop_wedged")
        while True:
            time.sleep(3600)

    asyncio.get_running_loop().call_later(0.2, block)


def build_admin_app(runtime: Runtime, token: str | None) -> ASGIApp:
    admin = Admin(runtime)
    app = Starlette(
        routes=[
            Route(path, route, methods=[path.method])
            for path, route in (
                (AdminPath.ACTIONS, admin.actions),
                (AdminPath.BREAKER, admin.breaker),
                (AdminPath.DEGRADATION, admin.degradation),
                (AdminPath.STATE, admin.state),
                (AdminPath.FAULTS, admin.faults),
            )
        ],
        exception_handlers=dict(EXCEPTION_HANDLERS),
    )
    return VariantHeader(RequireToken(app, token), lambda: runtime.variant.value)
