"""`node pressure NAME --on|--off`: the kubelet configuration that puts one node under
real kubelet MemoryPressure (a soft threshold it is past, an hour's grace, so nothing
is evicted) differs from the usual one by exactly those settings. Pure."""

from __future__ import annotations

from typing import Any

import yaml

from localcluster import cli, components, nodes
from localcluster.components import Layout
from localcluster.config import ClusterConfig, build_config


def _second_node() -> ClusterConfig:
    env = {"FUSEBOX_LOCALCLUSTER_DIR": "/tmp/x", "FUSEBOX_CACHE": "/tmp/cache"}
    return nodes.node_config(build_config(name="fbxmn", env=env, nodes=2), 2)


def _rendered(memory_pressure: bool) -> dict[str, Any]:
    view = _second_node()
    text = components.kubelet_config(view, Layout(view.state), memory_pressure=memory_pressure)
    parsed: dict[str, Any] = yaml.safe_load(text)
    return parsed


def test_the_usual_kubelet_has_no_soft_threshold() -> None:
    usual = _rendered(False)
    assert "evictionSoft" not in usual and "evictionSoftGracePeriod" not in usual
    assert "evictionPressureTransitionPeriod" not in usual
    assert usual["evictionHard"]["memory.available"] == "200Mi"


def test_under_pressure_a_soft_threshold_every_node_is_past_with_an_hours_grace() -> None:
    usual, pressed = _rendered(False), _rendered(True)
    assert pressed["evictionSoft"] == {"memory.available": "99%"}
    # The kubelet refuses a soft threshold without its grace period, and evicts at its end.
    assert pressed["evictionSoftGracePeriod"] == {"memory.available": "1h"}
    assert pressed["evictionPressureTransitionPeriod"] == "10s"
    added = {key: value for key, value in pressed.items() if key not in usual}
    assert set(added) == {
        "evictionSoft",
        "evictionSoftGracePeriod",
        "evictionPressureTransitionPeriod",
    }
    assert {key: pressed[key] for key in usual} == usual  # the hard thresholds untouched


def test_the_kubelet_reads_the_file_that_pressure_rewrites() -> None:
    view = _second_node()
    layout = Layout(view.state)
    assert layout.kubelet_config == view.state / "conf" / "kubelet.yaml"
    assert f"--config={layout.kubelet_config}" in components.kubelet_argv(view, layout)


def test_the_command_line_takes_on_or_off() -> None:
    parser = cli._parser()
    on = parser.parse_args(["node", "pressure", "fbxmn-node2", "--on"])
    off = parser.parse_args(["node", "pressure", "fbxmn-node2", "--off"])
    assert (on.action, on.node_name, on.pressure) == ("pressure", "fbxmn-node2", True)
    assert off.pressure is False
    assert parser.parse_args(["node", "stop", "fbxmn-node2"]).pressure is None
