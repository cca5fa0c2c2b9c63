"""claims: spec.gpu.deviceClassName turns the GPU request into a ResourceClaimTemplate."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import yaml
from kubernetes.client import (
    V1ContainerStatus,
    V1ObjectMeta,
    V1Pod,
    V1PodStatus,
    V1ResourceHealth,
    V1ResourceStatus,
)

from fusebox_contract.wiring import GPU_DEVICE_CLASS, GPU_RESOURCE
from fusebox_operator import spec as spec_module
from fusebox_operator.autoscaling import pending_for_gpu
from fusebox_operator.claims import CLAIM_NAME, build_claim_template, claim_template_name
from fusebox_operator.manifests import SIDECAR_CONTAINER, build_children, build_deployment
from fusebox_operator.settings import OperatorSettings
from fusebox_operator.sizing import size_memory
from fusebox_operator.spec import GpuSpec, SpecError, parse_spec

from .conftest import REPO, load_example
from .pod_security import restricted_violations
from .served import view_of

Snapshot = Callable[[str, Any], None]
SETTINGS = OperatorSettings()


def dra_spec(**gpu: object) -> dict[str, Any]:
    document = load_example("tiny-chat.yaml")
    spec: dict[str, Any] = document["spec"]
    spec["gpu"] = {"count": 1, "deviceClassName": GPU_DEVICE_CLASS, **gpu}
    return spec


def children(raw: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = parse_spec(raw)
    built = build_children(spec, "tiny-chat", "ml", size_memory(spec, [1024]), SETTINGS, "t")
    return {c["kind"]: c for c in built}


def test_device_class_name_parses_and_defaults_to_the_device_plugin() -> None:
    assert parse_spec(dra_spec()).gpu.device_class_name == GPU_DEVICE_CLASS
    assert parse_spec(dra_spec()).gpu.through_claim
    plain = load_example("tiny-chat.yaml")["spec"]
    assert parse_spec(plain).gpu.device_class_name == ""
    assert not parse_spec(plain).gpu.through_claim


@pytest.mark.parametrize("name", ["GPU.nvidia.com", "gpu_nvidia", "-gpu", "gpu.", "a" * 254])
def test_device_class_name_must_be_a_dns_subdomain(name: str) -> None:
    with pytest.raises(SpecError, match="gpu.deviceClassName"):
        parse_spec(dra_spec(deviceClassName=name))


def test_device_class_name_needs_a_gpu() -> None:
    with pytest.raises(SpecError, match="gpu.deviceClassName requires gpu.count > 0"):
        parse_spec(dra_spec(count=0))


def test_claim_template_requests_count_devices_of_the_class(snapshot: Snapshot) -> None:
    template = children(dra_spec())["ResourceClaimTemplate"]
    snapshot("resourceclaimtemplate", template)
    request = template["spec"]["spec"]["devices"]["requests"][0]
    assert request["exactly"] == {
        "deviceClassName": GPU_DEVICE_CLASS,
        "allocationMode": "ExactCount",
        "count": 1,
    }
    assert template["metadata"]["labels"]["app.kubernetes.io/instance"] == "tiny-chat"


def test_the_pod_names_the_claim_instead_of_asking_the_device_plugin(snapshot: Snapshot) -> None:
    built = children(dra_spec())
    deployment, template = built["Deployment"], built["ResourceClaimTemplate"]
    snapshot("deployment-dra", deployment)
    pod = deployment["spec"]["template"]["spec"]
    assert pod["resourceClaims"] == [
        {"name": CLAIM_NAME, "resourceClaimTemplateName": template["metadata"]["name"]}
    ]
    server = pod["containers"][0]
    assert server["resources"]["claims"] == [{"name": CLAIM_NAME}]
    assert GPU_RESOURCE not in server["resources"]["requests"]
    assert GPU_RESOURCE not in server["resources"]["limits"]
    assert restricted_violations(deployment["spec"]["template"]) == []


def test_the_sidecar_shares_the_servers_gpu_claim_so_its_nvml_sees_the_gpu() -> None:
    pod = children(dra_spec())["Deployment"]["spec"]["template"]["spec"]
    (sidecar,) = [c for c in pod["initContainers"] if c["name"] == SIDECAR_CONTAINER]

    assert sidecar["resources"]["claims"] == pod["containers"][0]["resources"]["claims"]
    assert sidecar["resources"]["claims"] == [{"name": CLAIM_NAME}]


def test_a_device_plugin_pods_sidecar_asks_for_no_gpu() -> None:
    device_plugin = {**dra_spec(), "gpu": {"count": 1}}
    pod = children(device_plugin)["Deployment"]["spec"]["template"]["spec"]
    (sidecar,) = [c for c in pod["initContainers"] if c["name"] == SIDECAR_CONTAINER]

    assert "claims" not in sidecar["resources"]
    assert GPU_RESOURCE not in sidecar["resources"]["limits"]


def test_the_template_comes_before_the_deployment_that_names_it() -> None:
    spec = parse_spec(dra_spec())
    kinds = [
        c["kind"] for c in build_children(spec, "n", "ml", size_memory(spec, [1024]), SETTINGS, "t")
    ]
    assert kinds.index("ResourceClaimTemplate") < kinds.index("Deployment")


def test_without_a_device_class_there_is_no_claim() -> None:
    built = children(load_example("tiny-chat.yaml")["spec"])
    assert "ResourceClaimTemplate" not in built
    pod = built["Deployment"]["spec"]["template"]["spec"]
    assert "resourceClaims" not in pod
    assert pod["containers"][0]["resources"]["limits"][GPU_RESOURCE] == "1"


def test_a_changed_request_is_a_new_template_and_a_rollout() -> None:
    # A template's spec is immutable: the operator makes a new one instead.
    one, other = GpuSpec(1, device_class_name="a.example.com"), GpuSpec(1, device_class_name="b")
    assert claim_template_name("s", one) == claim_template_name("s", one)
    assert claim_template_name("s", one) != claim_template_name("s", other)
    assert build_claim_template(one, "s", "ml", {})["metadata"]["name"].startswith("s-gpu-")

    def pod_template_of(raw: dict[str, Any]) -> Any:
        spec = parse_spec(raw)
        deployment = build_deployment(spec, "s", "ml", size_memory(spec, [1024]), SETTINGS)
        return deployment["metadata"]["annotations"]

    assert pod_template_of(dra_spec()) != pod_template_of(dra_spec(deviceClassName="other"))


def test_a_claim_that_cannot_be_allocated_counts_as_pending_for_gpus() -> None:
    message = "0/1 nodes are available: 1 cannot allocate all claims. still not schedulable"
    assert pending_for_gpu({"a": message, "b": "0/1 nodes are available: 1 Insufficient cpu."}) == [
        "a"
    ]


def test_the_kubelets_health_of_a_claimed_gpu_is_read_from_the_servers_status() -> None:
    health = [
        V1ResourceHealth(resource_id="k8s.gpu.nvidia.com/claim=u-gpu-0", health="Unhealthy"),
        V1ResourceHealth(resource_id="k8s.gpu.nvidia.com/claim=u-gpu-1", health="Healthy"),
    ]
    server = V1ContainerStatus(
        name="server",
        image="i",
        image_id="",
        ready=True,
        restart_count=0,
        allocated_resources_status=[V1ResourceStatus(name="claim:gpu", resources=health)],
    )
    pod = V1Pod(
        metadata=V1ObjectMeta(name="p", uid="u"),
        status=V1PodStatus(phase="Running", container_statuses=[server]),
    )
    assert view_of(pod).unhealthy_gpus == ("k8s.gpu.nvidia.com/claim=u-gpu-0",)


GPU_SCHEMA = yaml.safe_load((REPO / "crds" / "inferenceservice.yaml").read_text(encoding="utf-8"))[
    "spec"
]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["gpu"]


def test_the_crd_admits_exactly_the_device_class_names_the_parser_accepts() -> None:
    field = GPU_SCHEMA["properties"]["deviceClassName"]
    assert field["pattern"] == spec_module.DEVICE_CLASS_NAME_PATTERN
    assert field["maxLength"] == spec_module.DEVICE_CLASS_NAME_MAX_LENGTH
    assert field["default"] == GpuSpec().device_class_name


def test_the_crd_refuses_a_device_class_without_a_gpu_as_the_parser_does() -> None:
    (rule,) = [r for r in GPU_SCHEMA["x-kubernetes-validations"] if "deviceClassName" in r["rule"]]
    assert "self.count > 0" in rule["rule"] and "self.deviceClassName == ''" in rule["rule"]
    assert rule["message"] == "gpu.deviceClassName requires gpu.count > 0"
