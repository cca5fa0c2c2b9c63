"""`up`: the order in which the parts start, and what each waits for.

`up` is safe to run at any time: on a healthy cluster it only re-asserts
the simulated GPUs; on the wreck of a cluster whose processes were killed
without `down` (a CI machine straight after a killed session) it first
removes every leftover (teardown.down), then starts afresh. A daemon that
dies while `up` waits fails `up` at once with its log's tail, and what was
started is torn down again.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from localcluster import (
    addons,
    cgroups,
    containerd,
    gpu,
    health,
    hostchanges,
    network,
    pki,
    processes,
    teardown,
)
from localcluster.components import (
    BUILT_BINARIES,
    COMPONENTS,
    SANDBOX_IMAGE,
    SYSTEM_BINARIES,
    Layout,
    argv_for,
    cni_conflist,
    containerd_config,
    kube_proxy_config,
    kubelet_config,
)
from localcluster.config import ClusterConfig
from localcluster.progress import ClusterError, Reporter, log_tail

# Daemons that run in the node's network namespace (all of them, like a kind node).
IN_NETNS = frozenset(COMPONENTS)


def missing_binaries(config: ClusterConfig) -> list[str]:
    problems: list[str] = []
    bin_dir = Path(config.bin_dir)
    if not bin_dir.is_dir():
        return [f"{bin_dir} does not exist: run `make setup-binaries`"]
    for name in BUILT_BINARIES:
        if not (bin_dir / name).is_file():
            problems.append(f"{bin_dir / name} is missing: run `make setup-binaries`")
    for name in SYSTEM_BINARIES:
        if shutil.which(name, path=_system_path(config)) is None:
            problems.append(f"{name} is not installed: run `make setup-system`")
    if not Path("/usr/lib/cni/bridge").is_file():
        problems.append("/usr/lib/cni/bridge is missing: run `make setup-system`")
    return problems


def _system_path(config: ClusterConfig) -> str:
    return f"{config.bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def up(
    config: ClusterConfig,
    *,
    saved: ClusterConfig | None,
    load_images: bool,
    report: Reporter,
    only_images: tuple[str, ...] | None = None,
) -> None:
    problems = missing_binaries(config)
    if problems:
        raise ClusterError("cannot start:\n  " + "\n  ".join(problems))
    if saved is not None and health.is_healthy(saved):
        _check_same_network(saved, config)
        report.say(f"cluster {config.name!r} is already up")
        if (saved.gpus, saved.gpu_product, saved.gpu_memory_mib) != (
            config.gpus,
            config.gpu_product,
            config.gpu_memory_mib,
        ):
            (config.state / "config.json").write_text(config.to_json())
        gpu.advertise(health.kubectl_for(config), config)
        return
    if saved is not None:
        report.say("cleaning up what a previous run of this cluster left behind")
        teardown.down(saved, report=report, keep_logs=True)
    collisions = network.host_collisions(config)
    if collisions:
        raise ClusterError(
            "this host cannot take the cluster (choose other names or subnets, "
            "see `python -m localcluster up --help`):\n  " + "\n  ".join(collisions)
        )
    try:
        _start(config, load_images=load_images, only_images=only_images, report=report)
    except BaseException:
        report.say("start failed; tearing down what was started (logs kept)")
        teardown.down(config, report=report, keep_logs=True)
        raise


def _check_same_network(saved: ClusterConfig, wanted: ClusterConfig) -> None:
    keys = ("netns", "host_veth", "node_veth", "node_cidr", "pod_cidr", "service_cidr")
    differing = [k for k in keys if getattr(saved, k) != getattr(wanted, k)]
    if differing:
        raise ClusterError(
            f"cluster {saved.name!r} is up with other settings ({', '.join(differing)}); "
            "run `python -m localcluster down` first"
        )


def _start(
    config: ClusterConfig,
    *,
    load_images: bool,
    only_images: tuple[str, ...] | None,
    report: Reporter,
) -> None:
    layout = Layout(config.state)
    _prepare_state(config, layout)
    report.say(f"state in {config.state}; generating certificates")
    specs = pki.cluster_cert_specs(
        node_name=config.node_name,
        node_ip=config.node_ip,
        apiserver_service_ip=config.apiserver_service_ip,
    )
    pki.make_cluster_pki(layout.pki, specs)
    for component, cert in (
        ("kube-controller-manager", "controller-manager"),
        ("kube-scheduler", "scheduler"),
        ("kubelet", "kubelet-client"),
        ("kube-proxy", "kube-proxy"),
    ):
        pki.write_kubeconfig(
            layout.kubeconfig(component),
            pki_dir=layout.pki,
            cert_name=cert,
            server=config.apiserver_url,
        )
    pki.write_kubeconfig(
        config.kubeconfig, pki_dir=layout.pki, cert_name="admin", server=config.apiserver_url
    )
    _write_configs(config, layout)
    report.say(f"network namespace {config.netns}, node {config.node_ip}")
    hostchanges.record(layout.host_records)
    network.setup(config)
    cgroups.create_root(config.cgroup_root)

    _launch(config, layout, "etcd")
    _launch(config, layout, "kube-apiserver")
    report.say("waiting for the API server")
    _wait(
        config,
        layout,
        ("etcd", "kube-apiserver"),
        lambda: health.apiserver_ready(config),
        90,
        "the API server to answer /readyz",
    )
    _launch(config, layout, "kube-controller-manager")
    _launch(config, layout, "kube-scheduler")
    _launch(config, layout, "containerd")
    _wait(config, layout, ("containerd",), lambda: containerd.ctr_ok(config), 30, "containerd")
    if load_images:
        report.say("loading images into containerd")
        containerd.load_images(config, only_images)
        containerd.require_images(config, (SANDBOX_IMAGE, addons.COREDNS_IMAGE))
    _launch(config, layout, "kubelet")
    _launch(config, layout, "kube-proxy")
    kubelet_started = time.monotonic()
    report.say("waiting for the node to register")
    kubectl = health.kubectl_for(config)
    _wait(
        config,
        layout,
        COMPONENTS,
        lambda: health.node_exists(kubectl, config),
        60,
        "the node to register",
    )
    gpu.advertise(kubectl, config)
    _wait(config, layout, COMPONENTS, lambda: health.node_ready(kubectl, config), 120, "node Ready")
    report.say(f"node Ready {time.monotonic() - kubelet_started:.1f} s after the kubelet started")
    gpu.advertise(kubectl, config)
    kubectl.apply(addons.as_list([addons.storage_class(), *addons.coredns_objects(config)]))
    if load_images:
        report.say("waiting for CoreDNS")
        _wait(
            config,
            layout,
            COMPONENTS,
            lambda: health.coredns_ready(kubectl),
            120,
            "CoreDNS Available",
        )
    (config.state / "up").write_text(f"{time.time()}\n")
    report.say(f"cluster {config.name!r} is up: export KUBECONFIG={config.kubeconfig}")


def _prepare_state(config: ClusterConfig, layout: Layout) -> None:
    config.state.mkdir(parents=True, exist_ok=True)
    config.state.chmod(0o711)  # pods' bind mounts live below; only root lists it
    if layout.logs.exists():
        previous = config.state / "logs.previous"
        shutil.rmtree(previous, ignore_errors=True)
        layout.logs.rename(previous)
    for directory in (
        layout.pki,
        layout.kubeconfigs,
        layout.conf,
        layout.logs,
        layout.pids,
        layout.etcd_data,
        layout.containerd,
        layout.kubelet_root,
        layout.pod_logs,
        layout.cni_conf_dir,
        layout.cni_ipam,
        Path(config.containerd_root),
    ):
        directory.mkdir(parents=True, exist_ok=True)
    layout.etcd_data.chmod(0o700)
    layout.pki.chmod(0o700)
    (config.state / "config.json").write_text(config.to_json())


def _write_configs(config: ClusterConfig, layout: Layout) -> None:
    (layout.containerd / "config.toml").write_text(containerd_config(config, layout))
    (layout.cni_conf_dir / "10-fusebox.conflist").write_text(cni_conflist(config, layout))
    (layout.conf / "kubelet.yaml").write_text(kubelet_config(config, layout))
    (layout.conf / "kube-proxy.yaml").write_text(kube_proxy_config(config, layout))
    # No nameserver: pods with dnsPolicy Default resolve nothing, as nothing outside exists.
    (layout.conf / "resolv.conf").write_text("")


def _launch(config: ClusterConfig, layout: Layout, component: str) -> None:
    os.environ["PATH"] = _system_path(config)
    processes.spawn(
        argv_for(component, config, layout),
        log_path=layout.log(component),
        pid_path=layout.pid(component),
        netns=config.netns if component in IN_NETNS else None,
    )


def _wait(
    config: ClusterConfig,
    layout: Layout,
    watched: tuple[str, ...],
    condition: Callable[[], bool],
    timeout_seconds: float,
    what: str,
) -> None:
    """Poll condition; fail fast, with the log, when a watched daemon dies."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        if condition():
            return
        states = health.component_states(config)
        dead = [c for c in watched if not states[c]]
        if dead:
            raise ClusterError(
                f"{dead[0]} exited while waiting for {what}; last lines of "
                f"{layout.log(dead[0])}:\n{log_tail(layout.log(dead[0]))}"
            )
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {c}:\n{log_tail(layout.log(c), 15)}" for c in watched)
            raise ClusterError(
                f"timed out after {timeout_seconds:.0f} s waiting for {what}\n{logs}"
            )
        time.sleep(0.5)
