"""The suite shares a cluster politely (issue 11, item 8): a release someone else
installed (the demo's: `make demo`, then `make test`) keeps running untouched.

A stand-in for the demo's release is installed first, as scripts/demo.py installs
it (its own namespace, watching only that namespace), with an InferenceService of
its own. Then a representative test runs against the suite's release: a service
applied, served and deleted, and the suite's operator crashed and replaced. The
stand-in's operator pod must still be the same pod with the same restart count,
its service still its own, and neither operator may ever have named the other's
namespace in its log. The stand-in runs one replica and is a live peer of its
release's KopfPeering all the same, as the demo's is: a rollout's new pod would
pause for it. And a GPU count the suite raises for its tests (`two_gpus`)
is the cluster's own again afterwards.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from fusebox_contract.names import ConditionType

from ..conftest import Cluster, fresh_namespace
from .conftest import (
    OperatorRelease,
    ServiceFactory,
    apply_service,
    base_spec,
    chat,
    gpus_at_least,
    node_gpus,
    wait_for,
)
from .test_operator_replicas import peers

STAND_IN_SERVICE = "demo-chat"


@dataclass(frozen=True)
class PodIdentity:
    name: str
    uid: str
    restarts: int


def identity(pod: dict[str, Any]) -> PodIdentity:
    restarts = sum(int(s.get("restartCount", 0)) for s in pod["status"]["containerStatuses"])
    return PodIdentity(pod["metadata"]["name"], pod["metadata"]["uid"], restarts)


@pytest.fixture
def stand_in_demo(cluster: Cluster, crd: None) -> Iterator[OperatorRelease]:
    """A release shaped like the demo's, with a service its operator reconciles (its pods
    wait for a claim that does not exist: nothing here needs them to run)."""
    suffix = uuid.uuid4().hex[:6]
    with fresh_namespace(cluster, f"standin-demo-{suffix}") as namespace:
        release = OperatorRelease(cluster, namespace, f"standin-{suffix}")
        try:
            release.install("--set", f"watchNamespaces={{{namespace}}}")
            apply_service(cluster, namespace, STAND_IN_SERVICE, base_spec())
            wait_for(
                "the stand-in's operator to reconcile its service",
                lambda: (
                    cluster.kubectl(
                        "-n", namespace, "get", "deployment", STAND_IN_SERVICE, check=False
                    ).returncode
                    == 0
                ),
                timeout=120,
                diagnose=release.logs,
            )
            yield release
        finally:
            # fresh_namespace deletes the namespace after this.
            release.uninstall_with_services()


def test_another_release_keeps_running_untouched_while_the_suite_runs(
    cluster: Cluster,
    stand_in_demo: OperatorRelease,
    operator: OperatorRelease,
    inference_service: ServiceFactory,
    namespace: str,
) -> None:
    before = identity(wait_for("the stand-in's operator Ready", stand_in_demo.ready_pod))
    # One replica, a peer all the same (the chart peers at every replica count).
    wait_for(
        "the stand-in's operator, alone, a live peer of its KopfPeering",
        lambda: list(peers(stand_in_demo)) == [before.name],
        timeout=60,
    )
    stand_in_deployment = json.loads(
        cluster.kubectl(
            "-n", stand_in_demo.namespace, "get", "deployment", STAND_IN_SERVICE, "-o", "json"
        ).stdout
    )

    # The representative test: a service applied and served, the operator crashed.
    service = inference_service("polite", base_spec())
    wait_for(
        "a ready pod", lambda: service.ready_pods(), timeout=420, diagnose=service.diagnose_pods
    )
    assert wait_for("a 200 through the Service", lambda: chat(service.service_url()) == 200)
    suite_log_before_crash = operator.logs(lines=2000)
    operator.crash()
    wait_for(
        "the replacement operator to take the service over",
        lambda: service.condition(ConditionType.READY).get("status") == "True",
        timeout=120,
    )

    after = identity(wait_for("the stand-in's operator Ready", stand_in_demo.ready_pod))
    assert after == before, f"the stand-in's operator pod changed: {before} -> {after}"
    # Helm's record of the release (a Secret per revision): still one, still deployed.
    records = cluster.kubectl(
        "-n",
        stand_in_demo.namespace,
        "get",
        "secrets",
        "-l",
        f"owner=helm,name={stand_in_demo.release},status=deployed",
        "-o",
        "name",
    ).stdout.split()
    assert len(records) == 1, records
    # The stand-in's service is its operator's alone: untouched by the suite's.
    now = json.loads(
        cluster.kubectl(
            "-n", stand_in_demo.namespace, "get", "deployment", STAND_IN_SERVICE, "-o", "json"
        ).stdout
    )
    assert now["metadata"]["uid"] == stand_in_deployment["metadata"]["uid"]
    assert now["metadata"]["generation"] == stand_in_deployment["metadata"]["generation"]
    suite_log = suite_log_before_crash + operator.logs(lines=2000)
    stand_in_log = stand_in_demo.logs(lines=2000)
    assert f"{namespace}/polite" in suite_log, suite_log[-3000:]
    assert f"{stand_in_demo.namespace}/{STAND_IN_SERVICE}" in stand_in_log, stand_in_log[-3000:]
    assert stand_in_demo.namespace not in suite_log, suite_log[-3000:]
    assert namespace not in stand_in_log, stand_in_log[-3000:]


def test_a_gpu_count_raised_for_the_suite_is_put_back_afterwards(cluster: Cluster) -> None:
    """`two_gpus` raises the node's simulated GPUs through `gpus_at_least`; the cluster
    it shares (the demo's, started with one) keeps the count it had."""
    before = node_gpus(cluster, "capacity")
    with gpus_at_least(cluster, before + 1):
        assert node_gpus(cluster) >= before + 1
    assert node_gpus(cluster, "capacity") == before
