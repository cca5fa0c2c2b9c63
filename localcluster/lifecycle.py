"""`up` and `restart`: the order in which the parts start, and what each waits for.

`up` is safe to run at any time: on a healthy cluster it only re-asserts
the simulated GPUs; on a cluster where daemons died (killed, crashed, a CI
machine straight after a killed session) it restarts those daemons and keeps
every object; only when the saved state itself is unusable (recovery.plan_up
says which part) does it remove every leftover (teardown.down) and start
afresh. A daemon that dies while a fresh `up` waits fails `up` at once with
its log's tail, and what was started is torn down again.

`restart COMPONENT` stops one daemon and starts it with the same flags and
state, then waits until it serves; coredns, an object rather than a process,
is rolled out again.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from localcluster import (
    addons,
    cgroups,
    containerd,
    dra,
    gpu,
    health,
    hostchanges,
    netpolicy,
    network,
    nodes,
    pki,
    processes,
    recovery,
    registry,
    teardown,
)
from localcluster.components import (
    ADDON_COMPONENTS,
    BUILT_BINARIES,
    COMPONENTS,
    CONTAINERD_BIN_DIR,
    CONTAINERD_BINARIES,
    SANDBOX_IMAGE,
    SYSTEM_BINARIES,
    Layout,
    argv_for,
    cni_conflist,
    containerd_config,
    enabled_components,
    kube_proxy_config,
    kubelet_config,
    registry_endpoint,
    registry_hosts_file,
    registry_paths,
)
from localcluster.config import ClusterConfig
from localcluster.progress import ClusterError, Reporter, log_tail

# Daemons that run in the node's network namespace (all of them, like a kind node).
IN_NETNS = frozenset(COMPONENTS)

# How long a daemon may take to serve after it starts (the apiserver replays etcd).
READY_TIMEOUT_SECONDS = {"kube-apiserver": 90.0, "kubelet": 60.0}
DEFAULT_READY_TIMEOUT_SECONDS = 30.0

# How long a restart waits for a daemon to exit on SIGTERM before SIGKILL. Only
# etcd writes data worth a clean close; the apiserver, stateless, often lingers
# for seconds after it stopped serving.
STOP_GRACE_SECONDS = {"etcd": 10.0}

NETWORK_SETTINGS = (
    "netns",
    "host_veth",
    "node_veth",
    "node_cidr",
    "pod_cidr",
    "service_cidr",
    "nodes",
)


def missing_binaries(config: ClusterConfig) -> list[str]:
    problems: list[str] = []
    bin_dir = Path(config.bin_dir)
    if not bin_dir.is_dir():
        return [f"{bin_dir} does not exist: run `make setup-binaries`"]
    needed = [b for b in BUILT_BINARIES if b != "kube-router" or config.network_policy]
    for name in needed:
        if not (bin_dir / name).is_file():
            problems.append(f"{bin_dir / name} is missing: run `make setup-binaries`")
    if config.registry:
        for binary in (registry.REGISTRY_BINARY, registry.HTPASSWD_BINARY):
            if not binary.is_file():
                problems.append(f"{binary} is missing: run `make setup-binaries`")
    for name in CONTAINERD_BINARIES:
        if not (CONTAINERD_BIN_DIR / name).is_file():
            problems.append(f"{CONTAINERD_BIN_DIR / name} is missing: run `make setup-binaries`")
    for name in SYSTEM_BINARIES:
        if shutil.which(name, path=_system_path(config)) is None:
            problems.append(f"{name} is not installed: run `make setup-system`")
    if not Path("/usr/lib/cni/bridge").is_file():
        problems.append("/usr/lib/cni/bridge is missing: run `make setup-system`")
    return problems


def _system_path(config: ClusterConfig) -> str:
    system = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    return f"{config.bin_dir}:{CONTAINERD_BIN_DIR}:{system}"


def up(
    config: ClusterConfig,
    *,
    saved: ClusterConfig | None,
    load_images: bool,
    report: Reporter,
    only_images: tuple[str, ...] | None = None,
    network_policy: bool | None = None,
) -> None:
    """Start the cluster, or bring a running or damaged one back to what config asks.

    network_policy None keeps what a running cluster enforces; True or False
    turns kube-router on or off there.
    """
    problems = missing_binaries(config)
    if problems:
        raise ClusterError("cannot start:\n  " + "\n  ".join(problems))
    if saved is not None:
        plan = recovery.plan_up(survey(saved, config))
        if plan.action is recovery.Action.REFUSE:
            _check_same_network(saved, config)
        if plan.action is recovery.Action.NOTHING:
            _wait_serving(saved, "kube-apiserver")
            _restart_dead_extra_nodes(saved, report)
            report.say(f"cluster {config.name!r} is already up")
            _reassert(saved, config, network_policy, report)
            return
        if plan.action is recovery.Action.RESTART:
            report.say(
                f"cluster {config.name!r}: {', '.join(plan.restart)} not running; "
                "restarting, keeping every object"
            )
            restart(saved, plan.restart, report=report)
            _restart_dead_extra_nodes(saved, report)
            _reassert(saved, config, network_policy, report)
            report.say(f"cluster {config.name!r} is up: export KUBECONFIG={config.kubeconfig}")
            return
        report.say(
            f"cluster {config.name!r} cannot be restarted, wiping it and starting empty: "
            + "; ".join(plan.reasons)
        )
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


def survey(saved: ClusterConfig, wanted: ClusterConfig) -> recovery.Found:
    """What is left of the cluster saved describes: daemons, state files, network."""
    missing_network = []
    if saved.netns not in network.netns_names():
        missing_network.append(f"the node's network namespace {saved.netns!r}")
    elif not network.link_exists(saved.host_veth):
        missing_network.append(f"the host's veth {saved.host_veth!r}")
    existing = network.netns_names()
    missing_network += [
        f"node {view.node_name}'s network namespace {view.netns!r}"
        for view in nodes.extra_nodes(saved)
        if view.netns not in existing
    ]
    return recovery.Found(
        running=health.component_states(saved),
        missing_state=[k for k in recovery.REQUIRED_STATE if not (saved.state / k).exists()],
        missing_network=missing_network,
        other_settings=_differing_network(saved, wanted),
    )


def _reassert(
    saved: ClusterConfig, wanted: ClusterConfig, network_policy: bool | None, report: Reporter
) -> None:
    """Apply what `up` may change on a running cluster: simulated GPUs, NetworkPolicy."""
    config = dataclasses.replace(
        saved,
        gpus=wanted.gpus,
        gpu_product=wanted.gpu_product,
        gpu_memory_mib=wanted.gpu_memory_mib,
        network_policy=saved.network_policy if network_policy is None else network_policy,
    )
    if config.network_policy and not saved.network_policy:
        report.say("turning NetworkPolicy enforcement on (kube-router)")
        for view in nodes.all_nodes(config):
            _start_network_policy(view, Layout(view.state))
    elif saved.network_policy and not config.network_policy:
        report.say(
            "turning NetworkPolicy enforcement off: stopping kube-router, removing its rules"
        )
        for view in nodes.all_nodes(config):
            _stop_network_policy(view, Layout(view.state))
    if config != saved:
        (config.state / "config.json").write_text(config.to_json())
    for view in nodes.all_nodes(config):
        gpu.advertise(health.kubectl_for(config), view)
    health.kubectl_for(config).apply(addons.as_list([dra.device_class()]))


def _restart_dead_extra_nodes(saved: ClusterConfig, report: Reporter) -> None:
    """Start again the daemons of extra nodes that died or were stopped (`node stop`)."""
    for view in nodes.extra_nodes(saved):
        dead = [c for c, alive in health.component_states(view).items() if not alive]
        if dead:
            report.say(f"node {view.node_name}: {', '.join(dead)} not running; restarting")
            cgroups.create_root(view.cgroup_root)
            restart(view, dead, report=report)


def _start_network_policy(config: ClusterConfig, layout: Layout) -> None:
    if not layout.kubeconfig("kube-router").exists():  # a cluster from before kube-router
        pki.issue(layout.pki, netpolicy.CLIENT_CERT)
        pki.write_kubeconfig(
            layout.kubeconfig("kube-router"),
            pki_dir=layout.pki,
            cert_name=netpolicy.CLIENT_CERT.name,
            server=config.apiserver_url,
        )
    health.kubectl_for(config).apply(addons.as_list(netpolicy.rbac_objects()))
    _launch(config, layout, "kube-router")
    _wait_serving(config, "kube-router")


def _stop_network_policy(config: ClusterConfig, layout: Layout) -> None:
    proc = processes.read_pid_file(layout.pid("kube-router"))
    if proc is not None:
        processes.stop(proc)
    # kube-router leaves its rules in place when it stops; without this every
    # policy would stay enforced as it was, never updated again.
    command = network.in_netns(
        config, [*argv_for("kube-router", config, layout), "--cleanup-config"]
    )
    with open(layout.log("kube-router"), "ab") as log:
        subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=False, timeout=60)


def _differing_network(saved: ClusterConfig, wanted: ClusterConfig) -> list[str]:
    return [k for k in NETWORK_SETTINGS if getattr(saved, k) != getattr(wanted, k)]


def _check_same_network(saved: ClusterConfig, wanted: ClusterConfig) -> None:
    differing = _differing_network(saved, wanted)
    if differing:
        raise ClusterError(
            f"cluster {saved.name!r} runs with other settings ({', '.join(differing)}); "
            "run `python -m localcluster down` first (it removes every object)"
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
    pki.make_cluster_pki(layout.pki, [*specs, netpolicy.CLIENT_CERT])
    for component, cert in (
        ("kube-controller-manager", "controller-manager"),
        ("kube-scheduler", "scheduler"),
        ("kubelet", "kubelet-client"),
        ("kube-proxy", "kube-proxy"),
        ("kube-router", netpolicy.CLIENT_CERT.name),
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

    started: list[str] = []  # what a wait watches: a daemon dying fails `up` at once

    def launch(component: str) -> None:
        _launch(config, layout, component)
        started.append(component)

    def wait(condition: Callable[[], bool], timeout_seconds: float, what: str) -> None:
        wait_for(config, layout, tuple(started), condition, timeout_seconds, what)

    launch("etcd")
    launch("kube-apiserver")
    report.say("waiting for the API server")
    wait(lambda: health.apiserver_ready(config), 90, "the API server to answer /readyz")
    launch("kube-controller-manager")
    launch("kube-scheduler")
    if config.registry:
        registry.prepare(registry_paths(config), registry_endpoint(config))
        launch("registry")
        wait(lambda: health.component_ready(config, "registry"), 30, "the registry")
    launch("containerd")
    wait(lambda: containerd.ctr_ok(config), 30, "containerd")
    if load_images:
        report.say("loading images into containerd")
        containerd.load_images(config, only_images)
        containerd.require_images(config, (SANDBOX_IMAGE, addons.COREDNS_IMAGE))
    launch("kubelet")
    launch("kube-proxy")
    launch("device-plugin")
    kubelet_started = time.monotonic()
    report.say("waiting for the node to register")
    kubectl = health.kubectl_for(config)
    wait(lambda: health.node_exists(kubectl, config), 60, "the node to register")
    gpu.advertise(kubectl, config)
    wait(lambda: health.node_ready(kubectl, config), 120, "node Ready")
    report.say(f"node Ready {time.monotonic() - kubelet_started:.1f} s after the kubelet started")
    gpu.advertise(kubectl, config)
    # After the node exists: the driver's ResourceSlice is owned by the Node.
    launch(dra.COMPONENT)
    kubectl.apply(
        addons.as_list(
            [addons.storage_class(), dra.device_class(), *addons.coredns_objects(config)]
        )
    )
    if config.network_policy:
        kubectl.apply(addons.as_list(netpolicy.rbac_objects()))
        launch("kube-router")
        wait(
            lambda: health.component_ready(config, "kube-router"),
            DEFAULT_READY_TIMEOUT_SECONDS,
            "kube-router (NetworkPolicy) to answer its health check",
        )
    pod_cidrs = {config.node_name: config.node_pod_cidr}
    for view in nodes.extra_nodes(config):
        report.say(f"node {view.node_name}: network namespace {view.netns}, {view.node_ip}")
        _start_extra_node(config, view, pod_cidrs, load_images=load_images, only_images=only_images)
        subnet = pod_cidrs[view.node_name]
        report.say(f"node {view.node_name} Ready with {view.gpus} GPUs, pods in {subnet}")
    if load_images:
        report.say("waiting for CoreDNS")
        wait(lambda: health.coredns_ready(kubectl), 120, "CoreDNS Available")
    (config.state / "up").write_text(f"{time.time()}\n")
    report.say(f"cluster {config.name!r} is up: export KUBECONFIG={config.kubeconfig}")


def _start_extra_node(
    config: ClusterConfig,
    view: ClusterConfig,
    pod_cidrs: dict[str, str],
    *,
    load_images: bool,
    only_images: tuple[str, ...] | None,
) -> None:
    """Bring extra node `view` to Ready: its network, credentials, daemons and routes.

    The node's CNI configuration and the routes to its pods wait for the /24
    the controller-manager gives its Node (added to pod_cidrs); until the
    configuration exists the kubelet reports the network not ready, so no pod
    starts before. Nodes start one after the other.
    """
    layout = Layout(view.state)
    _prepare_state(view, layout)
    _issue_node_credentials(config, view, layout)
    _write_configs(view, layout)
    hostchanges.record(layout.host_records)
    network.setup_extra_node(view)
    cgroups.create_root(view.cgroup_root)
    started: list[str] = []

    def launch(component: str) -> None:
        _launch(view, layout, component)
        started.append(component)

    def wait(condition: Callable[[], bool], timeout_seconds: float, what: str) -> None:
        wait_for(view, layout, tuple(started), condition, timeout_seconds, what)

    launch("containerd")
    wait(lambda: containerd.ctr_ok(view), 30, f"containerd of {view.node_name}")
    if load_images:
        containerd.load_images(view, only_images)
        containerd.require_images(view, (SANDBOX_IMAGE, addons.COREDNS_IMAGE))
    launch("kubelet")
    launch("kube-proxy")
    launch("device-plugin")
    kubectl = health.kubectl_for(view)
    wait(lambda: health.node_exists(kubectl, view), 60, f"{view.node_name} to register")
    wait(lambda: bool(health.pod_cidr(kubectl, view)), 30, f"{view.node_name}'s podCIDR")
    pod_cidrs[view.node_name] = health.pod_cidr(kubectl, view)
    _write_cni_conflist(view, layout, pod_cidrs[view.node_name])
    network.apply_routes(nodes.pod_routes(nodes.all_nodes(config)[: view.node], pod_cidrs))
    gpu.advertise(kubectl, view)
    wait(lambda: health.node_ready(kubectl, view), 120, f"{view.node_name} Ready")
    launch(dra.COMPONENT)
    if config.network_policy:
        launch("kube-router")
        wait(
            lambda: health.component_ready(view, "kube-router"),
            DEFAULT_READY_TIMEOUT_SECONDS,
            f"kube-router of {view.node_name} to answer its health check",
        )


def _issue_node_credentials(config: ClusterConfig, view: ClusterConfig, layout: Layout) -> None:
    """The extra node's kubelet certificates, signed by the cluster CA, and its kubeconfigs.

    The CA's key stays in node 1's directory: the node's certificates are made
    there under the node's name and copied, with the CA certificate and the
    clients every node shares (kube-proxy, kube-router).
    """
    cluster_pki = Layout(config.state).pki
    for spec in nodes.node_cert_specs(view):
        pki.issue(cluster_pki, spec)
    for source, target in nodes.node_pki_files(view).items():
        shutil.copyfile(cluster_pki / source, layout.pki / target)
        (layout.pki / target).chmod(0o600)
    for component, cert in (
        ("kubelet", "kubelet-client"),
        ("kube-proxy", "kube-proxy"),
        ("kube-router", netpolicy.CLIENT_CERT.name),
    ):
        pki.write_kubeconfig(
            layout.kubeconfig(component),
            pki_dir=layout.pki,
            cert_name=cert,
            server=view.apiserver_url,
        )


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
    if config.registry:
        hosts = registry_hosts_file(config, layout)
        hosts.path.parent.mkdir(parents=True, exist_ok=True)
        hosts.path.write_text(hosts.text)
    if config.node == 1:  # an extra node's is written once its Node has a podCIDR
        _write_cni_conflist(config, layout, config.node_pod_cidr)
    layout.kubelet_config.write_text(kubelet_config(config, layout))
    (layout.conf / "kube-proxy.yaml").write_text(kube_proxy_config(config, layout))
    # No nameserver: pods with dnsPolicy Default resolve nothing, as nothing outside exists.
    (layout.conf / "resolv.conf").write_text("")


def _write_cni_conflist(config: ClusterConfig, layout: Layout, subnet: str) -> None:
    (layout.cni_conf_dir / "10-fusebox.conflist").write_text(cni_conflist(config, layout, subnet))


def _launch(config: ClusterConfig, layout: Layout, component: str) -> None:
    os.environ["PATH"] = _system_path(config)
    environment = processes.daemon_environment(os.environ)
    processes.spawn(
        argv_for(component, config, layout),
        log_path=layout.log(component),
        pid_path=layout.pid(component),
        netns=config.netns if component in IN_NETNS else None,
        environment=registry.serve_env(environment) if component == "registry" else environment,
    )


def wait_for(
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


def restart(config: ClusterConfig, components: Sequence[str], *, report: Reporter) -> None:
    """Stop and start each component with the same flags and state; wait until it serves.

    Daemons go in start order (etcd before the apiserver that needs it); the
    objects in etcd, containerd's images and containers, and the certificates
    are untouched, so pods keep running through every restart.
    """
    layout = Layout(config.state)
    daemons = recovery.restart_order(components, enabled_components(config))
    unknown = [c for c in components if c not in daemons and c not in ADDON_COMPONENTS]
    if unknown:
        raise ClusterError(f"{', '.join(unknown)}: not a component of cluster {config.name!r}")
    for component in daemons:
        proc = processes.read_pid_file(layout.pid(component))
        if proc is not None and processes.is_alive(proc):
            report.say(f"stopping {component}")
            processes.stop(proc, grace_seconds=STOP_GRACE_SECONDS.get(component, 5.0))
        if component == "containerd":
            _remove_dead_shims_sockets(layout)
        report.say(f"starting {component}")
        _launch(config, layout, component)
        _wait_serving(config, component)
    if "coredns" in components:
        report.say("rolling out CoreDNS again")
        kubectl = health.kubectl_for(config)
        kubectl.run("-n", "kube-system", "rollout", "restart", "deployment/coredns")
        kubectl.run(
            "-n",
            "kube-system",
            "rollout",
            "status",
            "deployment/coredns",
            "--timeout=120s",
            timeout_seconds=150,
        )
    if daemons:
        report.say(f"restarted {', '.join(daemons)}")


def _remove_dead_shims_sockets(layout: Layout) -> None:
    """Remove the sockets of the tasks' shims that died (SIGKILLed with the cluster).

    containerd, started again, drops such a task but leaves its shim's socket
    in /run/containerd/s, where `down` (which finds sockets through the
    tasks) can no longer see it. A socket nobody listens on is a dead shim's.
    """
    for bundle in containerd.task_bundles(layout):
        path = containerd.shim_socket_in(bundle)
        if path is not None and path.is_socket() and not _listening(path):
            path.unlink(missing_ok=True)


def _listening(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def _wait_serving(config: ClusterConfig, component: str) -> None:
    """Wait until a daemon serves; fail with its log when it exits or never does."""
    layout = Layout(config.state)
    timeout_seconds = READY_TIMEOUT_SECONDS.get(component, DEFAULT_READY_TIMEOUT_SECONDS)
    try:
        wait_for(
            config,
            layout,
            (component,),
            lambda: health.component_ready(config, component),
            timeout_seconds,
            f"{component} to serve",
        )
    except ClusterError as err:
        raise ClusterError(
            f"{err}\nIf its state is broken, `python -m localcluster down` and `up` start "
            "an empty cluster."
        ) from None
