"""manifests: every builder against golden YAML, pods under restricted Pod Security."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from fusebox_contract.settings import RESERVED_ENV_NAMES, SERVER_SETTINGS, body_limit_bytes
from fusebox_contract.wiring import drain_seconds
from fusebox_operator.manifests import (
    build_admin_secret,
    build_children,
    build_config_map,
    build_deployment,
    build_network_policy,
    build_pdb,
    build_pod_template,
    build_service,
    template_hash,
)
from fusebox_operator.settings import OperatorSettings
from fusebox_operator.sizing import size_memory
from fusebox_operator.spec import parse_spec

from .conftest import load_example
from .pod_security import restricted_violations

Snapshot = Callable[[str, Any], None]
SETTINGS = OperatorSettings()
EXAMPLES = ["tiny-chat.yaml", "llama-h100.yaml", "cpu-only.yaml", "s3-model.yaml", "hf-model.yaml"]


def deployment_of(example: str) -> dict[str, Any]:
    document = load_example(example)
    spec = parse_spec(document["spec"])
    sizing = size_memory(spec, [1024])
    return build_deployment(spec, document["metadata"]["name"], "ml", sizing, SETTINGS)


@pytest.mark.parametrize("example", EXAMPLES)
def test_deployment_matches_snapshot(example: str, snapshot: Snapshot) -> None:
    snapshot(f"deployment-{example.removesuffix('.yaml')}", deployment_of(example))


@pytest.mark.parametrize("example", EXAMPLES)
def test_pod_spec_passes_restricted_pod_security(example: str) -> None:
    assert restricted_violations(deployment_of(example)["spec"]["template"]["spec"]) == []


@pytest.mark.parametrize("example", EXAMPLES)
def test_the_sidecar_is_native_started_before_the_server_and_stopped_after_it(
    example: str,
) -> None:
    # An init container with restartPolicy Always: the kubelet starts the server
    # only once its startupProbe passes and stops it only after the server exited.
    pod = deployment_of(example)["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["server"]
    # First: a fetched model's init container runs after it, the sidecar exporting its
    # progress (test_model_fetch_pod).
    sidecar, *fetchers = pod["initContainers"]
    assert [c["name"] for c in fetchers] in ([], ["model-fetch"])
    assert sidecar["name"] == "sidecar"
    assert sidecar["restartPolicy"] == "Always"
    assert sidecar["startupProbe"]["tcpSocket"] == {"port": "metrics"}


@pytest.mark.parametrize("example", EXAMPLES)
def test_only_the_server_s_user_can_reach_its_process_and_the_sidecar_runs_as_another(
    example: str,
) -> None:
    # The pod shares one process namespace: a container under the server's user
    # could open /proc/<server>/root/... and read the admin token it does not mount.
    pod = deployment_of(example)["spec"]["template"]["spec"]
    assert pod["shareProcessNamespace"] is True
    users = {
        c["name"]: c["securityContext"]["runAsUser"]
        for c in [*pod["initContainers"], *pod["containers"]]
    }
    server_user = users.pop("server")
    assert users.pop("sidecar") != server_user
    # Everything else runs before the server starts (the model fetcher), or not at all.
    assert set(users) <= {"model-fetch"}
    # One group, the pod's fsGroup: the sidecar still reads the stats file the server writes.
    groups = {
        c["securityContext"]["runAsGroup"] for c in [*pod["initContainers"], *pod["containers"]]
    }
    assert groups == {pod["securityContext"]["fsGroup"]}


def test_pod_security_checker_catches_a_privileged_pod() -> None:
    pod = {
        "hostNetwork": True,
        "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
        "containers": [{"name": "c", "securityContext": {"privileged": True}}],
    }
    problems = restricted_violations(pod)
    assert "hostNetwork is set" in problems
    assert "c: privileged" in problems
    assert any("hostPath" in p for p in problems)


def test_service_secret_configmap_pdb_networkpolicy_match_snapshots(snapshot: Snapshot) -> None:
    spec = parse_spec(load_example("tiny-chat.yaml")["spec"])
    snapshot("service", build_service("tiny-chat", "ml"))
    snapshot("secret", build_admin_secret("tiny-chat", "ml", "test-token"))
    snapshot("configmap", build_config_map(spec, "tiny-chat", "ml"))
    snapshot("pdb", build_pdb("tiny-chat", "ml"))
    snapshot("networkpolicy", build_network_policy("tiny-chat", "ml", SETTINGS))


def test_the_pdb_lets_a_drain_evict_pods_that_are_not_ready() -> None:
    """With IfHealthyBudget (the default), two unready pods of a service left no
    disruption allowed, and even those broken pods could not be evicted: a node
    drain or an autoscaler's scale-down hung until the service was fixed."""
    spec = build_pdb("tiny-chat", "ml")["spec"]
    assert spec["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert spec["maxUnavailable"] == 1  # healthy pods still go one at a time


def test_gpu_request_and_product_node_selector() -> None:
    deployment = deployment_of("llama-h100.yaml")
    pod = deployment["spec"]["template"]["spec"]
    server = pod["containers"][0]
    assert server["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


def pod_of(raw_spec: dict[str, Any]) -> dict[str, Any]:
    spec = parse_spec(raw_spec)
    return build_pod_template(spec, "x", size_memory(spec, [1024]), SETTINGS)


def server_env_of(raw_spec: dict[str, Any]) -> dict[str, str]:
    server = pod_of(raw_spec)["spec"]["containers"][0]
    return {e["name"]: e["value"] for e in server["env"]}


def test_pvc_model_is_mounted_read_only_and_model_dir_points_inside() -> None:
    pod = deployment_of("llama-h100.yaml")["spec"]["template"]["spec"]
    server = pod["containers"][0]
    env = {e["name"]: e["value"] for e in server["env"]}
    assert env["FUSEBOX_MODEL_DIR"] == "/models/models/llama-2-7b-chat"
    claims = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert claims == [
        {"name": "model-0", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}}
    ]
    mount = next(m for m in server["volumeMounts"] if m["name"] == "model-0")
    assert mount["readOnly"] is True


def test_volume_names_are_numbered_so_a_63_character_claim_fits() -> None:
    long_claim = "c" * 63
    pod = pod_of(
        {
            "model": {"name": "chat", "source": f"pvc://{long_claim}/primary"},
            "fallback": {"source": "pvc://weights/int8", "quantization": "none"},
        }
    )
    volumes = {
        v["name"]: v["persistentVolumeClaim"]["claimName"]
        for v in pod["spec"]["volumes"]
        if "persistentVolumeClaim" in v
    }
    assert volumes == {"model-0": long_claim, "model-1": "weights"}
    mounts = {m["name"]: m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["model-0"] == f"/models/{long_claim}"
    assert mounts["model-1"] == "/models/weights"
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert env["FUSEBOX_FALLBACK_DIR"] == "/models/weights/int8"


def test_no_fallback_renders_no_fallback_env() -> None:
    env = server_env_of({"model": {"name": "chat", "source": "pvc://models/tiny"}})
    assert [name for name in env if name.startswith("FUSEBOX_FALLBACK")] == []


def test_a_fallback_renders_its_directory_and_quantization() -> None:
    env = server_env_of({"model": {"name": "chat", "source": "pvc://models/tiny"}, "fallback": {}})
    assert env["FUSEBOX_FALLBACK_DIR"] == "/models/models/tiny"
    assert env["FUSEBOX_FALLBACK_QUANTIZATION"] == "int8"


def test_dtype_and_revision_reach_the_server_and_the_pod_annotations() -> None:
    raw = {"model": {"name": "c", "source": "pvc://m", "dtype": "float16", "revision": "v2"}}
    env = server_env_of(raw)
    assert (env["FUSEBOX_DTYPE"], env["FUSEBOX_MODEL_REVISION"]) == ("float16", "v2")
    assert pod_of(raw)["metadata"]["annotations"]["fusebox.dev/model-revision"] == "v2"


@pytest.mark.parametrize(("cpu", "threads"), [("500m", "1"), ("1", "1"), ("2.5", "2"), ("8", "8")])
def test_torch_threads_are_the_whole_cores_of_server_cpu(cpu: str, threads: str) -> None:
    env = server_env_of({"model": {"name": "c", "source": "pvc://m"}, "server": {"cpu": cpu}})
    assert env["FUSEBOX_TORCH_THREADS"] == threads


def test_body_limit_follows_max_input_tokens() -> None:
    env = server_env_of(
        {"model": {"name": "c", "source": "pvc://m"}, "server": {"maxInputTokens": 100000}}
    )
    assert int(env["FUSEBOX_MAX_BODY_BYTES"]) == body_limit_bytes(100000)
    assert int(env["FUSEBOX_MAX_BODY_BYTES"]) > 6 * 100000  # every token JSON-escaped fits


def test_every_rendered_fusebox_env_name_is_a_contract_setting() -> None:
    declared = {setting.env for setting in SERVER_SETTINGS}
    env = server_env_of({"model": {"name": "c", "source": "pvc://m"}, "fallback": {}})
    assert {name for name in env if name.startswith("FUSEBOX_")} <= declared


@pytest.mark.parametrize(
    ("telemetry", "restart_after_at_least"),
    [
        ({}, 15 + 2 * 5 + 30),
        ({"wedgeAfterSeconds": 90}, 90 + 2 * 5 + 30),
        (
            {"wedgeAfterSeconds": 3600, "scrapeIntervalSeconds": 300, "scrapeTimeoutSeconds": 60},
            3600 + 600 + 30,
        ),
    ],
)
def test_liveness_lets_the_operator_restart_a_wedged_pod_first(
    telemetry: dict[str, Any], restart_after_at_least: float
) -> None:
    raw = {"model": {"name": "c", "source": "pvc://m"}, "telemetry": telemetry}
    probe = pod_of(raw)["spec"]["containers"][0]["livenessProbe"]
    # The first failing probe may come right after the wedge (a wedged loop
    # cannot answer), so the kubelet restarts after (threshold - 1) periods.
    earliest_restart = (probe["failureThreshold"] - 1) * probe["periodSeconds"]
    assert earliest_restart >= restart_after_at_least
    assert earliest_restart < restart_after_at_least + 2 * probe["periodSeconds"]


@pytest.mark.parametrize("timeout", [1, 60, 3600])
def test_a_stopping_pod_serves_through_its_endpoint_removal_then_drains_its_requests(
    timeout: int,
) -> None:
    raw = {
        "model": {"name": "c", "source": "pvc://m"},
        "server": {"requestTimeoutSeconds": timeout},
    }
    pod = pod_of(raw)["spec"]
    server = pod["containers"][0]
    sleep = server["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert sleep >= 5  # kube-proxy and ingresses drop the endpoint within seconds
    # The kubelet's SIGKILL comes only after the sleep and the server's whole drain,
    # which waits out a request started just before SIGTERM.
    assert pod["terminationGracePeriodSeconds"] > sleep + drain_seconds(timeout) >= sleep + timeout


def test_build_children_is_every_child_with_the_secret_first() -> None:
    spec = parse_spec(load_example("tiny-chat.yaml")["spec"])
    children = build_children(spec, "t", "ml", size_memory(spec, [1024]), SETTINGS, "tok")
    assert [c["kind"] for c in children] == [
        "Secret",
        "ConfigMap",
        "Service",
        "PodDisruptionBudget",
        "NetworkPolicy",
        "Deployment",
    ]
    assert children[0]["stringData"] == {"token": "tok"}
    assert {c["metadata"]["namespace"] for c in children} == {"ml"}


def test_memory_requests_equal_limits_without_swap() -> None:
    server = deployment_of("tiny-chat.yaml")["spec"]["template"]["spec"]["containers"][0]
    assert server["resources"]["requests"]["memory"] == server["resources"]["limits"]["memory"]
    assert server["resources"]["requests"]["cpu"] == server["resources"]["limits"]["cpu"]


def test_server_env_passes_through_unreserved_names() -> None:
    document = load_example("cpu-only.yaml")
    document["spec"]["server"]["env"] = [
        {"name": "FUSEBOX_FAULTS", "value": "leak:64"},
        {"name": "FUSEBOX_LOG_LEVEL", "value": "debug"},
    ]
    spec = parse_spec(document["spec"])
    template = build_pod_template(spec, "x", size_memory(spec, []), SETTINGS)
    env = template["spec"]["containers"][0]["env"]
    names = [e["name"] for e in env]
    assert len(names) == len(set(names))
    assert {"name": "FUSEBOX_FAULTS", "value": "leak:64"} in env
    assert {"name": "FUSEBOX_LOG_LEVEL", "value": "debug"} in env


def test_no_reserved_name_is_left_for_server_env_to_set() -> None:
    # Whatever the operator renders is reserved, so server.env cannot override it.
    env = server_env_of({"model": {"name": "c", "source": "pvc://m"}, "fallback": {}})
    assert set(env) <= RESERVED_ENV_NAMES


def test_template_hash_moves_only_when_the_pod_template_changes() -> None:
    document = load_example("tiny-chat.yaml")
    spec = parse_spec(document["spec"])
    sizing = size_memory(spec, [1024])
    base = build_deployment(spec, "t", "ml", sizing, SETTINGS)
    document["spec"]["replicas"] = 5
    scaled_spec = parse_spec(document["spec"])
    scaled = build_deployment(scaled_spec, "t", "ml", sizing, SETTINGS)
    assert template_hash(base["spec"]["template"]) == template_hash(scaled["spec"]["template"])
    document["spec"]["server"]["maxQueue"] = 7
    changed = build_deployment(parse_spec(document["spec"]), "t", "ml", sizing, SETTINGS)
    assert (
        changed["metadata"]["annotations"]["fusebox.dev/pod-template-hash"]
        != base["metadata"]["annotations"]["fusebox.dev/pod-template-hash"]
    )


def test_image_is_an_operator_setting() -> None:
    settings = OperatorSettings.from_env({"FUSEBOX_INFERENCE_IMAGE": "registry.example/inf:1.2"})
    spec = parse_spec(load_example("cpu-only.yaml")["spec"])
    template = build_pod_template(spec, "x", size_memory(spec, []), settings)
    images = {c["image"] for c in template["spec"]["containers"]}
    assert images == {"registry.example/inf:1.2"}
    assert {c["imagePullPolicy"] for c in template["spec"]["containers"]} == {"IfNotPresent"}


def test_network_policy_admin_port_only_from_operator_pods() -> None:
    settings = OperatorSettings.from_env(
        {
            "FUSEBOX_OPERATOR_NAMESPACE": "ops",
            "FUSEBOX_OPERATOR_POD_SELECTOR": "app=fuse,tier=control",
            "FUSEBOX_MONITORING_NAMESPACE": "",
        }
    )
    policy = build_network_policy("x", "ml", settings)
    admin_rule, metrics_rule = policy["spec"]["ingress"][1], policy["spec"]["ingress"][2]
    assert admin_rule["ports"] == [{"port": 8001, "protocol": "TCP"}]
    assert admin_rule["from"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}},
            "podSelector": {"matchLabels": {"app": "fuse", "tier": "control"}},
        }
    ]
    assert metrics_rule["from"] == admin_rule["from"]  # no monitoring namespace configured


def egress_of(example: str, settings: OperatorSettings = SETTINGS) -> list[str]:
    """The policy types of the NetworkPolicy build_children renders for an example."""
    spec = parse_spec(load_example(example)["spec"])
    children = build_children(spec, "x", "ml", size_memory(spec, [81920]), settings, "t" * 43)
    (policy,) = [child for child in children if child["kind"] == "NetworkPolicy"]
    assert "egress" not in policy["spec"]  # no rule: nothing may leave the pods
    return list(policy["spec"]["policyTypes"])


def test_pods_that_load_from_a_pvc_open_no_connection_out() -> None:
    assert egress_of("tiny-chat.yaml") == ["Ingress", "Egress"]


def test_pods_that_fetch_their_model_keep_egress_to_reach_the_store() -> None:
    assert egress_of("s3-model.yaml") == ["Ingress"]
    assert egress_of("hf-model.yaml") == ["Ingress"]


def test_the_chart_may_leave_egress_open_and_a_bad_choice_names_the_variable() -> None:
    allowed = OperatorSettings.from_env({"FUSEBOX_INFERENCE_EGRESS": "allow"})
    assert egress_of("tiny-chat.yaml", allowed) == ["Ingress"]
    denied = OperatorSettings.from_env({"FUSEBOX_INFERENCE_EGRESS": "deny"})
    assert egress_of("tiny-chat.yaml", denied) == ["Ingress", "Egress"]
    with pytest.raises(ValueError, match="FUSEBOX_INFERENCE_EGRESS='open' must be one of deny"):
        OperatorSettings.from_env({"FUSEBOX_INFERENCE_EGRESS": "open"})


def test_bad_operator_setting_names_the_variable() -> None:
    with pytest.raises(ValueError, match="FUSEBOX_LIVENESS_PORT='abc' must be a whole number"):
        OperatorSettings.from_env({"FUSEBOX_LIVENESS_PORT": "abc"})


def test_peering_is_standalone_for_one_replica_and_peered_for_more() -> None:
    assert OperatorSettings.from_env({}).standalone
    assert not OperatorSettings.from_env({"FUSEBOX_OPERATOR_REPLICAS": "2"}).standalone
    assert OperatorSettings.from_env({"FUSEBOX_WATCH_NAMESPACES": "a, b"}).watch_namespaces == (
        "a",
        "b",
    )
