"""The inference pods carry their service and model as labels, which the chart's
PodMonitor copies onto every sidecar series (`service`, `model_name`)."""

from __future__ import annotations

import re

import pytest

from fusebox_operator.manifests import (
    MODEL_LABEL,
    SERVICE_LABEL,
    build_pod_template,
    model_label_value,
)
from fusebox_operator.settings import OperatorSettings
from fusebox_operator.sizing import size_memory
from fusebox_operator.spec import parse_spec

# Kubernetes' label value syntax (apimachinery's validation.IsValidLabelValue).
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def pod_labels(model_name: str, service: str = "chat") -> dict[str, str]:
    spec = parse_spec({"model": {"name": model_name, "source": "pvc://m"}})
    template = build_pod_template(spec, service, size_memory(spec, [1024]), OperatorSettings())
    return dict(template["metadata"]["labels"])


def test_the_pods_carry_the_service_and_the_model() -> None:
    labels = pod_labels("tiny-llama", service="chat-bot")
    assert labels[SERVICE_LABEL] == "chat-bot"
    assert labels[MODEL_LABEL] == "tiny-llama"


@pytest.mark.parametrize(
    ("model", "label"),
    [("Qwen2.5-0.5B", "Qwen2.5-0.5B"), ("llama-", "llama"), ("m_v1._-", "m_v1"), ("a", "a")],
)
def test_every_model_name_the_crd_admits_is_a_valid_label_value(model: str, label: str) -> None:
    assert model_label_value(model) == label
    assert LABEL_VALUE.fullmatch(label)
    assert pod_labels(model)[MODEL_LABEL] == label
