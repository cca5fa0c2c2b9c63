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
# left requests hanging for a minute more while /readyz already said ok. The
# node daemons' client-go watches back off while the only API server is down
# (0.8 s doubling to 30 s, reset only after two quiet minutes), where an HA
# control plane's clients fail over to another API server; two of them hide
# what the API server serves from pods: kube-proxy (a stopping API server
# empties the `kubernetes` Service's endpoints, so pods were refused the API
# for 8 s after it served again) and kube-router (after a few restarts within
# minutes it admitted a new pod's IP 12-85 s late; 2026-12-06). Restarted with
# it, each lists afresh within a second or two.
RESTART_WITH = {
    "etcd": ("kube-apiserver",),
    "kube-apiserver": ("kube-proxy", "kube-router"),
}


def restart_order(components: Sequence[str], start_order: Sequence[str]) -> tuple[str, ...]:
    """components and the clients they drag along (RESTART_WITH, and theirs), in start
    order, once each; a client that is not in `start_order` (not enabled) is left out."""
    wanted = set(components)
    pending = list(components)
    while pending:
        for client in RESTART_WITH.get(pending.pop(), ()):
            if client not in wanted:
                wanted.add(client)
                pending.append(client)
    return tuple(c for c in start_order if c in wanted)
