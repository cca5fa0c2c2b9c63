"""The baseline the operator_scale bench compares Fusebox's operator with: a plain kopf
operator that creates the SAME children with server-side apply, and nothing else.

    kopf run bench/fleet/baseline_operator.py --standalone --namespace NS

Why: "500 services reach status in T seconds" means little alone; against an
operator that does the least any operator must (build the same Secret,
ConfigMap, Service, PodDisruptionBudget, NetworkPolicy and Deployment, apply
each once, write observedGeneration) it says what Fusebox's own logic costs.
It renders with Fusebox's builders, so the objects are byte for byte the same,
and it applies each with one PATCH (application/apply-patch+yaml): no reads,
no drift checks, no timers, no pod watch.
"""

from __future__ import annotations

import os
import secrets
import ssl
import sys
from pathlib import Path
from typing import Any

import aiohttp
import kopf
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "operator"))

from fusebox_operator import manifests  # noqa: E402
from fusebox_operator.settings import OperatorSettings  # noqa: E402
from fusebox_operator.sizing import size_memory  # noqa: E402
from fusebox_operator.spec import parse_spec  # noqa: E402

FIELD_MANAGER = "baseline-operator"
PLURALS = {
    "Secret": "secrets",
    "ConfigMap": "configmaps",
    "Service": "services",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "NetworkPolicy": "networkpolicies",
    "Deployment": "deployments",
}
GPU_MEMORY_MIB = 81559  # what the fleet's nodes say (plan.GPU_MEMORY_MIB); no node read


def child_path(child: dict[str, Any]) -> str:
    """The URL path of one namespaced child, from its apiVersion and kind."""
    version = child["apiVersion"]
    prefix = f"/api/{version}" if "/" not in version else f"/apis/{version}"
    meta = child["metadata"]
    return f"{prefix}/namespaces/{meta['namespace']}/{PLURALS[child['kind']]}/{meta['name']}"


class Cluster:
    """The API server of $KUBECONFIG, reached with its bearer token and CA."""

    def __init__(self) -> None:
        config = yaml.safe_load(Path(os.environ["KUBECONFIG"]).read_text())
        cluster = config["clusters"][0]["cluster"]
        self.server = cluster["server"]
        self.token = config["users"][0]["user"]["token"]
        self.ssl = ssl.create_default_context(cafile=cluster["certificate-authority"])
        self.session: aiohttp.ClientSession | None = None

    async def apply(self, child: dict[str, Any]) -> None:
        if self.session is None:
            self.session = aiohttp.ClientSession()
        url = f"{self.server}{child_path(child)}"
        params = {"fieldManager": FIELD_MANAGER, "force": "true"}
        headers = {
            "Authorization": f"Bearer {self.token}",
            "Content-Type": "application/apply-patch+yaml",
        }
        async with self.session.patch(
            url, params=params, headers=headers, data=yaml.safe_dump(child), ssl=self.ssl
        ) as response:
            if response.status >= 300:
                raise kopf.TemporaryError(f"{url}: HTTP {response.status}", delay=5)


CLUSTER = Cluster()


@kopf.on.startup()
def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.posting.level = 100  # no events: the baseline posts none


@kopf.on.create("fusebox.dev", "v1alpha1", "inferenceservices")
async def create(
    spec: kopf.Spec,
    name: str,
    namespace: str | None,
    meta: kopf.Meta,
    patch: kopf.Patch,
    **_: Any,
) -> None:
    assert namespace is not None  # the CRD is namespaced
    parsed = parse_spec(spec)
    sizing = size_memory(parsed, [GPU_MEMORY_MIB] if parsed.gpu.count else [])
    children = manifests.build_children(
        parsed,
        name,
        namespace,
        sizing,
        OperatorSettings(),
        secrets.token_urlsafe(32),
        replicas=parsed.replicas,
    )
    kopf.adopt(children)
    for child in children:
        await CLUSTER.apply(child)
    patch.status["observedGeneration"] = int(meta.get("generation") or 0)


@kopf.on.cleanup()
async def cleanup(**_: Any) -> None:
    if CLUSTER.session is not None:
        await CLUSTER.session.close()
