"""Pods as the apiserver serves them, built with the client's models.

The operator reads pods as JSON (pod_view.py); the tests build them with the
client's typed models, which say what each field is, and hand over the JSON the
client would have sent (camelCase, RFC 3339 timestamps, no nulls).
"""

from __future__ import annotations

from typing import Any

from kubernetes.client import ApiClient

from fusebox_operator.observations import PodView
from fusebox_operator.pod_view import pod_view

_CLIENT = ApiClient()


def served(model: Any) -> Any:
    """A typed client object as JSON, the way the API serves it."""
    return _CLIENT.sanitize_for_serialization(model)  # type: ignore[no-untyped-call]


def view_of(pod: Any) -> PodView:
    """What the operator reads of a typed pod, through the JSON the API would serve."""
    return pod_view(served(pod))
