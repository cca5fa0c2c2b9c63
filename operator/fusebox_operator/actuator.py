"""Carry out the policy's actions on pods through the server's admin API.

Why: actions must be safe to repeat (the operator can crash between acting
and recording), so every admin call carries the policy's idempotency id and
the server replays a recorded result instead of acting twice. Each pod's
runtime state (breaker, admit share, degradation level) is reconciled to the
desired one on every loop, so pods that start or restart later converge too.
The admin token is passed in, used in one header, and never logged.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

import aiohttp

from fusebox_operator.kube import Kube, KubeError, PodView
from fusebox_operator.manifests import ADMIN_PORT
from fusebox_operator.policy import Action, ActionKind, PodSample
from fusebox_operator.status import human_bytes

ADMIN_TIMEOUT_SECONDS = 10.0
LOAD_TIMEOUT_SECONDS = 120.0  # unload/load/swap move a whole model
STATE_TIMEOUT_SECONDS = 5.0  # a breaker flip is instant unless the server is wedged
log = logging.getLogger(__name__)

RuntimeTarget = tuple[str, int, int]  # (breaker, admitPercent, level)


class AdminError(RuntimeError):
    pass


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
        self, session: aiohttp.ClientSession, kube: Kube | None, admin_port: int = ADMIN_PORT
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
                if response.status != 200:
                    message = (payload or {}).get("error", {}).get("message", "")
                    raise AdminError(f"{method} {path} -> HTTP {response.status} {message}")
                return dict(payload)
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            raise AdminError(f"{method} {path}: {type(error).__name__} {error}") from error

    async def _post_action(
        self, pod: PodView, token: str, action_id: str, type_: str, variant: str | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"id": action_id, "type": type_}
        if variant is not None:
            body["variant"] = variant
        slow = type_ in ("unload", "load", "swap")
        timeout = LOAD_TIMEOUT_SECONDS if slow else ADMIN_TIMEOUT_SECONDS
        return await self._admin(pod, token, "POST", "/admin/v1/actions", body, timeout)

    async def execute(self, namespace: str, pod: PodView | None, token: str, action: Action) -> str:
        """Run one action; returns the result line (errors included, never raised)."""
        try:
            if action.kind is ActionKind.RESTART:
                if self.kube is None:
                    return "failed: no Kubernetes client to delete the pod"
                gone = await self.kube.delete_pod(namespace, action.pod)
                return "pod deleted; the Deployment replaces it" if gone else "pod already gone"
            if pod is None:
                return "failed: pod no longer listed"
            if action.kind is ActionKind.RELOAD:
                unload = await self._post_action(pod, token, f"{action.id}-unload", "unload")
                load = await self._post_action(
                    pod, token, f"{action.id}-load", "load", action.variant
                )
                merged = {**load, "memory_before": unload.get("memory_before")}
                return describe_result(merged)
            if action.kind in (ActionKind.SWAP_FALLBACK, ActionKind.RESTORE_PRIMARY):
                result = await self._post_action(pod, token, action.id, "swap", action.variant)
                return describe_result(result)
            result = await self._post_action(pod, token, action.id, action.kind.value)
            return describe_result(result)
        except (AdminError, KubeError) as error:
            log.warning("action %s on %s failed: %s", action.id, action.pod, error)
            return f"failed: {error}"

    async def reconcile_runtime(
        self,
        pod: PodView,
        token: str,
        target: RuntimeTarget,
        sample: PodSample | None,
        applied: MutableMapping[str, RuntimeTarget],
    ) -> bool:
        """Bring one pod's breaker and degradation level to the target; True if it changed."""
        key = f"{pod.uid}/{pod.server_restarts}"
        breaker, admit, level = target
        observed_ok = (
            sample is None
            or not sample.ok
            or (
                (sample.breaker_state in (None, breaker))
                and (sample.degradation_level in (None, level))
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
                {"state": breaker, "admitPercent": admit},
                STATE_TIMEOUT_SECONDS,
            )
            await self._admin(
                pod,
                token,
                "PUT",
                "/admin/v1/degradation",
                {"level": level},
                LOAD_TIMEOUT_SECONDS,
            )
        except AdminError as error:
            log.warning("runtime state of %s not set: %s", pod.name, error)
            return False
        applied[key] = target
        return True
