"""The load_delay fault: every model load takes N seconds longer, as a large
model's does, so the operator's one-pod-at-a-time rollout can be proven
against pods that really are unready for a while (the tiny model loads in
a fraction of a second)."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import httpx

from fusebox_contract.admin import ActionRequest, ActionResult, FaultsRequest, FaultsResult
from fusebox_contract.names import ActionType, Fault, Variant


def test_an_armed_load_delay_holds_every_load_and_readiness_for_that_long(
    start_server: Any,
) -> None:
    server = start_server(
        flags={"fallback-quantization": "int8"}, env={"FUSEBOX_FAULTS": "load_delay:0"}
    )
    armed = FaultsResult.parse(server.send(FaultsRequest({Fault.LOAD_DELAY: 3})).json())
    assert armed.values[Fault.LOAD_DELAY] == 3

    results: list[ActionResult] = []

    def swap() -> None:
        request = ActionRequest(uuid.uuid4().hex, ActionType.SWAP, Variant.FALLBACK)
        results.append(ActionResult.parse(server.send(request, timeout=60).json()))

    swapping = threading.Thread(target=swap)
    swapping.start()
    readiness: list[int] = []
    while swapping.is_alive():
        try:
            readiness.append(server.client.get("/readyz", timeout=2).status_code)
        except httpx.TimeoutException:
            readiness.append(0)
        swapping.join(timeout=0.2)
    (result,) = results
    assert result.variant is Variant.FALLBACK
    assert result.duration_seconds >= 3
    assert 503 in readiness
    assert server.client.get("/readyz").status_code == 200


def test_load_delay_is_forbidden_unless_armed_at_start(start_server: Any) -> None:
    server = start_server(env={"FUSEBOX_FAULTS": "slow:0"})
    assert server.send(FaultsRequest({Fault.LOAD_DELAY: 3})).status_code == 403
