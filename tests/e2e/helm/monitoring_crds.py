"""Minimal stand-ins for the Prometheus Operator's PodMonitor and ServiceMonitor
CRDs (monitoring.coreos.com/v1), written for these tests.

Why not the real ones: nothing can be downloaded here, and the tests only need
the API server to know the kinds and to check, under
`kubectl apply --dry-run=server --validate=strict`, the fields the chart sets.
The schemas are deliberately closed: a field the chart sets that is not listed
here is rejected, so a typo in a template fails the test.
"""

from __future__ import annotations

from typing import Any

STRING = {"type": "string"}
LABEL_SELECTOR = {
    "type": "object",
    "properties": {
        "matchLabels": {"type": "object", "additionalProperties": STRING},
        "matchExpressions": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "key": STRING,
                    "operator": STRING,
                    "values": {"type": "array", "items": STRING},
                },
            },
        },
    },
}
NAMESPACE_SELECTOR = {
    "type": "object",
    "properties": {"any": {"type": "boolean"}, "matchNames": {"type": "array", "items": STRING}},
}
ENDPOINT = {
    "type": "object",
    "properties": {
        "port": STRING,
        "path": STRING,
        "scheme": {"type": "string", "enum": ["http", "https"]},
        "interval": {"type": "string", "pattern": "^([0-9]+(ms|s|m|h|d|w|y))+$"},
        "scrapeTimeout": STRING,
        "honorLabels": {"type": "boolean"},
    },
}


def monitor_crd(kind: str, endpoints_field: str) -> dict[str, Any]:
    plural = f"{kind.lower()}s"
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com",
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
            },
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "required": ["selector", endpoints_field],
                                    "properties": {
                                        "selector": LABEL_SELECTOR,
                                        "namespaceSelector": NAMESPACE_SELECTOR,
                                        "jobLabel": STRING,
                                        endpoints_field: {"type": "array", "items": ENDPOINT},
                                    },
                                }
                            },
                        }
                    },
                }
            ],
        },
    }


MONITORING_CRDS = [
    monitor_crd("PodMonitor", "podMetricsEndpoints"),
    monitor_crd("ServiceMonitor", "endpoints"),
]
