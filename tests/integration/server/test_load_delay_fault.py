"""The load_delay fault: every model load takes N seconds longer, as a large
model's does, so the operator's one-pod-at-a-time rollout can be proven
against pods that really are unready for a while (the tiny model loads in
a fraction of a second)."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import httpx


def test_an_armed_load_delay_holds_every_load_and_readiness_for_that_long(
    start_server: Any,
) -> None:
    server = start_server(
        flags={"fallback-quantization": "int8"}, env={"FUSEBOX_FAULTS": "load_delay:0"}
    )
    assert (
        server.admin.put("/admin/v1/faults", json={"load_delay": 3}).json()["faults"]["load_delay"]
        == 3
    )

    result: dict[str, Any] = {}

    def swap() -> None:
        body = {"id": uuid.uuid4().hex, "type": "swap", "variant": "fallback"}
        result.update(server.admin.post("/admin/v1/actions", json=body, timeout=60).json())

    swapping = threading.Thread(target=swap)
    swapping.start()
    readiness: list[int] = []
    while swapping.is_alive():
        try:
            readiness.append(server.client.get("/readyz", timeout=2).status_code)
        except httpx.TimeoutException:
            readiness.append(0)
        swapping.join(timeout=0.2)
    assert result["variant"] == "fallback"
    assert result["duration_seconds"] >= 3
    assert 503 in readiness
    assert server.client.get("/readyz").status_code == 200


def test_load_delay_is_forbidden_unless_armed_at_start(start_server: Any) -> None:
    server = start_server(env={"FUSEBOX_FAULTS": "slow:0"})
    assert server.admin.put("/admin/v1/faults", json={"load_delay": 3}).status_code == 403
