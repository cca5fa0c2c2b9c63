"""The chart's inference.pod reaches the operator as every service's spec.pod defaults.

The path crosses three parts: values.yaml (checked by values.schema.json) ->
the operator Deployment's FUSEBOX_POD_DEFAULTS -> OperatorSettings, which the
operator's builders merge under each service's own spec.pod.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fusebox_operator.settings import OperatorSettings

from .conftest import CHART, Render, env_of, one, run_helm

SCHEMA_REFUSAL = "values don't meet the specifications of the schema"
POOL_TOLERATION = {"key": "pool", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}


def operator_settings(render: Render, *values: Path) -> OperatorSettings:
    env = env_of(one(render(*values), "Deployment"))
    return OperatorSettings.from_env(env)


def test_the_default_chart_gives_the_services_no_pod_defaults(render: Render) -> None:
    assert operator_settings(render).pod_defaults == OperatorSettings().pod_defaults


def test_inference_pod_values_reach_the_operator_as_pod_defaults(
    render: Render, tmp_path: Path
) -> None:
    values = tmp_path / "pod.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "inference": {
                    "pod": {
                        "tolerations": [POOL_TOLERATION],
                        "nodeSelector": {"pool": "gpu"},
                        "imagePullSecrets": [{"name": "regcred"}],
                        "runtimeClassName": "nvidia",
                        "priorityClassName": "inference",
                        "labels": {"team": "ml"},
                        "annotations": {"example.com/owner": "ml"},
                    }
                }
            }
        )
    )
    defaults = operator_settings(render, values).pod_defaults
    assert defaults.tolerations == (POOL_TOLERATION,)
    assert dict(defaults.node_selector) == {"pool": "gpu"}
    assert defaults.image_pull_secrets == ("regcred",)
    assert defaults.runtime_class_name == "nvidia"
    assert defaults.priority_class_name == "inference"
    assert dict(defaults.labels) == {"team": "ml"}
    assert dict(defaults.annotations) == {"example.com/owner": "ml"}
    assert defaults.service_account_name is None  # "" in the chart: no default


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"securityContext": {"privileged": True}}, "securityContext"),
        ({"image": "registry.example.com/inference:v2"}, "image"),
        ({"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100"}}, "nvidia.com~1gpu.product"),
        ({"runtimeClassName": "Not_A_Name"}, "runtimeClassName"),
    ],
)
def test_the_schema_refuses_what_a_service_may_not_default(
    helm: Path, tmp_path: Path, values: dict[str, object], named: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"inference": {"pod": values}}))
    result = run_helm(helm, "template", "fusebox", str(CHART), "--values", str(path))
    assert result.returncode != 0
    assert SCHEMA_REFUSAL in result.stderr, result.stderr
    assert named in result.stderr, result.stderr
