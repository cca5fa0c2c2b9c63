"""The admin port: token, actions with memory figures, idempotency, unload/load/swap."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from fusebox_server_harness import ADMIN_TOKEN, ServerProcess


def action(server: ServerProcess, kind: str, variant: str | None = None, **extra: Any) -> Any:
    body: dict[str, Any] = {"id": extra.pop("id", uuid.uuid4().hex), "type": kind}
    if variant:
        body["variant"] = variant
    response = server.admin.post("/admin/v1/actions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


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
        for method, path in (
            ("GET", "/admin/v1/state"),
            ("POST", "/admin/v1/actions"),
            ("PUT", "/admin/v1/breaker"),
            ("PUT", "/admin/v1/degradation"),
            ("PUT", "/admin/v1/faults"),
        ):
            response = anonymous.request(method, path, json={"id": "x", "type": "unload"})
            assert response.status_code == 401
            assert response.json()["error"]["code"] == "invalid_token"
    assert server.state()["model_loaded"] is True


def test_admin_routes_are_not_on_the_public_port(server: ServerProcess) -> None:
    response = server.client.get(
        "/admin/v1/state", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    )
    assert response.status_code == 404


def test_the_token_never_appears_in_logs(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.admin_url) as anonymous:
        anonymous.get("/admin/v1/state", headers={"Authorization": f"Bearer {ADMIN_TOKEN}x"})
    server.state()
    assert ADMIN_TOKEN not in server.log_text()


def test_gc_and_empty_cache_report_memory_before_and_after(clean_server: ServerProcess) -> None:
    for kind in ("gc", "empty_cache"):
        result = action(clean_server, kind)
        assert result["type"] == kind
        for when in ("memory_before", "memory_after"):
            figures = result[when]
            assert figures["rss_bytes"] > 0
            assert "cuda_allocated_bytes" in figures and "cuda_reserved_bytes" in figures
        assert result["model_loaded"] is True
    assert clean_server.chat("hi").status_code == 200


def test_unload_makes_the_api_answer_503_until_load(clean_server: ServerProcess) -> None:
    result = action(clean_server, "unload")
    assert result["model_loaded"] is False
    response = clean_server.chat("hi")
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "model_unavailable"
    assert int(response.headers["retry-after"]) > 0
    assert clean_server.client.get("/readyz").status_code == 503
    assert clean_server.client.get("/healthz").status_code == 200

    result = action(clean_server, "load", "primary")
    assert result["model_loaded"] is True
    assert clean_server.client.get("/readyz").status_code == 200
    assert clean_server.chat("hi").status_code == 200


def test_swap_to_the_quantized_fallback_and_back(clean_server: ServerProcess) -> None:
    primary_bytes = clean_server.state()["parameter_bytes"]
    result = action(clean_server, "swap", "fallback")
    assert result["variant"] == "fallback" and result["previous_variant"] == "primary"
    assert result["memory_before"]["rss_bytes"] > 0 and result["memory_after"]["rss_bytes"] > 0
    state = clean_server.state()
    assert state["variant"] == "fallback" and state["quantization"] == "int8"
    assert state["parameter_bytes"] < 0.5 * primary_bytes
    response = clean_server.chat("Hello, world.")
    assert response.status_code == 200
    assert response.headers["x-fusebox-served-by"] == "fallback"
    assert response.json()["choices"][0]["message"]["content"]

    back = action(clean_server, "swap")
    assert back["variant"] == "primary"
    assert clean_server.state()["parameter_bytes"] == primary_bytes


def test_the_same_action_id_acts_once(clean_server: ServerProcess) -> None:
    first = action(clean_server, "swap", "fallback", id="swap-once")
    assert first["replayed"] is False
    action(clean_server, "swap", "primary")
    again = action(clean_server, "swap", "fallback", id="swap-once")
    assert again["replayed"] is True
    assert again["memory_after"] == first["memory_after"]
    assert clean_server.state()["variant"] == "primary"


def test_an_action_id_reused_for_another_action_is_refused(server: ServerProcess) -> None:
    assert action(server, "gc", id="reused-once")["replayed"] is False
    response = server.admin.post("/admin/v1/actions", json={"id": "reused-once", "type": "unload"})
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "action_id_reused"
    assert "'reused-once' was used for gc" in error["message"]
    assert server.state()["model_loaded"] is True


@pytest.mark.parametrize(
    ("body", "status"),
    [
        pytest.param({"id": "a", "type": "explode"}, 400, id="unknown-type"),
        pytest.param({"type": "gc"}, 422, id="no-id"),
        pytest.param({"id": "b", "type": "load", "variant": "third"}, 400, id="unknown-variant"),
    ],
)
def test_bad_actions_get_clear_errors(server: ServerProcess, body: Any, status: int) -> None:
    response = server.admin.post("/admin/v1/actions", json=body)
    assert response.status_code == status
    assert response.json()["error"]["message"]


def test_breaker_and_degradation_reject_invalid_values(server: ServerProcess) -> None:
    assert server.admin.put("/admin/v1/breaker", json={"state": "ajar"}).status_code == 400
    response = server.admin.put(
        "/admin/v1/breaker", json={"state": "half_open", "admitPercent": 101}
    )
    assert response.status_code == 400
    assert server.admin.put("/admin/v1/degradation", json={"level": 4}).status_code == 400
    assert server.admin.put("/admin/v1/degradation", content=b"{").status_code == 400
    assert server.state()["breaker"]["state"] == "closed"


@pytest.mark.parametrize(
    ("tiers", "says"),
    [
        ("canned-answers", "must be a list"),
        (["canned-answers", "shrug"], "must be one of no-streaming, fallback-model"),
        ([3], "must be one of"),
        (["canned-answers", "canned-answers"], "must not repeat"),
    ],
)
def test_degradation_refuses_tiers_it_cannot_read_by_name(
    server: ServerProcess, tiers: object, says: str
) -> None:
    response = server.admin.put("/admin/v1/degradation", json={"level": 3, "tiers": tiers})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "tiers" and says in error["message"]
    assert server.state()["degradation_level"] == 0  # nothing half-applied


def test_a_level_engages_only_the_listed_tiers_below_it(server: ServerProcess) -> None:
    # This server has an int8 fallback; a list without fallback-model swaps nothing.
    body = {"level": 3, "tiers": ["canned-answers", "no-streaming"]}
    answer = server.admin.put("/admin/v1/degradation", json=body)
    try:
        assert answer.status_code == 200  # nothing to converge
        assert answer.json()["tiers"] == ["no-streaming", "canned-answers"]
        assert answer.json()["targetVariant"] == "primary"
        only_canned = {"level": 3, "tiers": ["canned-answers"]}
        server.admin.put("/admin/v1/degradation", json=only_canned).raise_for_status()
        assert server.state()["degradation_tiers"] == ["canned-answers"]
        # no-streaming is not listed, so a stream stays a stream at level 3.
        streamed = server.chat("hello", stream=True)
        assert streamed.headers["content-type"].startswith("text/event-stream")
        only_streaming = {"level": 3, "tiers": ["no-streaming"]}
        server.admin.put("/admin/v1/degradation", json=only_streaming).raise_for_status()
        assert server.state()["degradation_tiers"] == ["no-streaming"]
        buffered = server.chat("hello", stream=True)  # still SSE, the text in one chunk
        assert buffered.headers["content-type"].startswith("text/event-stream")
        assert buffered.text.count("data: {") == 2 and streamed.text.count("data: {") > 2
        # Without tiers a level engages every tier up to it, as before.
        server.admin.put("/admin/v1/degradation", json={"level": 1}).raise_for_status()
        assert server.state()["degradation_tiers"] == ["no-streaming"]
    finally:
        server.admin.put("/admin/v1/degradation", json={"level": 0}).raise_for_status()
    assert server.state()["degradation_tiers"] == []


def test_faults_are_forbidden_when_not_armed_at_start(server: ServerProcess) -> None:
    response = server.admin.put("/admin/v1/faults", json={"leak": 64})
    assert response.status_code == 403
    assert server.state()["faults"] is None
