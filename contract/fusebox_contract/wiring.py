"""How a Fusebox pod is wired: ports, paths and HTTP headers both ends rely on."""

from __future__ import annotations

import enum
import math
from typing import Final


class Port(enum.IntEnum):
    API = 8000  # OpenAI-compatible API, /healthz, /readyz
    ADMIN = 8001  # admin API, bearer token
    METRICS = 9400  # the sidecar's /metrics and /healthz


class HttpPath(enum.StrEnum):
    """HTTP paths the kubelet probes and Prometheus scrapes (server and sidecar)."""

    HEALTHZ = "/healthz"  # liveness: server (API port) and sidecar (metrics port)
    READYZ = "/readyz"  # readiness: the server's model is loaded and warm
    METRICS = "/metrics"  # the sidecar's Prometheus text


RUNTIME_DIR: Final = "/run/fusebox"
STATS_FILE: Final = f"{RUNTIME_DIR}/stats.json"
ADMIN_TOKEN_DIR: Final = "/var/run/fusebox-admin"
ADMIN_TOKEN_KEY: Final = "token"
ADMIN_TOKEN_FILE: Final = f"{ADMIN_TOKEN_DIR}/{ADMIN_TOKEN_KEY}"
CONFIG_DIR: Final = "/etc/fusebox"
MODELS_ROOT: Final = "/models"


class ConfigFile(enum.StrEnum):
    """Files of the service's ConfigMap, mounted at CONFIG_DIR and re-read live."""

    TEMPLATES = "templates.json"
    CANNED_ANSWERS = "canned-answers.json"
    QUALITY = "quality.json"

    @property
    def path(self) -> str:
        return f"{CONFIG_DIR}/{self.value}"


class QualityKey(enum.StrEnum):
    """The keys of ConfigFile.QUALITY, a JSON object; each is optional (the server's default).

    Spelled as in the CRD's `breaker.quality`, so the file reads like the spec.
    """

    SAMPLE_RATE = "sampleRate"
    MAX_OUTPUT_INPUT_RATIO = "maxOutputInputRatio"
    BLOCKED_TERMS = "blockedTerms"


REQUEST_ID_HEADER: Final = "X-Request-Id"
VARIANT_HEADER: Final = "X-Fusebox-Variant"  # which variant answered
FAULTS_ENV: Final = "FUSEBOX_FAULTS"
SERVED_BY_HEADER: Final = "X-Fusebox-Served-By"  # primary|fallback|canned: what produced the answer

# GPUs as the kubelet's device manager hands them out: the extended resource
# NVIDIA's device plugin (and localcluster's, localcluster/gpusim) advertises,
# the variable its Allocate sets to the ids of a container's GPUs, and each
# device's health in a pod's status.containerStatuses[].allocatedResourcesStatus.
GPU_RESOURCE: Final = "nvidia.com/gpu"
GPU_VISIBLE_DEVICES_ENV: Final = "NVIDIA_VISIBLE_DEVICES"
# Env the NVIDIA container toolkit and CUDA read to choose a container's GPUs
# and driver libraries. Set by hand in a pod that asks for no GPU, the toolkit
# (at its default, accept-nvidia-visible-devices-envvar-when-unprivileged)
# would hand it every GPU of the node, other tenants' included; only the
# device plugin or the DRA driver may set them.
GPU_SELECTION_ENV_NAMES: Final = frozenset(
    {
        GPU_VISIBLE_DEVICES_ENV,
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_DRIVER_CAPABILITIES",
        "NVIDIA_MIG_CONFIG_DEVICES",
        "NVIDIA_MIG_MONITOR_DEVICES",
    }
)


class DeviceHealth(enum.StrEnum):
    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"


# Where Prometheus runs: the namespace the inference pods' NetworkPolicy admits
# on the metrics port (the operator's default FUSEBOX_MONITORING_NAMESPACE, the
# chart's monitoring.scrapeNamespace) and localcluster's monitoring addon uses.
MONITORING_NAMESPACE: Final = "monitoring"
# The label every object of the chart carries; the addon's Prometheus selects
# PodMonitors and PrometheusRules by it.
PART_OF_LABEL: Final = "app.kubernetes.io/part-of"
PART_OF_VALUE: Final = "fusebox"

# GPUs through Dynamic Resource Allocation: the driver name NVIDIA's DRA driver
# (and localcluster's, localcluster/gpudra) publishes ResourceSlices under, and
# the DeviceClass of the same name that selects its devices.
GPU_DRA_DRIVER: Final = "gpu.nvidia.com"
GPU_DEVICE_CLASS: Final = "gpu.nvidia.com"


# ----- stopping a pod: preStop sleep, close notice, drain, all inside the grace period -----

PRE_STOP_SLEEP_SECONDS: Final = 5
"""The server container's preStop sleep: it keeps accepting while its endpoint leaves the
Service everywhere (kube-proxy, ingress), so no new connection reaches a closing server."""
CLOSE_NOTICE_SECONDS: Final = 2
"""After SIGTERM the server serves on this long, every response with `Connection: close`,
so clients leave their keep-alive connections between requests rather than find them
closed under a request just sent; then it stops accepting."""
DRAIN_MARGIN_SECONDS: Final = 2
"""Past the request timeout, for the last answers' bytes to go out."""
STOP_MARGIN_SECONDS: Final = 6
"""Past the drain, for the threads to stop and the process to exit before SIGKILL."""


def drain_seconds(request_timeout_seconds: float) -> int:
    """How long a server told to stop (SIGTERM) waits for requests under way: the
    longest may have just started, and the request timeout is its deadline."""
    return math.ceil(request_timeout_seconds) + DRAIN_MARGIN_SECONDS


def termination_grace_seconds(request_timeout_seconds: float) -> int:
    """The pod's terminationGracePeriodSeconds: the preStop sleep, the close notice, the
    drain, the exit."""
    return (
        PRE_STOP_SLEEP_SECONDS
        + CLOSE_NOTICE_SECONDS
        + drain_seconds(request_timeout_seconds)
        + STOP_MARGIN_SECONDS
    )
