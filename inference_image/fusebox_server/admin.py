"""The admin API (port 8001): how the operator acts on one server.

Why a separate port: the NetworkPolicy opens it to the operator only, and
the public API can never reach an admin route. Every call needs
`Authorization: Bearer <token>` (the token file comes from a Secret),
compared in constant time; headers are never logged. Actions carry an id
and run once per id (`actions.py`). `PUT /admin/v1/degradation` answers at
once: the level is set, and a variant change it implies converges in the
background (202 while it does). Routes raise domain errors; the edge's one
table renders them.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from enum import Enum
from pathlib import Path
from typing import Any, Final, TypeVar

import structlog
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from fusebox_contract.names import (
    ActionType,
    BreakerState,
    DegradationLevel,
    DegradationTier,
    Variant,
)
from fusebox_server.edge import EXCEPTION_HANDLERS, VariantHeader, error_response, read_body
from fusebox_server.errors import InvalidRequest, SchemaError, Unauthorized
from fusebox_server.openai_schema import parse_json_body
from fusebox_server.runtime import Runtime

log = structlog.get_logger("fusebox_server.admin")

ADMIN_BODY_LIMIT_BYTES: Final = 64 * 1024
MAX_ACTION_ID_CHARS: Final = 256

_E = TypeVar("_E", bound=Enum)


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


async def _json_object(request: Request) -> dict[str, Any]:
    return parse_json_body(await read_body(request, ADMIN_BODY_LIMIT_BYTES))


def _member(enum: type[_E], value: object, param: str) -> _E:
    """An enum member from its wire value, or a 400 naming the allowed values."""
    for member in enum:
        if member.value == value:
            return member
    allowed = ", ".join(str(m.value) for m in enum)
    raise InvalidRequest(f"'{param}' must be one of {allowed}", param=param)


def _tiers(raw: object) -> list[DegradationTier] | None:
    """`tiers`: the service's degradation tiers (absent: every tier), or a 400."""
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise InvalidRequest("'tiers' must be a list of tier names", param="tiers")
    tiers = [_member(DegradationTier, name, "tiers") for name in raw]
    if len(set(tiers)) != len(tiers):
        raise InvalidRequest("'tiers' must not repeat a tier", param="tiers")
    return tiers


class Admin:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    async def actions(self, request: Request) -> Response:
        body = await _json_object(request)
        action_id = body.get("id")
        if not isinstance(action_id, str) or not action_id:
            raise SchemaError("'id' must be a non-empty string", param="id")
        if len(action_id) > MAX_ACTION_ID_CHARS:
            raise InvalidRequest("'id' is too long", param="id")
        if not isinstance(body.get("type"), str):
            raise SchemaError("'type' must be a string", param="type")
        action_type = _member(ActionType, body["type"], "type")
        raw_variant = body.get("variant")
        if raw_variant is not None and not isinstance(raw_variant, str):
            raise SchemaError("'variant' must be a string", param="variant")
        variant = None if raw_variant is None else _member(Variant, raw_variant, "variant")
        return JSONResponse(await self.runtime.run_action(action_id, action_type, variant))

    async def breaker(self, request: Request) -> Response:
        body = await _json_object(request)
        state = _member(BreakerState, body.get("state"), "state")
        percent = body.get("admitPercent")
        if percent is not None and (
            isinstance(percent, bool) or not isinstance(percent, int) or not 0 <= percent <= 100
        ):
            raise InvalidRequest("'admitPercent' must be an integer 0..100", param="admitPercent")
        self.runtime.breaker.set(state, percent)
        log.info("breaker_set", state=state.value, admit_percent=self.runtime.breaker.admit_percent)
        return JSONResponse(self.runtime.state())

    async def degradation(self, request: Request) -> Response:
        body = await _json_object(request)
        level = body.get("level")
        if isinstance(level, bool) or not isinstance(level, int):
            raise InvalidRequest("'level' must be an integer 0..3", param="level")
        result = self.runtime.set_degradation(
            _member(DegradationLevel, level, "level"), _tiers(body.get("tiers"))
        )
        return JSONResponse(result.body(), status_code=202 if result.converging else 200)

    async def state(self, request: Request) -> Response:
        return JSONResponse({**self.runtime.state(), "debug": self._debug()})

    def _debug(self) -> dict[str, int]:
        """What a leak test reads beside the state: batch rows and jobs the worker holds."""
        worker = self.runtime.worker
        return {
            "batch_rows": worker.batch_rows if worker else 0,
            "inbox": worker.inbox_length if worker else 0,
        }

    async def faults(self, request: Request) -> Response:
        if not self.runtime.faults.armed:
            # Refuse before reading anything: faults cannot exist in this process.
            self.runtime.faults.update({})
        body = await _json_object(request)
        values = self.runtime.faults.update(body)
        if body.get("wedge"):
            wedge_event_loop_soon()
        log.warning("faults_set", faults=values)
        return JSONResponse({"faults": values})


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
            Route("/admin/v1/actions", admin.actions, methods=["POST"]),
            Route("/admin/v1/breaker", admin.breaker, methods=["PUT"]),
            Route("/admin/v1/degradation", admin.degradation, methods=["PUT"]),
            Route("/admin/v1/state", admin.state, methods=["GET"]),
            Route("/admin/v1/faults", admin.faults, methods=["PUT"]),
        ],
        exception_handlers=dict(EXCEPTION_HANDLERS),
    )
    return VariantHeader(RequireToken(app, token), lambda: runtime.variant.value)
