"""spec.pod: placement and identity of the inference pods, and the chart's defaults for it.

What a user sees: the pod carries what spec.pod (or the chart) says, Fusebox's own
fields and keys are refused by name, a service's value wins over the chart's, and
restricted Pod Security holds whatever is set.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from fusebox_operator.manifests import build_deployment, build_pod_template
from fusebox_operator.pod_placement import (
    OWNED_FIELDS,
    is_reserved_annotation,
    is_reserved_label,
)
from fusebox_operator.render import render_service
from fusebox_operator.settings import OperatorSettings
from fusebox_operator.sizing import size_memory
from fusebox_operator.spec import SpecError, parse_spec

from .conftest import REPO
from .pod_security import restricted_violations
from .test_crd import ENUMS as CRD_ENUMS

Snapshot = Callable[[str, Any], None]
MODEL = {"name": "chat", "source": "pvc://models/chat"}
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
POOL_TOLERATION = {"key": "pool", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
ZONE_SPREAD = {
    "maxSkew": 1,
    "topologyKey": "topology.kubernetes.io/zone",
    "whenUnsatisfiable": "ScheduleAnyway",
    "labelSelector": {"matchLabels": {"fusebox.dev/service": "chat"}},
}
UNSELECTED_SPREAD = {key: value for key, value in ZONE_SPREAD.items() if key != "labelSelector"}
EVERY_FIELD = {
    "tolerations": [POOL_TOLERATION],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}]}
                ]
            }
        }
    },
    "nodeSelector": {"kubernetes.io/os": "linux", "nvidia.com/gpu.product": "NVIDIA-H100"},
    "topologySpreadConstraints": [ZONE_SPREAD],
    "imagePullSecrets": [{"name": "regcred"}],
    "runtimeClassName": "nvidia",
    "priorityClassName": "inference-high",
    "serviceAccountName": "chat-identity",
    "labels": {"team": "search"},
    "annotations": {"example.com/owner": "search-team"},
    "image": "registry.example.com/fusebox/inference:v1@sha256:" + "0" * 64,
}


def pod_of(
    pod: dict[str, Any] | None = None,
    settings: OperatorSettings | None = None,
    **spec: Any,
) -> dict[str, Any]:
    raw: dict[str, Any] = {"model": MODEL, **spec}
    if pod is not None:
        raw["pod"] = pod
    parsed = parse_spec(raw)
    sizing = size_memory(parsed, [81559])
    template = build_pod_template(parsed, "chat", sizing, settings or OperatorSettings())
    return template


def refusal(pod: Any, **spec: Any) -> str:
    with pytest.raises(SpecError) as caught:
        parse_spec({"model": MODEL, "pod": pod, **spec})
    return str(caught.value)


def defaults(values: dict[str, Any]) -> OperatorSettings:
    return OperatorSettings.from_env({"FUSEBOX_POD_DEFAULTS": json.dumps(values)})


def test_every_field_reaches_the_pod_as_the_golden_shows(snapshot: Snapshot) -> None:
    parsed = parse_spec({"model": MODEL, "gpu": {"product": "NVIDIA-H100"}, "pod": EVERY_FIELD})
    # The chart's defaults, each overridden or merged by the service's own.
    settings = defaults(
        {
            "tolerations": [{"key": "other", "operator": "Exists"}],
            "labels": {"cost-center": "ml", "team": "platform"},
            "runtimeClassName": "runc",
        }
    )
    deployment = build_deployment(parsed, "chat", "ml", size_memory(parsed, [81559]), settings)
    snapshot("deployment-pod-placement", deployment)
    pod = deployment["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["tolerations"] == [POOL_TOLERATION, GPU_TOLERATION]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels["team"] == "search" and labels["cost-center"] == "ml"


def test_restricted_pod_security_holds_with_every_field_set() -> None:
    pod = pod_of(EVERY_FIELD, gpu={"product": "NVIDIA-H100"})["spec"]
    assert restricted_violations(pod) == []
    assert pod["automountServiceAccountToken"] is False  # a ServiceAccount, still no token
    assert pod["serviceAccountName"] == "chat-identity"


def test_the_image_override_reaches_the_server_and_the_sidecar() -> None:
    pod = pod_of({"image": "registry.example.com/inference:v2"})["spec"]
    images = {c["image"] for c in [*pod["containers"], *pod["initContainers"]]}
    assert images == {"registry.example.com/inference:v2"}
    assert {c["image"] for c in pod_of()["spec"]["containers"]} == {
        OperatorSettings().inference_image
    }


def test_the_gpu_toleration_stays_beside_the_pools_and_is_not_repeated() -> None:
    assert pod_of({"tolerations": [POOL_TOLERATION]})["spec"]["tolerations"] == [
        POOL_TOLERATION,
        GPU_TOLERATION,
    ]
    assert pod_of({"tolerations": [GPU_TOLERATION]})["spec"]["tolerations"] == [GPU_TOLERATION]
    # A CPU pod gets only what it asked for.
    cpu = pod_of({"tolerations": [POOL_TOLERATION]}, gpu={"count": 0})["spec"]
    assert cpu["tolerations"] == [POOL_TOLERATION]


def test_the_node_selector_merges_with_the_gpu_product() -> None:
    pod = pod_of({"nodeSelector": {"pool": "gpu"}}, gpu={"product": "NVIDIA-H100"})["spec"]
    assert pod["nodeSelector"] == {"pool": "gpu", "nvidia.com/gpu.product": "NVIDIA-H100"}


def test_a_node_selector_naming_another_product_is_refused_naming_the_key() -> None:
    message = refusal(
        {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100"}},
        gpu={"product": "NVIDIA-H100"},
    )
    assert "spec.pod.nodeSelector['nvidia.com/gpu.product']" in message
    assert "NVIDIA-A100" in message and "NVIDIA-H100" in message


@pytest.mark.parametrize(
    "field",
    [
        "securityContext",
        "hostNetwork",
        "hostPID",
        "privileged",
        "containers",
        "volumes",
        "env",
        "resources",
        "livenessProbe",
    ],
)
def test_a_field_fusebox_owns_is_refused_naming_it(field: str) -> None:
    message = refusal({field: True})
    assert f"spec.pod.{field} cannot be set: Fusebox owns it" in message
    assert OWNED_FIELDS[field] in message


def test_an_unknown_field_is_refused_naming_it_and_the_fields_taken() -> None:
    message = refusal({"nodeSelecter": {"a": "b"}})
    assert "spec.pod.nodeSelecter is not a field of spec.pod" in message
    assert "nodeSelector" in message


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ("labels", "fusebox.dev/service"),
        ("labels", "app.kubernetes.io/name"),
        ("labels", "app.kubernetes.io/managed-by"),
        ("annotations", "fusebox.dev/model-revision"),
        ("annotations", "prometheus.io/port"),
    ],
)
def test_fuseboxs_own_labels_and_annotations_cannot_be_overridden(section: str, key: str) -> None:
    message = refusal({section: {key: "mine"}})
    assert f"spec.pod.{section}[{key!r}] cannot be set: Fusebox sets it" in message


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("container.apparmor.security.beta.kubernetes.io/server", "unconfined"),
        ("container.apparmor.security.beta.kubernetes.io/sidecar", "unconfined"),
        ("seccomp.security.alpha.kubernetes.io/pod", "unconfined"),
        ("container.seccomp.security.alpha.kubernetes.io/server", "unconfined"),
    ],
)
def test_an_annotation_that_would_unconfine_a_container_is_refused(key: str, value: str) -> None:
    message = refusal({"annotations": {key: value}})
    assert f"spec.pod.annotations[{key!r}] cannot be {value!r}" in message
    assert "restricted Pod Security" in message


def test_a_seccomp_annotation_is_refused_with_one_rule_whatever_its_value() -> None:
    """Refused as unconfined, then as a node's profile: both times the rule that holds."""
    for value in ("unconfined", "localhost/x"):
        message = refusal({"annotations": {"seccomp.security.alpha.kubernetes.io/pod": value}})
        assert "runtime/default or docker/default" in message, message
        assert "localhost/PROFILE" not in message, message


@pytest.mark.parametrize(
    "value", ["runtime/default", "docker/default", "localhost/fusebox-inference"]
)
def test_an_annotation_naming_a_confining_profile_reaches_the_pod(value: str) -> None:
    key = "container.apparmor.security.beta.kubernetes.io/server"
    pod = pod_of(pod={"annotations": {key: value}})
    assert pod["metadata"]["annotations"][key] == value


SERVICE_SELECTOR = {"matchLabels": {"fusebox.dev/service": "chat"}}
HOST_SPREAD = {**UNSELECTED_SPREAD, "topologyKey": "kubernetes.io/hostname"}


@pytest.mark.parametrize(
    ("pod", "named", "says"),
    [
        (
            {"affinity": {"podAntiAffinity": {REQUIRED: [{"labelSelector": SERVICE_SELECTOR}]}}},
            "affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]"
            ".topologyKey",
            "is required",
        ),
        (
            {
                "affinity": {
                    "podAffinity": {
                        PREFERRED: [
                            {"weight": 10, "podAffinityTerm": {"labelSelector": SERVICE_SELECTOR}}
                        ]
                    }
                }
            },
            "affinity.podAffinity.preferredDuringSchedulingIgnoredDuringExecution[0]"
            ".podAffinityTerm.topologyKey",
            "is required",
        ),
        (
            {"topologySpreadConstraints": [HOST_SPREAD, {**HOST_SPREAD, "maxSkew": 2}]},
            "topologySpreadConstraints[1]",
            "repeats topologyKey 'kubernetes.io/hostname' with whenUnsatisfiable",
        ),
        (
            {
                "annotations": {
                    "container.apparmor.security.beta.kubernetes.io/web": "runtime/default"
                }
            },
            "annotations['container.apparmor.security.beta.kubernetes.io/web']",
            "names no container of the pod",
        ),
        (
            {
                "annotations": {
                    "seccomp.security.alpha.kubernetes.io/pod": "localhost/profiles/x.json"
                }
            },
            "annotations['seccomp.security.alpha.kubernetes.io/pod']",
            "seccompProfile RuntimeDefault",
        ),
        (
            {"topologySpreadConstraints": [{**HOST_SPREAD, "maxSkew": 2**31}]},
            "topologySpreadConstraints[0].maxSkew",
            "at most 2147483647",
        ),
    ],
    ids=["anti-affinity", "affinity", "spread-twice", "apparmor-container", "seccomp", "skew"],
)
def test_a_pod_value_the_api_server_would_refuse_in_the_deployment_is_refused_naming_it(
    pod: dict[str, Any], named: str, says: str
) -> None:
    """Accepted before, these made every reconcile fail with 'Unprocessable Entity'."""
    message = refusal(pod)
    assert f"spec.pod.{named}" in message and says in message


def test_pod_affinity_terms_with_a_topology_key_and_confined_containers_reach_the_pod() -> None:
    term = {"labelSelector": SERVICE_SELECTOR, "topologyKey": "kubernetes.io/hostname"}
    annotations = {
        "container.apparmor.security.beta.kubernetes.io/sidecar": "localhost/fusebox",
        "seccomp.security.alpha.kubernetes.io/pod": "runtime/default",
    }
    affinity = {
        "podAntiAffinity": {
            REQUIRED: [term],
            PREFERRED: [{"weight": 100, "podAffinityTerm": term}],
        }
    }
    spread = [HOST_SPREAD, {**HOST_SPREAD, "whenUnsatisfiable": "DoNotSchedule"}]
    pod = pod_of(
        pod={"affinity": affinity, "annotations": annotations, "topologySpreadConstraints": spread}
    )
    assert pod["spec"]["affinity"] == affinity
    assert pod["spec"]["topologySpreadConstraints"] == spread
    assert annotations.items() <= pod["metadata"]["annotations"].items()


def test_every_label_and_annotation_fusebox_renders_is_reserved() -> None:
    # The reserved lists and the builder are two places: this keeps them one set.
    metadata = pod_of(gpu={"product": "NVIDIA-H100"})["metadata"]
    assert all(is_reserved_label(key) for key in metadata["labels"])
    assert all(is_reserved_annotation(key) for key in metadata["annotations"])


def test_the_crd_rules_refuse_the_same_label_and_annotation_keys() -> None:
    crd = yaml.safe_load((REPO / "crds" / "inferenceservice.yaml").read_text(encoding="utf-8"))
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rules = " ".join(r["rule"] for r in spec["properties"]["pod"]["x-kubernetes-validations"])
    metadata = pod_of(gpu={"product": "NVIDIA-H100"})["metadata"]
    for key in [*metadata["labels"], *metadata["annotations"]]:
        assert f"'{key}'" in rules or key.startswith("fusebox.dev/"), key
    assert "startsWith('fusebox.dev/')" in rules


@pytest.mark.parametrize(
    ("pod", "named"),
    [
        ({"tolerations": [{"key": "a", "operator": "Exists", "value": "b"}]}, "tolerations[0]"),
        ({"tolerations": [{"key": "a", "operator": "Matches"}]}, "tolerations[0].operator"),
        (
            {"tolerations": [{"key": "a", "tolerationSeconds": 5}]},
            "tolerations[0].tolerationSeconds",
        ),
        (
            {"topologySpreadConstraints": [{**ZONE_SPREAD, "maxSkew": 0}]},
            "topologySpreadConstraints[0].maxSkew",
        ),
        ({"imagePullSecrets": ["regcred"]}, "imagePullSecrets[0]"),
        ({"runtimeClassName": "Not_A_Name"}, "runtimeClassName"),
        ({"labels": {"team": "a b"}}, "labels['team']"),
        ({"affinity": {"nodeAfinity": {}}}, "affinity.nodeAfinity"),
        ({"tolerations": [{"key": "gpu pool", "operator": "Exists"}]}, "tolerations[0].key"),
        (
            {"topologySpreadConstraints": [{**ZONE_SPREAD, "topologyKey": "zone key"}]},
            "topologySpreadConstraints[0].topologyKey",
        ),
        ({"image": "has space"}, "image"),
    ],
)
def test_a_malformed_value_is_refused_naming_its_field(pod: dict[str, Any], named: str) -> None:
    assert f"spec.pod.{named}" in refusal(pod)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (path, value)
        for path, values in CRD_ENUMS.items()
        if path.startswith("pod.")
        for value in values
    ],
)
def test_every_enum_value_the_crd_admits_in_spec_pod_parses(path: str, value: str) -> None:
    _, section, key = path.split(".")
    entry: dict[str, Any] = {"key": "k", "operator": "Exists"}
    if section == "topologySpreadConstraints":
        entry = dict(ZONE_SPREAD)
    entry[key] = value
    parse_spec({"model": MODEL, "pod": {section: [entry]}})


def test_a_service_value_wins_lists_replace_and_maps_merge() -> None:
    settings = defaults(
        {
            "tolerations": [{"key": "default-pool", "operator": "Exists"}],
            "nodeSelector": {"pool": "shared", "kubernetes.io/os": "linux"},
            "labels": {"team": "platform", "cost-center": "ml"},
            "annotations": {"example.com/a": "1"},
            "priorityClassName": "default-priority",
            "runtimeClassName": "nvidia",
            "imagePullSecrets": [{"name": "shared-cred"}],
        }
    )
    own = {
        "tolerations": [POOL_TOLERATION],
        "nodeSelector": {"pool": "dedicated"},
        "labels": {"team": "search"},
        "priorityClassName": "mine",
    }
    template = pod_of(own, settings, gpu={"count": 0})
    pod = template["spec"]
    assert pod["tolerations"] == [POOL_TOLERATION]  # the service's list replaces
    assert pod["nodeSelector"] == {"pool": "dedicated", "kubernetes.io/os": "linux"}
    assert template["metadata"]["labels"]["team"] == "search"
    assert template["metadata"]["labels"]["cost-center"] == "ml"
    assert template["metadata"]["annotations"]["example.com/a"] == "1"
    assert pod["priorityClassName"] == "mine"
    assert pod["runtimeClassName"] == "nvidia"  # not set by the service: the default
    assert pod["imagePullSecrets"] == [{"name": "shared-cred"}]


def test_the_charts_empty_values_are_no_defaults() -> None:
    chart = yaml.safe_load((REPO / "helm" / "fusebox" / "values.yaml").read_text("utf-8"))
    assert defaults(chart["inference"]["pod"]) == OperatorSettings()


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"securityContext": {}}, "inference.pod.securityContext cannot be set"),
        ({"image": "x:1"}, "inference.pod.image: set the chart's inferenceImage"),
        ({"nodeSelector": {"nvidia.com/gpu.product": "H100"}}, "gpu.product"),
        ({"labels": {"fusebox.dev/service": "x"}}, "inference.pod.labels['fusebox.dev/service']"),
        # Past the sizes the CRD bounds a spec.pod by, at any depth.
        (
            {"annotations": {"example.com/x": "v" * 513}},
            "inference.pod.annotations['example.com/x'] must be at most 512 characters",
        ),
        # What the API server refuses in every service's Deployment, named here once.
        (
            {"tolerations": [{"key": "gpu pool!", "operator": "Exists"}]},
            "inference.pod.tolerations[0].key 'gpu pool!' is not a qualified name",
        ),
        (
            {"tolerations": [{"key": "k" * 318, "operator": "Exists"}]},
            "inference.pod.tolerations[0].key",
        ),
        (
            {"tolerations": [{"key": "pool", "operator": "Equal", "value": "a b"}]},
            "inference.pod.tolerations[0].value 'a b' is not a label value",
        ),
        (
            {"topologySpreadConstraints": [{**ZONE_SPREAD, "topologyKey": "zone key!"}]},
            "inference.pod.topologySpreadConstraints[0].topologyKey 'zone key!' is not a "
            "qualified name",
        ),
        (
            {"topologySpreadConstraints": [{**UNSELECTED_SPREAD, "matchLabelKeys": ["a"]}]},
            "inference.pod.topologySpreadConstraints[0].matchLabelKeys needs a labelSelector",
        ),
        (
            {
                "topologySpreadConstraints": [
                    {**ZONE_SPREAD, "labelSelector": {}, "matchLabelKeys": ["a b"]}
                ]
            },
            "inference.pod.topologySpreadConstraints[0].matchLabelKeys[0] 'a b' is not a "
            "qualified name",
        ),
        (
            {"affinity": {"nodeAffinity": {REQUIRED: "x"}}},
            f"inference.pod.affinity.nodeAffinity.{REQUIRED} must be an object",
        ),
        (
            {"affinity": {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": []}}}},
            f"inference.pod.affinity.nodeAffinity.{REQUIRED}.nodeSelectorTerms must be a "
            "non-empty list",
        ),
        (
            {"affinity": {"podAntiAffinity": {PREFERRED: [None]}}},
            f"inference.pod.affinity.podAntiAffinity.{PREFERRED}[0] must be an object",
        ),
        (
            {"affinity": {"podAffinity": {"requiredDuringScheduling": []}}},
            "inference.pod.affinity.podAffinity.requiredDuringScheduling is not a field",
        ),
        (
            {"tolerations": [{"operator": "Exists"}] * 17},
            "inference.pod.tolerations must have at most 16 items",
        ),
    ],
)
def test_a_bad_chart_default_stops_the_operator_naming_it(
    values: dict[str, Any], named: str
) -> None:
    with pytest.raises(ValueError) as caught:
        defaults(values)
    assert "FUSEBOX_POD_DEFAULTS" in str(caught.value)
    assert named in str(caught.value)


def test_render_refuses_an_owned_field_as_the_operator_does() -> None:
    document = {"metadata": {"name": "chat"}, "spec": {"model": MODEL, "pod": {"hostPID": True}}}
    with pytest.raises(SpecError, match=r"InferenceService chat: spec.pod.hostPID cannot be set"):
        render_service(document, None, None, "", OperatorSettings())
