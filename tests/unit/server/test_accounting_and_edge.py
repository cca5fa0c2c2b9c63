"""One outcome per request, derived from the error class, counted once at the HTTP edge."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from fusebox_contract.names import RequestOutcome
from fusebox_server.control.accounting import RequestAccounting, RequestRecord, outcome_of
from fusebox_server.errors import (
    BodyTooLarge,
    BreakerOpen,
    ClientDisconnected,
    DeadlineExceeded,
    GenerationFailed,
    InputTooLong,
    MemoryPressure,
    ModelNotFound,
    ModelUnavailable,
    QueueFull,
    SchemaError,
    ServerError,
)
from fusebox_server.http.edge import EXCEPTION_HANDLERS, CountRequests, VariantHeader, record_of


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        (None, RequestOutcome.SUCCEEDED),
        (QueueFull("x"), RequestOutcome.REJECTED),
        (BreakerOpen("x"), RequestOutcome.REJECTED),
        (ModelUnavailable("x"), RequestOutcome.REJECTED),
        (MemoryPressure("x"), RequestOutcome.REJECTED),
        (DeadlineExceeded("x"), RequestOutcome.TIMED_OUT),
        (InputTooLong("x"), RequestOutcome.INVALID),
        (ModelNotFound("x"), RequestOutcome.INVALID),
        (SchemaError("x"), RequestOutcome.INVALID),
        (BodyTooLarge("x"), RequestOutcome.INVALID),
        (GenerationFailed("x"), RequestOutcome.FAILED),
        (ServerError("x"), RequestOutcome.FAILED),
        (RuntimeError("a bug"), RequestOutcome.FAILED),
        (ClientDisconnected("x"), RequestOutcome.CANCELLED),
    ],
)
def test_the_outcome_follows_from_the_error_class(
    error: BaseException | None, outcome: RequestOutcome
) -> None:
    assert outcome_of(error) is outcome


def test_a_record_is_counted_once_with_its_first_cause() -> None:
    accounting = RequestAccounting()
    record = RequestRecord("r", "/v1/completions")
    record.fail(QueueFull("full"))
    record.fail(DeadlineExceeded("late"))
    assert accounting.settle(record) is RequestOutcome.REJECTED
    assert accounting.settle(record) is RequestOutcome.REJECTED
    totals = accounting.totals()
    assert totals[RequestOutcome.REJECTED] == 1
    assert sum(totals.values()) == 1


def _app(accounting: RequestAccounting) -> VariantHeader:
    async def refuse(request: Request) -> Response:
        kind = request.query_params["kind"]
        if kind == "429":
            raise QueueFull("full")
        if kind == "504":
            raise DeadlineExceeded("late")
        if kind == "bug":
            raise RuntimeError("a bug")
        record = record_of(request)
        assert record is not None
        return JSONResponse({"request_id": record.request_id})

    async def other(request: Request) -> Response:
        raise QueueFull("full")

    app = Starlette(
        routes=[Route("/gen", refuse, methods=["POST"]), Route("/other", other)],
        middleware=[Middleware(CountRequests, accounting=accounting, paths=("/gen",))],
        exception_handlers=dict(EXCEPTION_HANDLERS),
    )
    return VariantHeader(app, lambda: "primary")


def test_each_outcome_through_the_edge_counts_exactly_once() -> None:
    accounting = RequestAccounting()
    n = 5
    with TestClient(_app(accounting), raise_server_exceptions=False) as client:
        for _ in range(n):
            ok = client.post("/gen?kind=ok", headers={"X-Request-Id": "abc-1"})
            assert ok.status_code == 200 and ok.json() == {"request_id": "abc-1"}
            full = client.post("/gen?kind=429")
            assert full.status_code == 429 and full.headers["retry-after"] == "1"
            assert full.json()["error"]["code"] == "queue_full"
            assert client.post("/gen?kind=504").status_code == 504
            bug = client.post("/gen?kind=bug")
            assert bug.status_code == 500
            assert bug.json()["error"]["code"] == "generation_failed"
            wrong_method = client.get("/gen")
            assert wrong_method.status_code == 405 and wrong_method.headers["allow"] == "POST"
            assert client.get("/other").status_code == 429  # not a counted path
        assert client.get("/nowhere").json()["error"]["code"] == "not_found"
        assert client.get("/nowhere").headers["x-fusebox-variant"] == "primary"
    assert accounting.totals() == {
        RequestOutcome.SUCCEEDED: n,
        RequestOutcome.REJECTED: n,
        RequestOutcome.TIMED_OUT: n,
        RequestOutcome.FAILED: n,
        RequestOutcome.INVALID: n,  # 405
        RequestOutcome.CANCELLED: 0,
    }
