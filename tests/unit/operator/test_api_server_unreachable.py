"""An API server the operator cannot reach: every call through the client library is a
KubeError that names it (never the request's URL or token), an action that needed it
stays in flight instead of escaping the tick, and the tick still writes its status.

The API server is a real socket on loopback: a port nothing listens on (refused), or
one that accepts and hangs up at once (the connection reset mid-request)."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator, Sequence

import aiohttp
import kubernetes
import pytest

from fusebox_operator.actuator import Actuator
from fusebox_operator.kube import Kube, KubeError
from fusebox_operator.observations import PodSample, PodView
from fusebox_operator.policy_state import Action, ActionKind
from fusebox_operator.spec import parse_spec
from fusebox_operator.tick import TickInputs, TickMemory, run_tick

TOKEN = "s3cret-bearer-token"
T0 = 1_800_000_000.0
POD = PodView("p", "uid-p", "127.0.0.1", "Running", True, True, True, 0, False, False)
RESTART = Action("abcd1234-000007-restart", ActionKind.RESTART, "p", "wedged", T0)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def hanging_up() -> Iterator[int]:
    """A port that accepts each connection and closes it before answering."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except TimeoutError:
                continue
            connection.recv(65536)
            connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield int(server.getsockname()[1])
    stop.set()
    thread.join()
    server.close()


def kube_at(port: int) -> Kube:
    configuration = kubernetes.client.Configuration()
    configuration.host = f"http://127.0.0.1:{port}"
    configuration.retries = 0
    configuration.api_key = {"authorization": f"Bearer {TOKEN}"}
    return Kube(configuration)


def test_a_delete_no_api_server_answers_is_a_kube_error_naming_it_without_the_token() -> None:
    with pytest.raises(KubeError) as refused:
        asyncio.run(kube_at(free_port()).delete_pod("team", "p"))
    message = str(refused.value)
    assert message.startswith("delete pod team/p: the API server is unreachable (")
    assert TOKEN not in message and "127.0.0.1" not in message


def test_a_pod_list_cut_off_mid_request_is_a_kube_error_naming_the_api_server(
    hanging_up: int,
) -> None:
    with pytest.raises(KubeError, match=r"^pods in team: the API server is unreachable \("):
        asyncio.run(kube_at(hanging_up).list_pods("team", {"app": "chat"}, "chat"))


async def act(kube: Kube, action: Action) -> tuple[str, bool]:
    async with aiohttp.ClientSession() as session:
        result = await Actuator(session, kube).execute("team", POD, "token", action)
    return result.text, result.settled


def test_a_restart_no_api_server_answers_stays_in_flight() -> None:
    text, settled = asyncio.run(act(kube_at(free_port()), RESTART))
    assert not settled
    assert text.startswith("in flight: delete pod team/p: the API server is unreachable")


class BrokenKube(Kube):
    """A client error nobody classified: the actuator must still answer."""

    async def delete_pod(self, namespace: str, name: str, grace_seconds: int | None = None) -> bool:
        raise ValueError("an answer the client could not read")


def test_an_action_failing_in_a_way_nobody_foresaw_stays_in_flight() -> None:
    text, settled = asyncio.run(act(BrokenKube(kubernetes.client.Configuration()), RESTART))
    assert (text, settled) == ("in flight: ValueError (see the operator's log)", False)


def test_a_tick_whose_restart_finds_no_api_server_writes_status_and_keeps_it_in_flight() -> None:
    spec = parse_spec({"model": {"name": "chat", "source": "pvc://models/tiny"}})
    wedged = PodSample("p", T0, model_loaded=True, stats_age_seconds=600.0,
                       heartbeat_age_seconds=600.0)  # fmt: skip

    async def scrape(targets: Sequence[PodView]) -> list[PodSample]:
        return [wedged for t in targets if t.name == "p"]

    async def tick() -> tuple[TickMemory, dict[str, object]]:
        memory = TickMemory()
        async with aiohttp.ClientSession() as session:
            actuator = Actuator(session, kube_at(free_port()))
            inputs = TickInputs("team", "svc", spec, {}, [POD], "token", 1)
            outcome = await run_tick(inputs, memory, scrape, actuator, lambda: T0)
        return memory, outcome.status_patch

    memory, status = asyncio.run(tick())
    assert memory.policy is not None
    (in_flight,) = memory.policy.in_flight.values()
    assert (in_flight.kind, in_flight.pod) == (ActionKind.RESTART, "p")
    assert status["updatedAt"] and status["conditions"]
