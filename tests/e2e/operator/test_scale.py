"""The scale subresource: `kubectl scale` on an InferenceService, through the real apiserver.

A platform engineer scales a service as any workload (`kubectl scale`, an
HPA or KEDA): the apiserver maps /scale onto spec.replicas, status.replicas
and status.selector, which the operator writes. On an autoscaled service the
operator's autoscaler owns the count: the edit is not applied, and the
SpecApplied event says so rather than nothing.
"""

from __future__ import annotations

import json
from typing import Any

from fusebox_contract.names import EventReason

from .conftest import Service, ServiceFactory, base_spec, wait_for


def scale(service: Service) -> dict[str, Any]:
    out = service.kubectl(
        "get", "inferenceservice", service.name, "--subresource=scale", "-o", "json"
    ).stdout
    return dict(json.loads(out))


def spec_applied(service: Service, text: str) -> str | None:
    return next(
        (
            str(e["message"])
            for e in service.events()
            if e["reason"] == EventReason.SPEC_APPLIED and text in e["message"]
        ),
        None,
    )


def test_kubectl_scale_sets_the_pods_and_the_scale_subresource_reports_them(
    inference_service: ServiceFactory,
) -> None:
    service = inference_service("scaled", base_spec(replicas=1))
    wait_for(
        "status.replicas 1 on the scale subresource",
        lambda: scale(service).get("status", {}).get("replicas") == 1,
        timeout=120,
        diagnose=service.diagnose,
    )
    assert scale(service)["spec"]["replicas"] == 1
    # The selector an HPA or KEDA would count the pods with: exactly the server pods.
    selector = scale(service)["status"]["selector"]
    assert selector == f"fusebox.dev/service={service.name}"
    selected = json.loads(service.kubectl("get", "pods", "-l", selector, "-o", "json").stdout)
    assert [p["metadata"]["name"] for p in selected["items"]] == [
        p["metadata"]["name"] for p in service.pods()
    ]

    service.kubectl("scale", "inferenceservice", service.name, "--replicas=0")
    assert service.get()["spec"]["replicas"] == 0
    wait_for("the Deployment at 0", lambda: service.deployment_replicas() == 0, timeout=60)
    wait_for(
        "status.replicas 0 once the pod is gone",
        lambda: scale(service).get("status", {}).get("replicas") == 0,
        timeout=120,
        diagnose=service.diagnose,
    )
    assert wait_for("SpecApplied replicas 1 -> 0", lambda: spec_applied(service, "replicas 1 -> 0"))


def test_kubectl_scale_on_an_autoscaled_service_is_not_applied_and_says_so(
    inference_service: ServiceFactory,
) -> None:
    spec = base_spec(autoscaling={"minReplicas": 1, "maxReplicas": 2})
    service = inference_service("scaled-auto", spec)
    wait_for(
        "the autoscaler's count in status",
        lambda: (service.status().get("autoscaling") or {}).get("replicas") == 1,
        timeout=120,
        diagnose=service.diagnose,
    )
    service.kubectl("scale", "inferenceservice", service.name, "--replicas=2")
    message = wait_for(
        "SpecApplied: not applied",
        lambda: spec_applied(service, "spec.replicas 2 not applied"),
        timeout=60,
    )
    assert "spec.autoscaling owns the count (now 1)" in message, message
    assert service.deployment_replicas() == 1
