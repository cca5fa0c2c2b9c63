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

from fusebox_contract.names import DegradationTier, Variant, engaged_tiers


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
        # Steps held this tick for want of a turn (`hold`): pod -> (the step, the
        # other pods out of service that hold it).
        self.held: dict[str, tuple[str, tuple[str, ...]]] = {}

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

    def out_of_service(self, besides: str) -> tuple[str, ...]:
        """The pods other than `besides` that are out of service: what holds it back."""
        return tuple(sorted(o for o in self._pods if o != besides and not self.in_service(o)))

    def hold(self, pod: str, step: str) -> None:
        """Record that `step` on `pod` waits for its turn (the caller tells it)."""
        self.held.setdefault(pod, (step, self.out_of_service(pod)))

    def grant(self, pod: str) -> None:
        if pod not in self.granted:
            self.granted.append(pod)

    def take(self, pod: str) -> bool:
        """`may_disrupt` and, when it may, `grant`: True when the pod may change now."""
        if not self.may_disrupt(pod):
            return False
        self.grant(pod)
        return True


def held_words(pod: str, step: str, holders: tuple[str, ...]) -> str:
    """`reload on p-1 waits: p-2 out of service (one pod out of service at a time)`."""
    who = ", ".join(holders) or "another pod"
    return f"{step} on {pod} waits: {who} out of service (one pod out of service at a time)"


@dataclass(frozen=True)
class Degradation:
    """What a pod is told: a level, and the service's tiers it engages from."""

    level: int
    tiers: tuple[DegradationTier, ...] = tuple(DegradationTier)

    def variant(self, has_fallback: bool) -> Variant:
        """The variant it serves: the fallback while fallback-model is engaged, if there
        is one. `[no-streaming, canned-answers]` at level 3 serves the primary."""
        engaged = DegradationTier.FALLBACK_MODEL in engaged_tiers(self.level, self.tiers)
        return Variant.FALLBACK if has_fallback and engaged else Variant.PRIMARY


def pod_degradations(
    desired: Degradation,
    current: Mapping[str, Degradation],
    has_fallback: bool,
    rollout: Rollout,
    without_fallback: Collection[str] = frozenset(),
) -> dict[str, Degradation]:
    """The degradation to push to each pod this tick.

    One that serves the same variant as the pod's current one (levels 1 and
    3 relative to 2, a tier list edited without touching fallback-model, or
    anything without a fallback) goes to every pod at once. One that swaps
    the model, by its level or by a tier list that adds or drops
    fallback-model, goes to a pod only when the rollout lets it out of
    service; the others keep theirs until a later tick. Pods already out of
    service are offered first, so a starting pod gets its level without
    holding up a Ready one. A pod in `without_fallback` (its server cannot
    load the fallback) is a pod without a fallback: everything reaches it at
    once, and it swaps nothing.
    """
    told: dict[str, Degradation] = {}
    for pod in sorted(current, key=lambda name: (rollout.in_service(name), name)):
        now = current[pod]
        swaps = has_fallback and pod not in without_fallback
        same_variant = now.variant(swaps) is desired.variant(swaps)
        told[pod] = desired if same_variant or rollout.take(pod) else now
    return told
