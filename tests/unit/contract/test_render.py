"""`python -m fusebox_operator render FILE`: the children, printed without a cluster."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from fusebox_operator.manifests import ADMIN_TOKEN_PLACEHOLDER

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "crds" / "examples"
KINDS = ["Secret", "ConfigMap", "Service", "PodDisruptionBudget", "NetworkPolicy", "Deployment"]


def render(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fusebox_operator", "render", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def write(tmp_path: Path, *documents: dict[str, Any]) -> Path:
    path = tmp_path / "services.yaml"
    path.write_text(yaml.safe_dump_all(documents), encoding="utf-8")
    return path


def service(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "fusebox.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": spec,
    }


def test_render_prints_every_child_with_a_placeholder_token() -> None:
    result = render(str(EXAMPLES / "cpu-only.yaml"), "--namespace", "ml")
    assert result.returncode == 0, result.stderr
    children = list(yaml.safe_load_all(result.stdout))
    assert [c["kind"] for c in children] == KINDS
    assert {c["metadata"]["namespace"] for c in children} == {"ml"}
    assert children[0]["stringData"] == {"token": ADMIN_TOKEN_PLACEHOLDER}
    assert "&id" not in result.stdout  # plain YAML, no anchors


def test_gpu_memory_flag_stands_in_for_the_node_label() -> None:
    result = render(str(EXAMPLES / "tiny-chat.yaml"), "--gpu-memory-mib", "16384")
    assert result.returncode == 0, result.stderr
    deployment = list(yaml.safe_load_all(result.stdout))[-1]
    server = deployment["spec"]["template"]["spec"]["containers"][0]
    assert server["resources"]["limits"]["memory"] == "22Gi"  # 16 x 1.25 + 2


def test_without_any_vram_figure_a_gpu_service_is_an_invalid_spec() -> None:
    result = render(str(EXAMPLES / "tiny-chat.yaml"))
    assert result.returncode == 2
    assert result.stdout == ""
    assert "InvalidSpec" in result.stderr and "nvidia.com/gpu.memory" in result.stderr


def test_an_invalid_spec_prints_the_operator_message_and_exits_2(tmp_path: Path) -> None:
    path = write(tmp_path, service("bad", {"model": {"name": "c", "source": "gs://org/repo"}}))
    result = render(str(path))
    assert result.returncode == 2
    assert result.stdout == ""
    assert "InferenceService bad: model.source 'gs://org/repo'" in result.stderr


def test_a_name_the_service_cannot_carry_is_an_invalid_spec(tmp_path: Path) -> None:
    cpu = {"model": {"name": "c", "source": "pvc://m"}, "gpu": {"count": 0}}
    path = write(tmp_path, service("chat.v2", cpu))
    result = render(str(path))
    assert result.returncode == 2
    assert result.stdout == ""
    assert "InferenceService chat.v2: metadata.name 'chat.v2' must be a DNS-1035" in result.stderr


def test_gpu_product_flag_refuses_fp8_on_a_gpu_without_it(tmp_path: Path) -> None:
    spec = {"model": {"name": "c", "source": "pvc://m"}, "fallback": {"quantization": "fp8"}}
    path = write(tmp_path, service("fp8", spec))
    refused = render(str(path), "--gpu-product", "NVIDIA-A100-SXM4-80GB")
    assert refused.returncode == 2
    assert "has no fp8 support" in refused.stderr
    accepted = render(str(path), "--gpu-product", "NVIDIA-H100-80GB-HBM3")
    assert accepted.returncode == 0, accepted.stderr
    deployment = list(yaml.safe_load_all(accepted.stdout))[-1]
    server = deployment["spec"]["template"]["spec"]["containers"][0]
    assert server["resources"]["limits"]["memory"] == "102Gi"  # the product table's 80 GiB


def test_every_document_of_a_file_is_rendered(tmp_path: Path) -> None:
    cpu = {"model": {"name": "c", "source": "pvc://m"}, "gpu": {"count": 0}}
    path = write(tmp_path, service("one", cpu), service("two", cpu))
    result = render(str(path))
    assert result.returncode == 0, result.stderr
    names = [c["metadata"]["name"] for c in yaml.safe_load_all(result.stdout)]
    assert (
        names.count("one") == 4 and names.count("two") == 4
    )  # Service, PDB, NetworkPolicy, Deployment


def test_a_document_of_another_kind_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}})
    result = render(str(path))
    assert result.returncode == 1
    assert "expected kind InferenceService, got ConfigMap" in result.stderr


def test_the_operator_command_without_render_still_runs_kopf() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "fusebox_operator", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0
    assert "Run the Fusebox operator (kopf)" in result.stdout
    assert "render FILE" in result.stdout
