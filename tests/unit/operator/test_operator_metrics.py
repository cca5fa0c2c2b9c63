"""The operator's own metrics: bounded labels, what each seam records, and the
exposition a real Prometheus parses (`promtool check metrics`)."""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import fusebox_operator
from fusebox_contract.admin import AdminPath, ErrorAnswer
from fusebox_operator.observations import PodView
from fusebox_operator.operator_metrics import (
    CAUSE_PREFIXES,
    METRICS,
    SERVICE_STALE_SECONDS,
    ActionCause,
    ActionOutcome,
    OperatorMetric,
    OperatorMetrics,
    action_cause,
    action_outcome,
    serve,
    timed,
)
from fusebox_operator.policy_state import ActionKind
from fusebox_operator.telemetry import scrape_pod

from .test_actuator_answers import FakeAdmin, execute


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def value(metrics: OperatorMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize(
    ("kind", "reason", "cause"),
    [
        (ActionKind.GC, "RSS 900 MiB = 92% of the memory limit, +40 MiB/min", ActionCause.MEMORY),
        (ActionKind.RELOAD, "GPU memory 70 GiB = 95% of VRAM; time to OOM ~40 s", "memory"),
        (ActionKind.GROW_LIMIT, "anything", ActionCause.MEMORY),
        (
            ActionKind.RESTART,
            "server stats 45 s old (> 30 s): event loop or worker wedged",
            "wedged",
        ),
        (ActionKind.DRAIN, "GPU 0 reported Unhealthy by the kubelet", ActionCause.GPU_UNHEALTHY),
        (ActionKind.RESTORE_PRIMARY, "memory calm for 300 s after the swap", "recovered"),
        (ActionKind.GC, "node memory pressure (1.0 GiB available): shedding", "node_memory"),
        (ActionKind.EMPTY_CACHE, "something new", ActionCause.OTHER),
    ],
)
def test_an_actions_free_text_reason_becomes_a_bounded_cause(
    kind: ActionKind, reason: str, cause: str
) -> None:
    assert action_cause(kind, reason) == cause


@pytest.mark.parametrize(
    ("text", "settled", "replayed", "result"),
    [
        ("RSS 900.0Mi -> 500.0Mi", True, False, ActionOutcome.SUCCEEDED),
        ("RSS 900.0Mi -> 500.0Mi; replayed", True, True, ActionOutcome.REPLAYED),
        ("failed: POST /admin/v1/actions -> HTTP 409", True, False, ActionOutcome.FAILED),
        ("in flight: TimeoutError", False, False, ActionOutcome.IN_FLIGHT),
    ],
)
def test_an_actuator_answer_becomes_a_result(
    text: str, settled: bool, replayed: bool, result: ActionOutcome
) -> None:
    assert action_outcome(text, settled, replayed) is result


def test_a_tick_counts_breaker_transitions_and_the_services_by_state() -> None:
    clock = Clock()
    metrics = OperatorMetrics(clock=clock)
    closed = {"breaker": {"state": "Closed"}, "summary": {"breaker": "Closed"}}
    opened = {
        "breaker": {"state": "Open"},
        "summary": {"breaker": "Open"},
        "degradation": {"tier": "no-streaming"},
    }
    metrics.tick("ml/chat", 0.2, closed, opened)
    metrics.tick("ml/chat", 0.1, opened, {})  # no patch: the state holds
    metrics.tick("ml/chat-bot", 0.1, closed, {"summary": {"breaker": "Closed"}})
    transitions = OperatorMetric.BREAKER_TRANSITIONS.samples[0]
    assert value(metrics, transitions, from_state="Closed", to_state="Open") == 1
    assert value(metrics, transitions, from_state="Open", to_state="Closed") == 0
    services = OperatorMetric.SERVICES.value
    assert value(metrics, services, breaker="Open", tier="no-streaming") == 1
    assert value(metrics, services, breaker="Closed", tier="none") == 1
    ticks = OperatorMetric.TICK_DURATION_SECONDS.value
    assert value(metrics, f"{ticks}_count") == 3
    assert value(metrics, f"{ticks}_sum") == pytest.approx(0.4)

    metrics.forget("ml/chat")
    assert value(metrics, services, breaker="Open", tier="no-streaming") == 0
    clock.now += SERVICE_STALE_SECONDS + 1  # chat-bot no longer ticked: deleted elsewhere
    assert value(metrics, services, breaker="Closed", tier="none") == 0


def test_timed_observes_a_handler_that_raises_too() -> None:
    metrics = OperatorMetrics()

    @timed(metrics.reconcile_seconds)
    async def handler(fail: bool) -> str:
        if fail:
            raise RuntimeError("refused")
        return "done"

    assert asyncio.run(handler(fail=False)) == "done"
    with pytest.raises(RuntimeError):
        asyncio.run(handler(fail=True))
    name = OperatorMetric.RECONCILE_DURATION_SECONDS.value
    assert value(metrics, f"{name}_count") == 2


def test_the_actuator_counts_each_action_and_each_failed_admin_call() -> None:
    actions, admin = OperatorMetric.ACTIONS.samples[0], OperatorMetric.ADMIN_ERRORS.samples[0]
    labels = {"action": "swap_fallback", "reason": "other", "result": "failed"}
    before = value(METRICS, actions, **labels), value(METRICS, admin, call="actions", kind="http")
    refusal = ErrorAnswer("no fallback is configured", "invalid_request_error", "variant")
    execute(FakeAdmin({AdminPath.ACTIONS: [(409, refusal.encode())]}), ActionKind.SWAP_FALLBACK)
    assert value(METRICS, actions, **labels) == before[0] + 1
    assert value(METRICS, admin, call="actions", kind="http") == before[1] + 1


def test_a_scrape_that_reaches_no_sidecar_is_counted_as_unreachable() -> None:
    errors = OperatorMetric.SCRAPE_ERRORS.samples[0]
    before = value(METRICS, errors, kind="unreachable")

    async def scrape() -> Any:
        async with aiohttp.ClientSession() as session:
            pod = PodView("p", "uid-p", "127.0.0.1", "Running", True, True, True, 0, False, False)
            return await scrape_pod(session, pod, 2.0, "ttft", port=closed_port())

    assert not asyncio.run(scrape()).ok
    assert value(METRICS, errors, kind="unreachable") == before + 1


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed again when the block ends


def test_the_endpoint_serves_every_metric_in_a_form_promtool_accepts(tmp_path: Any) -> None:
    metrics = OperatorMetrics()
    metrics.tick(
        "ml/chat", 0.05, {}, {"breaker": {"state": "Open"}, "summary": {"breaker": "Open"}}
    )
    metrics.action(ActionKind.RESTART, "server stats 45 s old", "pod deleted", True, False)
    server = serve(metrics, 0, host="127.0.0.1")
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    for metric in OperatorMetric:
        assert f"# TYPE {metric.value}" in text, metric
    assert (
        'fusebox_operator_actions_total{action="restart",reason="wedged",result="succeeded"} 1.0'
        in text
    )
    assert "process_" not in text and "python_gc" not in text  # no default collectors
    checked = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


PRODUCERS = ("policy", "gpu_health", "node_pressure", "memory_trend")


@pytest.mark.parametrize(("prefix", "cause"), CAUSE_PREFIXES)
def test_each_cause_prefix_is_how_a_producer_words_its_reason(
    prefix: str, cause: ActionCause
) -> None:
    """A drift guard: the policy's wording changed means the classifier must follow."""
    package = Path(fusebox_operator.__file__).parent
    sources = "".join((package / f"{name}.py").read_text(encoding="utf-8") for name in PRODUCERS)
    assert f'f"{prefix}' in sources or f'"{prefix}"' in sources, (prefix, cause)


def test_a_metrics_port_in_use_stops_the_operator_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import kopf

    from fusebox_operator.__main__ import run_operator

    def never(**_: Any) -> None:
        raise AssertionError("kopf must not start without its metrics endpoint")

    monkeypatch.setattr(kopf, "run", never)
    # run_operator configures logging the way the process wants it: put it back after.
    root, objects = logging.getLogger(), logging.getLogger("kopf.objects")
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)
    monkeypatch.setattr(objects, "filters", list(objects.filters))
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setenv("FUSEBOX_METRICS_PORT", str(port))
        with pytest.raises(
            SystemExit, match=f"cannot serve metrics on FUSEBOX_METRICS_PORT={port}"
        ):
            run_operator()
