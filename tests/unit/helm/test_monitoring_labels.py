"""The chart's PodMonitor labels every sidecar series with its service and model.

The source labels are Prometheus' names for the pods' labels the operator sets
(manifests.SERVICE_LABEL, MODEL_LABEL): `__meta_kubernetes_pod_label_` plus the
key with every character outside [a-zA-Z0-9_] turned into `_`.
"""

from __future__ import annotations

import re
from typing import Any

from fusebox_operator.manifests import MODEL_LABEL, SERVICE_LABEL

from .conftest import Render, by_kind

# Labels Prometheus or the Prometheus Operator set on a PodMonitor's targets, and the
# ones the sidecar's own series carry: a target label must not shadow any of them.
TAKEN = {"job", "instance", "namespace", "pod", "container", "endpoint", "le", "model"}


def discovered(key: str) -> str:
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)


def inference_monitor(render: Render) -> dict[str, Any]:
    monitors = by_kind(render(sets=("monitoring.podMonitor.enabled=true",)), "PodMonitor")
    return next(m for m in monitors if m["metadata"]["name"].endswith("-inference"))


def test_the_pod_monitor_copies_service_and_model_onto_every_series(render: Render) -> None:
    (endpoint,) = inference_monitor(render)["spec"]["podMetricsEndpoints"]
    copied = {
        tuple(r["sourceLabels"]): r["targetLabel"]
        for r in endpoint["relabelings"]
        if r["action"] == "replace"
    }
    assert copied == {
        (discovered(SERVICE_LABEL),): "service",
        (discovered(MODEL_LABEL),): "model_name",
    }
    assert not set(copied.values()) & TAKEN
