"""Two operator pods of one release never act at once, whatever a `helm upgrade`
changes. Every pod peers through one kopf peering at every replicaCount, so the
Deployment rolls a new pod in beside the running ones (kopf starts it paused: it
waits for the acting pod to leave, or makes it pause), and the Deployment is
recreated (every old pod gone first) only where the old pods and the new would not
see each other in a peering (docs/decisions/operator-rollouts.md).

The chart reads the Deployment the cluster holds with `lookup`, which `helm template`
answers with nothing. `render_over` renders a copy of the chart whose lookup returns
a given Deployment instead, so these tests see the strategy a real upgrade gets.
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fusebox_operator.settings import OperatorSettings

from .conftest import CHART, Render, by_kind, env_of, load_documents, one, run_helm

Documents = list[dict[str, Any]]
RenderOver = Callable[..., Documents]

LOOKUP = 'lookup "apps/v1" "Deployment" .Release.Namespace $fullname'
"""The expression deployment.yaml reads the running Deployment with."""

ROLLING = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
RECREATE = {"type": "Recreate"}  # the API server refuses rollingUpdate beside it


@pytest.fixture(scope="module")
def render_over(helm: Path, tmp_path_factory: pytest.TempPathFactory) -> RenderOver:
    """Render the chart as an upgrade over `running`, the Deployment the cluster holds."""
    chart = tmp_path_factory.mktemp("chart") / "fusebox"
    shutil.copytree(CHART, chart)
    template = chart / "templates" / "deployment.yaml"
    source = template.read_text()
    assert source.count(LOOKUP) == 1, "deployment.yaml no longer reads the running Deployment"

    def render(running: dict[str, Any], *sets: str) -> Documents:
        text = json.dumps(running)
        assert "`" not in text  # inside a Go raw string
        template.write_text(source.replace(LOOKUP, f"fromJson `{text}`"))
        args = ["template", "fusebox", str(chart), "--namespace", "fusebox-system"]
        for pair in sets:
            args += ["--set", pair]
        result = run_helm(helm, *args)
        assert result.returncode == 0, result.stderr
        return load_documents(result.stdout)

    return render


def strategy(documents: Documents) -> Any:
    return one(documents, "Deployment")["spec"]["strategy"]


def peering_of(documents: Documents) -> OperatorSettings:
    """What the operator's own parser makes of the rendered env."""
    return OperatorSettings.from_env(env_of(one(documents, "Deployment")))


def with_env(deployment: dict[str, Any], name: str, value: str) -> dict[str, Any]:
    changed = copy.deepcopy(deployment)
    (container,) = changed["spec"]["template"]["spec"]["containers"]
    (entry,) = [e for e in container["env"] if e["name"] == name]
    entry["value"] = value
    return changed


@pytest.mark.parametrize("scope", [(), ("watchNamespaces={team-a}",)])
def test_one_replica_peers_so_an_upgrade_rolls_its_new_pod_in_beside_the_old(
    render: Render, scope: tuple[str, ...]
) -> None:
    """The new pod starts paused beside the old one (no gap, and the old one keeps
    acting if the new one never becomes Ready), through the peering the chart made."""
    documents = render(sets=("replicaCount=1", *scope))
    settings = peering_of(documents)
    assert not settings.standalone
    kind = "KopfPeering" if scope else "ClusterKopfPeering"
    assert {p["metadata"]["name"] for p in by_kind(documents, kind)} == {settings.peering_name}
    assert strategy(documents) == ROLLING


@pytest.mark.parametrize(("before", "after"), [(1, 2), (2, 1), (1, 3), (3, 1), (1, 1)])
@pytest.mark.parametrize("scope", [(), ("watchNamespaces={team-a}",)])
def test_a_replica_change_rolls_pods_that_peer_with_the_running_ones(
    render: Render, render_over: RenderOver, before: int, after: int, scope: tuple[str, ...]
) -> None:
    """`helm upgrade --set replicaCount=2` over one replica, and back: the old pods
    and the new read one peering object, so one of them acts throughout."""
    running = one(render(sets=(f"replicaCount={before}", *scope)), "Deployment")
    documents = render_over(running, f"replicaCount={after}", *scope)
    old = OperatorSettings.from_env(env_of(running))
    new = peering_of(documents)
    assert not old.standalone and not new.standalone
    assert (old.peering_name, old.watch_namespaces) == (new.peering_name, new.watch_namespaces)
    assert strategy(documents) == ROLLING


@pytest.mark.parametrize("after", [1, 2])
def test_an_upgrade_over_a_standalone_pod_recreates_the_pods(
    render: Render, render_over: RenderOver, after: int
) -> None:
    """Every chart before this one ran one replica standalone: that pod never reads
    the peering, so a new pod beside it would act too. The old pod goes first."""
    running = with_env(one(render(), "Deployment"), "FUSEBOX_PEERING", "standalone")
    assert OperatorSettings.from_env(env_of(running)).standalone
    documents = render_over(running, f"replicaCount={after}")
    assert not peering_of(documents).standalone
    assert strategy(documents) == RECREATE


@pytest.mark.parametrize(
    ("running_sets", "upgrade_sets", "expected"),
    [
        ((), ("peering.name=fusebox-peers",), RECREATE),  # another peering object
        ((), ("watchNamespaces={team-a}",), RECREATE),  # ClusterKopfPeering -> KopfPeering
        (("watchNamespaces={team-a}",), (), RECREATE),  # and back
        # Named namespaces to named namespaces: the pods share each common
        # namespace's KopfPeering, and act on disjoint ones only alone.
        (("watchNamespaces={team-a}",), ("watchNamespaces={team-a,team-b}",), ROLLING),
        (("watchNamespaces={team-a}",), ("watchNamespaces={team-b}",), ROLLING),
    ],
)
def test_an_upgrade_to_a_peering_the_running_pods_do_not_read_recreates_the_pods(
    render: Render,
    render_over: RenderOver,
    running_sets: tuple[str, ...],
    upgrade_sets: tuple[str, ...],
    expected: dict[str, Any],
) -> None:
    running = one(render(sets=running_sets), "Deployment")
    assert strategy(render_over(running, *upgrade_sets)) == expected


def test_a_namespace_glob_runs_standalone_and_recreates_the_pod(
    render: Render, render_over: RenderOver
) -> None:
    """No KopfPeering can be made in namespaces not known yet: the one pod runs
    standalone, so each upgrade stops it before its successor starts."""
    glob = "watchNamespaces={e2e-*}"
    documents = render(sets=(glob,))
    assert peering_of(documents).standalone
    assert by_kind(documents, "ClusterKopfPeering") + by_kind(documents, "KopfPeering") == []
    assert strategy(documents) == RECREATE
    assert strategy(render_over(one(render(), "Deployment"), glob)) == RECREATE
