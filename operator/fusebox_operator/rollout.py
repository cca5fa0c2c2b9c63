"""Which pods may be taken out of service now: one at a time, within the PDB.

Why: a reload, a swap, a restart or a degradation level that changes the
served model makes a pod unready for as long as a model load takes. Pushed
to every pod at once, Fusebox's own remedy leaves the Service without a
ready endpoint. The PodDisruptionBudget says `maxUnavailable: 1`; this
module is that rule for the operator's own disruptions: a Ready pod may be
taken out of service only when every other pod is Ready and none is
converging or being acted on, and at most one per tick; the others wait
for a later tick. A pod that is already out of service (not Ready, or
converging) may be acted on at any time: acting on it takes nothing more
out of service (Kubernetes' `unhealthyPodEvictionPolicy: AlwaysAllow`
reasons the same way), and a wedged or starting pod must not wait for
another one. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from fusebox_contract.names import DegradationLevel, Variant


@dataclass(frozen=True)
class PodReadiness:
    """One pod as the rollout sees it."""

    name: str
    ready: bool  # the pod's Ready condition, and not terminating
    busy: bool = False  # converging to another variant, or a disruptive action in flight

    @property
    def in_service(self) -> bool:
        return self.ready and not self.busy


class Rollout:
    """One tick's disruption budget: at most one in-service pod may be taken out.

    `may_disrupt` answers for a pod; `grant` records that the caller takes it
    out of service now, so later questions in the same tick see it as out.
    """

    def __init__(self, pods: Iterable[PodReadiness]) -> None:
        self._pods = {pod.name: pod for pod in pods}
        self.granted: list[str] = []

    def in_service(self, pod: str) -> bool:
        view = self._pods.get(pod)
        return view is not None and view.in_service and pod not in self.granted

    def may_disrupt(self, pod: str) -> bool:
        view = self._pods.get(pod)
        if view is None:
            return False  # a pod not listed is not ours to touch
        if not self.in_service(pod):
            return True  # already out of service: acting on it takes nothing more out
        return all(self.in_service(other) for other in self._pods if other != pod)

    def grant(self, pod: str) -> None:
        if pod not in self.granted:
            self.granted.append(pod)

    def take(self, pod: str) -> bool:
        """`may_disrupt` and, when it may, `grant`: True when the pod may change now."""
        if not self.may_disrupt(pod):
            return False
        self.grant(pod)
        return True


def variant_for_level(level: int, has_fallback: bool) -> Variant:
    """The variant a degradation level serves: the fallback from level 2, if there is one."""
    if has_fallback and level >= DegradationLevel.FALLBACK_MODEL:
        return Variant.FALLBACK
    return Variant.PRIMARY


def pod_levels(
    desired: int,
    current: Mapping[str, int],
    has_fallback: bool,
    rollout: Rollout,
    without_fallback: Collection[str] = frozenset(),
) -> dict[str, int]:
    """The degradation level to push to each pod this tick.

    A level that serves the same variant as the pod's current one (levels 1
    and 3 relative to 2, or any level without a fallback) goes to every pod
    at once. A level that swaps the model goes to a pod only when the rollout
    lets it out of service; the others keep their level until a later tick.
    Pods already out of service are offered first, so a starting pod gets
    its level without holding up a Ready one. A pod in `without_fallback`
    (its server cannot load the fallback) is a pod without a fallback: every
    level reaches it at once, and it swaps nothing.
    """
    levels: dict[str, int] = {}
    for pod in sorted(current, key=lambda name: (rollout.in_service(name), name)):
        level = current[pod]
        swaps = has_fallback and pod not in without_fallback
        same_variant = variant_for_level(level, swaps) is variant_for_level(desired, swaps)
        if same_variant or rollout.take(pod):
            levels[pod] = desired
        else:
            levels[pod] = level
    return levels
