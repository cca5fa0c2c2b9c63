"""Three spec fields whose effect is shown across the process boundary: whole operator
ticks (tick.run_tick, no kopf) against the real server and sidecar on loopback, each
run twice on the same real inputs with two values of the field, and the decision
differs.

- breaker.halfOpen.minSuccessRate: the same real request outcomes while half-open
  (three answered, one timed out by the server: 75 %) close the breaker at 0.5 and
  reopen it at 0.99.
- breaker.resource.gpuMemory.ratioOfVRAM: the same GPU memory readings (75 % of VRAM
  and growing) climb the ladder, a gc run by the real server, at 0.7, and do nothing
  at 0.8.
- autoscaling.scaleUpStabilizationSeconds: the same load (requests in flight on the
  real server) after an idle tick waits out a 30 s window, then scales once the
  clock is past it; at 0 it scales at once.

GPU memory is the only simulated input, at the hardware edge: the sidecar imports a
`pynvml` of this test's (one device whose memory the test writes to a file), so the
reading travels as it would from a GPU: sidecar's NVML reader, its /metrics, the
operator's scrape, the policy. Failures and load come from the server's own fault
injection (`slow`) and its request timeout, switched through the admin API.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bench import loopback
from fusebox_contract.admin import AdminPath, FaultsRequest
from fusebox_contract.names import BreakerState, EventReason, Fault
from fusebox_contract.wiring import FAULTS_ENV
from fusebox_operator.actuator import Actuator
from fusebox_operator.observations import PodSample, PodView
from fusebox_operator.policy_state import PolicyState
from fusebox_operator.rollout import Degradation
from fusebox_operator.spec import InferenceServiceSpec, parse_spec
from fusebox_operator.status import EventRecord
from fusebox_operator.telemetry import scrape_all
from fusebox_operator.tick import TickInputs, TickMemory, TickOutcome, run_tick

from .test_operator_io import POD, TOKEN

GIB = 1024**3
MIB = 1024**2
VRAM_BYTES = 16 * GIB
REQUEST_TIMEOUT_SECONDS = 2  # the server's --request-timeout: a slowed request gets a 504

# NVML at the hardware edge: the names the sidecar's NvmlReader calls, one device whose
# memory is what the test last wrote to READINGS.
FAKE_PYNVML = '''"""NVML for the field-effects test: one GPU whose memory the test writes."""
import json

READINGS = {readings!r}
NVML_ERROR_GPU_IS_LOST = 15


class NVMLError(Exception):
    value = 999


class _Memory:
    def __init__(self, used, total):
        self.used, self.total, self.free = used, total, total - used


def nvmlInit():
    pass


def nvmlShutdown():
    pass


def nvmlDeviceGetCount():
    return 1


def nvmlDeviceGetHandleByIndex(index):
    return index


def nvmlDeviceGetMemoryInfo(handle):
    with open(READINGS) as file:
        reading = json.load(file)
    return _Memory(reading["used"], reading["total"])


def nvmlDeviceGetComputeRunningProcesses(handle):
    return []
'''


@dataclass
class Served:
    api_url: str
    admin_url: str
    admin_port: int
    metrics_port: int
    gpu_readings: Path

    def gpu_memory(self, used_bytes: int) -> None:
        """What NVML reports as used on the device from the next scrape on."""
        temporary = self.gpu_readings.with_suffix(".tmp")
        temporary.write_text(json.dumps({"used": used_bytes, "total": VRAM_BYTES}))
        temporary.replace(self.gpu_readings)

    def slow(self, millis_per_token: int) -> None:
        """The server's `slow` fault, through the admin API."""
        body = json.dumps(FaultsRequest({Fault.SLOW: millis_per_token}).encode()).encode()
        request = urllib.request.Request(
            self.admin_url + AdminPath.FAULTS,
            data=body,
            method="PUT",
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200

    def complete(self, max_tokens: int) -> int:
        """One completion on the public API; its HTTP status."""
        body = {"model": loopback.SERVED_MODEL_NAME, "prompt": "hello", "max_tokens": max_tokens}
        request = urllib.request.Request(
            self.api_url + "/v1/completions",
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                response.read()
                return int(response.status)
        except urllib.error.HTTPError as error:
            with error:
                return int(error.code)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The real server (the `slow` fault armed, a 2 s request timeout) and the real
    sidecar, whose NVML is the test's device."""
    tmp = tmp_path_factory.mktemp("field-effects")
    model = loopback.generated_model("tiny", quiet=True)
    token_file = loopback.write_token_file(tmp / "token", TOKEN)
    stats = tmp / "stats.json"
    nvml_dir = tmp / "nvml"
    nvml_dir.mkdir()
    readings = tmp / "gpu.json"
    (nvml_dir / "pynvml.py").write_text(FAKE_PYNVML.format(readings=str(readings)))
    api_port, admin_port = loopback.free_port(), loopback.free_port()
    metrics_port = loopback.free_port()
    ports = Served(
        f"http://{loopback.HOST}:{api_port}",
        f"http://{loopback.HOST}:{admin_port}",
        admin_port,
        metrics_port,
        readings,
    )
    ports.gpu_memory(1 * GIB)
    command = loopback.server_command(
        model,
        api_port=api_port,
        admin_port=admin_port,
        token_file=token_file,
        stats_path=stats,
        device="cpu",
        extra_flags=("--request-timeout", str(REQUEST_TIMEOUT_SECONDS)),
    )
    server_log = open(tmp / "server.log", "wb")  # noqa: SIM115
    sidecar_log = open(tmp / "sidecar.log", "wb")  # noqa: SIM115
    server = subprocess.Popen(
        command,
        env={**os.environ, FAULTS_ENV: "slow:0"},
        stdout=server_log,
        stderr=subprocess.STDOUT,
    )
    sidecar_path = os.pathsep.join(p for p in (str(nvml_dir), os.environ.get("PYTHONPATH")) if p)
    sidecar = subprocess.Popen(
        [
            *(sys.executable, "-m", "fusebox_sidecar"),
            *("--stats-file", str(stats), "--host", loopback.HOST, "--port", str(metrics_port)),
        ],
        env={**os.environ, "PYTHONPATH": sidecar_path},
        stdout=sidecar_log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 180
        while not asyncio.run(_loaded(ports)):
            assert server.poll() is None, (tmp / "server.log").read_text()[-3000:]
            assert sidecar.poll() is None, (tmp / "sidecar.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "server and sidecar not ready in 180 s"
            time.sleep(0.5)
        yield ports
    finally:
        for process in (sidecar, server):
            loopback.stop(process, grace_seconds=20)
        server_log.close()
        sidecar_log.close()


async def _scrape(served: Served) -> PodSample:
    async with aiohttp.ClientSession() as session:
        (sample,) = await scrape_all(session, [POD], 2.0, "ttft", port=served.metrics_port)
        return sample


async def _loaded(served: Served) -> bool:
    """The sidecar answers with the server's model loaded and the test's GPU in it."""
    sample = await _scrape(served)
    return sample.ok and sample.model_loaded is True and sample.gpu_memory_total_bytes is not None


def _spec(extra: dict[str, Any]) -> InferenceServiceSpec:
    return parse_spec(
        {
            "model": {"name": "chat", "source": "pvc://models/tiny"},
            "replicas": 1,
            "telemetry": {
                "scrapeIntervalSeconds": 1,
                "scrapeTimeoutSeconds": 1,
                "wedgeAfterSeconds": 60,
            },
            **extra,
        }
    )


@dataclass
class Ticks:
    """Ticks as the kopf timer runs them, each status patch applied to the next."""

    served: Served
    session: aiohttp.ClientSession
    spec: InferenceServiceSpec
    memory: TickMemory = field(default_factory=TickMemory)
    status: dict[str, Any] = field(default_factory=lambda: {"memory": {"limitBytes": 8 * GIB}})
    events: list[EventRecord] = field(default_factory=list)

    async def scrape(self, pods: Sequence[PodView]) -> list[PodSample]:
        return await scrape_all(self.session, pods, 2.0, "ttft", port=self.served.metrics_port)

    async def once(self, clock: Callable[[], float] = time.time) -> TickOutcome:
        actuator = Actuator(self.session, None, admin_port=self.served.admin_port)
        inputs = TickInputs("ns", "iteffects", self.spec, self.status, [POD], TOKEN, 1)
        outcome = await run_tick(inputs, self.memory, self.scrape, actuator, clock)
        self.status = {**self.status, **outcome.status_patch}
        self.events += outcome.events
        return outcome

    def reasons(self) -> list[EventReason]:
        return [event.reason for event in self.events]


async def _server_closed_again(served: Served, session: aiohttp.ClientSession) -> None:
    """The server back to a closed breaker at level 0, whatever the ticks told it."""
    actuator = Actuator(session, None, admin_port=served.admin_port)
    target = (BreakerState.CLOSED, 100, Degradation(0))
    call = await actuator.reconcile_runtime(POD, TOKEN, target, None, {})
    assert call.reached is not False, call


# --- breaker.halfOpen.minSuccessRate ------------------------------------------------------------


def _half_open_verdict(served: Served, min_success_rate: float) -> Ticks:
    """A half-open breaker's verdict on three answered requests and one timed out."""
    spec = _spec(
        {
            "breaker": {
                "latency": {"p99ThresholdMillis": 60000},
                "halfOpen": {
                    "admitPercent": 100,
                    "minRequests": 4,
                    "p99RecoveryMillis": 30000,
                    "minSuccessRate": min_success_rate,
                },
            }
        }
    )

    async def go() -> Ticks:
        half_open = PolicyState("iteffects")
        half_open.breaker, half_open.breaker_since = BreakerState.HALF_OPEN, time.time()
        async with aiohttp.ClientSession() as session:
            ticks = Ticks(served, session, spec, TickMemory(policy=half_open))
            try:
                # The first tick takes the counters as they are and tells the server
                # HALF_OPEN (admitting all); only what follows decides.
                await ticks.once()
                answered = [await asyncio.to_thread(served.complete, 2) for _ in range(3)]
                assert answered == [200, 200, 200]
                served.slow(REQUEST_TIMEOUT_SECONDS * 1000)
                try:
                    timed_out = await asyncio.to_thread(served.complete, 4)
                finally:
                    served.slow(0)
                assert timed_out == 504
                deadline = time.monotonic() + 30
                while ticks.status["breaker"]["state"] == BreakerState.HALF_OPEN.status_name:
                    assert time.monotonic() < deadline, ticks.status["breaker"]
                    await asyncio.sleep(1.0)
                    await ticks.once()
            finally:
                await _server_closed_again(served, session)
        return ticks

    return asyncio.run(go())


def test_half_open_closes_at_min_success_rate_half_and_reopens_at_99_on_the_same_outcomes(
    served: Served,
) -> None:
    lenient = _half_open_verdict(served, 0.5)
    breaker = lenient.status["breaker"]
    assert breaker["state"] == BreakerState.CLOSED.status_name
    assert "4 half-open requests" in breaker["reason"]
    assert "success 75.0% (need >= 50.0%)" in breaker["reason"]
    assert EventReason.BREAKER_CLOSED in lenient.reasons()

    strict = _half_open_verdict(served, 0.99)
    breaker = strict.status["breaker"]
    assert breaker["state"] == BreakerState.OPEN.status_name
    assert "4 half-open requests" in breaker["reason"]
    assert "success 75.0% (need >= 99.0%)" in breaker["reason"]
    assert breaker["trips"] == 1
    assert EventReason.BREAKER_OPENED in strict.reasons()


# --- breaker.resource.gpuMemory.ratioOfVRAM -----------------------------------------------------


def _gpu_ladder(served: Served, ratio_of_vram: float) -> Ticks:
    """Five ticks while NVML reports 75 % of VRAM used, 16 MiB more each half second: well
    above the default growth, and far enough from full that the ladder starts at gc."""
    spec = _spec({"breaker": {"resource": {"gpuMemory": {"ratioOfVRAM": ratio_of_vram}}}})

    async def go() -> Ticks:
        async with aiohttp.ClientSession() as session:
            ticks = Ticks(served, session, spec)
            try:
                for step in range(5):
                    served.gpu_memory(12 * GIB + step * 16 * MIB)
                    await ticks.once()
                    await asyncio.sleep(0.5)
            finally:
                served.gpu_memory(1 * GIB)
                await _server_closed_again(served, session)
        return ticks

    return asyncio.run(go())


def test_gpu_memory_over_ratio_of_vram_climbs_the_ladder_and_under_it_does_not(
    served: Served,
) -> None:
    low = _gpu_ladder(served, 0.7)
    actions = low.status.get("recentActions") or []
    assert [a["type"] for a in actions] == ["gc"], actions
    assert actions[0]["reason"].startswith("GPU memory 12")
    assert "of VRAM" in actions[0]["reason"]
    assert actions[0]["result"].startswith("RSS ")  # the real server ran it
    assert EventReason.GARBAGE_COLLECTED in low.reasons()

    high = _gpu_ladder(served, 0.8)
    assert high.status.get("recentActions") in (None, [])
    assert "lastAction" not in high.status
    assert EventReason.GARBAGE_COLLECTED not in high.reasons()
    # It saw the same device: the readings reached the status.
    assert high.status["pods"][0]["gpuMemoryBytes"] >= 12 * GIB


# --- autoscaling.scaleUpStabilizationSeconds ----------------------------------------------------

IN_FLIGHT = 6


class Load:
    """IN_FLIGHT requests kept in flight on the real server, each slowed to about a second."""

    def __init__(self, served: Served) -> None:
        self.served = served
        self.stop = threading.Event()
        self.pool = ThreadPoolExecutor(IN_FLIGHT)

    def __enter__(self) -> Load:
        self.served.slow(250)
        for _ in range(IN_FLIGHT):
            self.pool.submit(self._keep_one)
        return self

    def _keep_one(self) -> None:
        while not self.stop.is_set():
            self.served.complete(4)

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.served.slow(0)
        self.pool.shutdown(wait=True)


async def _until_in_flight(served: Served, wanted: Callable[[float], bool]) -> None:
    """Until the sidecar reports requests in flight (queued and running) as wanted."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        sample = await _scrape(served)
        if wanted((sample.queue_length or 0) + (sample.requests_running or 0)):
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"the load never showed as wanted: {sample}")


def _scale_up(served: Served, window_seconds: int) -> list[tuple[TickOutcome, dict[str, Any]]]:
    """An idle tick, then ticks under load: now, and with the clock past the window;
    each tick's outcome with status.autoscaling after it."""
    spec = _spec(
        {
            "autoscaling": {
                "minReplicas": 1,
                "maxReplicas": 4,
                "metric": "inFlight",
                "targetPerReplica": 1,
                "scaleUpStabilizationSeconds": window_seconds,
            }
        }
    )

    async def go() -> list[tuple[TickOutcome, dict[str, Any]]]:
        seen: list[tuple[TickOutcome, dict[str, Any]]] = []
        async with aiohttp.ClientSession() as session:
            ticks = Ticks(served, session, spec)

            async def tick(clock: Callable[[], float] = time.time) -> None:
                outcome = await ticks.once(clock)
                seen.append((outcome, dict(ticks.status["autoscaling"])))

            try:
                await _until_in_flight(served, lambda load: load == 0)
                await tick()
                with Load(served):
                    await _until_in_flight(served, lambda load: load >= 4)
                    await tick()
                    await tick(lambda: time.time() + window_seconds + 1)
            finally:
                await _server_closed_again(served, session)
        return seen

    return asyncio.run(go())


def _scaled_up(outcome: TickOutcome) -> bool:
    return EventReason.SCALED_UP in [event.reason for event in outcome.events]


def test_scale_up_waits_out_a_30s_window_and_acts_at_once_at_0(served: Served) -> None:
    (idle, _), (loaded, scaling), (past_window, _) = _scale_up(served, 30)
    assert idle.replicas == 1 and not _scaled_up(idle)
    assert scaling["recommendedReplicas"] > 1  # the load asked for more
    # The idle tick a moment ago is inside the window: held at 1.
    assert loaded.replicas == 1 and not _scaled_up(loaded)
    assert past_window.replicas is not None and past_window.replicas > 1
    assert _scaled_up(past_window)

    (idle, _), (loaded, scaling), _ = _scale_up(served, 0)
    assert idle.replicas == 1 and not _scaled_up(idle)
    assert scaling["recommendedReplicas"] > 1
    # The same load after the same idle tick: scaled at once.
    assert loaded.replicas == scaling["recommendedReplicas"] == scaling["replicas"]
    assert _scaled_up(loaded)
