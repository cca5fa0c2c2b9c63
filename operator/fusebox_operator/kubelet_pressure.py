"""The kubelets' own memory signal: which nodes report MemoryPressure, read operator-wide.
The same list says which nodes are not Ready (a pod's own status hides it: serving.py).

Why: the sidecar's MemAvailable is the host's /proc/meminfo, which says
nothing about one node where nodes share a host (localcluster) or where lxcfs
shows the container's figures; the kubelet's `MemoryPressure` condition is
the node's own verdict, from its eviction thresholds (node_pressure.py treats
it as a second trigger of the same relief). Nodes are one list for the whole
operator, at most once per `READ_INTERVAL_SECONDS` whatever the number of
services or ticks: one request per interval against the target of two API
requests per service per minute, served from the API server's watch cache
(`resourceVersion=0`). A watch would cost the `watch` verb on nodes and a
thread for a signal that moves every few minutes at most; the role keeps
`get, list`.

Its own module, beside `kube`, because it is one concern (a shared, timed
read with its own failure rule) and takes the client it is given: any
failure to read (RBAC refusing `list nodes`, an API error, a timeout) is "no
kubelet signal", the floor alone decides, and the log says so once per spell,
not once per tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Protocol

from fusebox_operator.node_pressure import KubeletPressure
from fusebox_operator.observations import NodeNotReady

log = logging.getLogger(__name__)

READ_INTERVAL_SECONDS = 10.0
"""How old the shared reading may be: the kubelet posts its node status every 10 s by
default, and a soft eviction threshold's grace period is minutes."""
REQUEST_TIMEOUT_SECONDS = 15
WAIT_SECONDS = 1.0
"""How long a tick waits for a list under way before it goes on with the last answer."""
MEMORY_PRESSURE = "MemoryPressure"
NODE_READY = "Ready"


class NodeLister(Protocol):
    """What this module needs of kubernetes' CoreV1Api (`kube.Kube.core`)."""

    def list_node(
        self,
        *,
        resource_version: str | None = ...,
        _request_timeout: int = ...,
        _preload_content: bool = ...,
    ) -> Any: ...


def pressured_nodes(node_list: Mapping[str, Any]) -> dict[str, KubeletPressure]:
    """The nodes of a NodeList (as the API serves it) whose MemoryPressure is True.

    False and Unknown (a node whose kubelet stopped posting) are not pressure:
    an Unknown node is NotReady, and its pods are the node lifecycle's to move.
    """
    pressured: dict[str, KubeletPressure] = {}
    for node in node_list.get("items") or []:
        name = (node.get("metadata") or {}).get("name")
        for condition in (node.get("status") or {}).get("conditions") or []:
            if condition.get("type") != MEMORY_PRESSURE or condition.get("status") != "True":
                continue
            if isinstance(name, str) and name:
                pressured[name] = KubeletPressure(
                    name,
                    _epoch(condition.get("lastTransitionTime")),
                    str(condition.get("message") or ""),
                )
    return pressured


def not_ready_nodes(node_list: Mapping[str, Any]) -> dict[str, NodeNotReady]:
    """The nodes of a NodeList whose Ready condition is False or Unknown (the node
    controller sets Unknown once the kubelet stops posting), with its transition time.
    A node with no Ready condition yet (just registered) is not named."""
    found: dict[str, NodeNotReady] = {}
    for node in node_list.get("items") or []:
        name = (node.get("metadata") or {}).get("name")
        for condition in (node.get("status") or {}).get("conditions") or []:
            if condition.get("type") != NODE_READY or condition.get("status") == "True":
                continue
            if isinstance(name, str) and name:
                found[name] = NodeNotReady(name, _epoch(condition.get("lastTransitionTime")))
    return found


def _epoch(moment: Any) -> float | None:
    """An API timestamp ('2026-12-06T03:20:11Z') as epoch seconds; None when unreadable."""
    if not isinstance(moment, str):
        return None
    try:
        return datetime.fromisoformat(moment.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class KubeletPressureReader:
    """The nodes under kubelet MemoryPressure, shared by every service's ticks.

    `pressured()` lists the Nodes when the last list (or failed try) began
    longer than the interval ago, else answers the last one: ticks that ask
    while a list is under way get the one before (at most an interval older)
    rather than wait on the API server or send a list of their own.
    """

    def __init__(
        self,
        core: NodeLister,
        interval_seconds: float = READ_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._core = core
        self._interval_seconds = interval_seconds
        self._clock = clock
        self._read_at: float | None = None
        self._last: dict[str, KubeletPressure] | None = None
        self._not_ready: dict[str, NodeNotReady] | None = None  # from the same list
        self._unreadable = False  # told in the log; told again only once readable
        self._listing: asyncio.Task[None] | None = None

    async def pressured(self) -> dict[str, KubeletPressure] | None:
        """Node -> its kubelet's MemoryPressure; None: no kubelet signal (unreadable).

        A tick waits at most `WAIT_SECONDS` for a list under way, then goes on with
        the last answer while the list finishes in the background: an API server
        that is restarting can swallow a connection attempt for seconds, and the
        pods' ticks (a new operator's first admin calls among them) must not wait
        on a signal that moves every few minutes at most.
        """
        loop = asyncio.get_running_loop()
        if self._listing is not None and self._listing.get_loop() is not loop:
            self._listing = None  # begun in an event loop that has ended
        now = self._clock()
        due = self._read_at is None or now - self._read_at >= self._interval_seconds
        if self._listing is None and due:
            # Marked before the list: a failed try counts too, so an API that refuses
            # is asked once per interval.
            self._read_at = now
            self._listing = loop.create_task(self._read())
        if self._listing is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._listing), WAIT_SECONDS)
        return self._last

    def not_ready(self) -> dict[str, NodeNotReady] | None:
        """Node -> its Ready condition where not True, from the list `pressured` last
        read (ask that first); None: unreadable, or not read yet."""
        return self._not_ready

    async def _read(self) -> None:
        try:
            body = await asyncio.to_thread(self._list)
        # Whatever the client raises (ApiException, urllib3's errors, a body that is
        # not a NodeList) means the same here: no signal, the floor alone decides.
        except Exception as error:
            self._last = self._not_ready = None
            if not self._unreadable:
                self._unreadable = True
                log.warning(
                    "cannot read the Nodes' MemoryPressure (%s): node memory pressure "
                    "is judged from the sidecars' MemAvailable only until they are readable",
                    _why(error),
                )
            return
        finally:
            self._listing = None
        self._last = pressured_nodes(body)
        self._not_ready = not_ready_nodes(body)
        if self._unreadable:
            self._unreadable = False
            log.info("the Nodes' MemoryPressure is readable again")

    def _list(self) -> Mapping[str, Any]:
        # Raw JSON: typing every Node (its images, its addresses) to read one condition
        # would cost more than the list itself.
        answer = self._core.list_node(
            resource_version="0",
            _request_timeout=REQUEST_TIMEOUT_SECONDS,
            _preload_content=False,
        )
        body = json.loads(answer.data)
        if not isinstance(body, dict):
            raise ValueError(f"not a NodeList: {type(body).__name__}")
        return body


def _why(error: Exception) -> str:
    """'403 Forbidden' for the client's ApiException, else the error's own words."""
    status, reason = getattr(error, "status", None), getattr(error, "reason", None)
    if status is not None:
        return f"{status} {reason or ''}".strip()
    return f"{type(error).__name__}: {error}"
