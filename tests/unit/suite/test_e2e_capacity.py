"""The e2e suite's CPU pre-flight: it stops, naming the holders, when `make demo`
(or anything else) leaves too little CPU for the suite's pods; it lets a fresh
cluster, the monitoring addon and a killed run's leftovers through."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

_spec = importlib.util.spec_from_file_location(
    "e2e_capacity", Path(__file__).resolve().parents[2] / "e2e" / "capacity.py"
)
assert _spec and _spec.loader
capacity = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(capacity)


def pod(namespace: str, *cpus: str, phase: str = "Running", pod_level: str = "") -> dict[str, Any]:
    containers = [{"resources": {"requests": {"cpu": cpu}}} for cpu in cpus]
    spec: dict[str, Any] = {"containers": containers}
    if pod_level:
        spec["resources"] = {"requests": {"cpu": pod_level}}
    return {"metadata": {"namespace": namespace}, "spec": spec, "status": {"phase": phase}}


FRESH_CLUSTER = [pod("kube-system", "100m")]
DEMO = [
    pod("fusebox-system", "100m"),
    pod("fusebox-demo", "700m", "100m"),
    pod("fusebox-demo", "700m", "100m"),
]


def test_a_fresh_cluster_fits_the_suite_with_the_monitoring_addon_still_to_install() -> None:
    assert capacity.shortfall("2", FRESH_CLUSTER) is None


def test_the_demo_left_running_stops_the_suite_and_the_message_names_it_and_the_cure() -> None:
    why = capacity.shortfall("2", [*FRESH_CLUSTER, *DEMO])
    assert why is not None
    assert "fusebox-demo 1600m" in why and "fusebox-system 100m" in why
    assert "make demo-down" in why
    assert "needs 1470m" in why and "200m of its 2000m" in why


def test_the_installed_monitoring_addon_is_counted_once() -> None:
    monitoring = [pod("monitoring", "160m"), pod("monitoring", "50m")]
    # 2000 - 100 - 210 = 1690 free >= 1300 needed: the addon is not to come
    assert capacity.shortfall("2", [*FRESH_CLUSTER, *monitoring]) is None
    assert capacity.shortfall("1600m", [*FRESH_CLUSTER, *monitoring]) is not None


def test_finished_pods_and_the_suites_own_namespaces_hold_nothing() -> None:
    leftovers = [
        pod("fusebox-demo", "1900m", phase="Succeeded"),
        pod("e2e-test-leak-ab12cd", "500m", "100m"),
        pod("fusebox-e2e-ab12cd", "100m"),
        pod("helm-e2e-x-12ab34", "600m"),
        pod("standin-demo-12ab34", "600m"),
    ]
    assert capacity.held_cpu(leftovers) == {}
    assert capacity.shortfall("2", [*FRESH_CLUSTER, *leftovers]) is None


def test_a_pod_level_request_is_what_the_scheduler_counts() -> None:
    assert capacity.held_cpu([pod("other", "100m", "100m", pod_level="1500m")]) == {"other": 1500}


def test_quantities() -> None:
    assert [capacity.cpu_millis(q) for q in ("2", "1500m", "0.5", "0")] == [2000, 1500, 500, 0]


def test_the_scheduler_counts_an_init_container_only_when_it_asks_more_than_the_rest() -> None:
    fetching = pod("team", "200m", "100m")
    fetching["spec"]["initContainers"] = [{"resources": {"requests": {"cpu": "500m"}}}]
    assert capacity.scheduled_cpu_millis(fetching) == 500
    fetching["spec"]["initContainers"] = [{"resources": {"requests": {"cpu": "250m"}}}]
    assert capacity.scheduled_cpu_millis(fetching) == 300
    assert capacity.scheduled_cpu_millis(pod("team", "1", pod_level="1500m")) == 1500


def test_a_native_sidecar_counts_while_the_server_runs_and_beside_later_init_containers() -> None:
    sidecar = {"restartPolicy": "Always", "resources": {"requests": {"cpu": "100m"}}}
    fetch = {"resources": {"requests": {"cpu": "400m"}}}
    fetching = pod("team", "200m")
    fetching["spec"]["initContainers"] = [sidecar, fetch]
    assert capacity.scheduled_cpu_millis(fetching) == 500  # the fetch with the sidecar
    fetching["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "500m"
    assert capacity.scheduled_cpu_millis(fetching) == 600  # the server with the sidecar
    # An init container before the sidecar runs alone.
    fetching["spec"]["initContainers"] = [{"resources": {"requests": {"cpu": "900m"}}}, sidecar]
    assert capacity.scheduled_cpu_millis(fetching) == 900


def test_free_cpu_counts_terminating_pods_and_not_finished_ones() -> None:
    pods = [pod("a", "600m"), pod("b", "300m", phase="Succeeded"), pod("c", "0.5")]
    pods[2]["metadata"]["deletionTimestamp"] = "2026-12-05T15:00:00Z"  # still holds its CPU
    assert capacity.free_cpu_millis("2", pods) == 900
