"""values.schema.json refuses at `helm install` the inference.pod values the operator
refuses when it starts (settings.parse_pod_defaults): caught there, they would make
the install succeed and the operator crash-loop. Each case crosses both ends: the
schema names the key, and the operator's own parser refuses the same value; what
the schema admits, the parser admits too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from fusebox_operator.settings import parse_pod_defaults

from .conftest import CHART, Render, env_of, one, run_helm

SCHEMA_REFUSAL = "values don't meet the specifications of the schema"
SPREAD = {
    "maxSkew": 1,
    "topologyKey": "kubernetes.io/hostname",
    "whenUnsatisfiable": "DoNotSchedule",
}
AT = "/inference/pod/"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


def with_pod(tmp_path: Path, pod: dict[str, Any]) -> Path:
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump({"inference": {"pod": pod}}))
    return path


@pytest.mark.parametrize(
    ("pod", "pointer"),
    [
        ({"tolerations": [{"key": "a", "foo": "bar"}]}, "tolerations/0"),
        ({"tolerations": [{"key": "a", "operator": "Maybe"}]}, "tolerations/0/operator"),
        (
            {"tolerations": [{"key": "a", "operator": "Exists", "value": "x"}]},
            "tolerations/0/value",
        ),
        ({"tolerations": [{"operator": "Equal", "value": "x"}]}, "tolerations/0"),
        ({"tolerations": [{"key": "a", "effect": "Sometimes"}]}, "tolerations/0/effect"),
        (
            {"tolerations": [{"key": "a", "effect": "NoSchedule", "tolerationSeconds": 30}]},
            "tolerations/0/effect",
        ),
        (
            {"tolerations": [{"key": "a", "effect": "NoExecute", "tolerationSeconds": "30"}]},
            "tolerations/0/tolerationSeconds",
        ),
        ({"tolerations": [{"key": "gpu pool!", "operator": "Exists"}]}, "tolerations/0/key"),
        (
            {"tolerations": [{"key": "pool", "operator": "Equal", "value": "a b"}]},
            "tolerations/0/value",
        ),
        ({"affinity": {"nodeAffinity": "gpu"}}, "affinity/nodeAffinity"),
        (
            {"affinity": {"nodeAffinity": {REQUIRED: "x"}}},
            f"affinity/nodeAffinity/{REQUIRED}",
        ),
        (
            {"affinity": {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": []}}}},
            f"affinity/nodeAffinity/{REQUIRED}/nodeSelectorTerms",
        ),
        (
            {"affinity": {"podAntiAffinity": {PREFERRED: {}}}},
            f"affinity/podAntiAffinity/{PREFERRED}",
        ),
        ({"affinity": {"podAffinity": {"requiredDuringScheduling": []}}}, "affinity/podAffinity"),
        ({"affinity": {"nodeSelector": {}}}, "affinity"),
        ({"nodeSelector": {"pool": "a b"}}, "nodeSelector/pool"),
        ({"nodeSelector": {"Bad_Prefix/pool": "a"}}, "nodeSelector"),
        (
            {"topologySpreadConstraints": [{**SPREAD, "maxSkew": 0}]},
            "topologySpreadConstraints/0/maxSkew",
        ),
        (
            {"topologySpreadConstraints": [{**SPREAD, "whenUnsatisfiable": "Never"}]},
            "topologySpreadConstraints/0/whenUnsatisfiable",
        ),
        (
            {
                "topologySpreadConstraints": [
                    {**SPREAD, "whenUnsatisfiable": "ScheduleAnyway", "minDomains": 2}
                ]
            },
            "topologySpreadConstraints/0/whenUnsatisfiable",
        ),
        (
            {"topologySpreadConstraints": [{**SPREAD, "nodeTaintsPolicy": "Maybe"}]},
            "topologySpreadConstraints/0/nodeTaintsPolicy",
        ),
        ({"topologySpreadConstraints": [{**SPREAD, "foo": 1}]}, "topologySpreadConstraints/0"),
        (
            {"topologySpreadConstraints": [{**SPREAD, "topologyKey": "zone key!"}]},
            "topologySpreadConstraints/0/topologyKey",
        ),
        (
            {"topologySpreadConstraints": [{**SPREAD, "matchLabelKeys": ["pod-template-hash"]}]},
            "topologySpreadConstraints/0",
        ),
        (
            {
                "topologySpreadConstraints": [
                    {**SPREAD, "labelSelector": {}, "matchLabelKeys": ["a b"]}
                ]
            },
            "topologySpreadConstraints/0/matchLabelKeys/0",
        ),
        ({"imagePullSecrets": [{"name": "regcred"}, {"name": "regcred"}]}, "imagePullSecrets"),
        ({"labels": {"fusebox.dev/service": "chat"}}, "labels/fusebox.dev~1service"),
        (
            {"labels": {"app.kubernetes.io/managed-by": "me"}},
            "labels/app.kubernetes.io~1managed-by",
        ),
        ({"labels": {"team": "a b"}}, "labels/team"),
        ({"annotations": {"prometheus.io/port": "1"}}, "annotations/prometheus.io~1port"),
        ({"annotations": {"fusebox.dev/x": "1"}}, "annotations/fusebox.dev~1x"),
        ({"annotations": {"owner name": "ml"}}, "annotations"),
        # The CRD's sizes of a spec.pod: a default is a value of every service's.
        ({"tolerations": [{"operator": "Exists"}] * 33}, "tolerations"),
        ({"nodeSelector": {f"k{i}": "v" for i in range(33)}}, "nodeSelector"),
        ({"topologySpreadConstraints": [SPREAD] * 9}, "topologySpreadConstraints"),
        (
            {"imagePullSecrets": [{"name": f"s{i}"} for i in range(17)]},
            "imagePullSecrets",
        ),
        ({"labels": {f"k{i}": "v" for i in range(65)}}, "labels"),
        ({"annotations": {f"k{i}": "v" for i in range(65)}}, "annotations"),
    ],
)
def test_the_schema_refuses_what_the_operator_would_refuse_at_start(
    helm: Path, tmp_path: Path, pod: dict[str, Any], pointer: str
) -> None:
    result = run_helm(
        helm, "template", "fusebox", str(CHART), "--values", str(with_pod(tmp_path, pod))
    )
    assert result.returncode != 0, "rendered"
    assert SCHEMA_REFUSAL in result.stderr, result.stderr
    assert f"at '{AT}{pointer}" in result.stderr, result.stderr
    with pytest.raises(ValueError):
        parse_pod_defaults(json.dumps(pod))


def test_what_the_schema_admits_the_operator_parses(render: Render, tmp_path: Path) -> None:
    pod = {
        "tolerations": [
            {"operator": "Exists"},
            {"key": "pool", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"},
            {
                "key": "node.kubernetes.io/unreachable",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 30,
            },
        ],
        "affinity": {
            "nodeAffinity": {
                REQUIRED: {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]}
                    ]
                },
            },
            "podAntiAffinity": {
                PREFERRED: [
                    {
                        "weight": 1,
                        "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"},
                    }
                ]
            },
            "podAffinity": {},
        },
        "nodeSelector": {"example.com/pool": "gpu-a"},
        "topologySpreadConstraints": [
            {
                **SPREAD,
                "minDomains": 2,
                "nodeAffinityPolicy": "Honor",
                "matchLabelKeys": ["pod-template-hash"],
                "labelSelector": {},
            },
        ],
        "imagePullSecrets": [{"name": "a"}, {"name": "b"}],
        "labels": {"example.com/team": "ml", "tier": ""},
        "annotations": {"example.com/owner": "ml team, on call"},
    }
    env = env_of(one(render(with_pod(tmp_path, pod)), "Deployment"))
    defaults = parse_pod_defaults(env["FUSEBOX_POD_DEFAULTS"])
    assert dict(defaults.labels) == {"example.com/team": "ml", "tier": ""}
    assert defaults.image_pull_secrets == ("a", "b")
    assert defaults.tolerations is not None and len(defaults.tolerations) == 3
    assert defaults.affinity == pod["affinity"]


PROFILE_ANNOTATIONS = (
    "container.apparmor.security.beta.kubernetes.io/server",
    "seccomp.security.alpha.kubernetes.io/pod",
    "container.seccomp.security.alpha.kubernetes.io/sidecar",
)
"""One key under each prefix the operator holds to a confining profile
(pod_placement.CONFINEMENT_ANNOTATION_PREFIXES)."""
CONFINED = ("runtime/default", "docker/default")


@pytest.mark.parametrize(
    ("key", "profile", "words"),
    [
        ("seccomp.security.alpha.kubernetes.io/pod", "localhost/x", "seccompProfile"),
        ("container.apparmor.security.beta.kubernetes.io/other", "runtime/default", "container"),
    ],
)
def test_an_annotation_the_api_server_would_refuse_with_the_pod_is_refused_at_install(
    helm: Path, tmp_path: Path, key: str, profile: str, words: str
) -> None:
    """A seccomp profile other than the RuntimeDefault Fusebox sets, or an AppArmor
    annotation naming no container of the pod: every pod or the Deployment would be
    refused, and the operator refuses them at start."""
    pod = {"annotations": {key: profile}}
    result = run_helm(
        helm, "template", "fusebox", str(CHART), "--values", str(with_pod(tmp_path, pod))
    )
    assert result.returncode != 0, "rendered"
    assert SCHEMA_REFUSAL in result.stderr, result.stderr
    with pytest.raises(ValueError, match=words):
        parse_pod_defaults(json.dumps(pod))


def test_the_charts_pod_default_bounds_are_the_crds() -> None:
    """The operator holds chart defaults to spec.pod's bounds: the install must too."""
    crd = yaml.safe_load((CHART / "crds" / "inferenceservice.yaml").read_text(encoding="utf-8"))
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    crd_pod = spec["properties"]["pod"]["properties"]
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    chart_pod = schema["properties"]["inference"]["properties"]["pod"]["properties"]
    for field in ("tolerations", "topologySpreadConstraints", "imagePullSecrets"):
        assert chart_pod[field]["maxItems"] == crd_pod[field]["maxItems"], field
    for field in ("nodeSelector", "labels", "annotations"):
        assert chart_pod[field]["maxProperties"] == crd_pod[field]["maxProperties"], field
    values = chart_pod["annotations"]["additionalProperties"]["maxLength"]
    assert values == crd_pod["annotations"]["additionalProperties"]["maxLength"]


@pytest.mark.parametrize("key", PROFILE_ANNOTATIONS)
@pytest.mark.parametrize("profile", ["unconfined", "RuntimeDefault", "runtime/default ", ""])
def test_the_schema_refuses_an_unconfining_profile_annotation(
    helm: Path, tmp_path: Path, key: str, profile: str
) -> None:
    """An unconfined (or misspelt) AppArmor or seccomp profile would loosen every
    inference pod where the namespace does not enforce restricted Pod Security; the
    operator refuses it at start, so the install must refuse it too, naming it."""
    pod = {"annotations": {key: profile}}
    result = run_helm(
        helm, "template", "fusebox", str(CHART), "--values", str(with_pod(tmp_path, pod))
    )
    assert result.returncode != 0, "rendered"
    assert SCHEMA_REFUSAL in result.stderr, result.stderr
    pointer = f"{AT}annotations/{key.replace('/', '~1')}"
    assert f"at '{pointer}': '{profile}' does not match pattern" in result.stderr, result.stderr
    with pytest.raises(ValueError, match="restricted Pod"):
        parse_pod_defaults(json.dumps(pod))


@pytest.mark.parametrize(
    ("key", "profile"),
    [
        *((key, profile) for key in PROFILE_ANNOTATIONS for profile in CONFINED),
        # A node's own AppArmor profile; seccomp must match the RuntimeDefault Fusebox sets.
        ("container.apparmor.security.beta.kubernetes.io/server", "localhost/x"),
    ],
)
def test_a_confining_profile_annotation_reaches_the_operator(
    render: Render, tmp_path: Path, key: str, profile: str
) -> None:
    annotations = {key: profile, "example.com/unconfined": "a note, not a profile"}
    env = env_of(one(render(with_pod(tmp_path, {"annotations": annotations})), "Deployment"))
    assert dict(parse_pod_defaults(env["FUSEBOX_POD_DEFAULTS"]).annotations) == annotations
