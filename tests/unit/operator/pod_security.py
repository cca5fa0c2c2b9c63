"""A checker for the Kubernetes "restricted" Pod Security Standard.

Written from the PSS definition (kubernetes.io/docs/concepts/security/
pod-security-standards): every baseline control plus the restricted ones.
Returns the violations so a failing test says which control broke.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ALLOWED_VOLUME_KEYS = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}


def restricted_violations(pod_spec: Mapping[str, Any]) -> list[str]:
    problems: list[str] = []
    pod_sc: Mapping[str, Any] = pod_spec.get("securityContext") or {}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(key):
            problems.append(f"{key} is set")
    if (pod_sc.get("windowsOptions") or {}).get("hostProcess"):
        problems.append("pod hostProcess")
    for sysctl in pod_sc.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            problems.append(f"unsafe sysctl {sysctl.get('name')}")
    for volume in pod_spec.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= ALLOWED_VOLUME_KEYS:
            problems.append(f"volume {volume.get('name')} of type {sorted(kinds)}")
    pod_non_root = pod_sc.get("runAsNonRoot") is True
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    if pod_seccomp not in (None, "RuntimeDefault", "Localhost"):
        problems.append(f"pod seccomp {pod_seccomp}")
    if pod_sc.get("runAsUser") == 0:
        problems.append("pod runAsUser 0")
    selinux = pod_sc.get("seLinuxOptions") or {}
    if selinux.get("user") or selinux.get("role"):
        problems.append("pod seLinuxOptions user/role")
    containers = [
        *(pod_spec.get("initContainers") or []),
        *(pod_spec.get("containers") or []),
        *(pod_spec.get("ephemeralContainers") or []),
    ]
    for container in containers:
        name = container.get("name")
        sc: Mapping[str, Any] = container.get("securityContext") or {}
        if sc.get("privileged"):
            problems.append(f"{name}: privileged")
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            problems.append(f"{name}: hostProcess")
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation not false")
        if not (
            sc.get("runAsNonRoot") is True or (pod_non_root and sc.get("runAsNonRoot") is None)
        ):
            problems.append(f"{name}: runAsNonRoot not true")
        if sc.get("runAsUser") == 0:
            problems.append(f"{name}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or {}).get("type") or pod_seccomp
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{name}: seccompProfile {seccomp}")
        capabilities = sc.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            problems.append(f"{name}: capabilities not dropping ALL")
        for added in capabilities.get("add") or []:
            if added != "NET_BIND_SERVICE":
                problems.append(f"{name}: adds capability {added}")
        if sc.get("procMount") not in (None, "Default"):
            problems.append(f"{name}: procMount {sc.get('procMount')}")
        for port in container.get("ports") or []:
            if port.get("hostPort"):
                problems.append(f"{name}: hostPort {port['hostPort']}")
        apparmor = (sc.get("appArmorProfile") or {}).get("type")
        if apparmor not in (None, "RuntimeDefault", "Localhost"):
            problems.append(f"{name}: appArmor {apparmor}")
    return problems
