"""Carry out the policy's actions on pods through the server's admin API.

Why: actions must be safe to repeat (the operator can crash between acting
and recording), so every admin call carries the policy's idempotency id and
the server replays a recorded result instead of acting twice. Each pod's
runtime state (breaker, admit share, degradation level) is reconciled to the
desired one on every loop, so pods that start or restart later converge too.
A call whose outcome is unknown (it timed out, the connection broke) is
reported unsettled: the tick retries it later with the same id, so a model
load slower than the timeout is waited for, never requested twice.
The admin token is passed in, used in one header, and never logged.
Paths and bodies are the contract's (`fusebox_contract.admin`): requests are
encoded there, and an answer it cannot parse is a failed call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, replace
from typing import TypeVar

import aiohttp

from fusebox_contract import admin
from fusebox_contract.names import ActionType, BreakerState, DegradationLevel, Variant
from fusebox_contract.wiring import Port
from fusebox_operator.kube import Kube, KubeError
from fusebox_operator.observations import PodSample, PodView
from fusebox_operator.operator_metrics import METRICS, AdminErrorKind
from fusebox_operator.policy_state import Action, ActionKind
from fusebox_operator.rollout import Degradation
from fusebox_operator.status import human_bytes

ADMIN_TIMEOUT_SECONDS = 10.0
LOAD_TIMEOUT_SECONDS = 300.0
"""unload/load/swap move a whole model: minutes for a large one from a PVC. A
load slower still is not lost: the retry reuses the id and the server makes
the duplicate wait for the first call's result."""
STATE_TIMEOUT_SECONDS = 5.0  # a breaker flip is instant unless the server is wedged
MODEL_ACTIONS = frozenset({ActionType.UNLOAD, ActionType.LOAD, ActionType.SWAP})
ACCEPTED = frozenset({200, 202})  # 202: the server converges in the background
TOKEN_REFUSED = frozenset({401, 403})  # the Secret's token was rotated or recreated
log = logging.getLogger(__name__)

RuntimeTarget = tuple[BreakerState, int, Degradation]  # (breaker, admit percent, degradation)
_Answer = TypeVar("_Answer")


@dataclass(frozen=True)
class RuntimeCall:
    """One pod's runtime reconcile: whether it was told anything; why it failed ("" if not)."""

    changed: bool = False
    error: str = ""

    @property
    def reached(self) -> bool | None:
        """True: the admin API took a call; False: it did not; None: none was needed."""
        if self.error:
            return False
        return True if self.changed else None


class AdminError(RuntimeError):
    """The call failed. `settled` is False when its outcome is unknown (retry it)."""

    def __init__(self, message: str, settled: bool = True) -> None:
        super().__init__(message)
        self.settled = settled


@dataclass(frozen=True)
class ActionResult:
    """What an action did, as one line; `settled` is False while its outcome is unknown."""

    text: str
    settled: bool = True
    # The server had already run this id (a previous operator sent it and died before
    # recording it): the server replayed its result; the action happened once.
    replayed: bool = False


def outcome(result: admin.ActionResult) -> ActionResult:
    """What the server answered, as the line status and events show."""
    return ActionResult(result.describe(human_bytes), replayed=result.replayed)


def admin_session() -> aiohttp.ClientSession:
    """The connection pool for admin calls alone, made once at operator startup.

    Its own, not the scrapes': with one shared pool, hung sidecars' scrapes held
    the connections an action waited for (and a pool-wide wait counts inside the
    call's timeout). No limit over all pods either: a model load holds its
    connection for up to LOAD_TIMEOUT_SECONDS, and a breaker flip must not wait
    behind a hundred of them. Calls to one pod are not limited: a breaker flip
    may go to a pod while its reload is in flight.
    """
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))


class Actuator:
    def __init__(
        self, session: aiohttp.ClientSession, kube: Kube | None, admin_port: int = Port.ADMIN
    ) -> None:
        self.session = session
        self.kube = kube
        self.admin_port = admin_port
        # Tokens a pod answered 401 or 403 to, until the service's handler asks
        # (token_refused): its cached copy is then dropped and the Secret read again.
        self._refused: set[str] = set()

    def token_refused(self, token: str) -> bool:
        """Whether a pod refused `token` since the last question; forgets it."""
        if token in self._refused:
            self._refused.discard(token)
            return True
        return False

    async def _admin(
        self,
        pod: PodView,
        token: str,
        request: admin.AdminRequest,
        parse: Callable[[object], _Answer],
        timeout_seconds: float = ADMIN_TIMEOUT_SECONDS,
    ) -> _Answer:
        """One request, to its path; the answer as the contract's class. An answer that
        is not JSON or does not parse is a failed call (settled: the server did answer)."""
        path = request.path
        method = path.method
        url = f"http://{pod.ip}:{self.admin_port}{path}"
        headers = {"Authorization": f"Bearer {token}"}
        try:
            async with self.session.request(
                method,
                url,
                json=request.encode(),
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout_seconds),
            ) as response:
                payload = await response.json(content_type=None)
                if response.status in TOKEN_REFUSED:
                    self._refused.add(token)
                if response.status not in ACCEPTED:
                    message = admin.ErrorAnswer.message_of(payload)
                    METRICS.admin_error(path.name.lower(), AdminErrorKind.HTTP)
                    raise AdminError(f"{method} {path} -> HTTP {response.status} {message}")
                return parse(payload)
        except ValueError as error:  # not JSON, or not the contract's body (AdminBodyError)
            METRICS.admin_error(path.name.lower(), AdminErrorKind.BAD_ANSWER)
            raise AdminError(f"{method} {path}: {type(error).__name__} {error}") from error
        except (aiohttp.ClientError, TimeoutError) as error:
            METRICS.admin_error(path.name.lower(), AdminErrorKind.UNREACHABLE)
            # Sent or not, done or not: unknown. A retry with the same id is safe.
            raise AdminError(
                f"{method} {path}: {type(error).__name__} {error}".rstrip(), settled=False
            ) from error

    async def _post_action(
        self,
        pod: PodView,
        token: str,
        action_id: str,
        type_: ActionType,
        variant: Variant | None = None,
    ) -> admin.ActionResult:
        request = admin.ActionRequest(action_id, type_, variant)
        timeout = LOAD_TIMEOUT_SECONDS if type_ in MODEL_ACTIONS else ADMIN_TIMEOUT_SECONDS
        return await self._admin(pod, token, request, admin.ActionResult.parse, timeout)

    async def _grow_limit(self, namespace: str, action: Action) -> ActionResult:
        """Resize the server's memory limit in place; the pod keeps serving."""
        if self.kube is None or action.memory_limit_bytes is None:
            return ActionResult("failed: no Kubernetes client or no target limit")
        resized = await self.kube.resize_server_memory(
            namespace, action.pod, action.memory_limit_bytes
        )
        if resized is None:
            return ActionResult("pod already gone")
        old, new = resized
        return ActionResult(f"memory limit {old} -> {new} in place, no restart (pods/resize)")

    async def execute(
        self, namespace: str, pod: PodView | None, token: str, action: Action
    ) -> ActionResult:
        """Run one action (`_execute`) and count it in the operator's metrics."""
        result = await self._execute(namespace, pod, token, action)
        METRICS.action(action.kind, action.reason, result.text, result.settled, result.replayed)
        return result

    async def _execute(
        self, namespace: str, pod: PodView | None, token: str, action: Action
    ) -> ActionResult:
        """Run one action; the result line, errors included (never raised).

        Every call carries the action's id (a reload's two calls derive
        theirs from it), so running the same action again replays the
        server's recorded results instead of acting twice.
        """
        try:
            if action.kind in (ActionKind.RESTART, ActionKind.DRAIN):
                if self.kube is None:
                    return ActionResult("failed: no Kubernetes client to delete the pod")
                gone = await self.kube.delete_pod(namespace, action.pod)
                return ActionResult(
                    "pod deleted; the Deployment replaces it" if gone else "pod already gone"
                )
            if action.kind is ActionKind.GROW_LIMIT:
                return await self._grow_limit(namespace, action)
            if pod is None:
                return ActionResult("failed: pod no longer listed")
            if action.kind is ActionKind.RELOAD:
                unload = await self._post_action(
                    pod, token, f"{action.id}-unload", ActionType.UNLOAD
                )
                load = await self._post_action(
                    pod, token, f"{action.id}-load", ActionType.LOAD, action.variant
                )
                # Replayed only if both calls were: the reload then happened once, before.
                both = replace(
                    load,
                    memory_before=unload.memory_before,
                    replayed=unload.replayed and load.replayed,
                )
                return outcome(both)
            if action.kind in (ActionKind.SWAP_FALLBACK, ActionKind.RESTORE_PRIMARY):
                return outcome(
                    await self._post_action(pod, token, action.id, ActionType.SWAP, action.variant)
                )
            return outcome(
                await self._post_action(pod, token, action.id, ActionType(action.kind.value))
            )
        except AdminError as error:
            log.warning("action %s on %s: %s", action.id, action.pod, error)
            if not error.settled:
                return ActionResult(f"in flight: {error}", settled=False)
            return ActionResult(f"failed: {error}")
        except KubeError as error:
            log.warning("action %s on %s: %s", action.id, action.pod, error)
            return ActionResult(f"in flight: {error}", settled=False)  # a delete is safe to repeat
        except Exception as error:  # noqa: BLE001  never raised: the tick must go on to status
            # Unforeseen (a client error not classified, a bug): whether the call was
            # made is unknown, so it stays in flight and is retried under its id.
            log.exception("action %s on %s failed unexpectedly", action.id, action.pod)
            return ActionResult(
                f"in flight: {type(error).__name__} (see the operator's log)", settled=False
            )

    async def reconcile_runtime(
        self,
        pod: PodView,
        token: str,
        target: RuntimeTarget,
        sample: PodSample | None,
        applied: MutableMapping[str, RuntimeTarget],
    ) -> RuntimeCall:
        """Bring one pod's breaker and degradation level to the target: whether it was
        told anything, and the error when the pod's admin API did not take it."""
        key = pod.instance
        breaker, admit, degradation = target
        observed_ok = (
            sample is None
            or not sample.ok
            or (
                (sample.breaker_state in (None, breaker))
                and (sample.degradation_level in (None, degradation.level))
            )
        )
        if applied.get(key) == target and observed_ok:
            return RuntimeCall()
        try:
            await self._admin(
                pod,
                token,
                admin.BreakerRequest(breaker, admit),
                admin.ServerState.parse,
                STATE_TIMEOUT_SECONDS,
            )
            await self._admin(
                pod,
                token,
                admin.DegradationRequest(DegradationLevel(degradation.level), degradation.tiers),
                admin.DegradationResult.parse,
                # 202: the server swaps in the background; an older server
                # answers when loaded, and a repeat never starts a second load.
                ADMIN_TIMEOUT_SECONDS,
            )
        except AdminError as error:
            # A pod not yet ready is usually a server still loading behind a sidecar
            # that already answers: expected, retried next tick, not worth a WARNING.
            level = logging.WARNING if pod.ready else logging.INFO
            log.log(level, "runtime state of %s not set: %s", pod.name, error)
            return RuntimeCall(error=str(error))
        applied[key] = target
        return RuntimeCall(changed=True)
