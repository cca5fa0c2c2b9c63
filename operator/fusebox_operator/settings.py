"""Operator-wide settings read once from the environment.

Why: the image, the namespaces the NetworkPolicy trusts and the watch scope
differ between a laptop cluster, CI and production, and the Helm chart sets
them as env vars. Reading them in one place, into a frozen dataclass, keeps
the builders pure (they take `OperatorSettings`, never `os.environ`).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

from fusebox_operator.crd_schema import spec_schema
from fusebox_operator.gpu_products import PRODUCT_LABEL
from fusebox_operator.pod_placement import (
    PlacementError,
    PodPlacement,
    parse_placement,
    pod_field_names,
)

DEFAULT_INFERENCE_IMAGE = "localhost/fusebox/inference:dev"
DEFAULT_OPERATOR_NAMESPACE = "fusebox-system"
DEFAULT_OPERATOR_POD_SELECTOR = "app.kubernetes.io/name=fusebox-operator"
DEFAULT_MONITORING_NAMESPACE = "monitoring"
MIN_RESYNC_SECONDS = 5  # the chart's minimum too (values.schema.json)
# kopf touches its peering entry every lifetime less 5 to 10 s (at least every second).
MIN_PEERING_LIFETIME_SECONDS = 10  # the chart's minimum too
POD_DEFAULTS_ENV = "FUSEBOX_POD_DEFAULTS"
"""JSON of the chart's `inference.pod`: every service's spec.pod defaults."""
INFERENCE_EGRESS_ENV = "FUSEBOX_INFERENCE_EGRESS"
"""The chart's `inference.egress`: `deny` (the default) or `allow`."""
INFERENCE_EGRESS_CHOICES = ("deny", "allow")


def parse_inference_egress(text: str) -> bool:
    """Whether the pods of a service whose model is on a PVC may open connections out."""
    choice = text.strip() or INFERENCE_EGRESS_CHOICES[0]
    if choice not in INFERENCE_EGRESS_CHOICES:
        raise ValueError(
            f"{INFERENCE_EGRESS_ENV}={text!r} must be one of {', '.join(INFERENCE_EGRESS_CHOICES)}"
        )
    return choice == "allow"


def parse_pod_defaults(text: str) -> PodPlacement:
    """The chart's `inference.pod` (JSON), parsed as a spec.pod is, less what is per service.

    No image (the chart's inferenceImage is that default) and no
    nvidia.com/gpu.product selector (gpu.product is each service's choice).
    """
    where = "inference.pod"  # the chart's name for it
    try:
        raw = json.loads(text) if text.strip() else None
    except ValueError as error:
        raise ValueError(f"{POD_DEFAULTS_ENV} is not JSON: {error}") from None
    allowed = tuple(name for name in pod_field_names() if name != "image")
    if isinstance(raw, Mapping):
        # The chart lists every key, empty ("", [], {}) where it has no default.
        raw = {k: v for k, v in raw.items() if k not in allowed or v not in ("", [], {}, None)}
    try:
        defaults = parse_placement(raw, where, allowed)
    except PlacementError as error:
        if isinstance(raw, Mapping) and "image" in raw:
            raise ValueError(
                f"{POD_DEFAULTS_ENV}: {where}.image: set the chart's inferenceImage instead"
            ) from None
        raise ValueError(f"{POD_DEFAULTS_ENV}: {error}") from None
    # The sizes the CRD bounds a spec.pod by (a toleration list, a label value...):
    # a default is a value of every service's spec.pod.
    oversized = next(spec_schema().violations({"pod": raw}), None) if raw else None
    if oversized is not None:
        raise ValueError(f"{POD_DEFAULTS_ENV}: {oversized.replace('spec.pod', where, 1)}")
    if PRODUCT_LABEL in dict(defaults.node_selector):
        raise ValueError(
            f"{POD_DEFAULTS_ENV}: {where}.nodeSelector may not set {PRODUCT_LABEL}: each "
            "service's gpu.product does"
        )
    return defaults


def parse_label_selector(text: str) -> dict[str, str]:
    """`a=b,c=d` into a matchLabels dict; raises ValueError on anything else."""
    labels: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"label selector {text!r}: expected key=value[,key=value]")
        labels[key.strip()] = value.strip()
    return labels


@dataclass(frozen=True)
class OperatorSettings:
    inference_image: str = DEFAULT_INFERENCE_IMAGE
    operator_namespace: str = DEFAULT_OPERATOR_NAMESPACE
    operator_pod_labels: Mapping[str, str] = field(
        default_factory=lambda: parse_label_selector(DEFAULT_OPERATOR_POD_SELECTOR)
    )
    monitoring_namespace: str = DEFAULT_MONITORING_NAMESPACE  # "" = none
    watch_namespaces: tuple[str, ...] = ()  # empty = all namespaces
    peering: str = "auto"  # auto | standalone | <peering object name>
    # kopf pauses every peer that shares the highest priority, so replicas must
    # not tie: 0 means "draw one at start" (see __main__.peering_priority).
    peering_priority: int = 0
    # How long a replica that stopped touching the peering counts as alive: the
    # takeover time when one dies without leaving (its node lost, SIGKILL).
    peering_lifetime_seconds: int = 15
    # This replica's name (the chart passes the pod's as POD_ID; else the host's),
    # shown in status.operator.
    pod_name: str = field(default_factory=socket.gethostname)
    replicas: int = 1
    liveness_port: int = 8080
    metrics_port: int = 9401  # the operator's own /metrics (operator_metrics.py); 0: none
    watch_server_timeout_seconds: int = 300
    watch_client_timeout_seconds: int = 330
    request_timeout_seconds: int = 30
    # How often each service's children are compared with the spec and put back
    # when deleted or edited outside Fusebox (handlers._resync).
    resync_seconds: int = 60
    # The chart's inference.pod: what every service's spec.pod starts from.
    pod_defaults: PodPlacement = PodPlacement()
    # The chart's inference.egress: False closes the egress of the pods that load
    # from a PVC (manifests.build_network_policy); fetching pods always keep it.
    inference_egress_allowed: bool = False

    @property
    def pod_watch_scopes(self) -> tuple[str | None, ...]:
        """Where the pod watch looks: each named namespace, or None for all of them.

        A kopf pattern ("e2e-*", "!kube-system") names no namespace to watch, so
        one watch covers them all (the chart grants such installs cluster-wide
        RBAC); the store still answers per namespace.
        """
        if not self.watch_namespaces or any(
            mark in name for name in self.watch_namespaces for mark in "*?!"
        ):
            return (None,)
        return self.watch_namespaces

    @property
    def standalone(self) -> bool:
        """Peering only matters when several operator replicas could act at once."""
        if self.peering == "auto":
            return self.replicas <= 1
        return self.peering == "standalone"

    @property
    def peering_name(self) -> str:
        return "fusebox" if self.peering in ("auto", "standalone") else self.peering

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> OperatorSettings:
        def integer(name: str, default: int) -> int:
            text = env.get(name, "").strip()
            if not text:
                return default
            if not text.isdigit():
                raise ValueError(f"{name}={text!r} must be a whole number")
            return int(text)

        def at_least(name: str, default: int, minimum: int) -> int:
            value = integer(name, default)
            if value < minimum:
                raise ValueError(f"{name}={value} must be at least {minimum}")
            return value

        namespaces = env.get("FUSEBOX_WATCH_NAMESPACES", "")
        return cls(
            inference_image=env.get("FUSEBOX_INFERENCE_IMAGE") or DEFAULT_INFERENCE_IMAGE,
            operator_namespace=env.get("FUSEBOX_OPERATOR_NAMESPACE") or DEFAULT_OPERATOR_NAMESPACE,
            operator_pod_labels=parse_label_selector(
                env.get("FUSEBOX_OPERATOR_POD_SELECTOR") or DEFAULT_OPERATOR_POD_SELECTOR
            ),
            monitoring_namespace=env.get(
                "FUSEBOX_MONITORING_NAMESPACE", DEFAULT_MONITORING_NAMESPACE
            ),
            watch_namespaces=tuple(n.strip() for n in namespaces.split(",") if n.strip()),
            peering=env.get("FUSEBOX_PEERING") or "auto",
            peering_priority=integer("FUSEBOX_PEERING_PRIORITY", 0),
            peering_lifetime_seconds=at_least(
                "FUSEBOX_PEERING_LIFETIME_SECONDS", 15, MIN_PEERING_LIFETIME_SECONDS
            ),
            pod_name=env.get("POD_ID") or socket.gethostname(),
            replicas=integer("FUSEBOX_OPERATOR_REPLICAS", 1),
            liveness_port=integer("FUSEBOX_LIVENESS_PORT", 8080),
            metrics_port=integer("FUSEBOX_METRICS_PORT", 9401),
            watch_server_timeout_seconds=integer("FUSEBOX_WATCH_SERVER_TIMEOUT_SECONDS", 300),
            watch_client_timeout_seconds=integer("FUSEBOX_WATCH_CLIENT_TIMEOUT_SECONDS", 330),
            request_timeout_seconds=integer("FUSEBOX_REQUEST_TIMEOUT_SECONDS", 30),
            resync_seconds=at_least("FUSEBOX_RESYNC_SECONDS", 60, MIN_RESYNC_SECONDS),
            pod_defaults=parse_pod_defaults(env.get(POD_DEFAULTS_ENV, "")),
            inference_egress_allowed=parse_inference_egress(env.get(INFERENCE_EGRESS_ENV, "")),
        )
