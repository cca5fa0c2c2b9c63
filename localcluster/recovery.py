"""What `up` does with a cluster it finds: nothing, restart some daemons, or wipe. Pure.

A cluster whose daemon died still holds everything that matters: etcd's
data, containerd's images and running pods, the certificates. Restarting
the dead daemons keeps all of it; wiping loses every object. So `up` wipes
only when the state itself cannot be used, and says which part and why.
The facts are gathered by lifecycle.survey; the decision is made here,
where a test can drive it without a cluster.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence

# Files without which the saved state cannot run a cluster again, relative to
# the state directory, with what their absence means.
REQUIRED_STATE = {
    "up": "the previous `up` never finished",
    "pki/ca.crt": "the cluster CA is gone",
    "pki/ca.key": "the cluster CA's key is gone",
    "kubeconfig": "the admin kubeconfig is gone",
    "etcd/member": "etcd's data directory is gone",
    "conf/kubelet.yaml": "the kubelet's configuration is gone",
    "containerd/config.toml": "containerd's configuration is gone",
}


class Action(enum.Enum):
    NOTHING = "nothing"
    RESTART = "restart"
    WIPE = "wipe"
    REFUSE = "refuse"  # usable, but not the cluster asked for: the user decides


@dataclasses.dataclass(frozen=True)
class Found:
    """What `up` saw of a cluster a previous `up` started."""

    running: Mapping[str, bool]  # each daemon of the cluster, in start order: alive?
    missing_state: Sequence[str] = ()  # keys of REQUIRED_STATE that are absent
    missing_network: Sequence[str] = ()  # the node's namespace or veth, if gone
    other_settings: Sequence[str] = ()  # network settings that differ from those asked for


@dataclasses.dataclass(frozen=True)
class Plan:
    action: Action
    restart: tuple[str, ...] = ()  # in start order
    reasons: tuple[str, ...] = ()  # why the cluster is wiped


def plan_up(found: Found) -> Plan:
    """Restart exactly the dead daemons unless the state or network is unusable.

    Unusable state wipes, whatever the settings; usable state under other
    network settings than those asked for is refused, never wiped.
    """
    reasons = [REQUIRED_STATE[key] + f" ({key})" for key in found.missing_state]
    reasons += [
        f"{what} is gone (the host rebooted, or it was deleted)" for what in found.missing_network
    ]
    if reasons:
        return Plan(Action.WIPE, reasons=tuple(reasons))
    if found.other_settings:
        # Its state is fine: wiping it for a flag would lose every object.
        differing = ", ".join(found.other_settings)
        return Plan(Action.REFUSE, reasons=(f"it runs with other network settings ({differing})",))
    dead = tuple(component for component, alive in found.running.items() if not alive)
    if dead:
        return Plan(Action.RESTART, restart=dead)
    return Plan(Action.NOTHING)


# Restarting a daemon alone can leave its clients waiting out their reconnect
# backoff: the apiserver's etcd clients, after etcd was down for a minute,
# left requests hanging for a minute more while /readyz already said ok.
RESTART_WITH = {"etcd": ("kube-apiserver",)}


def restart_order(components: Sequence[str], start_order: Sequence[str]) -> tuple[str, ...]:
    """components and the clients they drag along (RESTART_WITH), in start order, once each."""
    wanted = set(components)
    for component in components:
        wanted.update(RESTART_WITH.get(component, ()))
    return tuple(c for c in start_order if c in wanted)
