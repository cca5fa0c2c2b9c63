"""What `up` does with a cluster it finds, what `restart` accepts, and the NetworkPolicy switch."""

from __future__ import annotations

import dataclasses

import pytest

from localcluster import netpolicy
from localcluster.components import (
    COMPONENTS,
    Layout,
    argv_for,
    canonical_component,
    enabled_components,
)
from localcluster.config import ClusterConfig, ConfigError, build_config, network_policy_asked
from localcluster.recovery import REQUIRED_STATE, Action, Found, plan_up, restart_order


def _all_running(**dead: bool) -> dict[str, bool]:
    return {c: not dead.get(c.replace("-", "_"), False) for c in COMPONENTS}


def test_a_healthy_cluster_is_left_alone() -> None:
    assert plan_up(Found(running=_all_running())).action is Action.NOTHING


def test_only_the_dead_daemons_are_restarted_in_start_order() -> None:
    plan = plan_up(Found(running=_all_running(kubelet=True, etcd=True)))
    assert plan.action is Action.RESTART
    assert plan.restart == ("etcd", "kubelet")


def test_every_daemon_dead_with_intact_state_restarts_all_rather_than_wiping() -> None:
    plan = plan_up(Found(running=dict.fromkeys(COMPONENTS, False)))
    assert (plan.action, plan.restart) == (Action.RESTART, COMPONENTS)


@pytest.mark.parametrize(
    ("found", "reason"),
    [
        (Found(running={}, missing_state=["etcd/member"]), "etcd's data directory is gone"),
        (Found(running={}, missing_state=["up"]), "the previous `up` never finished"),
        (Found(running={}, missing_state=["pki/ca.key"]), "the cluster CA's key is gone"),
        (
            Found(running={}, missing_network=["the node's network namespace 'fusebox'"]),
            "network namespace 'fusebox' is gone (the host rebooted",
        ),
        (
            Found(running={}, missing_state=["up"], other_settings=["pod_cidr"]),
            "the previous `up` never finished",
        ),
    ],
)
def test_unusable_state_wipes_and_says_which_part_and_why(found: Found, reason: str) -> None:
    plan = plan_up(found)
    assert plan.action is Action.WIPE
    assert any(reason in r for r in plan.reasons), plan.reasons


def test_usable_state_under_other_network_settings_is_refused_not_wiped() -> None:
    plan = plan_up(Found(running={"etcd": False}, other_settings=["pod_cidr"]))
    assert plan.action is Action.REFUSE
    assert plan.reasons == ("it runs with other network settings (pod_cidr)",)


def test_every_required_state_entry_has_a_reason() -> None:
    for key in REQUIRED_STATE:
        plan = plan_up(Found(running={}, missing_state=[key]))
        assert plan.reasons and key in plan.reasons[0]


def test_restart_order_follows_the_start_order_and_names_each_once() -> None:
    assert restart_order(["kubelet", "kube-proxy", "kubelet"], COMPONENTS) == (
        "kubelet",
        "kube-proxy",
    )


def test_etcd_restarts_with_the_apiserver_whose_clients_would_wait_out_their_backoff() -> None:
    # ... and the API server with the policy agent, whose watches would back off in turn.
    assert restart_order(["kubelet", "etcd"], COMPONENTS) == (
        "etcd",
        "kube-apiserver",
        "kubelet",
        "kube-proxy",
        "kube-router",
    )


def test_the_api_server_restarts_with_the_service_proxy_and_the_policy_agent_where_it_runs() -> (
    None
):
    assert restart_order(["kube-apiserver"], COMPONENTS) == (
        "kube-apiserver",
        "kube-proxy",
        "kube-router",
    )
    without_policy = tuple(c for c in COMPONENTS if c != "kube-router")
    assert restart_order(["kube-apiserver"], without_policy) == ("kube-apiserver", "kube-proxy")


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("apiserver", "kube-apiserver"),
        ("controller-manager", "kube-controller-manager"),
        ("scheduler", "kube-scheduler"),
        ("etcd", "etcd"),
        ("containerd", "containerd"),
        ("kubelet", "kubelet"),
        ("kube-proxy", "kube-proxy"),
        ("coredns", "coredns"),
        ("network-policy", "kube-router"),
        ("kube-router", "kube-router"),
        ("dockerd", None),
    ],
)
def test_restart_accepts_each_component_by_its_short_or_full_name(
    typed: str, meant: str | None
) -> None:
    assert canonical_component(typed) == meant


def _config(**flags: object) -> ClusterConfig:
    env = {"FUSEBOX_LOCALCLUSTER_DIR": "/tmp/x"}
    return build_config(name="fusebox", env=env, **flags)  # type: ignore[arg-type]


def test_network_policy_is_enforced_by_default_and_kube_router_runs_last() -> None:
    config = _config()
    assert config.network_policy
    assert enabled_components(config)[-1] == "kube-router"


def test_without_network_policy_no_kube_router_runs() -> None:
    assert "kube-router" not in enabled_components(_config(network_policy=False))


def test_the_switch_is_flag_then_environment_then_unset() -> None:
    assert network_policy_asked(False, {"FUSEBOX_LOCALCLUSTER_NETWORK_POLICY": "on"}) is False
    assert network_policy_asked(None, {"FUSEBOX_LOCALCLUSTER_NETWORK_POLICY": "off"}) is False
    assert network_policy_asked(None, {}) is None
    with pytest.raises(ConfigError, match="use on or off"):
        network_policy_asked(None, {"FUSEBOX_LOCALCLUSTER_NETWORK_POLICY": "maybe"})


def test_a_cluster_saved_before_enforcement_existed_runs_no_kube_router() -> None:
    saved = _config()
    raw = saved.to_json().replace('"network_policy": true,', "")
    assert "network_policy" not in raw
    assert ClusterConfig.from_json(raw) == dataclasses.replace(saved, network_policy=False)


def test_kube_router_runs_only_its_firewall_with_its_own_kubeconfig() -> None:
    config = _config()
    layout = Layout(config.state)
    argv = argv_for("kube-router", config, layout)
    assert argv[0].endswith("/kube-router")
    assert f"--kubeconfig={layout.kubeconfig('kube-router')}" in argv
    for flag in ("--run-firewall=true", "--run-router=false", "--run-service-proxy=false"):
        assert flag in argv
    assert f"--hostname-override={config.node_name}" in argv
    assert f"--service-cluster-ip-range={config.service_cidr}" in argv


def test_kube_router_may_only_read_and_is_bound_to_its_certificate_user() -> None:
    role, binding = netpolicy.rbac_objects()
    verbs = {v for rule in role["rules"] for v in rule["verbs"]}
    assert verbs == {"get", "list", "watch"}
    assert binding["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": netpolicy.USER}
    ]
    assert netpolicy.CLIENT_CERT.common_name == netpolicy.USER
