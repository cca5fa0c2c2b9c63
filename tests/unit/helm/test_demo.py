"""The demo's pure parts: the spec it applies to the example and what it prints."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType
from typing import Any

import pytest
import yaml

from .conftest import REPO


def load_demo() -> ModuleType:
    spec = importlib.util.spec_from_file_location("demo", REPO / "scripts" / "demo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def example() -> dict[str, Any]:
    return dict(yaml.safe_load((REPO / "crds" / "examples" / "tiny-chat.yaml").read_text()))


def test_demo_service_arms_the_leak_at_start_and_keeps_the_example_shape() -> None:
    demo = load_demo()
    service, notes = demo.demo_service(example(), node_cpu_millis=2000)
    spec = service["spec"]
    assert spec["replicas"] == 2 and spec["model"]["source"] == "pvc://models/tiny"
    assert {"name": "FUSEBOX_FAULTS", "value": "leak:0"} in spec["server"]["env"]
    assert spec["server"]["cpu"] == "700m"
    assert spec["breaker"]["resource"]["cooldownSeconds"] == 8
    assert spec["memory"]["allowSwap"] is True
    assert spec["telemetry"]["scrapeIntervalSeconds"] == 2
    assert "wedgeAfterSeconds" not in spec["telemetry"]  # the default holds since load is no wedge
    assert len(notes) == 5
    # The example file itself is not changed.
    assert "env" not in example()["spec"]["server"]


def test_demo_service_cpu_fits_the_node_for_every_replica() -> None:
    demo = load_demo()
    for node_cpu in (1000, 2000, 4000, 64000):
        service, _ = demo.demo_service(example(), node_cpu_millis=node_cpu)
        cpu = int(service["spec"]["server"]["cpu"].removesuffix("m"))
        assert 250 <= cpu <= 1000
        if node_cpu >= 2000:
            assert cpu * 2 <= node_cpu - 600


def test_progress_line_shows_pods_ready_condition_and_breaker() -> None:
    demo = load_demo()
    status = {
        "conditions": [{"type": "Ready", "status": "False", "reason": "PodsNotReady"}],
        "breaker": {"state": "Closed"},
        "degradation": {"tier": "none"},
    }
    assert demo.progress_line(status, 1, 2) == (
        "pods ready 1/2  Ready=False (PodsNotReady)  breaker=Closed  tier=none"
    )
    assert demo.progress_line({}, 0, 2).startswith("pods ready 0/2  Ready=- (-)  breaker=-")


def test_a_missing_image_stops_the_demo_with_what_to_run() -> None:
    demo = load_demo()
    pod = {
        "status": {
            "containerStatuses": [
                {
                    "image": "localhost/fusebox/inference:dev",
                    "state": {"waiting": {"reason": "ErrImageNeverPull"}},
                }
            ]
        }
    }
    with pytest.raises(demo.DemoError, match=r"inference:dev is not in the cluster.*make images"):
        demo.check_images([pod])
    demo.check_images([{"status": {"containerStatuses": [{"state": {"running": {}}}]}}])


def test_the_demo_reads_the_local_port_kubectl_port_forward_picked() -> None:
    """The admin and sidecar ports are reached through `kubectl port-forward POD :PORT`;
    kubectl chooses the local port and says so on its first line."""
    demo = load_demo()
    assert demo.forwarded_port("Forwarding from 127.0.0.1:40511 -> 8001\n") == 40511
    assert demo.forwarded_port("error: unable to forward port because pod is not running.") is None
    assert (demo.ADMIN_PORT, demo.METRICS_PORT) == (8001, 9400)
