"""Allocations failing inside the real server: clean 503s with Retry-After, then recovery.

The server runs under `faultshim/malloc_fault.c` (compiled here with the system
cc and preloaded): with the fault on, a share of the allocations the Python
interpreter and torch's CPU allocator ask for return NULL. Steady traffic from
the real `openai` client (chat, streamed chat, completions) runs before, during
and after. Why a shim and not libfiu: see the C file's header.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fusebox_server_harness import MODEL_NAME, ServerProcess

from fusebox_contract.names import RequestOutcome
from fusebox_server.errors import ALLOCATION_FAILURE_MARKERS

SHIM_SOURCE = Path(__file__).parent / "faultshim" / "malloc_fault.c"
FAILURES_PER_MILLION = 300
WORKERS = 4
# The fault phase ends once this many allocation failures were answered (or it gives up).
WANTED_MEMORY_ANSWERS = 40
FAULT_PHASE_LIMIT_SECONDS = 90.0
# Where an allocation failure leaves a connection without an HTTP answer, as the server
# logs it: inside asyncio and uvicorn while a connection is accepted, set up or read
# (no request exists yet), or while the answer's own bytes are written after its status
# went out (`response_cut` from the edge; uvicorn's "Exception in ASGI application" with
# an allocation failure when Starlette's last-resort handler re-raises after answering). Each
# explains at most one dropped connection.
UNANSWERABLE_FAILURES = re.compile(
    r"Fatal error: protocol\.data_received\(\) call failed"
    r"|Fatal read error on socket transport"
    r"|Exception in callback (H11Protocol\.|_Selector\w*Transport\."
    r"|BaseSelectorEventLoop\._accept_connection)"
    r"|response_cut"
)
UVICORN_APP_ERROR = "Exception in ASGI application"
# A failure whose own log line was lost to a failed allocation leaves one of these
# instead: stdlib logging's report of a handler that raised (raw, on stderr), or
# asyncio's second line when its default exception handler itself raised.
LOST_LOG_LINE = "--- Logging error ---"
EXCEPTION_HANDLER_FAILED = "Exception in default exception handler"


def _unanswerable(event: dict[str, Any]) -> bool:
    name = str(event.get("event", ""))
    if name.startswith(EXCEPTION_HANDLER_FAILED):
        return True
    if name.startswith(UVICORN_APP_ERROR):
        raised = str(event.get("exc_info", ""))
        return any(word in raised for word in ("MemoryError", *ALLOCATION_FAILURE_MARKERS))
    return UNANSWERABLE_FAILURES.match(name) is not None


CLIENT_TIMEOUT_SECONDS = 20.0


@dataclass
class MallocFault:
    """The shim's control file: failures per million allocations, 0 = off."""

    control: Path
    count: Path

    def set(self, per_million: int) -> None:
        # In place, never truncated: the server maps this file.
        with self.control.open("r+b") as file:
            file.write(f"{per_million:08d}".encode())

    @property
    def injected(self) -> int:
        return int.from_bytes(self.count.read_bytes()[:8], "little")


@pytest.fixture(scope="module")
def malloc_fault() -> Iterator[MallocFault]:
    workdir = Path(tempfile.mkdtemp(prefix="fusebox-malloc-fault-"))
    compiler = shutil.which("cc")
    assert compiler, "the system C compiler (cc) builds the malloc fault shim"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-O2", "-o", str(workdir / "malloc_fault.so"),
         str(SHIM_SOURCE), "-ldl"],
        check=True,
    )  # fmt: skip
    fault = MallocFault(workdir / "control", workdir / "count")
    fault.control.write_bytes(b"00000000")
    fault.count.write_bytes(bytes(16))
    yield fault
    shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def faulty_server(start_server: Any, malloc_fault: MallocFault) -> ServerProcess:
    server: ServerProcess = start_server(
        flags={"max-concurrency": 4, "max-queue": 16, "max-new-tokens": 64},
        env={
            "LD_PRELOAD": str(malloc_fault.control.parent / "malloc_fault.so"),
            "MALLOC_FAULT_CONTROL": str(malloc_fault.control),
            "MALLOC_FAULT_COUNT": str(malloc_fault.count),
        },
    )
    return server


@dataclass
class Tally:
    """What the clients saw, by kind; `odd` keeps anything outside the contract."""

    kinds: Counter[str] = field(default_factory=Counter)
    odd: list[str] = field(default_factory=list)

    @property
    def memory_answers(self) -> int:
        return self.kinds["503 out_of_memory"] + self.kinds["stream error out_of_memory"]

    @property
    def total(self) -> int:
        return sum(self.kinds.values())


def _error_kind(status: int, response: httpx.Response, tally: Tally) -> str:
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        tally.odd.append(f"{status} not OpenAI-shaped: {response.text[:300]!r}")
        return f"{status} unshaped"
    retry_after = response.headers.get("retry-after", "")
    if status in (429, 503) and not (retry_after.isdigit() and int(retry_after) > 0):
        tally.odd.append(f"{status} {error.get('code')} without Retry-After")
    if not isinstance(error.get("message"), str) or not error.get("type"):
        tally.odd.append(f"{status} error without message or type: {error!r}")
    if status not in (200, 429, 503):
        tally.odd.append(f"{status} {error!r}")
    if "Traceback" in response.text:
        tally.odd.append(f"{status} body carries a traceback")
    return f"{status} {error.get('code')}"


async def _one_request(client: openai.AsyncOpenAI, turn: int, tally: Tally) -> None:
    kind = turn % 3
    try:
        if kind == 0:
            chat = await client.chat.completions.create(
                model=MODEL_NAME,
                messages=[{"role": "user", "content": f"Hello number {turn}"}],
                max_tokens=8,
                temperature=0,
            )
            assert chat.choices[0].message.content is not None
        elif kind == 1:
            stream = await client.chat.completions.create(
                model=MODEL_NAME,
                messages=[{"role": "user", "content": "Tell me a story"}],
                max_tokens=16,
                temperature=0,
                stream=True,
            )
            finish = None
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
            assert finish is not None, "a stream ended without a finish reason or an error event"
        else:
            completion = await client.completions.create(
                model=MODEL_NAME, prompt="Once upon a time", max_tokens=8, temperature=0
            )
            assert completion.choices[0].text is not None
        tally.kinds["200"] += 1
    except openai.APIStatusError as error:
        tally.kinds[_error_kind(error.status_code, error.response, tally)] += 1
    except openai.APIConnectionError as error:  # includes timeouts
        tally.kinds[f"dropped {type(error.__cause__).__name__}"] += 1
    except openai.APIError as error:  # an error event inside a 200 stream
        body = error.body if isinstance(error.body, dict) else {}
        tally.kinds[f"stream error {body.get('code')}"] += 1
        if body.get("code") != "out_of_memory":
            tally.odd.append(f"stream error: {body!r}")


async def _traffic(url: str, tally: Tally, done: asyncio.Event, turns: Iterator[int]) -> None:
    async with openai.AsyncOpenAI(
        base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=CLIENT_TIMEOUT_SECONDS
    ) as client:

        async def worker() -> None:
            while not done.is_set():
                await _one_request(client, next(turns), tally)

        await asyncio.gather(*(worker() for _ in range(WORKERS)))


async def _run_phases(
    server: ServerProcess, fault: MallocFault
) -> tuple[Tally, Tally, Tally, float]:
    """Steady traffic: fault off, on (until enough failures were answered), off again."""
    phases = (Tally(), Tally(), Tally())
    turn_numbers = iter(range(10**9))
    switched_off_at = 0.0
    for index, tally in enumerate(phases):
        done = asyncio.Event()
        if index == 1:
            fault.set(FAILURES_PER_MILLION)
        traffic = asyncio.create_task(_traffic(server.url, tally, done, turn_numbers))
        deadline = time.monotonic() + (FAULT_PHASE_LIMIT_SECONDS if index == 1 else 60.0)
        while time.monotonic() < deadline and not traffic.done():
            enough = (
                tally.memory_answers >= WANTED_MEMORY_ANSWERS and tally.total >= 100
                if index == 1
                else tally.total >= 30
            )
            if enough:
                break
            await asyncio.sleep(0.05)
        if index == 1:
            fault.set(0)
            switched_off_at = time.time()
        done.set()
        await traffic
    return (*phases, switched_off_at)


def _server_log_events(server: ServerProcess) -> list[dict[str, Any]]:
    events = []
    for line in server.log_text().splitlines():
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    return events


def test_malloc_failures_get_503s_with_retry_after_and_the_server_recovers(
    faulty_server: ServerProcess, malloc_fault: MallocFault
) -> None:
    server = faulty_server
    before, during, after, switched_off_at = asyncio.run(_run_phases(server, malloc_fault))
    print(
        f"\nbefore: {dict(before.kinds)}\nduring: {dict(during.kinds)}\nafter: {dict(after.kinds)}"
    )
    print(f"allocation failures injected: {malloc_fault.injected}")

    # The process lived through it.
    assert server.process.poll() is None, server.log_text()[-4000:]
    assert server.state().pid == server.pid

    # Before and after: every request succeeds.
    assert set(before.kinds) == {"200"}, before
    assert set(after.kinds) == {"200"}, after

    # During: 200, or an OpenAI-shaped 503 out_of_memory (429 when the queue is full) with
    # Retry-After, or a stream that ends with an out_of_memory error event. Never a 500.
    assert during.memory_answers >= WANTED_MEMORY_ANSWERS, during
    assert during.odd == [], during.odd
    answered = {"200", "503 out_of_memory", "429 queue_full", "stream error out_of_memory"}
    dropped = {kind: n for kind, n in during.kinds.items() if kind.startswith("dropped")}
    assert set(during.kinds) - set(dropped) <= answered, during

    # A dropped connection only where the server could not answer at all.
    events = _server_log_events(server)
    unanswerable = [e for e in events if _unanswerable(e)]
    lost_lines = server.log_text().count(LOST_LOG_LINE)
    assert sum(dropped.values()) <= len(unanswerable) + lost_lines, (
        dropped,
        [e["event"][:80] for e in events if e.get("level") in ("warning", "error")],
    )

    # Each out_of_memory answer is counted as a failed request (state, below), its log line
    # names the reason (a log line can itself be lost to a failed allocation: not counted).
    oom_lines = [
        e for e in events if e.get("event") == "request" and e.get("error") == "out_of_memory"
    ]
    assert oom_lines
    assert {(e["status"], e["outcome"]) for e in oom_lines} == {(503, "failed")}

    # Recovered: healthy, ready, every admission slot free, the stats file written again.
    assert server.client.get("/healthz").status_code == 200
    assert server.client.get("/readyz").status_code == 200
    settled = server.wait_for(
        lambda: (lambda s: s if s.running == 0 and s.queue_length == 0 else None)(server.state()),
        what="no request running or queued",
    )
    assert settled.worker_active == 0
    # Counted as failed, not rejected. Under the shim a counter's own update can fail
    # (an int above 256 is an allocation), so all but a tenth must show.
    counts = settled.requests
    assert counts[RequestOutcome.FAILED] >= 0.9 * during.memory_answers, counts
    assert counts[RequestOutcome.REJECTED] <= during.kinds["429 queue_full"], counts
    server.wait_for(
        lambda: server.stats()["written_at"] > switched_off_at, what="a fresh stats file"
    )
