"""NetworkPolicy enforcement: kube-router's identity and what it may read. Pure.

The bridge CNI enforces no policy, so Fusebox's admin-port and metrics-port
isolation would be untested YAML. kube-router runs beside kube-proxy in the
node's namespace with only its firewall controller, turning each
NetworkPolicy into iptables rules and ipsets (docs/decisions/localcluster.md
says why not kube-network-policies: this kernel has no nft `queue`). It
reads the API with its own client certificate, bound to a read-only
ClusterRole, like the other daemons' kubeconfigs.
"""

from __future__ import annotations

from typing import Any

from localcluster.pki import CertSpec

USER = "fusebox:kube-router"
CLIENT_CERT = CertSpec("kube-router", USER, client=True)

# What its firewall controller watches (pods, namespaces, nodes, policies) and
# the informers its start-up syncs regardless (services, endpoints, slices).
_READ = ["get", "list", "watch"]
RULES: list[dict[str, Any]] = [
    {
        "apiGroups": [""],
        "resources": ["namespaces", "pods", "nodes", "services", "endpoints"],
        "verbs": _READ,
    },
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": _READ},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": _READ},
]


def rbac_objects() -> list[dict[str, Any]]:
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "fusebox:kube-router"},
        "rules": RULES,
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "fusebox:kube-router"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "fusebox:kube-router",
        },
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
    }
    return [role, binding]
