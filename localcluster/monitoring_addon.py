"""The monitoring addon: a real Prometheus under the real Prometheus Operator.

`python -m localcluster monitoring` installs, idempotently, into the
`monitoring` namespace (the one the inference pods' NetworkPolicy admits on
the metrics port):

- the Prometheus Operator's CRDs, copied by build-binaries.sh out of the
  operator's module zip (server-side apply: they are too large for the
  last-applied annotation);
- the operator (image built from its pinned module), with least-privilege
  RBAC: cluster-wide it only reads monitors, rules and namespaces; what it
  writes (the StatefulSet, its Secrets and ConfigMaps, the Service) it writes
  in `monitoring` alone (`--prometheus-instance-namespaces`);
- one Prometheus that discovers pods through the Kubernetes API and selects
  every PodMonitor and PrometheusRule labelled part-of=fusebox (the chart's
  labels) in any namespace.

Everything runs non-root under restricted Pod Security. The objects are
plain dicts (builders below, no I/O); `install` is the only function that
talks to the cluster.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fusebox_contract import wiring
from localcluster.addons import RESTRICTED_CONTAINER_SECURITY
from localcluster.config import REPO_ROOT, ClusterConfig
from localcluster.kubectl import Kubectl
from localcluster.progress import ClusterError

NAMESPACE = wiring.MONITORING_NAMESPACE
OPERATOR_NAME = "prometheus-operator"
OPERATOR_IMAGE = "localhost/fusebox/prometheus-operator:latest"
RELOADER_IMAGE = "localhost/fusebox/prometheus-config-reloader:latest"
PROMETHEUS_IMAGE = "localhost/fusebox/prometheus:latest"
# The Prometheus object; the operator names its StatefulSet prometheus-<name>
# and the Service prometheus-operated.
PROMETHEUS_NAME = "fusebox"
PROMETHEUS_SERVICE_ACCOUNT = "prometheus"
PROMETHEUS_PORT = 9090
# Short intervals keep the e2e test's waits short; a production Prometheus
# would scrape every 15-30 s (the chart's PodMonitor sets its own interval).
SCRAPE_INTERVAL = "5s"
EVALUATION_INTERVAL = "5s"
# How often the config reloader re-reads the config the operator writes. Its
# own default is 3 minutes, and its file watch follows the first file the kubelet
# mounted only: once the kubelet has swapped the Secret's files, a new PodMonitor
# waited up to 3 minutes (89-144 s in the e2e runs) to reach Prometheus.
RELOADER_WATCH_INTERVAL = "10s"
CONFIG_RELOADER = "config-reloader"
FIELD_MANAGER = "localcluster-monitoring"
NON_ROOT_ID = 65532
MONITORING_DIR = REPO_ROOT / ".cache" / "monitoring"
PROMETHEUS_GO_MOD = REPO_ROOT / "localcluster" / "monitoring" / "prometheus" / "go.mod"
READY_TIMEOUT_SECONDS = 300.0

SELECTOR = {wiring.PART_OF_LABEL: wiring.PART_OF_VALUE}
_OWN_LABELS = {"app.kubernetes.io/part-of": "localcluster-monitoring"}

RESTRICTED_POD: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": NON_ROOT_ID,
    "runAsGroup": NON_ROOT_ID,
    "fsGroup": NON_ROOT_ID,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def _wait_established(kubectl: Kubectl, crds: Path, timeout_seconds: float = 90) -> None:
    """`kubectl wait --for=condition=Established`, again while a CRD just created still
    reads `status.conditions: null` (kubectl wait fails at once on that instead of
    waiting: ".status.conditions accessor error")."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        waited = kubectl.run(
            "wait", "--for=condition=Established", "-f", str(crds), "--timeout=60s",
            check=False, timeout_seconds=timeout_seconds,
        )  # fmt: skip
        if waited.returncode == 0:
            return
        if "accessor error" not in waited.stderr or time.monotonic() > deadline:
            raise ClusterError(f"monitoring CRDs not Established: {waited.stderr.strip()}")
        time.sleep(1)


def prometheus_version(go_mod: str) -> str:
    """Prometheus' release from its Go module's version: v0.316.0 is v3.16.0
    (Prometheus 3 publishes v0.3MM.P module versions for release 3.MM.P)."""
    match = re.search(r"github\.com/prometheus/prometheus v0\.3(\d\d)\.(\d+)", go_mod)
    if match is None:
        raise ClusterError("localcluster/monitoring/prometheus/go.mod pins no Prometheus 3")
    return f"v3.{int(match.group(1))}.{match.group(2)}"


def _meta(name: str, namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": dict(_OWN_LABELS)}
    if namespace is not None:
        meta["namespace"] = namespace
    return meta


def _rule(group: str, resources: list[str], verbs: list[str]) -> dict[str, Any]:
    return {"apiGroups": [group], "resources": resources, "verbs": verbs}


def _binding(kind: str, name: str, account: str, namespace: str | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": f"{kind}Binding",
        "metadata": _meta(name, namespace),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}],
    }


def namespace_object() -> dict[str, Any]:
    meta = _meta(NAMESPACE)
    meta["labels"]["pod-security.kubernetes.io/enforce"] = "restricted"
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


def operator_objects() -> list[dict[str, Any]]:
    """The operator: its ServiceAccount, its RBAC and its Deployment.

    Cluster-wide it may only read what Prometheus is configured from (monitors,
    rules, scrape configs) and the namespaces their selectors match; the
    Alertmanager, ThanosRuler and PrometheusAgent controllers find no
    permission and stay off. It writes only in `monitoring`.
    """
    cluster_role = f"localcluster:{OPERATOR_NAME}"
    monitors = ["podmonitors", "servicemonitors", "probes", "prometheusrules", "scrapeconfigs"]
    labels = {"app.kubernetes.io/name": OPERATOR_NAME}
    container = {
        "name": OPERATOR_NAME,
        "image": OPERATOR_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "args": [
            f"--prometheus-config-reloader={RELOADER_IMAGE}",
            f"--prometheus-instance-namespaces={NAMESPACE}",
            "--log-format=json",
        ],
        "ports": [{"name": "http", "containerPort": 8080}],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"}},
        "resources": {
            "requests": {"cpu": "50m", "memory": "64Mi"},
            "limits": {"cpu": "500m", "memory": "256Mi"},
        },
        "securityContext": RESTRICTED_CONTAINER_SECURITY,
    }
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": _meta(OPERATOR_NAME, NAMESPACE),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": _meta(cluster_role),
            "rules": [
                _rule("monitoring.coreos.com", monitors, ["get", "list", "watch"]),
                _rule("", ["namespaces"], ["get", "list", "watch"]),
            ],
        },
        _binding("ClusterRole", cluster_role, OPERATOR_NAME),
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _meta(OPERATOR_NAME, NAMESPACE),
            "rules": [
                _rule(
                    "monitoring.coreos.com",
                    ["prometheuses", "prometheuses/status", "prometheuses/finalizers"],
                    ["get", "list", "watch", "update", "patch"],
                ),
                _rule("apps", ["statefulsets"], ["*"]),
                _rule("", ["configmaps", "secrets"], ["*"]),
                _rule("", ["pods"], ["list", "delete"]),
                _rule(
                    "",
                    ["services", "services/finalizers", "endpoints"],
                    ["get", "create", "update", "delete"],
                ),
                _rule("", ["events"], ["create", "patch"]),
            ],
        },
        _binding("Role", OPERATOR_NAME, OPERATOR_NAME, NAMESPACE),
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": _meta(OPERATOR_NAME, NAMESPACE),
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": OPERATOR_NAME,
                        "securityContext": RESTRICTED_POD,
                        "containers": [container],
                    },
                },
            },
        },
    ]


def config_reloader_args() -> list[str]:
    """The config reloader's arguments as the operator (v0.85) makes them for this
    Prometheus, with a shorter re-read (RELOADER_WATCH_INTERVAL). The Prometheus'
    `containers` entry replaces the whole list, so every argument is restated;
    `install` checks them against the operator's own (reloader_args_missing)."""
    config = "/etc/prometheus/config"
    return [
        f"--watch-interval={RELOADER_WATCH_INTERVAL}",
        "--listen-address=:8080",
        f"--reload-url=http://localhost:{PROMETHEUS_PORT}/-/reload",
        f"--config-file={config}/prometheus.yaml.gz",
        f"--config-envsubst-file={config}_out/prometheus.env.yaml",
        f"--watched-dir=/etc/prometheus/rules/prometheus-{PROMETHEUS_NAME}-rulefiles-0",
    ]


def reloader_args_missing(statefulset: dict[str, Any]) -> list[str]:
    """The arguments the operator gives its init config reloader (the one nobody
    overrides) that the restated config reloader lacks: a newer operator's new
    argument, which config_reloader_args() must then restate too."""
    spec = statefulset["spec"]["template"]["spec"]

    def args(containers: list[dict[str, Any]], name: str) -> list[str]:
        return next((c.get("args") or [] for c in containers if c["name"] == name), [])

    ours = set(args(spec["containers"], CONFIG_RELOADER))
    theirs = args(spec.get("initContainers") or [], f"init-{CONFIG_RELOADER}")
    # Its own: a one-off run (--watch-interval=0) on a port of its own.
    own = ("--watch-interval=", "--listen-address=")
    return [a for a in theirs if not a.startswith(own) and a not in ours]


def prometheus_objects(version: str) -> list[dict[str, Any]]:
    """Prometheus' ServiceAccount (it may only discover pods) and the Prometheus."""
    cluster_role = f"localcluster:{PROMETHEUS_SERVICE_ACCOUNT}"
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": _meta(PROMETHEUS_SERVICE_ACCOUNT, NAMESPACE),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": _meta(cluster_role),
            "rules": [_rule("", ["pods"], ["get", "list", "watch"])],
        },
        _binding("ClusterRole", cluster_role, PROMETHEUS_SERVICE_ACCOUNT),
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "Prometheus",
            "metadata": _meta(PROMETHEUS_NAME, NAMESPACE),
            "spec": {
                "image": PROMETHEUS_IMAGE,
                "version": version,
                # Images are loaded into containerd, never pulled (a :latest
                # tag would default to Always).
                "imagePullPolicy": "IfNotPresent",
                "replicas": 1,
                "serviceAccountName": PROMETHEUS_SERVICE_ACCOUNT,
                "podMonitorSelector": {"matchLabels": SELECTOR},
                "podMonitorNamespaceSelector": {},
                "ruleSelector": {"matchLabels": SELECTOR},
                "ruleNamespaceSelector": {},
                "scrapeInterval": SCRAPE_INTERVAL,
                "evaluationInterval": EVALUATION_INTERVAL,
                "retention": "6h",
                "resources": {
                    "requests": {"cpu": "100m", "memory": "256Mi"},
                    "limits": {"memory": "1Gi"},
                },
                "securityContext": RESTRICTED_POD,
                # Merged by name into the container the operator generates.
                "containers": [{"name": CONFIG_RELOADER, "args": config_reloader_args()}],
            },
        },
    ]


def all_objects(version: str) -> list[dict[str, Any]]:
    return [namespace_object(), *operator_objects(), *prometheus_objects(version)]


def prometheus_available(prometheus: dict[str, Any]) -> bool:
    """The operator reports the Prometheus Available: its pods run and are ready."""
    conditions = (prometheus.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Available" and c.get("status") == "True" for c in conditions)


def _server_side_apply(kubectl: Kubectl, *args: str, input_text: str | None = None) -> None:
    kubectl.run(
        "apply",
        "--server-side",
        "--force-conflicts",
        f"--field-manager={FIELD_MANAGER}",
        *args,
        input_text=input_text,
        timeout_seconds=120,
    )


def install(
    kubectl: Kubectl,
    *,
    monitoring_dir: Path = MONITORING_DIR,
    go_mod: Path = PROMETHEUS_GO_MOD,
    say: Callable[[str], None] = print,
    timeout_seconds: float = READY_TIMEOUT_SECONDS,
) -> None:
    """Apply the CRDs and every object, then wait until Prometheus is Available."""
    crds = monitoring_dir / "crds"
    if not crds.is_dir():
        raise ClusterError(f"{crds} is missing: run localcluster/build-binaries.sh")
    say("monitoring: applying the Prometheus Operator's CRDs")
    _server_side_apply(kubectl, "-f", str(crds))
    _wait_established(kubectl, crds)
    version = prometheus_version(go_mod.read_text())
    say(f"monitoring: applying the operator and Prometheus {version} in {NAMESPACE}")
    document = {"apiVersion": "v1", "kind": "List", "items": all_objects(version)}
    _server_side_apply(kubectl, "-f", "-", input_text=json.dumps(document))
    deadline = time.monotonic() + timeout_seconds
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        last = kubectl.get_json("-n", NAMESPACE, "prometheus", PROMETHEUS_NAME)
        if prometheus_available(last):
            statefulset = kubectl.get_json(
                "-n", NAMESPACE, "statefulset", f"prometheus-{PROMETHEUS_NAME}"
            )
            missing = reloader_args_missing(statefulset)
            if missing:
                raise ClusterError(
                    f"the config reloader restated in the Prometheus lacks {missing}, "
                    "which the operator gives its own: add them to config_reloader_args()"
                )
            say(f"monitoring: Prometheus {NAMESPACE}/{PROMETHEUS_NAME} is available")
            return
        time.sleep(2)
    pods = kubectl.run("-n", NAMESPACE, "get", "pods", "-o", "wide", check=False).stdout
    raise ClusterError(
        f"Prometheus {NAMESPACE}/{PROMETHEUS_NAME} not available after {timeout_seconds:.0f} s; "
        f"its conditions: {(last.get('status') or {}).get('conditions')}\n{pods}"
    )


def install_into(config: ClusterConfig, say: Callable[[str], None] = print) -> None:
    kubectl = Kubectl(Path(config.bin_dir) / "kubectl", config.kubeconfig)
    install(kubectl, say=say)
