"""`up`, `down` and `status`: the order in which the parts start, stop and are checked.

`up` is safe to run at any time: on a healthy cluster it only re-asserts
the simulated GPUs; on the wreck of a cluster whose processes were killed
without `down` (a CI machine straight after a killed session) it first
removes every leftover, then starts afresh. `down` stops only what this
cluster started, in an order that lets each piece go (kubelet, containers,
shims, daemons), then unmounts, deletes namespaces, links, routes, rules and
cgroups, and puts back the sysctls the kubelet changed.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from localcluster import addons, cgroups, gpu, hostchanges, network, pki, processes
from localcluster.components import (
    BUILT_BINARIES,
    COMPONENTS,
    PROGRAM_NAMES,
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
from localcluster.kubectl import Kubectl, KubectlError

CTR = "ctr"
K8S_NAMESPACE = "k8s.io"
# Daemons that run in the node's network namespace (all of them, like a kind node).
IN_NETNS = frozenset(COMPONENTS)


class ClusterError(RuntimeError):
    """The cluster could not be brought to the requested state; the message says why."""


@dataclasses.dataclass
class Reporter:
    """Progress lines on a stream; `up` is slow enough that silence looks like a hang."""

    stream: TextIO
    started: float = dataclasses.field(default_factory=time.monotonic)

    def say(self, message: str) -> None:
        elapsed = time.monotonic() - self.started
        print(f"[{elapsed:5.1f}s] {message}", file=self.stream, flush=True)


# ---------------------------------------------------------------- checks
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


def kubectl_for(config: ClusterConfig) -> Kubectl:
    return Kubectl(Path(config.bin_dir) / "kubectl", config.kubeconfig)


def component_states(config: ClusterConfig) -> dict[str, bool]:
    layout = Layout(config.state)
    states: dict[str, bool] = {}
    for component in COMPONENTS:
        proc = processes.read_pid_file(layout.pid(component))
        states[component] = proc is not None and processes.is_alive(proc)
    return states


def apiserver_ready(config: ClusterConfig) -> bool:
    if not config.kubeconfig.exists():
        return False
    try:
        return kubectl_for(config).run("get", "--raw", "/readyz", timeout_seconds=15).stdout == "ok"
    except KubectlError:
        return False


def is_healthy(config: ClusterConfig) -> bool:
    return all(component_states(config).values()) and apiserver_ready(config)


# ---------------------------------------------------------------- up
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
    if saved is not None and is_healthy(saved):
        _check_same_network(saved, config)
        report.say(f"cluster {config.name!r} is already up")
        if (saved.gpus, saved.gpu_product, saved.gpu_memory_mib) != (
            config.gpus,
            config.gpu_product,
            config.gpu_memory_mib,
        ):
            (config.state / "config.json").write_text(config.to_json())
        gpu.advertise(kubectl_for(config), config)
        return
    if saved is not None:
        report.say("cleaning up what a previous run of this cluster left behind")
        down(saved, report=report, keep_logs=True)
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
        down(config, report=report, keep_logs=True)
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
        lambda: apiserver_ready(config),
        90,
        "the API server to answer /readyz",
    )
    _launch(config, layout, "kube-controller-manager")
    _launch(config, layout, "kube-scheduler")
    _launch(config, layout, "containerd")
    _wait(config, layout, ("containerd",), lambda: _ctr_ok(config), 30, "containerd")
    if load_images:
        report.say("loading images into containerd")
        _load_images(config, only_images)
        _require_images(config, (SANDBOX_IMAGE, addons.COREDNS_IMAGE))
    _launch(config, layout, "kubelet")
    _launch(config, layout, "kube-proxy")
    kubelet_started = time.monotonic()
    report.say("waiting for the node to register")
    kubectl = kubectl_for(config)
    _wait(
        config,
        layout,
        COMPONENTS,
        lambda: _node_exists(kubectl, config),
        60,
        "the node to register",
    )
    gpu.advertise(kubectl, config)
    _wait(config, layout, COMPONENTS, lambda: _node_ready(kubectl, config), 120, "node Ready")
    report.say(f"node Ready {time.monotonic() - kubelet_started:.1f} s after the kubelet started")
    gpu.advertise(kubectl, config)
    kubectl.apply(addons.as_list([addons.storage_class(), *addons.coredns_objects(config)]))
    if load_images:
        report.say("waiting for CoreDNS")
        _wait(config, layout, COMPONENTS, lambda: _coredns_ready(kubectl), 120, "CoreDNS Available")
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


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


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
        states = component_states(config)
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


def _ctr(
    config: ClusterConfig, *args: str, check: bool = False
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CTR, f"--address={config.containerd_socket}", "--namespace", K8S_NAMESPACE, *args],
        capture_output=True,
        text=True,
        check=check,
        timeout=60,
    )


def _ctr_ok(config: ClusterConfig) -> bool:
    return config.containerd_socket.exists() and _ctr(config, "version").returncode == 0


def image_reference(name: str) -> str:
    """`testapp` -> `localhost/fusebox/testapp:latest`; full references pass through. Pure."""
    if "/" in name:
        return name
    return f"localhost/fusebox/{name}" + ("" if ":" in name else ":latest")


def _load_images(config: ClusterConfig, only: tuple[str, ...] | None = None) -> None:
    """Load built images (all, or `only` these) through the images module."""
    try:
        images = importlib.import_module("localcluster.images")
    except ModuleNotFoundError as err:
        raise ClusterError(
            "localcluster/images.py is missing, so no image can be loaded: run `make images`"
        ) from err
    load: Callable[..., None] = images.load_images
    names = None if only is None else [image_reference(n) for n in only]
    try:
        load(CTR, str(config.containerd_socket), names=names)
    except RuntimeError as err:  # images.ImageError: its message names the make target
        raise ClusterError(f"loading images: {err}") from err


def load_images_into_running(config: ClusterConfig) -> None:
    if not _ctr_ok(config):
        raise ClusterError(f"containerd of cluster {config.name!r} is not running: run `up` first")
    _load_images(config)


def _require_images(config: ClusterConfig, names: tuple[str, ...]) -> None:
    listed = set(_ctr(config, "images", "ls", "-q").stdout.split())
    missing = [n for n in names if n not in listed]
    if missing:
        raise ClusterError(f"images missing from the node: {', '.join(missing)}: run `make images`")


def _node_exists(kubectl: Kubectl, config: ClusterConfig) -> bool:
    return kubectl.run("get", "node", config.node_name, check=False).returncode == 0


def _node_ready(kubectl: Kubectl, config: ClusterConfig) -> bool:
    result = kubectl.run(
        "get",
        "node",
        config.node_name,
        "-o",
        "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
        check=False,
    )
    return result.stdout.strip() == "True"


def _coredns_ready(kubectl: Kubectl) -> bool:
    result = kubectl.run(
        "-n",
        "kube-system",
        "get",
        "deployment",
        "coredns",
        "-o",
        "jsonpath={.status.availableReplicas}",
        check=False,
    )
    return result.stdout.strip() not in ("", "0")


# ---------------------------------------------------------------- down
def down(config: ClusterConfig, *, report: Reporter, keep_logs: bool = True) -> list[str]:
    """Stop and remove everything of this cluster; returns what could not be removed."""
    layout = Layout(config.state)

    def stop(component: str) -> None:
        proc = processes.read_pid_file(layout.pid(component))
        if proc is not None and processes.is_alive(proc):
            report.say(f"stopping {component}")
            processes.stop(proc, grace_seconds=10 if component != "kubelet" else 5)

    stop("kubelet")
    # Shims killed without a trace leave their sockets; their ids are the bundles'.
    shim_sockets = [
        hostchanges.shim_socket(str(config.containerd_socket), K8S_NAMESPACE, bundle.name)
        for bundle in _task_bundles(layout)
    ]
    pod_netns = _kill_containers(config, report)
    for component in reversed(COMPONENTS):
        if component != "kubelet":
            stop(component)
    # Anything of ours still running (pid files lost, shims, nsenter wrappers).
    strays = processes.find_by_cmdline(str(config.state), PROGRAM_NAMES)
    shim_sockets += [
        socket for p in strays if (socket := _shim_socket_of(processes.cmdline(p.pid)))
    ]
    if strays:
        report.say(f"killing {len(strays)} leftover processes")
        processes.kill_all(strays)
    stuck_cgroups = cgroups.kill_and_remove(config.cgroup_root)
    stuck_mounts = _unmount_under((config.state, Path(config.containerd_root)))
    network.teardown(config, pod_netns)
    hostchanges.restore(
        layout.host_records,
        pod_logs_dir=layout.pod_logs,
        cni_network_name=config.cni_network_name,
        shim_sockets=shim_sockets,
    )
    problems = [f"cgroup {c}" for c in stuck_cgroups] + [f"mount {m}" for m in stuck_mounts]
    problems += network.leftovers(config)
    if not problems:
        for entry in config.state.iterdir() if config.state.exists() else []:
            if keep_logs and entry.name in ("logs", "logs.previous"):
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
    return problems


def _task_bundles(layout: Layout) -> list[Path]:
    tasks = layout.containerd / "state" / "io.containerd.runtime.v2.task" / K8S_NAMESPACE
    return sorted(tasks.iterdir()) if tasks.is_dir() else []


def _kill_containers(config: ClusterConfig, report: Reporter) -> list[str]:
    """Kill every task while containerd still runs; return the pods' netns names."""
    if not _ctr_ok(config):
        return []
    netns_names: list[str] = []
    for container_id in _ctr(config, "containers", "ls", "-q").stdout.split():
        info = _ctr(config, "containers", "info", container_id)
        if info.returncode != 0:
            continue
        try:
            spec = json.loads(info.stdout).get("Spec") or {}
        except json.JSONDecodeError:
            continue
        for ns in spec.get("linux", {}).get("namespaces", []):
            path = ns.get("path", "")
            if ns.get("type") == "network" and "/netns/" in path:
                netns_names.append(Path(path).name)
    tasks = _ctr(config, "tasks", "ls", "-q").stdout.split()
    if tasks:
        report.say(f"killing {len(tasks)} containers")
    for task in tasks:
        _ctr(config, "tasks", "kill", "--all", "--signal", "SIGKILL", task)
    for task in tasks:
        _ctr(config, "tasks", "delete", "--force", task)
    return sorted(set(netns_names))


def _shim_socket_of(args: list[str]) -> Path | None:
    if not args or Path(args[0]).name != "containerd-shim-runc-v2":
        return None
    flags = dict(zip(args[1::], args[2::], strict=False))
    try:
        return hostchanges.shim_socket(flags["-address"], flags["-namespace"], flags["-id"])
    except KeyError:
        return None


def _mount_points() -> list[str]:
    points: list[str] = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        raw = line.split()[4]
        points.append(raw.encode().decode("unicode_escape"))
    return points


def _unmount_under(roots: tuple[Path, ...]) -> list[str]:
    prefixes = tuple(str(r).rstrip("/") + "/" for r in roots)
    for _attempt in range(3):
        targets = [m for m in _mount_points() if m.startswith(prefixes)]
        if not targets:
            return []
        for mount in sorted(targets, key=len, reverse=True):
            result = subprocess.run(["umount", mount], capture_output=True, check=False)
            if result.returncode != 0:
                subprocess.run(["umount", "-l", mount], capture_output=True, check=False)
    return [m for m in _mount_points() if m.startswith(prefixes)]


# ---------------------------------------------------------------- status
def status_lines(config: ClusterConfig) -> tuple[bool, list[str]]:
    states = component_states(config)
    lines = [f"{name:<24} {'running' if alive else 'stopped'}" for name, alive in states.items()]
    ready = apiserver_ready(config)
    lines.append(f"{'apiserver /readyz':<24} {'ok' if ready else 'not answering'}")
    healthy = all(states.values()) and ready
    if ready:
        kubectl = kubectl_for(config)
        node_ready = _node_ready(kubectl, config)
        lines.append(f"{'node ' + config.node_name:<24} {'Ready' if node_ready else 'NotReady'}")
        try:
            count = gpu.advertised_count(kubectl.get_json("node", config.node_name))
        except KubectlError:
            count = 0
        lines.append(
            f"{'nvidia.com/gpu':<24} {count} ({config.gpu_product}, {config.gpu_memory_mib} MiB)"
        )
        dns = _coredns_ready(kubectl)
        lines.append(f"{'coredns':<24} {'Available' if dns else 'not available'}")
        healthy = healthy and node_ready
    lines.append(f"{'kubeconfig':<24} {config.kubeconfig}")
    lines.append(f"{'logs':<24} {Layout(config.state).logs}")
    return healthy, lines
