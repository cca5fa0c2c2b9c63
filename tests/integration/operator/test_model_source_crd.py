"""s3:// and hf:// sources through a real API server: the CRD's defaults and CEL messages,
and the rendered pod (its model-fetch init container) admitted by the API server's
validation. The parser's side of each refusal is tests/unit/operator/test_spec.py."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from .loopback_apiserver import REPO, apiserver_with_crd, kubectl

pytestmark = pytest.mark.integration

TOKEN = "model-source-test-token"
NAMESPACE = "ml"
EXAMPLES = REPO / "crds" / "examples"


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with apiserver_with_crd(
        tmp_path_factory.mktemp("apiserver"), token=TOKEN, namespace=NAMESPACE
    ) as config:
        yield config


def service(model: dict[str, Any]) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "fusebox.dev/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": "chat", "namespace": NAMESPACE},
            "spec": {"model": {"name": "chat", **model}, "gpu": {"count": 0}},
        }
    )


def dry_run(config: Path, document: str) -> subprocess.CompletedProcess[str]:
    return kubectl(config, "create", "--dry-run=server", "-o", "json", "-f", "-", stdin=document)


def test_a_fetched_source_is_admitted_with_the_cache_defaults(kubeconfig: Path) -> None:
    created = dry_run(kubeconfig, service({"source": "s3://models/tiny"}))
    assert created.returncode == 0, created.stderr
    model = json.loads(created.stdout)["spec"]["model"]
    assert (model["endpoint"], model["region"]) == ("", "")
    shared = dry_run(
        kubeconfig, service({"source": "hf://org/name@v1", "cache": {"claimName": "models"}})
    )
    assert shared.returncode == 0, shared.stderr
    cache = json.loads(shared.stdout)["spec"]["model"]["cache"]
    assert cache == {"claimName": "models", "sizeLimit": "20Gi"}


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"source": "gs://models/tiny"}, "model.source must be pvc://CLAIM[/path], file:///path"),
        ({"source": "s3://Models/tiny"}, "model.source: s3:// needs a bucket name"),
        ({"source": "hf://just-a-name"}, "model.source: hf:// needs ORG/NAME"),
        (
            {"source": "pvc://models/tiny", "endpoint": "http://s3:9000"},
            "apply to s3:// and hf:// sources only",
        ),
        ({"source": "hf://org/name", "region": "eu-west-1"}, "model.region applies to s3://"),
        ({"source": "s3://models/tiny", "endpoint": "not a url"}, "model.endpoint must be"),
        ({"source": "s3://models/tiny", "endpoint": "s3.lab:65536"}, "the port at most 65535"),
        (
            {"source": "s3://models/tiny", "endpoint": "https://s3.lab/minio"},
            "model.endpoint of an s3:// source is host[:port] or http(s)://host[:port], "
            "without a path",
        ),
        (
            {"source": "s3://models/tiny", "credentials": {"secretName": "Bad_Name"}},
            "model.credentials.secretName must be a Secret's name",
        ),
        (
            {"source": "s3://models/tiny", "cache": {"sizeLimit": "lots"}},
            "model.cache.sizeLimit must be a memory quantity",
        ),
        (
            {"source": "hf://org/name", "cache": {"claimName": "models", "sizeLimit": "4Gi"}},
            "model.cache.sizeLimit has no effect with model.cache.claimName",
        ),
        (
            {"source": "hf://org/name@v1", "revision": "v2"},
            "model.revision has no effect on an hf:// source with @REVISION",
        ),
    ],
)
def test_a_bad_source_setting_is_refused_with_its_message(
    kubeconfig: Path, model: dict[str, Any], message: str
) -> None:
    refused = dry_run(kubeconfig, service(model))
    assert refused.returncode != 0
    assert message in refused.stderr


def test_a_fetched_fallback_source_is_refused(kubeconfig: Path) -> None:
    document = yaml.safe_load(service({"source": "s3://models/tiny"}))
    document["spec"]["fallback"] = {"source": "hf://org/small", "quantization": "none"}
    refused = dry_run(kubeconfig, yaml.safe_dump(document))
    assert refused.returncode != 0
    assert "fetched for model.source only" in refused.stderr


def test_canned_answers_without_their_tier_are_refused(kubeconfig: Path) -> None:
    document = yaml.safe_load(service({"source": "s3://models/tiny"}))
    canned = {"tiers": ["no-streaming"], "cannedAnswers": {"hi": "busy"}}
    document["spec"]["degradation"] = canned
    refused = dry_run(kubeconfig, yaml.safe_dump(document))
    assert refused.returncode != 0
    assert "cannedAnswers has no effect unless degradation.tiers lists canned" in refused.stderr
    document["spec"]["degradation"]["tiers"] = ["no-streaming", "canned-answers"]
    admitted = dry_run(kubeconfig, yaml.safe_dump(document))
    assert admitted.returncode == 0, admitted.stderr


@pytest.mark.parametrize("example", ["s3-model.yaml", "hf-model.yaml"])
def test_the_rendered_children_of_a_fetched_model_pass_the_api_servers_validation(
    kubeconfig: Path, example: str
) -> None:
    rendered = subprocess.run(
        [
            sys.executable,
            "-m",
            "fusebox_operator",
            "render",
            str(EXAMPLES / example),
            "--gpu-memory-mib",
            "24576",
            "--namespace",
            NAMESPACE,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert rendered.returncode == 0, rendered.stderr
    deployment = next(
        d for d in yaml.safe_load_all(rendered.stdout) if d and d["kind"] == "Deployment"
    )
    init = deployment["spec"]["template"]["spec"]["initContainers"]
    assert [c["name"] for c in init] == ["sidecar", "model-fetch"]
    admitted = dry_run(kubeconfig, yaml.safe_dump(deployment))
    assert admitted.returncode == 0, admitted.stderr
