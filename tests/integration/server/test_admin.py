"""The admin port: token, actions with memory figures, idempotency, unload/load/swap.

Requests go out and answers come back through the contract's classes
(`fusebox_contract.admin`), so every test here also shows that what the
server writes is what the operator's reader parses; bodies the server must
refuse are written by hand.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fusebox_server_harness import ADMIN_TOKEN, ServerProcess

from fusebox_contract.admin import (
    AdminPath,
    BreakerRequest,
    BreakerView,
    DegradationRequest,
    DegradationResult,
    ErrorAnswer,
    FaultsRequest,
    ServerState,
)
from fusebox_contract.names import (
    ActionType,
    BreakerState,
    DegradationLevel,
    DegradationTier,
    Fault,
    Quantization,
    Variant,
)


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({}, id="no-token"),
        pytest.param({"Authorization": "Bearer wrong-token"}, id="wrong-token"),
        pytest.param({"Authorization": ADMIN_TOKEN}, id="no-bearer-scheme"),
        pytest.param({"Authorization": f"Basic {ADMIN_TOKEN}"}, id="other-scheme"),
    ],
)
def test_admin_refuses_calls_without_the_token(server: ServerProcess, headers: Any) -> None:
    with httpx.Client(base_url=server.admin_url, headers=headers) as anonymous:
        for path in AdminPath:
            response = anonymous.request(path.method, path, json={"id": "x", "type": "unload"})
            assert response.status_code == 401
            assert ErrorAnswer.parse(response.json()).code == "invalid_token"
    assert server.state().model_loaded is True


def test_admin_routes_are_not_on_the_public_port(server: ServerProcess) -> None:
    for path in AdminPath:
        response = server.client.request(
            path.method, path, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        )
        assert response.status_code == 404


def test_the_token_never_appears_in_logs(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.admin_url) as anonymous:
        anonymous.get(AdminPath.STATE, headers={"Authorization": f"Bearer {ADMIN_TOKEN}x"})
    server.state()
    assert ADMIN_TOKEN not in server.log_text()


def test_gc_and_empty_cache_report_memory_before_and_after(clean_server: ServerProcess) -> None:
    for kind in (ActionType.GC, ActionType.EMPTY_CACHE):
        result = clean_server.act(kind)
        assert result.type is kind
        for figures in (result.memory_before, result.memory_after):
            assert figures.rss_bytes is not None and figures.rss_bytes > 0
            assert figures.cuda_allocated_bytes is None  # a CPU server: not measurable
        assert result.model_loaded is True
        assert result.leaks_before is None and result.swap_memory is None  # no faults, no CUDA
    assert clean_server.chat("hi").status_code == 200


def test_unload_makes_the_api_answer_503_until_load(clean_server: ServerProcess) -> None:
    result = clean_server.act(ActionType.UNLOAD)
    assert result.model_loaded is False
    response = clean_server.chat("hi")
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "model_unavailable"
    assert int(response.headers["retry-after"]) > 0
    assert clean_server.client.get("/readyz").status_code == 503
    assert clean_server.client.get("/healthz").status_code == 200

    result = clean_server.act(ActionType.LOAD, Variant.PRIMARY)
    assert result.model_loaded is True
    assert clean_server.client.get("/readyz").status_code == 200
    assert clean_server.chat("hi").status_code == 200


def test_swap_to_the_quantized_fallback_and_back(clean_server: ServerProcess) -> None:
    primary_bytes = clean_server.state().parameter_bytes
    assert primary_bytes is not None
    result = clean_server.act(ActionType.SWAP, Variant.FALLBACK)
    assert (result.variant, result.previous_variant) == (Variant.FALLBACK, Variant.PRIMARY)
    assert result.memory_before.rss_bytes and result.memory_after.rss_bytes
    state = clean_server.state()
    assert state.variant is Variant.FALLBACK and state.quantization is Quantization.INT8
    assert state.parameter_bytes is not None and state.parameter_bytes < 0.5 * primary_bytes
    response = clean_server.chat("Hello, world.")
    assert response.status_code == 200
    assert response.headers["x-fusebox-served-by"] == "fallback"
    assert response.json()["choices"][0]["message"]["content"]

    back = clean_server.act(ActionType.SWAP)
    assert back.variant is Variant.PRIMARY
    assert clean_server.state().parameter_bytes == primary_bytes


def test_the_same_action_id_acts_once(clean_server: ServerProcess) -> None:
    first = clean_server.act(ActionType.SWAP, Variant.FALLBACK, action_id="swap-once")
    assert first.replayed is False
    clean_server.act(ActionType.SWAP, Variant.PRIMARY)
    again = clean_server.act(ActionType.SWAP, Variant.FALLBACK, action_id="swap-once")
    assert again == first.replay()
    assert clean_server.state().variant is Variant.PRIMARY


def test_an_action_id_reused_for_another_action_is_refused(server: ServerProcess) -> None:
    assert server.act(ActionType.GC, action_id="reused-once").replayed is False
    response = server.admin.post(AdminPath.ACTIONS, json={"id": "reused-once", "type": "unload"})
    assert response.status_code == 409
    error = ErrorAnswer.parse(response.json())
    assert error.code == "action_id_reused"
    assert "'reused-once' was used for gc" in error.message
    assert server.state().model_loaded is True


@pytest.mark.parametrize(
    ("body", "status", "code", "param", "message"),
    [
        pytest.param(
            {"id": "a", "type": "explode"},
            400,
            "invalid_request",
            "type",
            "'type' must be one of gc, empty_cache, unload, load, swap",
            id="unknown-type",
        ),
        pytest.param(
            {"type": "gc"},
            422,
            "invalid_schema",
            "id",
            "'id' must be a non-empty string",
            id="no-id",
        ),
        pytest.param(
            {"id": "x" * 257, "type": "gc"},
            400,
            "invalid_request",
            "id",
            "'id' is too long",
            id="long-id",
        ),
        pytest.param(
            {"id": "a", "type": 3},
            422,
            "invalid_schema",
            "type",
            "'type' must be a string",
            id="type-not-a-string",
        ),
        pytest.param(
            {"id": "b", "type": "load", "variant": "third"},
            400,
            "invalid_request",
            "variant",
            "'variant' must be one of primary, fallback",
            id="unknown-variant",
        ),
        pytest.param(
            ["gc"], 422, "invalid_schema", None, "request body must be a JSON object", id="a-list"
        ),
        pytest.param(
            {"id": "c", "type": "unload", "varient": "fallback"},
            400,
            "invalid_request",
            "varient",
            "unknown key 'varient' (known: id, type, variant)",
            id="unknown-key",
        ),
        pytest.param(
            {"id": "d", "type": "unload", "variant": "fallback"},
            400,
            "invalid_request",
            "variant",
            "'variant' applies only to load and swap",
            id="variant-on-unload",
        ),
    ],
)
def test_bad_actions_get_clear_errors(
    server: ServerProcess, body: Any, status: int, code: str, param: str | None, message: str
) -> None:
    response = server.admin.post(AdminPath.ACTIONS, json=body)
    assert response.status_code == status
    error = ErrorAnswer.parse(response.json())
    assert (error.code, error.param, error.message) == (code, param, message)
    assert server.state().model_loaded is True  # nothing was unloaded


@pytest.mark.parametrize(
    ("path", "body", "status", "param", "message"),
    [
        pytest.param(
            AdminPath.BREAKER,
            {"state": "half_open", "admit_percent": 5},
            400,
            "admit_percent",
            "unknown key 'admit_percent' (known: state, admitPercent)",
            id="breaker-unknown-key",
        ),
        pytest.param(
            AdminPath.BREAKER,
            {"state": "half_open", "admitPercent": 0},
            400,
            "admitPercent",
            "'admitPercent' must be 1..100 when half_open (0: use open)",
            id="half-open-admitting-nothing",
        ),
        pytest.param(
            AdminPath.BREAKER,
            {"admitPercent": 5},
            422,
            "state",
            "'state' must be one of closed, open, half_open",
            id="breaker-no-state",
        ),
        pytest.param(
            AdminPath.BREAKER,
            {"state": "half_open", "admitPercent": "5"},
            422,
            "admitPercent",
            "'admitPercent' must be an integer 0..100",
            id="admit-percent-a-string",
        ),
        pytest.param(
            AdminPath.DEGRADATION,
            {"level": 1, "tier": ["no-streaming"]},
            400,
            "tier",
            "unknown key 'tier' (known: level, tiers)",
            id="degradation-unknown-key",
        ),
        pytest.param(
            AdminPath.DEGRADATION,
            {"level": "1"},
            422,
            "level",
            "'level' must be an integer 0..3",
            id="level-a-string",
        ),
        pytest.param(
            AdminPath.DEGRADATION,
            {"tiers": []},
            422,
            "level",
            "'level' must be an integer 0..3",
            id="no-level",
        ),
    ],
)
def test_bad_breaker_and_degradation_bodies_are_refused_by_name(
    clean_server: ServerProcess,
    path: AdminPath,
    body: dict[str, Any],
    status: int,
    param: str,
    message: str,
) -> None:
    response = clean_server.admin.put(path, json=body)
    assert response.status_code == status
    error = ErrorAnswer.parse(response.json())
    code = "invalid_schema" if status == 422 else "invalid_request"
    assert (error.code, error.param, error.message) == (code, param, message)
    state = clean_server.state()  # nothing half-applied
    assert (state.breaker.state, state.breaker.admit_percent) == (BreakerState.CLOSED, 100)
    assert state.degradation_level == 0


def test_an_open_breaker_takes_admit_percent_zero_as_the_operator_sends_it(
    clean_server: ServerProcess,
) -> None:
    answer = clean_server.send(BreakerRequest(BreakerState.OPEN, 0))  # policy.admit_percent
    assert answer.status_code == 200
    assert ServerState.parse(answer.json()).breaker == BreakerView(BreakerState.OPEN, 0)


def test_breaker_and_degradation_reject_invalid_values(server: ServerProcess) -> None:
    assert server.admin.put(AdminPath.BREAKER, json={"state": "ajar"}).status_code == 400
    response = server.admin.put(AdminPath.BREAKER, json={"state": "half_open", "admitPercent": 101})
    assert response.status_code == 400
    assert ErrorAnswer.parse(response.json()) == ErrorAnswer(
        "'admitPercent' must be an integer 0..100",
        "invalid_request_error",
        "admitPercent",
        "invalid_request",
    )
    assert server.admin.put(AdminPath.DEGRADATION, json={"level": 4}).status_code == 400
    assert server.admin.put(AdminPath.DEGRADATION, json={"level": "1"}).status_code == 422
    assert server.admin.put(AdminPath.DEGRADATION, content=b"{").status_code == 400
    assert server.state().breaker.state is BreakerState.CLOSED


@pytest.mark.parametrize(
    ("tiers", "status", "says"),
    [
        ("canned-answers", 422, "must be a list"),
        (["canned-answers", "shrug"], 400, "must be one of no-streaming, fallback-model"),
        ([3], 422, "must be a list of tier names"),
        (["canned-answers", "canned-answers"], 400, "must not repeat"),
    ],
)
def test_degradation_refuses_tiers_it_cannot_read_by_name(
    server: ServerProcess, tiers: object, status: int, says: str
) -> None:
    response = server.admin.put(AdminPath.DEGRADATION, json={"level": 3, "tiers": tiers})
    assert response.status_code == status
    error = ErrorAnswer.parse(response.json())
    assert error.param == "tiers" and says in error.message
    assert server.state().degradation_level == 0  # nothing half-applied


def test_a_level_engages_only_the_listed_tiers_below_it(server: ServerProcess) -> None:
    # This server has an int8 fallback; a list without fallback-model swaps nothing.
    canned, streaming = DegradationTier.CANNED_ANSWERS, DegradationTier.NO_STREAMING
    top = DegradationLevel.CANNED_ANSWERS
    answer = server.send(DegradationRequest(top, (canned, streaming)))
    try:
        assert answer.status_code == 200  # nothing to converge
        result = DegradationResult.parse(answer.json())
        assert result.tiers == (streaming, canned)
        assert result.target_variant is Variant.PRIMARY
        server.send(DegradationRequest(top, (canned,))).raise_for_status()
        assert server.state().degradation_tiers == (canned,)
        # no-streaming is not listed, so a stream stays a stream at level 3.
        streamed = server.chat("hello", stream=True)
        assert streamed.headers["content-type"].startswith("text/event-stream")
        server.send(DegradationRequest(top, (streaming,))).raise_for_status()
        assert server.state().degradation_tiers == (streaming,)
        buffered = server.chat("hello", stream=True)  # still SSE, the text in one chunk
        assert buffered.headers["content-type"].startswith("text/event-stream")
        assert buffered.text.count("data: {") == 2 and streamed.text.count("data: {") > 2
        # Without tiers a level engages every tier up to it, as before.
        server.send(DegradationRequest(DegradationLevel.NO_STREAMING)).raise_for_status()
        assert server.state().degradation_tiers == (streaming,)
    finally:
        server.send(DegradationRequest(DegradationLevel.NONE)).raise_for_status()
    assert server.state().degradation_tiers == ()


def test_faults_are_forbidden_when_not_armed_at_start(server: ServerProcess) -> None:
    response = server.send(FaultsRequest({Fault.LEAK: 64}))
    assert response.status_code == 403
    assert server.state().faults is None


def test_the_state_carries_the_worker_s_figures_and_the_breaker_answers_with_it(
    server: ServerProcess,
) -> None:
    state = server.state()
    assert state.debug is not None and state.debug.inbox == 0
    assert state.model_loaded and state.variant is Variant.PRIMARY
    answer = server.send(BreakerRequest(BreakerState.CLOSED))
    assert answer.status_code == 200
    told = ServerState.parse(answer.json())
    assert told.debug is None  # the worker's figures are GET state's alone
    assert (told.breaker.state, told.breaker.admit_percent) == (BreakerState.CLOSED, 100)
    assert told.variant is Variant.PRIMARY and told.model_loaded
