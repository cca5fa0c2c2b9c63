"""The operator's I/O edge and its tick against the real server and sidecar processes.

What the e2e tier does through a cluster, in seconds on loopback: telemetry
scrapes the real sidecar, the actuator drives the real admin API with
idempotency ids, runtime-state reconciliation shows up in the next scrape,
and whole ticks (tick.run_tick, no kopf) move the pod to the fallback and
back, reporting what the pod serves; a pod whose device cannot serve its
fallback (int4 on a CPU) takes the level, swaps nothing and is named once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from fusebox_contract.admin import AdminPath, ServerState
from fusebox_contract.names import BreakerState, DegradationTier, EventReason, Variant
from fusebox_operator.actuator import ActionResult, Actuator, RuntimeCall, RuntimeTarget
from fusebox_operator.incident import PAUSE_ACTIONS
from fusebox_operator.observations import PodSample, PodView
from fusebox_operator.policy_state import Action, ActionKind, PolicyState
from fusebox_operator.rollout import Degradation
from fusebox_operator.spec import InferenceServiceSpec, Mode, parse_spec
from fusebox_operator.telemetry import scrape_all
from fusebox_operator.tick import TickInputs, TickMemory, TickOutcome, converging, run_tick

TOKEN = "integration-admin-token"
POD = PodView("pod-a", "uid-a", "127.0.0.1", "Running", True, True, True, 0, False, False)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Pair:
    api_port: int
    admin_port: int
    metrics_port: int


def _model_dir(tmp: Path) -> Path:
    cache = Path(os.environ.get("FUSEBOX_CACHE", Path.home() / ".cache" / "fusebox"))
    model = cache / "models" / "tiny"
    if not (model / "config.json").exists():
        model = tmp / "tiny"
        subprocess.run(
            [sys.executable, "-m", "fusebox_server.model.tiny_model", str(model)],
            check=True,
            timeout=300,
        )
    return model


SERVED_REVISION = "v9"  # what the server reports serving: status.model.revision reads it


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    tmp = tmp_path_factory.mktemp("operator-io")
    model = _model_dir(tmp)
    with _served(tmp, model, ["--fallback-dir", str(model)]) as ports:
        yield ports


@pytest.fixture(scope="module")
def int4_on_cpu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    """A server whose fallback (int4) its device (a CPU) cannot serve."""
    tmp = tmp_path_factory.mktemp("operator-io-int4")
    with _served(tmp, _model_dir(tmp), ["--fallback-quantization", "int4"]) as ports:
        yield ports


@contextlib.contextmanager
def _served(tmp: Path, model: Path, fallback: list[str]) -> Iterator[Pair]:
    """The real server and sidecar on loopback, until the server is ready."""
    (tmp / "token").write_text(TOKEN)
    ports = Pair(free_port(), free_port(), free_port())
    env = {**os.environ, "FUSEBOX_FAULTS": "leak:8"}
    server_log = open(tmp / "server.log", "wb")  # noqa: SIM115
    sidecar_log = open(tmp / "sidecar.log", "wb")  # noqa: SIM115
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fusebox_server",
            "--model-dir",
            str(model),
            *fallback,
            "--host",
            "127.0.0.1",
            "--port",
            str(ports.api_port),
            "--admin-port",
            str(ports.admin_port),
            "--admin-token-file",
            str(tmp / "token"),
            "--stats-file",
            str(tmp / "stats.json"),
            "--device",
            "cpu",
            "--model-revision",
            SERVED_REVISION,
        ],
        env=env,
        stdout=server_log,
        stderr=subprocess.STDOUT,
    )
    sidecar = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fusebox_sidecar",
            "--stats-file",
            str(tmp / "stats.json"),
            "--host",
            "127.0.0.1",
            "--port",
            str(ports.metrics_port),
        ],
        stdout=sidecar_log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                url = f"http://127.0.0.1:{ports.api_port}/readyz"
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            assert server.poll() is None, (tmp / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "server not ready in 180 s"
            time.sleep(0.5)
        yield ports
    finally:
        for process in (sidecar, server):
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        server_log.close()
        sidecar_log.close()


async def _scrape(pair: Pair) -> PodSample:
    async with aiohttp.ClientSession() as session:
        for _ in range(20):
            (sample,) = await scrape_all(session, [POD], 2.0, "ttft", port=pair.metrics_port)
            if sample.ok and sample.rss_bytes is not None:
                return sample
            await asyncio.sleep(0.5)
    raise AssertionError(f"no usable scrape: {sample}")


async def _execute(pair: Pair, action: Action, token: str = TOKEN) -> str:
    async with aiohttp.ClientSession() as session:
        actuator = Actuator(session, None, admin_port=pair.admin_port)
        result = await actuator.execute("ns", POD, token, action)
        assert result.settled
        return result.text


def _action(kind: ActionKind, action_id: str, variant: Variant = Variant.PRIMARY) -> Action:
    return Action(action_id, kind, "pod-a", "test", time.time(), variant)


def test_scrape_of_the_real_sidecar_gives_memory_counters_and_state(pair: Pair) -> None:
    # /readyz flips before the stats thread's next write (once a second), so
    # the first scrape may still carry the loading state.
    deadline = time.monotonic() + 30
    sample = asyncio.run(_scrape(pair))
    while not sample.model_loaded and time.monotonic() < deadline:
        time.sleep(0.5)
        sample = asyncio.run(_scrape(pair))
    assert sample.rss_bytes is not None and sample.rss_bytes > 10 * 1024**2
    assert sample.requests is not None
    assert sample.breaker_state is BreakerState.CLOSED and sample.model_loaded is True
    assert sample.variant is Variant.PRIMARY
    assert sample.stats_age_seconds is not None and sample.stats_age_seconds < 10


def test_gc_action_reports_memory_and_replays_by_id(pair: Pair) -> None:
    first = asyncio.run(_execute(pair, _action(ActionKind.GC, "it-gc-1")))
    assert first.startswith("RSS ") and "replayed" not in first
    again = asyncio.run(_execute(pair, _action(ActionKind.GC, "it-gc-1")))
    assert again.endswith("replayed")


def test_reload_and_swap_change_the_variant(pair: Pair) -> None:
    assert "variant primary" in asyncio.run(_execute(pair, _action(ActionKind.RELOAD, "it-reload")))
    swapped = asyncio.run(
        _execute(pair, _action(ActionKind.SWAP_FALLBACK, "it-swap", Variant.FALLBACK))
    )
    assert "variant fallback" in swapped
    restored = asyncio.run(
        _execute(pair, _action(ActionKind.RESTORE_PRIMARY, "it-restore", Variant.PRIMARY))
    )
    assert "variant primary" in restored


def test_wrong_token_is_reported_as_a_failed_action(pair: Pair) -> None:
    result = asyncio.run(_execute(pair, _action(ActionKind.GC, "it-gc-bad"), token="wrong"))
    assert result.startswith("failed:") and "401" in result


def test_runtime_state_reconciled_shows_in_the_next_scrape(pair: Pair) -> None:
    async def go() -> PodSample:
        async with aiohttp.ClientSession() as session:
            actuator = Actuator(session, None, admin_port=pair.admin_port)
            applied: dict[str, RuntimeTarget] = {}
            target = (BreakerState.HALF_OPEN, 5, Degradation(1))
            told = await actuator.reconcile_runtime(POD, TOKEN, target, None, applied)
            assert (told.changed, told.reached) == (True, True)
            # Same target, nothing observed yet: no second call.
            again = await actuator.reconcile_runtime(POD, TOKEN, target, None, applied)
            assert (again.changed, again.reached) == (False, None)
        for _ in range(20):
            sample = await _scrape(pair)
            if sample.breaker_state is BreakerState.HALF_OPEN:
                return sample
            await asyncio.sleep(0.5)
        return sample

    sample = asyncio.run(go())
    assert (sample.breaker_state, sample.degradation_level) == (BreakerState.HALF_OPEN, 1)

    async def back() -> None:
        async with aiohttp.ClientSession() as session:
            actuator = Actuator(session, None, admin_port=pair.admin_port)
            target = (BreakerState.CLOSED, 100, Degradation(0))
            await actuator.reconcile_runtime(POD, TOKEN, target, None, {})

    asyncio.run(back())


# --- whole ticks, no kopf ---------------------------------------------------------------------

SPEC = parse_spec(
    {
        "model": {"name": "chat", "source": "pvc://models/tiny"},
        "replicas": 1,
        "fallback": {"quantization": "none", "source": "pvc://models/tiny-fallback"},
        "telemetry": {
            "scrapeIntervalSeconds": 1,
            "scrapeTimeoutSeconds": 1,
            "wedgeAfterSeconds": 60,
        },
    }
)


class TimedActuator(Actuator):
    """The real actuator, noting when each action finished."""

    finished: list[float]

    async def execute(
        self, namespace: str, pod: PodView | None, token: str, action: Action
    ) -> ActionResult:
        result = await super().execute(namespace, pod, token, action)
        self.finished.append(time.time())
        return result


async def _ticks(
    pair: Pair,
    status: dict[str, Any],
    until: Any,
    finished: list[float] | None = None,
    spec: InferenceServiceSpec = SPEC,
) -> tuple[list[TickOutcome], dict[str, Any]]:
    """Run ticks as the kopf timer would, applying each status patch, until `until(status)`."""
    memory = TickMemory()
    outcomes: list[TickOutcome] = []
    async with aiohttp.ClientSession() as session:
        actuator = TimedActuator(session, None, admin_port=pair.admin_port)
        actuator.finished = finished if finished is not None else []

        async def scrape(pods: Sequence[PodView]) -> list[PodSample]:
            return await scrape_all(session, pods, 2.0, "ttft", port=pair.metrics_port)

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            inputs = TickInputs("ns", "itsvc", spec, status, [POD], TOKEN, 1)
            outcome = await run_tick(inputs, memory, scrape, actuator, time.time)
            outcomes.append(outcome)
            status = {**status, **outcome.status_patch}
            if until(status):
                return outcomes, status
            await asyncio.sleep(1.0)
    raise AssertionError(f"not reached in 120 s; last status {status}")


def _base_status(level: int) -> dict[str, Any]:
    return {"memory": {"limitBytes": 8 * 1024**3}, "degradation": {"level": level}}


def test_ticks_move_the_pod_to_the_fallback_and_report_what_it_serves(pair: Pair) -> None:
    def serving(variant: Variant) -> Any:
        return lambda status: (
            status.get("activeVariant") == variant
            and status["pods"][0].get("variant") == variant
            and status["degradation"]["level"] == 2
        )

    outcomes, status = asyncio.run(_ticks(pair, _base_status(2), serving(Variant.FALLBACK)))
    # The first tick asked for level 2; the status said primary until the pod reported the swap.
    assert outcomes[0].status_patch["activeVariant"] == Variant.PRIMARY
    # status.model is what the pod reports (fusebox_model_info), not the spec's main/auto:
    # the primary's revision, and no dtype while the fallback's weights are loaded.
    assert status["model"]["revision"] == SERVED_REVISION
    assert status["model"].get("dtype") is None
    assert "fallback-model" in status["degradation"]["tiers"]

    back = {**status, "degradation": {"level": 0}, "policy": {}}
    _, status = asyncio.run(
        _ticks(pair, back, lambda s: s.get("activeVariant") == Variant.PRIMARY
               and s["degradation"]["level"] == 0)
    )  # fmt: skip
    assert status["pods"][0]["variant"] == Variant.PRIMARY
    assert status["model"]["dtype"] in {"float32", "bfloat16", "float16"}  # auto, resolved


def _admin_state(pair: Pair) -> ServerState:
    request = urllib.request.Request(
        f"http://127.0.0.1:{pair.admin_port}{AdminPath.STATE}",
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return ServerState.parse(json.load(response))


def test_tiers_that_leave_out_fallback_model_reach_canned_answers_without_a_swap(
    pair: Pair,
) -> None:
    # The pair's server has a fallback; the spec's tiers leave fallback-model out.
    spec = replace(SPEC, degradation=replace(SPEC.degradation, tiers=SKIPPED_FALLBACK_TIERS))
    loads_before = _admin_state(pair).model_loads

    def at_three(status: dict[str, Any]) -> bool:
        return _admin_state(pair).degradation_level == 3

    _, status = asyncio.run(_ticks(pair, _base_status(3), at_three, spec=spec))
    state = _admin_state(pair)
    assert state.degradation_tiers == SKIPPED_FALLBACK_TIERS
    assert (state.variant, state.target_variant) == (Variant.PRIMARY, Variant.PRIMARY)
    assert state.model_loads == loads_before  # no model was loaded for the tier
    assert status["activeVariant"] == Variant.PRIMARY
    assert status["degradation"]["tiers"] == ["no-streaming", "canned-answers"]
    back = {**status, "degradation": {"level": 0}, "policy": {}}
    asyncio.run(_ticks(pair, back, lambda s: _admin_state(pair).degradation_level == 0,
                       spec=spec))  # fmt: skip


def test_an_action_in_flight_is_retried_with_its_id_and_status_is_written_at_once(
    pair: Pair,
) -> None:
    # An operator that timed out on this gc (outcome unknown) and restarted.
    pending = Action("it-tick-gc", ActionKind.GC, POD.name, "RSS high", time.time())
    state = PolicyState("itsvc")
    state.settle(pending, settled=False)
    status = {**_base_status(0), "policy": state.to_status()}
    finished: list[float] = []
    outcomes, status = asyncio.run(_ticks(pair, status, lambda s: "lastAction" in s, finished))
    first = outcomes[0]
    assert status["lastAction"]["id"] == "it-tick-gc"  # the same id, not a new action
    assert status["lastAction"]["result"].startswith("RSS ")
    assert first.state.in_flight == {}
    assert [e.reason for e in first.events] == [EventReason.GARBAGE_COLLECTED]
    # Written in the same tick, with the pod re-scraped after the action.
    assert first.status_patch and first.samples[0].sampled_at >= finished[0]


SKIPPED_FALLBACK_TIERS = (DegradationTier.NO_STREAMING, DegradationTier.CANNED_ANSWERS)

INT4_SPEC = parse_spec(
    {
        "model": {"name": "chat", "source": "pvc://models/tiny"},
        "replicas": 1,
        "fallback": {"quantization": "int4"},
        "telemetry": {
            "scrapeIntervalSeconds": 1,
            "scrapeTimeoutSeconds": 1,
            "wedgeAfterSeconds": 60,
        },
    }
)


def test_a_pod_that_cannot_load_its_fallback_takes_the_level_is_named_once_and_not_waited_for(
    int4_on_cpu: Pair,
) -> None:
    async def ticks() -> tuple[list[TickOutcome], dict[str, Any], TickMemory]:
        """Ticks at level 2 until the pod reports it, then three more."""
        memory = TickMemory()
        outcomes: list[TickOutcome] = []
        status = _base_status(2)
        async with aiohttp.ClientSession() as session:
            actuator = Actuator(session, None, admin_port=int4_on_cpu.admin_port)

            async def scrape(pods: Sequence[PodView]) -> list[PodSample]:
                return await scrape_all(session, pods, 2.0, "ttft", port=int4_on_cpu.metrics_port)

            deadline = time.monotonic() + 120
            extra = 3
            while extra and time.monotonic() < deadline:
                inputs = TickInputs("ns", "itsvc", INT4_SPEC, status, [POD], TOKEN, 1)
                outcome = await run_tick(inputs, memory, scrape, actuator, time.time)
                outcomes.append(outcome)
                status = {**status, **outcome.status_patch}
                if outcome.samples and outcome.samples[0].degradation_level == 2:
                    extra -= 1
                await asyncio.sleep(1.0)
        assert not extra, f"the pod never reported level 2; last status {status}"
        return outcomes, status, memory

    outcomes, status, memory = asyncio.run(ticks())
    sample = outcomes[-1].samples[0]
    assert (sample.fallback_configured, sample.fallback_available) == (True, False)
    assert sample.fallback_unavailable_reason and "CUDA" in sample.fallback_unavailable_reason
    # The level reached the pod; it swapped nothing, and nobody waits for it to.
    assert (sample.degradation_level, sample.variant) == (2, Variant.PRIMARY)
    assert not converging(POD, sample, outcomes[-1].state, memory.applied, INT4_SPEC)
    named = [e for o in outcomes for e in o.events if e.reason is EventReason.FALLBACK_UNAVAILABLE]
    assert len(named) == 1 and named[0].type == "Warning"
    assert "pod-a" in named[0].message and "CUDA" in named[0].message
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert "cannot swap on pod-a" in degraded["message"]
    assert status["activeVariant"] == Variant.PRIMARY


# --- spec.mode Observe, then Enforce -----------------------------------------------------------


class CountingActuator(Actuator):
    """The real actuator, noting every call it is asked to make on a pod."""

    calls: list[str]

    async def execute(
        self, namespace: str, pod: PodView | None, token: str, action: Action
    ) -> ActionResult:
        self.calls.append(action.id)
        return await super().execute(namespace, pod, token, action)

    async def reconcile_runtime(self, *args: Any, **kwargs: Any) -> RuntimeCall:
        self.calls.append("runtime")
        return await super().reconcile_runtime(*args, **kwargs)


def test_observe_posts_would_act_and_calls_nothing_then_enforce_acts(pair: Pair) -> None:
    observe = replace(SPEC, mode=Mode.OBSERVE)

    async def ticks(
        spec: InferenceServiceSpec, status: dict[str, Any], count: int
    ) -> tuple[list[TickOutcome], dict[str, Any], list[str]]:
        memory = TickMemory()
        outcomes: list[TickOutcome] = []
        async with aiohttp.ClientSession() as session:
            actuator = CountingActuator(session, None, admin_port=pair.admin_port)
            actuator.calls = []

            async def scrape(pods: Sequence[PodView]) -> list[PodSample]:
                # The real sidecar's figures, with the limit set so that the server's
                # RSS is at 97 % of it: the ladder's first rung is due at once.
                samples = await scrape_all(session, pods, 2.0, "ttft", port=pair.metrics_port)
                return [
                    replace(s, memory_limit_bytes=s.rss_bytes / 0.97) if s.rss_bytes else s
                    for s in samples
                ]

            for _ in range(count):
                inputs = TickInputs("ns", "itobserve", spec, status, [POD], TOKEN, 1)
                outcome = await run_tick(inputs, memory, scrape, actuator, time.time)
                outcomes.append(outcome)
                status = {**status, **outcome.status_patch}
                await asyncio.sleep(1.0)
        return outcomes, status, actuator.calls

    outcomes, status, calls = asyncio.run(ticks(observe, _base_status(0), 3))
    assert calls == []  # no action and no runtime state reached the server
    would = [e.message for o in outcomes for e in o.events if e.reason is EventReason.WOULD_ACT]
    assert would and would[0].startswith("would gc pod-a: RSS "), would
    assert status["lastWouldAct"]["type"] == "gc" and status["mode"] == "Observe"
    assert "lastAction" not in status

    outcomes, status, calls = asyncio.run(ticks(SPEC, status, 1))
    [first] = outcomes
    assert first.status_patch["lastAction"]["type"] == "gc"  # the first Enforce tick acted
    result = first.status_patch["lastAction"]["result"]
    assert result.startswith("RSS ") and "replayed" not in result  # the server ran it now
    assert EventReason.GARBAGE_COLLECTED in [e.reason for e in first.events]
    assert status["mode"] == "Enforce"


# --- fusebox.dev/pause-actions, then resumed ---------------------------------------------------


def test_paused_by_annotation_posts_would_act_and_calls_nothing_then_resumes(pair: Pair) -> None:
    paused = {PAUSE_ACTIONS: "INC-7 investigating"}

    async def ticks(
        annotations: dict[str, str], status: dict[str, Any], count: int
    ) -> tuple[list[TickOutcome], dict[str, Any], list[str]]:
        memory = TickMemory()
        outcomes: list[TickOutcome] = []
        async with aiohttp.ClientSession() as session:
            actuator = CountingActuator(session, None, admin_port=pair.admin_port)
            actuator.calls = []

            async def scrape(pods: Sequence[PodView]) -> list[PodSample]:
                # The real sidecar's figures at 97 % of the limit: the first rung is due.
                samples = await scrape_all(session, pods, 2.0, "ttft", port=pair.metrics_port)
                return [
                    replace(s, memory_limit_bytes=s.rss_bytes / 0.97) if s.rss_bytes else s
                    for s in samples
                ]

            for _ in range(count):
                inputs = TickInputs("ns", "itpause", SPEC, status, [POD], TOKEN, 1, annotations)
                outcome = await run_tick(inputs, memory, scrape, actuator, time.time)
                outcomes.append(outcome)
                status = {**status, **outcome.status_patch}
                await asyncio.sleep(1.0)
        return outcomes, status, actuator.calls

    outcomes, status, calls = asyncio.run(ticks(paused, _base_status(0), 2))
    assert calls == []  # no action and no runtime state reached the server
    events = [e for o in outcomes for e in o.events]
    would = [e.message for e in events if e.reason is EventReason.WOULD_ACT]
    assert would and would[0].startswith("would gc pod-a: RSS "), would
    assert f"paused by {PAUSE_ACTIONS} (INC-7 investigating)" in would[0]
    assert [e.reason for e in events].count(EventReason.ACTIONS_PAUSED) == 1
    [entry] = status["incident"]["controls"]
    assert (entry["annotation"], entry["value"]) == (PAUSE_ACTIONS, "INC-7 investigating")
    assert "lastAction" not in status

    outcomes, status, calls = asyncio.run(ticks({}, status, 1))
    [first] = outcomes
    assert first.status_patch["lastAction"]["type"] == "gc"  # the first tick unpaused acted
    assert "replayed" not in first.status_patch["lastAction"]["result"]
    assert EventReason.ACTIONS_RESUMED in [e.reason for e in first.events]
    assert status["incident"]["controls"] == []
