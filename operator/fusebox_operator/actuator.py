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
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from fusebox_contract.names import ActionType, BreakerState, Variant
from fusebox_contract.wiring import Port
from fusebox_operator.kube import Kube, KubeError
from fusebox_operator.observations import PodSample, PodView
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
log = logging.getLogger(__name__)

RuntimeTarget = tuple[BreakerState, int, Degradation]  # (breaker, admitPercent, degradation)


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


def describe_result(result: dict[str, Any]) -> str:
    """The server's before/after memory as one line for status and events."""
    before = result.get("memory_before") or {}
    after = result.get("memory_after") or {}
    parts = []
    for key, label in (("rss_bytes", "RSS"), ("cuda_reserved_bytes", "CUDA reserved")):
        if before.get(key) is not None and after.get(key) is not None:
            freed = before[key] - after[key]
            parts.append(
                f"{label} {human_bytes(before[key])} -> {human_bytes(after[key])} "
                f"({'freed' if freed >= 0 else 'grew'} {human_bytes(abs(freed))})"
            )
    if result.get("variant"):
        parts.append(f"variant {result['variant']}")
    if result.get("replayed"):
        parts.append("replayed")
    return "; ".join(parts) or "done"


class Actuator:
    def __init__(
        self, session: aiohttp.ClientSession, kube: Kube | None, admin_port: int = Port.ADMIN
    ) -> None:
        self.session = session
        self.kube = kube
        self.admin_port = admin_port

    async def _admin(
        self,
        pod: PodView,
        token: str,
        method: str,
        path: str,
        body: dict[str, Any],
        timeout_seconds: float = ADMIN_TIMEOUT_SECONDS,
    ) -> dict[str, Any]:
        url = f"http://{pod.ip}:{self.admin_port}{path}"
        headers = {"Authorization": f"Bearer {token}"}
        try:
            async with self.session.request(
                method,
                url,
                json=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout_seconds),
            ) as response:
                payload = await response.json(content_type=None)
                if response.status not in ACCEPTED:
                    message = (payload or {}).get("error", {}).get("message", "")
                    raise AdminError(f"{method} {path} -> HTTP {response.status} {message}")
                return dict(payload)
        except ValueError as error:
            raise AdminError(f"{method} {path}: {type(error).__name__} {error}") from error
        except (aiohttp.ClientError, TimeoutError) as error:
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
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"id": action_id, "type": type_.value}
        if variant is not None:
            body["variant"] = variant.value
        timeout = LOAD_TIMEOUT_SECONDS if type_ in MODEL_ACTIONS else ADMIN_TIMEOUT_SECONDS
        return await self._admin(pod, token, "POST", "/admin/v1/actions", body, timeout)

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
                merged = {**load, "memory_before": unload.get("memory_before")}
                both = bool(unload.get("replayed")) and bool(load.get("replayed"))
                return ActionResult(describe_result(merged), replayed=both)
            if action.kind in (ActionKind.SWAP_FALLBACK, ActionKind.RESTORE_PRIMARY):
                result = await self._post_action(
                    pod, token, action.id, ActionType.SWAP, action.variant
                )
                return ActionResult(describe_result(result), replayed=bool(result.get("replayed")))
            result = await self._post_action(pod, token, action.id, ActionType(action.kind.value))
            return ActionResult(describe_result(result), replayed=bool(result.get("replayed")))
        except AdminError as error:
            log.warning("action %s on %s: %s", action.id, action.pod, error)
            if not error.settled:
                return ActionResult(f"in flight: {error}", settled=False)
            return ActionResult(f"failed: {error}")
        except KubeError as error:
            log.warning("action %s on %s: %s", action.id, action.pod, error)
            return ActionResult(f"in flight: {error}", settled=False)  # a delete is safe to repeat

    async def reconcile_runtime(
        self,
        pod: PodView,
        token: str,
        target: RuntimeTarget,
        sample: PodSample | None,
        applied: MutableMapping[str, RuntimeTarget],
    ) -> bool:
        """Bring one pod's breaker and degradation level to the target; True if it changed."""
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
            return False
        try:
            await self._admin(
                pod,
                token,
                "PUT",
                "/admin/v1/breaker",
                {"state": breaker.value, "admitPercent": admit},
                STATE_TIMEOUT_SECONDS,
            )
            await self._admin(
                pod,
                token,
                "PUT",
                "/admin/v1/degradation",
                {"level": degradation.level, "tiers": [t.value for t in degradation.tiers]},
                # 202: the server swaps in the background; an older server
                # answers when loaded, and a repeat never starts a second load.
                ADMIN_TIMEOUT_SECONDS,
            )
        except AdminError as error:
            # A pod not yet ready is usually a server still loading behind a sidecar
            # that already answers: expected, retried next tick, not worth a WARNING.
            level = logging.WARNING if pod.ready else logging.INFO
            log.log(level, "runtime state of %s not set: %s", pod.name, error)
            return False
        applied[key] = target
        return True
