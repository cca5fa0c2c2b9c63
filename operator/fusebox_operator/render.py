"""`python -m fusebox_operator render FILE`: the children, without a cluster.

Why: users expect `helm template` and `kubectl --dry-run` before they apply.
This reads InferenceService documents, runs the same pure path the handler
runs (parse_spec -> size_memory -> build_children) and prints the objects as
multi-document YAML. The flags stand in for what the handler reads from the
nodes (the `nvidia.com/gpu.memory` and `nvidia.com/gpu.product` labels). The
admin token is a placeholder: a real one is made once, in the cluster.
An invalid spec prints the operator's InvalidSpec message and exits 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import yaml

from fusebox_operator.gpu_products import product_vram_gib
from fusebox_operator.manifests import ADMIN_TOKEN_PLACEHOLDER, Manifest, build_children
from fusebox_operator.settings import OperatorSettings
from fusebox_operator.sizing import size_memory
from fusebox_operator.spec import (
    SpecError,
    check_quantization_device,
    check_service_name,
    parse_spec,
)

KIND = "InferenceService"
EXIT_INVALID_SPEC = 2
MIB_PER_GIB = 1024


class _PlainDumper(yaml.SafeDumper):
    """Writes shared sub-objects out in full: no `&id001` anchors for kubectl to show."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


class RenderError(ValueError):
    """The file holds something that is not a renderable InferenceService."""


def node_vram_mib(product: str, gpu_memory_mib: int | None) -> list[int]:
    """The `nvidia.com/gpu.memory` labels the flags describe (none: the handler finds none)."""
    if gpu_memory_mib is not None:
        return [gpu_memory_mib]
    gib = product_vram_gib(product) if product else None
    return [gib * MIB_PER_GIB] if gib is not None else []


def render_service(
    document: dict[str, Any],
    namespace: str | None,
    gpu_memory_mib: int | None,
    gpu_product: str,
    settings: OperatorSettings,
) -> list[Manifest]:
    """One InferenceService document -> its children; raises SpecError like the handler."""
    metadata = document.get("metadata") or {}
    name = metadata.get("name") if isinstance(metadata, dict) else None
    if not isinstance(name, str) or not name:
        raise RenderError("an InferenceService needs metadata.name")
    try:
        check_service_name(name)
        spec = parse_spec(document.get("spec") or {})
        # The nodes' product stands in when the spec names none, as the scheduler would pick.
        product = spec.gpu.product or gpu_product
        check_quantization_device(spec.fallback, spec.gpu.count, product)
        node_vram = node_vram_mib(product, gpu_memory_mib) if spec.gpu.count else []
        sizing = size_memory(spec, node_vram)
    except SpecError as error:
        raise SpecError(f"{KIND} {name}: {error}") from error
    target = namespace or metadata.get("namespace") or "default"
    return build_children(spec, name, target, sizing, settings, ADMIN_TOKEN_PLACEHOLDER)


def render_documents(
    documents: Sequence[Any],
    namespace: str | None,
    gpu_memory_mib: int | None,
    gpu_product: str,
    settings: OperatorSettings,
) -> list[Manifest]:
    children: list[Manifest] = []
    for document in documents:
        if document is None:
            continue
        if not isinstance(document, dict) or document.get("kind") != KIND:
            raise RenderError(f"expected kind {KIND}, got {_kind_of(document)}")
        children += render_service(document, namespace, gpu_memory_mib, gpu_product, settings)
    return children


def _kind_of(document: Any) -> str:
    return str(document.get("kind")) if isinstance(document, dict) else type(document).__name__


def parser() -> argparse.ArgumentParser:
    command = argparse.ArgumentParser(
        prog="python -m fusebox_operator render",
        description="Print, as multi-document YAML, the objects the operator would create "
        "for the InferenceService(s) in FILE (no cluster needed). Exit 2 on an invalid spec.",
    )
    command.add_argument("file", help="YAML file of one or more InferenceService documents")
    command.add_argument(
        "--gpu-memory-mib",
        type=int,
        default=None,
        help="VRAM per GPU in MiB, as the nodes' nvidia.com/gpu.memory label would say",
    )
    command.add_argument(
        "--gpu-product",
        default="",
        help="GPU product of the nodes (nvidia.com/gpu.product) when the spec names none",
    )
    command.add_argument(
        "--namespace", default=None, help="namespace of the children (default: the document's)"
    )
    return command


def main(argv: Sequence[str], out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    args = parser().parse_args(list(argv))
    try:
        settings = OperatorSettings.from_env(os.environ)
        text = Path(args.file).read_text(encoding="utf-8")
        documents = list(yaml.safe_load_all(text))
        children = render_documents(
            documents, args.namespace, args.gpu_memory_mib, args.gpu_product, settings
        )
    except SpecError as error:
        print(f"InvalidSpec: {error}", file=err)
        return EXIT_INVALID_SPEC
    except (OSError, ValueError, yaml.YAMLError) as error:
        print(f"render: {error}", file=err)
        return 1
    except RecursionError:  # a YAML alias that holds itself (`a: &x [*x]`)
        print("render: the document nests itself (a YAML alias inside its own value)", file=err)
        return 1
    yaml.dump_all(children, out, Dumper=_PlainDumper, sort_keys=False, allow_unicode=True)
    return 0
