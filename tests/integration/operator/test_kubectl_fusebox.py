"""`kubectl fusebox` as a process against a real kube-apiserver (etcd and the API server
from the cluster binaries, on loopback; no nodes, no pods).

What only a real API server shows: the CRD keeps the status the operator writes
(`status.incident` is not pruned), the plugin's merge patches set and remove the
annotations the operator reads, a service that does not exist is named, and a bad
tier is refused before anything is written.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from fusebox_operator.actuator import ActionResult, RuntimeCall
from fusebox_operator.incident import PAUSE_ACTIONS, PIN_TIER
from fusebox_operator.kube import SERVICE_GROUP, SERVICE_PLURAL, SERVICE_VERSION
from fusebox_operator.observations import PodSample, PodView
from fusebox_operator.policy_state import Action
from fusebox_operator.reconcile_status import applied_status
from fusebox_operator.sizing import size_memory
from fusebox_operator.spec import parse_spec
from fusebox_operator.tick import TickInputs, TickMemory, run_tick

from .loopback_apiserver import REPO, loopback_apiserver, skip_without_binaries

TOKEN = "kubectl-fusebox-test-token"
NAMESPACE = "prod"
LIMIT = 4 * 1024**3
RAW: dict[str, Any] = {
    "model": {"name": "chat", "source": "pvc://models/tiny"},
    "gpu": {"count": 0},
}


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    skip_without_binaries()
    with loopback_apiserver(
        tmp_path_factory.mktemp("apiserver"),
        token=TOKEN,
        user="tester",
        authorization_mode="AlwaysAllow",
        namespace=NAMESPACE,
    ) as config:
        _install(config)
        yield config


def _api(config: Path) -> kubernetes.client.ApiClient:
    return kubernetes.config.new_client_from_config(config_file=str(config))  # type: ignore[no-any-return]


class ServerLikeActuator:
    async def execute(
        self, namespace: str, pod: PodView | None, token: str, action: Action
    ) -> ActionResult:
        return ActionResult("RSS 3.9Gi -> 3.2Gi (freed 700.0Mi); variant primary")

    async def reconcile_runtime(self, *args: Any) -> RuntimeCall:
        return RuntimeCall(changed=True)


def _operator_status(annotations: dict[str, str]) -> dict[str, Any]:
    """The status the operator writes: reconcile's, then one tick on a pod at 97 %."""
    spec = parse_spec(RAW)
    now = time.time()
    status = applied_status({}, RAW, size_memory(spec, []), "chat", 1, now)
    pod = PodView("chat-0", "uid-0", "10.0.0.1", "Running", True, True, True, 0, False, False)

    async def scrape(pods: Sequence[PodView]) -> list[PodSample]:
        sample = PodSample(
            "chat-0", now, stats_age_seconds=1.0, heartbeat_age_seconds=0.5,
            rss_bytes=0.97 * LIMIT, memory_limit_bytes=LIMIT,
        )  # fmt: skip
        return [sample]

    inputs = TickInputs(NAMESPACE, "svc", spec, status, [pod], "t", 1, annotations)
    outcome = asyncio.run(run_tick(inputs, TickMemory(), scrape, ServerLikeActuator(), time.time))
    return {**status, **outcome.status_patch}


def _install(config: Path) -> None:
    """The CRD, the namespace, and a service whose status the operator's builders wrote."""
    api = _api(config)
    crd = yaml.safe_load((REPO / "crds" / "inferenceservice.yaml").read_text())
    extensions = kubernetes.client.ApiextensionsV1Api(api)
    extensions.create_custom_resource_definition(crd)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        read = extensions.read_custom_resource_definition(crd["metadata"]["name"])
        if any(
            c.type == "Established" and c.status == "True" for c in read.status.conditions or []
        ):
            break
        time.sleep(0.2)
    core = kubernetes.client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    objects = kubernetes.client.CustomObjectsApi(api)
    args = (SERVICE_GROUP, SERVICE_VERSION, NAMESPACE, SERVICE_PLURAL)
    body = {
        "apiVersion": f"{SERVICE_GROUP}/{SERVICE_VERSION}",
        "kind": "InferenceService",
        "metadata": {"name": "chat", "annotations": {PIN_TIER: "no-streaming"}},
        "spec": RAW,
    }
    # CRD defaulting: the API server fills the spec as the operator would read it.
    deadline = time.monotonic() + 30
    while True:
        try:
            objects.create_namespaced_custom_object(*args, body)
            break
        except kubernetes.client.exceptions.ApiException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)  # the resource is served a moment after Established
    status = _operator_status({PIN_TIER: "no-streaming"})
    objects.patch_namespaced_custom_object_status(*args, "chat", {"status": status})
    core.create_namespaced_event(
        NAMESPACE,
        {
            "metadata": {"name": "chat.pinned"},
            "involvedObject": {
                "kind": "InferenceService",
                "name": "chat",
                "namespace": NAMESPACE,
                "apiVersion": f"{SERVICE_GROUP}/{SERVICE_VERSION}",
            },
            "reason": "TierPinned",
            "message": "degradation tier held at no-streaming (level 1)",
            "type": "Warning",
            "lastTimestamp": "2026-12-05T03:00:00Z",
            "count": 1,
        },
    )


def plugin(config: Path, *args: str, wrapper: bool = False) -> subprocess.CompletedProcess[str]:
    """`python -m fusebox_operator.kubectl_plugin`, or the checkout's bin/kubectl-fusebox."""
    env = {**os.environ, "KUBECONFIG": str(config)}
    module = [sys.executable, "-m", "fusebox_operator.kubectl_plugin"]
    command = [str(REPO / "bin" / "kubectl-fusebox")] if wrapper else module
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )


def annotations(config: Path) -> dict[str, str]:
    objects = kubernetes.client.CustomObjectsApi(_api(config))
    body = objects.get_namespaced_custom_object(
        SERVICE_GROUP, SERVICE_VERSION, NAMESPACE, SERVICE_PLURAL, "chat"
    )
    return dict(body["metadata"].get("annotations") or {})


def test_status_explain_and_history_read_what_the_api_server_keeps(kubeconfig: Path) -> None:
    listed = plugin(kubeconfig, "status", wrapper=True)
    assert listed.returncode == 0, listed.stderr
    row = listed.stdout.splitlines()[1].split()
    assert row[:5] == [NAMESPACE, "chat", "Enforce,pinned:no-streaming", "Closed", "no-streaming"]

    explained = plugin(kubeconfig, "explain", "chat")
    assert explained.returncode == 0, explained.stderr
    # status.incident survived the CRD's schema, and the ladder's state too.
    assert f"{PIN_TIER}='no-streaming' since" in explained.stdout
    assert "rss: next rung empty_cache at" in explained.stdout

    told = plugin(kubeconfig, "history", "chat")
    assert "result: RSS 3.9Gi -> 3.2Gi (freed 700.0Mi)" in told.stdout
    assert "Warning TierPinned: degradation tier held at no-streaming" in told.stdout


def test_pause_and_resume_set_and_remove_the_annotation(kubeconfig: Path) -> None:
    paused = plugin(kubeconfig, "pause", "chat", "INC-9 bad rollout")
    assert paused.returncode == 0, paused.stderr
    assert annotations(kubeconfig)[PAUSE_ACTIONS] == "INC-9 bad rollout"
    resumed = plugin(kubeconfig, "-n", NAMESPACE, "resume", "chat")
    assert resumed.returncode == 0, resumed.stderr
    assert PAUSE_ACTIONS not in annotations(kubeconfig)
    assert annotations(kubeconfig)[PIN_TIER] == "no-streaming"  # the others untouched


def test_a_bad_tier_and_a_missing_service_are_named_and_nothing_is_written(
    kubeconfig: Path,
) -> None:
    refused = plugin(kubeconfig, "pin", "chat", "turbo")
    assert refused.returncode == 2
    assert "unknown tier 'turbo': one of none, no-streaming" in refused.stderr
    assert annotations(kubeconfig)[PIN_TIER] == "no-streaming"
    missing = plugin(kubeconfig, "explain", "nope")
    assert missing.returncode == 1
    assert f"InferenceService {NAMESPACE}/nope not found" in missing.stderr
