"""What only a real API server shows about the spec's limits and the children it refuses:
the CRD's rules on a map's keys (a structural schema cannot bound them), the 422 Status
a Deployment the Pod API refuses is answered with (read by kube.refusal_of into the
ChildRefused the reconcile puts in InvalidSpec), and the PodDisruptionBudget's
unhealthyPodEvictionPolicy kept as rendered.

The parser's side of each bound is tests/unit/operator/test_spec_bounds.py; the
condition, tests/unit/operator/test_handlers.py.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from fusebox_operator import manifests
from fusebox_operator.kube import ChildRefused, Kube
from fusebox_operator.settings import OperatorSettings
from fusebox_operator.sizing import size_memory
from fusebox_operator.spec import parse_spec

from .loopback_apiserver import apiserver_with_crd, kubectl

pytestmark = pytest.mark.integration

TOKEN = "spec-limits-test-token"
NAMESPACE = "ml"
SPEC: dict[str, Any] = {
    "model": {"name": "chat", "source": "pvc://models/chat"},
    "gpu": {"count": 0},
}


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with apiserver_with_crd(
        tmp_path_factory.mktemp("apiserver"), token=TOKEN, namespace=NAMESPACE
    ) as config:
        yield config


def dry_run(config: Path, spec: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    document = {
        "apiVersion": "fusebox.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "chat", "namespace": NAMESPACE},
        "spec": spec,
    }
    return kubectl(
        config,
        "create",
        "--dry-run=server",
        "-o",
        "json",
        "-f",
        "-",
        stdin=yaml.safe_dump(document),
    )


@pytest.mark.parametrize(
    ("section", "key", "bound"),
    [
        ({"degradation": {"cannedAnswers": {}}}, "p", 256),
        ({"pod": {"labels": {}}}, "example.com/x", 317),
        ({"pod": {"annotations": {}}}, "example.com/x", 317),
        ({"pod": {"nodeSelector": {}}}, "example.com/x", 317),
    ],
    ids=["canned-prompt", "label", "annotation", "node-selector"],
)
def test_a_map_key_past_its_bound_is_refused_by_the_api_server(
    kubeconfig: Path, section: dict[str, Any], key: str, bound: int
) -> None:
    def spec_with(length: int) -> dict[str, Any]:
        """The section with one key of `length` characters, ending in `key`."""
        ((name, inner),) = section.items()
        ((field, _),) = inner.items()
        return {**SPEC, name: {field: {"a" * (length - len(key)) + key: "v"}}}

    assert dry_run(kubeconfig, spec_with(bound)).returncode == 0
    refused = dry_run(kubeconfig, spec_with(bound + 1))
    assert refused.returncode != 0
    assert f"keys must be at most {bound} characters" in refused.stderr


def kube_for(config: Path) -> Kube:
    kubernetes.config.load_kube_config(config_file=str(config))  # type: ignore[no-untyped-call]
    return Kube()


def rendered(kind: str) -> dict[str, Any]:
    parsed = parse_spec(SPEC)
    children = manifests.build_children(
        parsed, "chat", NAMESPACE, size_memory(parsed, []), OperatorSettings.from_env({}), "t"
    )
    return next(child for child in children if child["kind"] == kind)


def apply(config: Path, manifest: dict[str, Any]) -> Any:
    kube = kube_for(config)

    async def run() -> Any:
        try:
            return await kube.apply(manifest)
        finally:
            await kube.close()

    return asyncio.run(run())


def test_a_deployment_the_pod_api_refuses_is_a_child_refused_naming_the_field(
    kubeconfig: Path,
) -> None:
    deployment = rendered("Deployment")
    term = {"labelSelector": {"matchLabels": {"fusebox.dev/service": "chat"}}}  # no topologyKey
    deployment["spec"]["template"]["spec"]["affinity"] = {
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
    }
    with pytest.raises(ChildRefused) as refused:
        apply(kubeconfig, deployment)
    field = (
        "spec.template.spec.affinity.podAntiAffinity."
        "requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey"
    )
    assert refused.value.kind == "Deployment"
    assert field in [cause_field for cause_field, _ in refused.value.causes]
    assert str(refused.value).startswith(f"the API server refused Deployment {NAMESPACE}/chat: ")
    assert field in str(refused.value)


def test_the_pdb_keeps_its_unhealthy_pod_eviction_policy(kubeconfig: Path) -> None:
    apply(kubeconfig, rendered("PodDisruptionBudget"))
    stored = kubectl(kubeconfig, "get", "pdb", "chat", "-n", NAMESPACE, "-o", "yaml")
    assert stored.returncode == 0, stored.stderr
    assert yaml.safe_load(stored.stdout)["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
