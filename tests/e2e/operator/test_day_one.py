"""Issue 35, item 7: docs/day-one.md, run as written.

The test reads the doc's marked shell blocks (`<!-- day-one: STEP -->` before a
```sh block) and runs each with bash, in order, the `settings` block first in
each, with the names set to this run's: a GPU node tainted and labelled, the
operator and chart from the cluster's authenticated registry with pull secrets,
every inference pod given the pool's toleration, label and secret through the
chart's `inference.pod`, a model from S3 (versitygw in the cluster, standing in
for the team's bucket), the service in Observe mode posting WouldAct under a leak
and acting on nothing, `kubectl fusebox explain`, then Enforce acting. Between
the steps it checks what the doc says happens. The cleanup block runs whatever
happened, and the node's taint is taken off even when it fails.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fusebox_contract.names import ConditionType, EventReason

from ..conftest import REPO_ROOT, Cluster, fresh_namespace, localcluster, wait_for
from .conftest import Service, traffic
from .test_model_sources import ACCESS_KEY, GATEWAY, GATEWAY_PORT, SECRET_KEY, upload_model

DOC = Path(__file__).resolve().parents[3] / "docs" / "day-one.md"
STEPS = (
    "settings",
    "pool",
    "namespaces",
    "registry",
    "install",
    "model-credentials",
    "observe",
    "traffic",
    "would-act",
    "enforce",
    "cleanup",
)
BLOCK = re.compile(r"<!-- day-one: (?P<step>[\w-]+) -->\n```sh\n(?P<body>.*?)\n```", re.S)
TAINT = "fusebox.dev/pool"
ACTIONS = {EventReason.GARBAGE_COLLECTED, EventReason.CACHE_EMPTIED, "ModelUnloaded"}


def doc_steps() -> dict[str, str]:
    return {m["step"]: m["body"] for m in BLOCK.finditer(DOC.read_text())}


def test_the_doc_marks_every_step_once_in_order() -> None:
    found = [m["step"] for m in BLOCK.finditer(DOC.read_text())]
    assert found == list(STEPS)


def lab_env(cluster: Cluster, names: dict[str, str]) -> dict[str, str]:
    """The environment `eval "$(python -m localcluster env)"` gives, plus the run's names."""
    exported = dict(
        line.removeprefix("export ").split("=", 1)
        for line in localcluster("env").stdout.splitlines()
        if line.startswith("export FUSEBOX_REGISTRY")
    )
    path = f"{cluster.bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}"
    # The doc is run from the checkout (`python -m localcluster`); here from a scratch
    # directory, so the values file it writes lands there.
    return {
        **os.environ,
        **exported,
        **names,
        "KUBECONFIG": str(cluster.kubeconfig),
        "PATH": path,
        "PYTHONPATH": str(REPO_ROOT),
    }


class Walk:
    """Runs the doc's steps in one working directory, the settings block first in each."""

    def __init__(self, env: dict[str, str], workdir: Path) -> None:
        self.steps = doc_steps()
        self.env = env
        self.workdir = workdir

    def run(self, step: str, check: bool = True) -> str:
        """The step's output; with check, a failure names the step with its output."""
        done = self.attempt(step)
        if check:
            assert done.returncode == 0, f"step {step} failed:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def attempt(self, step: str) -> subprocess.CompletedProcess[str]:
        script = f"{self.steps['settings']}\n{self.steps[step]}\n"
        return subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=self.workdir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )


@pytest.fixture
def store(cluster: Cluster, model_root: Path) -> Iterator[str]:
    """The team's bucket, played by versitygw in a namespace of its own, holding the tiny
    model at s3://models/tiny; yields its endpoint. Up before the pool is tainted."""
    with fresh_namespace(cluster, f"day1-store-{uuid.uuid4().hex[:6]}") as namespace:
        upload_model(cluster, namespace, model_root)
        yield f"http://{GATEWAY}.{namespace}.svc:{GATEWAY_PORT}"


def events(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("-n", namespace, "get", "events", "-o", "json").stdout
    return list(json.loads(out)["items"])


def reasons(cluster: Cluster, namespace: str) -> list[str]:
    return [e["reason"] for e in events(cluster, namespace)]


def test_day_one_walks_from_a_tainted_pool_to_an_enforced_service(
    cluster: Cluster, crd: None, store: str
) -> None:
    if not cluster.local:
        pytest.skip("the walk uses localcluster's registry and node")
    suffix = uuid.uuid4().hex[:6]
    app = f"day1-app-{suffix}"
    names = {
        "RELEASE": f"day1-{suffix}",
        "OPERATOR_NS": f"day1-op-{suffix}",
        "APP_NS": app,
        "S3_ENDPOINT": store,
        "S3_ACCESS_KEY": ACCESS_KEY,
        "S3_SECRET_KEY": SECRET_KEY,
    }
    node = cluster.kubectl(
        "get", "nodes", "-l", "nvidia.com/gpu.product", "-o", "jsonpath={.items[0].metadata.name}"
    ).stdout
    with tempfile.TemporaryDirectory(prefix="day-one-") as workdir:
        walk = Walk(lab_env(cluster, names), Path(workdir))
        try:
            for step in ("pool", "namespaces", "registry", "install"):
                walk.run(step)
            taints = cluster.kubectl("get", "node", node, "-o", "jsonpath={.spec.taints}").stdout
            assert TAINT in taints, taints
            operator_pod = cluster.kubectl(
                "-n", names["OPERATOR_NS"], "get", "pods", "-o", "jsonpath={.items[0]}"
            ).stdout
            assert "/fusebox/operator:dev" in operator_pod and "regcred" in operator_pod

            walk.run("model-credentials")
            walk.run("observe")
            service = Service(cluster, app, "chat")
            (pod,) = service.pods()
            spec = pod["spec"]
            assert {"name": "regcred"} in spec["imagePullSecrets"], spec
            assert spec["nodeSelector"].get(TAINT) == "gpu", spec["nodeSelector"]
            assert any(t.get("key") == TAINT for t in spec["tolerations"]), spec["tolerations"]
            ready = service.condition(ConditionType.MODEL_READY)
            assert ready.get("reason") == "Verified", ready

            walk.run("traffic")
            wait_for(
                "a WouldAct event for the leak",
                lambda: "WouldAct" in reasons(cluster, app),
                timeout=180,
                diagnose=service.diagnose,
            )
            assert not ACTIONS & set(reasons(cluster, app)), "Observe acted"
            assert service.status().get("lastWouldAct"), service.status()
            told = walk.run("would-act")
            assert "WouldAct" in told and "mode Observe" in told, told

            walk.run("enforce")
            with traffic(service.service_url(), 1.0):
                wait_for(
                    "the first rung acted in Enforce",
                    lambda: ACTIONS & set(reasons(cluster, app)),
                    timeout=240,
                    diagnose=service.diagnose,
                )
        finally:
            cleaned = walk.attempt("cleanup")
            cluster.kubectl("taint", "nodes", node, f"{TAINT}-", check=False)
            cluster.kubectl("label", "nodes", node, f"{TAINT}-", check=False)
    # Reached only when every step passed: the cleanup must have too (the chart's
    # pre-delete hook ran as a Job, from the registry, with no service left).
    assert cleaned.returncode == 0, f"cleanup failed:\n{cleaned.stdout}\n{cleaned.stderr}"
    release = cluster.kubectl("-n", names["OPERATOR_NS"], "get", "deployments", check=False)
    assert "day1-" not in release.stdout, release.stdout
