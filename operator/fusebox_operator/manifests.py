"""Pure builders: an InferenceService spec -> the child objects it owns.

Why: the shape of every child (a restricted-Pod-Security Deployment running
the server and its metrics sidecar, the Service, the admin-token Secret, the
PodDisruptionBudget, the NetworkPolicy, the ConfigMap of templates) is the
operator's most reviewed output. Building plain dicts from typed inputs makes
each one testable against golden YAML without a cluster; handlers adopt them
(owner references) and kube.py applies them.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from fusebox_operator.settings import OperatorSettings
from fusebox_operator.sizing import MemorySizing
from fusebox_operator.spec import InferenceServiceSpec, ModelSource

Manifest = dict[str, Any]

API_PORT = 8000
ADMIN_PORT = 8001
METRICS_PORT = 9400
RUNTIME_DIR = "/run/fusebox"
STATS_FILE = f"{RUNTIME_DIR}/stats.json"
ADMIN_TOKEN_DIR = "/var/run/fusebox-admin"
ADMIN_TOKEN_KEY = "token"
CONFIG_DIR = "/etc/fusebox"
MODELS_ROOT = "/models"
NONROOT_UID = 65532
SIDECAR_COMMAND = ["/opt/venv/bin/python", "-m", "fusebox_sidecar"]
SERVER_CONTAINER = "server"
SIDECAR_CONTAINER = "sidecar"
TEMPLATE_HASH_ANNOTATION = "fusebox.dev/pod-template-hash"
SERVICE_LABEL = "fusebox.dev/service"


def selector_labels(name: str) -> dict[str, str]:
    return {SERVICE_LABEL: name}


def common_labels(name: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "fusebox-inference",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/managed-by": "fusebox-operator",
        **selector_labels(name),
    }


def _metadata(name: str, namespace: str, owner: str) -> Manifest:
    return {"name": name, "namespace": namespace, "labels": common_labels(owner)}


def admin_secret_name(name: str) -> str:
    return f"{name}-admin"


def config_map_name(name: str) -> str:
    return f"{name}-config"


def _model_dir(source: ModelSource) -> str:
    if source.scheme == "pvc":
        mount = f"{MODELS_ROOT}/{source.claim}"
        return f"{mount}/{source.path}" if source.path else mount
    return source.path


def _model_claims(spec: InferenceServiceSpec) -> list[str]:
    sources = [spec.model.source]
    if spec.fallback is not None and spec.fallback.source is not None:
        sources.append(spec.fallback.source)
    claims: list[str] = []
    for source in sources:
        if source.scheme == "pvc" and source.claim not in claims:
            claims.append(source.claim)
    return claims


def memory_quantity(size_bytes: int) -> str:
    """Bytes as the Kubernetes quantity a human would write (4Gi, 1536Mi)."""
    for suffix, factor in (("Gi", 1024**3), ("Mi", 1024**2), ("Ki", 1024)):
        if size_bytes % factor == 0:
            return f"{size_bytes // factor}{suffix}"
    return str(size_bytes)


def _restricted_container_security() -> Manifest:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": NONROOT_UID,
        "runAsGroup": NONROOT_UID,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _server_env(spec: InferenceServiceSpec) -> list[Manifest]:
    server = spec.server
    values: list[tuple[str, str]] = [
        ("FUSEBOX_MODEL_DIR", _model_dir(spec.model.source)),
        ("FUSEBOX_MODEL_NAME", spec.model.name),
        ("FUSEBOX_HOST", "0.0.0.0"),
        ("FUSEBOX_PORT", str(API_PORT)),
        ("FUSEBOX_ADMIN_PORT", str(ADMIN_PORT)),
        ("FUSEBOX_ADMIN_TOKEN_FILE", f"{ADMIN_TOKEN_DIR}/{ADMIN_TOKEN_KEY}"),
        ("FUSEBOX_STATS_FILE", STATS_FILE),
        ("FUSEBOX_MAX_CONCURRENCY", str(server.max_concurrency)),
        ("FUSEBOX_MAX_QUEUE", str(server.max_queue)),
        ("FUSEBOX_MAX_INPUT_TOKENS", str(server.max_input_tokens)),
        ("FUSEBOX_MAX_NEW_TOKENS", str(server.max_new_tokens)),
        ("FUSEBOX_REQUEST_TIMEOUT", str(server.request_timeout_seconds)),
        ("FUSEBOX_TOKENIZER_CACHE_SIZE", str(server.tokenizer_cache_size)),
        ("FUSEBOX_TEMPLATES_FILE", f"{CONFIG_DIR}/templates.json"),
        ("FUSEBOX_CANNED_ANSWERS_FILE", f"{CONFIG_DIR}/canned-answers.json"),
        ("FUSEBOX_QUALITY_SAMPLE_RATE", f"{spec.breaker.quality.sample_rate:g}"),
        (
            "FUSEBOX_QUALITY_MAX_OUTPUT_INPUT_RATIO",
            f"{spec.breaker.quality.max_output_input_ratio:g}",
        ),
        ("FUSEBOX_QUALITY_BLOCKED_TERMS_FILE", f"{CONFIG_DIR}/blocked-terms.json"),
        # auto: CUDA when the container sees a GPU (a simulated one shows none).
        ("FUSEBOX_DEVICE", "auto" if spec.gpu.count > 0 else "cpu"),
        # Read-only root: every library cache goes to the writable /tmp volume.
        ("HOME", "/tmp"),
        ("HF_HOME", "/tmp/huggingface"),
        ("HF_HUB_OFFLINE", "1"),
    ]
    if spec.fallback is not None:
        fallback_source = spec.fallback.source or spec.model.source
        values.append(("FUSEBOX_FALLBACK_DIR", _model_dir(fallback_source)))
        values.append(("FUSEBOX_FALLBACK_QUANTIZATION", spec.fallback.quantization))
    # server.env is a test/demo passthrough (e.g. FUSEBOX_FAULTS); it may
    # override a managed value in place (no duplicate names in the pod spec).
    merged = dict(values)
    merged.update(server.env)
    return [{"name": key, "value": value} for key, value in merged.items()]


def _server_container(
    spec: InferenceServiceSpec, sizing: MemorySizing, settings: OperatorSettings
) -> Manifest:
    requests: dict[str, str] = {
        "cpu": spec.server.cpu,
        "memory": memory_quantity(sizing.request_bytes),
    }
    limits: dict[str, str] = {"memory": memory_quantity(sizing.limit_bytes)}
    if not spec.memory.allow_swap:
        limits["cpu"] = spec.server.cpu  # every resource equal: Guaranteed QoS, no swap
    if spec.gpu.count > 0:
        requests["nvidia.com/gpu"] = str(spec.gpu.count)
        limits["nvidia.com/gpu"] = str(spec.gpu.count)
    mounts: list[Manifest] = [
        {"name": "runtime", "mountPath": RUNTIME_DIR},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "admin-token", "mountPath": ADMIN_TOKEN_DIR, "readOnly": True},
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
    ]
    mounts += [
        {"name": f"model-{claim}", "mountPath": f"{MODELS_ROOT}/{claim}", "readOnly": True}
        for claim in _model_claims(spec)
    ]
    return {
        "name": SERVER_CONTAINER,
        "image": settings.inference_image,
        "imagePullPolicy": "IfNotPresent",
        "env": _server_env(spec),
        "ports": [
            {"name": "http", "containerPort": API_PORT, "protocol": "TCP"},
            {"name": "admin", "containerPort": ADMIN_PORT, "protocol": "TCP"},
        ],
        # Startup covers the model load; liveness is a slow backstop so the
        # operator's own wedge detection (faster, with an event) acts first.
        "startupProbe": {
            "httpGet": {"path": "/healthz", "port": "http"},
            "periodSeconds": 2,
            "timeoutSeconds": 2,
            "failureThreshold": 150,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "http"},
            "periodSeconds": 10,
            "timeoutSeconds": 3,
            "failureThreshold": 6,
        },
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": "http"},
            "periodSeconds": 2,
            "timeoutSeconds": 2,
            "failureThreshold": 2,
        },
        "resources": {"requests": requests, "limits": limits},
        "securityContext": _restricted_container_security(),
        "volumeMounts": mounts,
    }


def _sidecar_container(settings: OperatorSettings) -> Manifest:
    resources = {"cpu": "100m", "memory": "160Mi"}
    return {
        "name": SIDECAR_CONTAINER,
        "image": settings.inference_image,
        "imagePullPolicy": "IfNotPresent",
        "command": [
            *SIDECAR_COMMAND,
            "--stats-file",
            STATS_FILE,
            "--port",
            str(METRICS_PORT),
        ],
        "env": [{"name": "HOME", "value": "/tmp"}],
        "ports": [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "metrics"},
            "periodSeconds": 10,
            "timeoutSeconds": 3,
            "failureThreshold": 3,
        },
        "readinessProbe": {
            "httpGet": {"path": "/healthz", "port": "metrics"},
            "periodSeconds": 5,
            "timeoutSeconds": 2,
        },
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "securityContext": _restricted_container_security(),
        "volumeMounts": [
            {"name": "runtime", "mountPath": RUNTIME_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }


def build_pod_template(
    spec: InferenceServiceSpec, name: str, sizing: MemorySizing, settings: OperatorSettings
) -> Manifest:
    volumes: list[Manifest] = [
        {"name": "runtime", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
        {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
        {
            "name": "admin-token",
            "secret": {"secretName": admin_secret_name(name), "defaultMode": 0o440},
        },
        {"name": "config", "configMap": {"name": config_map_name(name)}},
    ]
    volumes += [
        {"name": f"model-{claim}", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        for claim in _model_claims(spec)
    ]
    pod_spec: Manifest = {
        # The sidecar reads the server's /proc/<pid>/status for RSS.
        "shareProcessNamespace": True,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": spec.server.request_timeout_seconds + 10,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": NONROOT_UID,
            "runAsGroup": NONROOT_UID,
            "fsGroup": NONROOT_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            _server_container(spec, sizing, settings),
            _sidecar_container(settings),
        ],
        "volumes": volumes,
    }
    if spec.gpu.count > 0:
        pod_spec["tolerations"] = [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]
    if spec.gpu.product:
        pod_spec["nodeSelector"] = {"nvidia.com/gpu.product": spec.gpu.product}
    return {
        "metadata": {
            "labels": common_labels(name),
            "annotations": {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(METRICS_PORT),
            },
        },
        "spec": pod_spec,
    }


def template_hash(template: Manifest) -> str:
    """A stable digest of the pod template: the Deployment is replaced only when it moves."""
    canonical = json.dumps(template, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def build_deployment(
    spec: InferenceServiceSpec,
    name: str,
    namespace: str,
    sizing: MemorySizing,
    settings: OperatorSettings,
) -> Manifest:
    template = build_pod_template(spec, name, sizing, settings)
    metadata = _metadata(name, namespace, name)
    metadata["annotations"] = {TEMPLATE_HASH_ANNOTATION: template_hash(template)}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            "replicas": spec.replicas,
            "selector": {"matchLabels": selector_labels(name)},
            # GPUs are scarce: replace a pod in place rather than surge a new one.
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
            },
            "template": template,
        },
    }


def build_service(name: str, namespace: str) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(name, namespace, name),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(name),
            "ports": [{"name": "http", "port": API_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def build_admin_secret(name: str, namespace: str, token: str) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(admin_secret_name(name), namespace, name),
        "type": "Opaque",
        "stringData": {ADMIN_TOKEN_KEY: token},
    }


def build_config_map(spec: InferenceServiceSpec, name: str, namespace: str) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(config_map_name(name), namespace, name),
        "data": {
            "templates.json": json.dumps(list(spec.server.templates), ensure_ascii=False),
            "canned-answers.json": json.dumps(
                dict(spec.degradation.canned_answers), ensure_ascii=False, sort_keys=True
            ),
            "blocked-terms.json": json.dumps(
                list(spec.breaker.quality.blocked_terms), ensure_ascii=False
            ),
        },
    }


def build_pdb(name: str, namespace: str) -> Manifest:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(name, namespace, name),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(name)}},
    }


def build_network_policy(name: str, namespace: str, settings: OperatorSettings) -> Manifest:
    operator_peer: Manifest = {
        "namespaceSelector": {
            "matchLabels": {"kubernetes.io/metadata.name": settings.operator_namespace}
        },
        "podSelector": {"matchLabels": dict(settings.operator_pod_labels)},
    }
    metrics_peers: list[Manifest] = [operator_peer]
    if settings.monitoring_namespace:
        metrics_peers.append(
            {
                "namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": settings.monitoring_namespace}
                }
            }
        )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(name, namespace, name),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(name)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"ports": [{"port": API_PORT, "protocol": "TCP"}]},
                {"from": [operator_peer], "ports": [{"port": ADMIN_PORT, "protocol": "TCP"}]},
                {"from": metrics_peers, "ports": [{"port": METRICS_PORT, "protocol": "TCP"}]},
            ],
        },
    }
