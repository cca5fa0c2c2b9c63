"""server.prefixCache.maxBytes through a real API server: the CRD's default, its CEL
messages, the reserved env name, and the rendered pod (the env and a limit grown for
the cache) admitted by the API server's own validation.

The parser's side of each refusal and the sizing figures are
tests/unit/operator/test_prefix_cache.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fusebox_contract.settings import PREFIX_CACHE_BYTES

from .loopback_apiserver import apiserver_with_crd, kubectl

pytestmark = pytest.mark.integration

TOKEN = "prefix-cache-test-token"
NAMESPACE = "ml"


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with apiserver_with_crd(
        tmp_path_factory.mktemp("apiserver"), token=TOKEN, namespace=NAMESPACE
    ) as config:
        yield config


def service(server: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "fusebox.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "chat", "namespace": NAMESPACE},
        "spec": {
            "model": {"name": "chat", "source": "pvc://models/tiny"},
            "gpu": {"count": 0},
            "server": server,
        },
    }


def dry_run(config: Path, document: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    text = yaml.safe_dump(document)
    return kubectl(config, "create", "--dry-run=server", "-o", "json", "-f", "-", stdin=text)


def test_left_out_the_api_server_defaults_it_to_one_gib(kubeconfig: Path) -> None:
    created = dry_run(kubeconfig, service({}))
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout)["spec"]["server"]["prefixCache"] == {"maxBytes": "1Gi"}


@pytest.mark.parametrize("value", ["512Mi", "0", "1.5Gi", "1Ti", "536870912", 536870912, 0])
def test_a_memory_quantity_up_to_one_tebibyte_is_admitted(kubeconfig: Path, value: str) -> None:
    created = dry_run(kubeconfig, service({"prefixCache": {"maxBytes": value}}))
    assert created.returncode == 0, created.stderr


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("lots", "server.prefixCache.maxBytes must be a memory quantity such as 512Mi"),
        ("-1Gi", "server.prefixCache.maxBytes must be a memory quantity such as 512Mi"),
        ("500m", "server.prefixCache.maxBytes must be a memory quantity such as 512Mi"),
        ("2Ti", "server.prefixCache.maxBytes must be at most 1Ti"),
        (-1, "server.prefixCache.maxBytes must be a memory quantity such as 512Mi"),
        (2 << 40, "server.prefixCache.maxBytes must be at most 1Ti"),
        (True, "spec.server.prefixCache.maxBytes"),
    ],
)
def test_a_bad_value_is_refused_with_a_message_naming_the_field(
    kubeconfig: Path, value: Any, message: str
) -> None:
    refused = dry_run(kubeconfig, service({"prefixCache": {"maxBytes": value}}))
    assert refused.returncode != 0
    assert message in refused.stderr


def test_server_env_may_not_set_the_prefix_cache_bytes(kubeconfig: Path) -> None:
    env = [{"name": PREFIX_CACHE_BYTES.env, "value": "1"}]
    refused = dry_run(kubeconfig, service({"env": env}))
    assert refused.returncode != 0
    assert "server.env may not set a name the operator renders" in refused.stderr


def test_the_rendered_pod_carries_the_bytes_and_the_grown_limit_and_is_admitted(
    kubeconfig: Path, tmp_path: Path
) -> None:
    spec_file = tmp_path / "service.yaml"
    spec_file.write_text(yaml.safe_dump(service({"prefixCache": {"maxBytes": "4Gi"}})))
    rendered = subprocess.run(
        [sys.executable, "-m", "fusebox_operator", "render", str(spec_file)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert rendered.returncode == 0, rendered.stderr
    children = list(yaml.safe_load_all(rendered.stdout))
    deployment = next(c for c in children if c["kind"] == "Deployment")
    server = next(
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "server"
    )
    env = {item["name"]: item["value"] for item in server["env"]}
    assert env[PREFIX_CACHE_BYTES.env] == str(4 << 30)
    assert server["resources"]["limits"]["memory"] == "6Gi"
    admitted = kubectl(
        kubeconfig,
        "create",
        "--dry-run=server",
        "-f",
        "-",
        stdin=yaml.safe_dump(deployment),
    )
    assert admitted.returncode == 0, admitted.stderr
