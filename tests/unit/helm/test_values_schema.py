"""values.schema.json refuses, at install, values that would render a broken or
unsafe operator: a null where the chart needs a value, an image reference the
template would mangle, a security context outside the restricted Pod Security
Standard, and extra labels that repeat the chart's own."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fusebox_operator.manifests import build_deployment
from fusebox_operator.pod_placement import (
    LABEL_VALUE_PATTERN,
    QUALIFIED_NAME_MAX_LENGTH,
    QUALIFIED_NAME_PATTERN,
)
from fusebox_operator.settings import OperatorSettings
from fusebox_operator.sizing import size_memory
from fusebox_operator.spec import LABEL_VALUE_PATTERN as SPEC_LABEL_VALUE_PATTERN
from fusebox_operator.spec import parse_spec

from .conftest import CHART, Render, env_of, load_documents, one, run_helm

SCHEMA_REFUSAL = "values don't meet the specifications of the schema"
DEFAULTS = yaml.safe_load((CHART / "values.yaml").read_text())
DIGEST = "sha256:" + "0123456789abcdef" * 4

USER_MAPS = {"resources", "grafana.dashboard.labels"}
"""Maps whose entries are the user's to drop with null (a CPU limit, the default
dashboard label); the map itself is still required."""

PLATFORM_ASSIGNED = {
    "podSecurityContext.runAsUser",
    "podSecurityContext.runAsGroup",
    "podSecurityContext.fsGroup",
    "securityContext.runAsUser",
}
"""Ids a platform such as OpenShift assigns itself: null leaves them to it."""


def keys_with_a_value(values: dict[str, Any], prefix: tuple[str, ...] = ()) -> Iterator[str]:
    """Dotted paths of the keys in values.yaml whose default is not null."""
    for key, value in values.items():
        path = ".".join((*prefix, key))
        if value is None or path in PLATFORM_ASSIGNED:
            continue
        yield path
        if isinstance(value, dict) and path not in USER_MAPS:
            yield from keys_with_a_value(value, (*prefix, key))


def nested(path: str, value: Any) -> dict[str, Any]:
    keys = path.split(".")
    document: Any = value
    for key in reversed(keys):
        document = {key: document}
    result: dict[str, Any] = document
    return result


def template(helm: Path, *args: str) -> str:
    """stderr of a `helm template` that must fail."""
    result = run_helm(helm, "template", "fusebox", str(CHART), *args)
    assert result.returncode != 0, f"{args} rendered"
    return result.stderr


def refusal(helm: Path, *sets: str) -> str:
    stderr = template(helm, *(arg for pair in sets for arg in ("--set", pair)))
    assert SCHEMA_REFUSAL in stderr, stderr
    return stderr


def pointer(*keys: str) -> str:
    """The JSON pointer helm names a key by (a `/` inside a key becomes `~1`)."""
    return "".join("/" + key.replace("~", "~0").replace("/", "~1") for key in keys)


def set_key(path: str) -> str:
    """A label key as a --set path (its dots escaped)."""
    return path.replace(".", "\\.")


@pytest.mark.parametrize("path", sorted(keys_with_a_value(DEFAULTS)))
def test_a_null_value_is_refused_naming_its_key(helm: Path, tmp_path: Path, path: str) -> None:
    """Helm drops a null key before validation: unless the schema requires it, the
    template renders an empty port, env value or interval."""
    values = tmp_path / "null.yaml"
    values.write_text(yaml.safe_dump(nested(path, None)))
    stderr = template(helm, "--values", str(values))
    assert SCHEMA_REFUSAL in stderr, stderr
    *parents, key = path.split(".")
    assert f"at '{pointer(*parents)}': missing property '{key}'" in stderr, stderr


def test_null_drops_a_map_entry_or_a_platform_assigned_id_and_keeps_a_null_default(
    render: Render, tmp_path: Path
) -> None:
    values = tmp_path / "dropped.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "resources": {"limits": {"cpu": None}},
                "podSecurityContext": {"runAsUser": None, "runAsGroup": None, "fsGroup": None},
                "securityContext": {"runAsUser": None},
                "topologySpreadConstraints": None,
                "grafana": {"dashboard": {"enabled": True, "labels": {"grafana_dashboard": None}}},
            }
        )
    )
    documents = render(values)
    pod = one(documents, "Deployment")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert "cpu" not in container["resources"]["limits"]
    assert not {"runAsUser", "runAsGroup", "fsGroup"} & pod["securityContext"].keys()
    assert "runAsUser" not in container["securityContext"]
    assert "grafana_dashboard" not in one(documents, "ConfigMap")["metadata"]["labels"]


def test_a_digest_pins_the_operator_image_in_place_of_the_tag(render: Render) -> None:
    image = one(render(sets=(f"image.digest={DIGEST}",)), "Deployment")["spec"]["template"]["spec"][
        "containers"
    ][0]["image"]
    assert image == f"localhost/fusebox/operator@{DIGEST}"
    ported = one(
        render(sets=("image.repository=registry.example.com:5000/fusebox/op",)), "Deployment"
    )
    assert ported["spec"]["template"]["spec"]["containers"][0]["image"] == (
        "registry.example.com:5000/fusebox/op:dev"
    )


@pytest.mark.parametrize(
    "reference",
    [
        f"registry.example.com/fusebox/inference@{DIGEST}",
        f"registry.example.com:5000/fusebox/inference:v0.1.0@{DIGEST}",
        "registry.example.com/fusebox/inference:v0.1.0",
    ],
)
def test_the_inference_image_takes_a_tag_a_digest_or_both(render: Render, reference: str) -> None:
    """The reference reaches the inference pods' containers as it was given."""
    env = env_of(one(render(sets=(f"inferenceImage={reference}",)), "Deployment"))
    spec = parse_spec({"model": {"name": "chat", "source": "pvc://models/chat"}})
    deployment = build_deployment(
        spec, "chat", "team-a", size_memory(spec, [1024]), OperatorSettings.from_env(env)
    )
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert {container["image"] for container in containers} == {reference}


@pytest.mark.parametrize(
    ("value", "key"),
    [
        (f"image.repository=registry.example.com/op@{DIGEST}", "/image/repository"),
        ("image.repository=registry.example.com/op:v1", "/image/repository"),
        ("image.repository=registry.example.com:5000/op:v1", "/image/repository"),
        ("image.digest=sha256:0123", "/image/digest"),
        (f"image.digest={DIGEST.removeprefix('sha256:')}", "/image/digest"),
        (f"image.tag={DIGEST}", "/image/tag"),
        ("inferenceImage=registry.example.com/inference", "/inferenceImage"),
        ("inferenceImage=registry.example.com/inference@sha256:0123", "/inferenceImage"),
    ],
)
def test_an_image_reference_the_template_would_mangle_is_refused(
    helm: Path, value: str, key: str
) -> None:
    assert f"at '{key}'" in refusal(helm, value)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("podSecurityContext.runAsNonRoot=false", "at '/podSecurityContext/runAsNonRoot'"),
        ("securityContext.runAsNonRoot=false", "at '/securityContext/runAsNonRoot'"),
        (
            "securityContext.allowPrivilegeEscalation=true",
            "at '/securityContext/allowPrivilegeEscalation'",
        ),
        ("securityContext.privileged=true", "at '/securityContext/privileged'"),
        (
            "podSecurityContext.seccompProfile.type=Unconfined",
            "at '/podSecurityContext/seccompProfile/type'",
        ),
        (
            "securityContext.seccompProfile.type=Unconfined",
            "at '/securityContext/seccompProfile/type'",
        ),
        (
            "securityContext.capabilities.drop={NET_RAW}",
            "at '/securityContext/capabilities/drop': no items match contains schema",
        ),
        (
            "securityContext.capabilities.add={SYS_ADMIN}",
            "at '/securityContext/capabilities/add/0': value must be 'NET_BIND_SERVICE'",
        ),
        ("securityContext.procMount=Unmasked", "at '/securityContext/procMount'"),
        (
            "securityContext.windowsOptions.hostProcess=true",
            "at '/securityContext/windowsOptions/hostProcess'",
        ),
        (
            "securityContext.seLinuxOptions.type=spc_t",
            "at '/securityContext/seLinuxOptions/type'",
        ),
        (
            "podSecurityContext.appArmorProfile.type=Unconfined",
            "at '/podSecurityContext/appArmorProfile/type'",
        ),
        (
            "podSecurityContext.sysctls[0].name=kernel.msgmax",
            "at '/podSecurityContext/sysctls/0/name'",
        ),
    ],
)
def test_the_schema_refuses_what_the_restricted_profile_forbids(
    helm: Path, value: str, message: str
) -> None:
    assert message in refusal(helm, value)


def test_the_restricted_profile_still_admits_its_own_options(render: Render) -> None:
    pod = one(
        render(
            sets=(
                "securityContext.capabilities.add={NET_BIND_SERVICE}",
                "securityContext.capabilities.drop={ALL,NET_RAW}",
                "podSecurityContext.seccompProfile.type=Localhost",
                "podSecurityContext.seccompProfile.localhostProfile=profiles/fusebox.json",
            )
        ),
        "Deployment",
    )["spec"]["template"]["spec"]
    assert pod["securityContext"]["seccompProfile"]["type"] == "Localhost"
    assert pod["containers"][0]["securityContext"]["capabilities"] == {
        "add": ["NET_BIND_SERVICE"],
        "drop": ["ALL", "NET_RAW"],
    }


@pytest.mark.parametrize(
    "labels_value",
    [
        "monitoring.podMonitor.labels",
        "monitoring.prometheusRule.labels",
        "grafana.dashboard.labels",
    ],
)
def test_extra_object_labels_cannot_repeat_the_charts_own(
    helm: Path, render: Render, labels_value: str
) -> None:
    chart_keys = one(render(), "Deployment")["metadata"]["labels"]
    for key in chart_keys:
        stderr = refusal(helm, f"{labels_value}.{set_key(key)}=other")
        assert f"at '{pointer(*labels_value.split('.'), key)}': false schema" in stderr, stderr


def test_pod_labels_cannot_repeat_the_selector_labels(helm: Path, render: Render) -> None:
    selector = one(render(), "Deployment")["spec"]["selector"]["matchLabels"]
    for key in selector:
        stderr = refusal(helm, f"podLabels.{set_key(key)}=evil")
        assert f"at '{pointer('podLabels', key)}': false schema" in stderr, stderr
    labels = one(render(sets=("podLabels.team=platform",)), "Deployment")["spec"]["template"][
        "metadata"
    ]["labels"]
    assert labels == {**selector, "team": "platform"}


@pytest.mark.parametrize("name", ["a: b", "Team_A", "-critical", "a" * 254])
def test_an_operator_priority_class_that_is_no_dns_subdomain_is_refused(
    helm: Path, name: str
) -> None:
    stderr = template(helm, "--set-string", f"priorityClassName={name}")
    assert SCHEMA_REFUSAL in stderr, stderr
    assert "at '/priorityClassName'" in stderr, stderr


def test_the_operator_priority_class_reaches_its_pods_as_a_string(helm: Path) -> None:
    """Quoted: a name YAML would read as a boolean or number stays a string."""
    result = run_helm(
        helm, "template", "fusebox", str(CHART), "--set-string", "priorityClassName=true"
    )
    assert result.returncode == 0, result.stderr
    pods = [
        doc["spec"]["template"]["spec"]
        for doc in load_documents(result.stdout)
        if doc["kind"] in ("Deployment", "Job")
    ]
    assert len(pods) == 3  # the operator and both hooks
    assert {pod["priorityClassName"] for pod in pods} == {"true"}


@pytest.mark.parametrize("name", ["registry.example.com", "ghcr.io-pull", "regcred"])
def test_a_pull_secret_name_with_dots_reaches_the_operator_hooks_and_inference_pods(
    helm: Path, name: str
) -> None:
    """A Secret's name is a DNS subdomain (dots allowed): the platform's own pull
    Secret works for the operator and its hooks as it does under inference.pod."""
    result = run_helm(
        helm, "template", "fusebox", str(CHART),
        "--set", f"imagePullSecrets[0]={name}",
        "--set", f"inference.pod.imagePullSecrets[0].name={name}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    documents = load_documents(result.stdout)
    pods = [
        doc["spec"]["template"]["spec"] for doc in documents if doc["kind"] in ("Deployment", "Job")
    ]
    assert len(pods) == 3  # the operator and both hooks
    assert all(pod["imagePullSecrets"] == [{"name": name}] for pod in pods)
    defaults = json.loads(env_of(one(documents, "Deployment"))["FUSEBOX_POD_DEFAULTS"])
    assert defaults["imagePullSecrets"] == [{"name": name}]


@pytest.mark.parametrize("name", ["Reg_Cred", "regcred.", "-regcred", "a" * 254])
def test_a_pull_secret_name_that_is_no_dns_subdomain_is_refused_in_both_places(
    helm: Path, name: str
) -> None:
    operator = template(helm, "--set-string", f"imagePullSecrets[0]={name}")
    assert SCHEMA_REFUSAL in operator and "at '/imagePullSecrets/0'" in operator, operator
    inference = template(helm, "--set-string", f"inference.pod.imagePullSecrets[0].name={name}")
    assert "at '/inference/pod/imagePullSecrets/0/name'" in inference, inference


@pytest.mark.parametrize(
    ("value", "key"),
    [
        ("tolerations[0].foo=bar", "/tolerations/0"),
        ("tolerations[0].operator=Exists,tolerations[0].value=x", "/tolerations/0/value"),
        ("topologySpreadConstraints[0].maxSkew=1", "/topologySpreadConstraints/0"),
        ("affinity.nodeAffinty.x=y", "/affinity"),
        ("nodeSelector.pool=a b", "/nodeSelector/pool"),
        ("podLabels.team=a b", "/podLabels"),
    ],
)
def test_the_operator_pods_placement_and_labels_have_the_apis_shapes(
    helm: Path, value: str, key: str
) -> None:
    """Refused by helm naming the key, not later by the API server mid-install."""
    assert f"at '{key}" in refusal(helm, value)


def test_the_schema_checks_label_keys_and_values_by_the_operators_patterns() -> None:
    """One rule at both ends: what helm admits as a taint key, topologyKey or label
    value, the operator's start-up parse (pod_placement) admits, and the reverse."""
    definitions = json.loads((CHART / "values.schema.json").read_text())["definitions"]
    assert definitions["qualifiedName"]["pattern"] == QUALIFIED_NAME_PATTERN
    assert definitions["qualifiedName"]["maxLength"] == QUALIFIED_NAME_MAX_LENGTH
    assert definitions["labelValue"]["pattern"] == LABEL_VALUE_PATTERN == SPEC_LABEL_VALUE_PATTERN


@pytest.mark.parametrize(
    ("values", "at"),
    [
        (
            'inference.pod.tolerations=[{"key":"a b","operator":"Equal","value":"x"}]',
            "/inference/pod/tolerations/0/key",
        ),
        (
            'inference.pod.tolerations=[{"key":"pool","operator":"Equal","value":"x y"}]',
            "/inference/pod/tolerations/0/value",
        ),
        (
            'inference.pod.topologySpreadConstraints=[{"maxSkew":1,"topologyKey":"zone key!",'
            '"whenUnsatisfiable":"DoNotSchedule"}]',
            "/inference/pod/topologySpreadConstraints/0/topologyKey",
        ),
        (
            'inference.pod.topologySpreadConstraints=[{"maxSkew":1,"topologyKey":"zone",'
            '"whenUnsatisfiable":"DoNotSchedule","matchLabelKeys":["pod-template-hash"]}]',
            "/inference/pod/topologySpreadConstraints/0",
        ),
        (
            'inference.pod.affinity={"nodeAffinity":'
            '{"requiredDuringSchedulingIgnoredDuringExecution":"x"}}',
            "/inference/pod/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution",
        ),
    ],
)
def test_an_inference_pod_default_every_deployment_would_fail_on_is_refused_at_install(
    helm: Path, values: str, at: str
) -> None:
    """The API server would refuse every service's Deployment over such a default and
    the operator would retry them all forever: helm refuses it first, naming it."""
    stderr = template(helm, "--set-json", values)
    assert SCHEMA_REFUSAL in stderr and f"at '{at}" in stderr, stderr


def test_inference_egress_is_deny_or_allow(helm: Path) -> None:
    stderr = refusal(helm, "inference.egress=open")
    assert pointer("inference", "egress") in stderr and "deny" in stderr, stderr
