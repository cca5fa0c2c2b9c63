"""Command lines and configuration files of every cluster component. Pure.

Kept apart from the code that starts processes so the settings that matter
(and why each is there) read in one place, and tests can look at them
without a cluster. Every path is under the cluster's state directory except
containerd's content store, which lives in the cache so images survive
`down`/`up`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from localcluster import dra, gpu, registry
from localcluster.config import REGISTRY_PORT, REPO_ROOT, ClusterConfig

SANDBOX_IMAGE = "localhost/fusebox/pause:latest"

# containerd 2 built by build-binaries.sh (Debian's 1.6 has no CDI), with its own
# cache key; first on the daemons' PATH so containerd finds its own shim.
CONTAINERD_BIN_DIR = REPO_ROOT / ".cache" / "containerd"
CONTAINERD_BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr")


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where each component keeps its files inside the state directory."""

    state: Path

    @property
    def pki(self) -> Path:
        return self.state / "pki"

    @property
    def kubeconfigs(self) -> Path:
        return self.state / "kubeconfigs"

    @property
    def conf(self) -> Path:
        return self.state / "conf"

    @property
    def logs(self) -> Path:
        return self.state / "logs"

    @property
    def pids(self) -> Path:
        return self.state / "pids"

    @property
    def etcd_data(self) -> Path:
        return self.state / "etcd"

    @property
    def containerd(self) -> Path:
        return self.state / "containerd"

    @property
    def kubelet_root(self) -> Path:
        return self.state / "kubelet"

    @property
    def kubelet_config(self) -> Path:
        """The kubelet's configuration file (`node pressure` rewrites it)."""
        return self.conf / "kubelet.yaml"

    @property
    def pod_logs(self) -> Path:
        return self.state / "pod-logs"

    @property
    def cni_conf_dir(self) -> Path:
        return self.conf / "cni"

    @property
    def cni_ipam(self) -> Path:
        return self.state / "cni-ipam"

    @property
    def registry_hosts(self) -> Path:
        """containerd's registry config_path: <host:port>/hosts.toml per registry."""
        return self.containerd / "certs.d"

    @property
    def host_records(self) -> Path:
        """What `up` changed on the host, so `down` can restore it after a crash."""
        return self.state / "host"

    def log(self, component: str) -> Path:
        return self.logs / f"{component}.log"

    def pid(self, component: str) -> Path:
        return self.pids / f"{component}.pid"

    def kubeconfig(self, component: str) -> Path:
        return self.kubeconfigs / f"{component}.kubeconfig"


# Start order; `down` stops in the reverse, with the kubelet first. A new
# daemon gets a line here, an argv builder in argv_for and, when it answers
# a health URL inside the node, an entry in HEALTH_URLS.
COMPONENTS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "registry",
    "containerd",
    "kubelet",
    "kube-proxy",
    "device-plugin",
    dra.COMPONENT,
    "kube-router",
)

# What a node runs for itself: every node has these; node 1 also runs the control plane.
NODE_COMPONENTS = frozenset(
    {"containerd", "kubelet", "kube-proxy", "device-plugin", dra.COMPONENT, "kube-router"}
)

# Daemons a setting can leave out (`up --no-network-policy`, FUSEBOX_LOCALCLUSTER_REGISTRY=off).
OPTIONAL_COMPONENTS = frozenset({"kube-router", "registry"})

# Objects in the cluster (not processes) that `restart` also takes.
ADDON_COMPONENTS = ("coredns",)

# Shorter names users type; each maps to one entry of COMPONENTS.
ALIASES = {
    "apiserver": "kube-apiserver",
    "controller-manager": "kube-controller-manager",
    "scheduler": "kube-scheduler",
    "proxy": "kube-proxy",
    "network-policy": "kube-router",
}

# What each daemon answers when it is ready, from inside the node's namespace.
# The apiserver is probed through kubectl and containerd through ctr instead.
HEALTH_URLS = {
    "etcd": "http://127.0.0.1:2381/health",
    "kube-controller-manager": "https://127.0.0.1:10257/healthz",
    "kube-scheduler": "https://127.0.0.1:10259/healthz",
    "kubelet": "http://127.0.0.1:10248/healthz",
    "kube-proxy": "http://127.0.0.1:10256/healthz",
    "kube-router": "http://127.0.0.1:20244/healthz",
}


def enabled_components(config: ClusterConfig) -> tuple[str, ...]:
    """This node's daemons, in start order: all of them on node 1, NODE_COMPONENTS elsewhere."""
    wanted = {"kube-router": config.network_policy, "registry": config.registry}
    return tuple(
        c
        for c in COMPONENTS
        if (c not in OPTIONAL_COMPONENTS or wanted[c])
        and (config.node == 1 or c in NODE_COMPONENTS)
    )


def canonical_component(name: str) -> str | None:
    """The component a user's name means (`apiserver` is kube-apiserver), or None."""
    name = ALIASES.get(name, name)
    return name if name in COMPONENTS or name in ADDON_COMPONENTS else None


def etcd_argv(config: ClusterConfig, layout: Layout) -> list[str]:
    pki = layout.pki
    return [
        str(Path(config.bin_dir) / "etcd"),
        "--name=fusebox",
        f"--data-dir={layout.etcd_data}",
        "--listen-client-urls=https://127.0.0.1:2379",
        "--advertise-client-urls=https://127.0.0.1:2379",
        "--listen-peer-urls=http://127.0.0.1:2380",
        "--initial-advertise-peer-urls=http://127.0.0.1:2380",
        "--initial-cluster=fusebox=http://127.0.0.1:2380",
        "--listen-metrics-urls=http://127.0.0.1:2381",
        f"--cert-file={pki / 'etcd-server.crt'}",
        f"--key-file={pki / 'etcd-server.key'}",
        f"--trusted-ca-file={pki / 'ca.crt'}",
        "--client-cert-auth=true",
        "--quota-backend-bytes=2147483648",
        "--log-level=warn",
    ]


def apiserver_argv(config: ClusterConfig, layout: Layout) -> list[str]:
    pki = layout.pki
    return [
        str(Path(config.bin_dir) / "kube-apiserver"),
        f"--advertise-address={config.node_ip}",
        "--bind-address=0.0.0.0",
        "--secure-port=6443",
        f"--cert-dir={layout.state / 'apiserver-generated'}",
        "--etcd-servers=https://127.0.0.1:2379",
        f"--etcd-cafile={pki / 'ca.crt'}",
        f"--etcd-certfile={pki / 'apiserver-etcd-client.crt'}",
        f"--etcd-keyfile={pki / 'apiserver-etcd-client.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction,PodSecurity",
        # PodSecurity, not a global switch, must be what refuses privileged pods.
        "--allow-privileged=true",
        f"--service-cluster-ip-range={config.service_cidr}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
        f"--kubelet-certificate-authority={pki / 'ca.crt'}",
        # Otherwise the node name is resolved through the machine's DNS for logs/exec.
        "--kubelet-preferred-address-types=InternalIP",
        "--profiling=false",
        "--v=1",
    ]


def controller_manager_argv(config: ClusterConfig, layout: Layout) -> list[str]:
    pki = layout.pki
    kubeconfig = layout.kubeconfig("kube-controller-manager")
    return [
        str(Path(config.bin_dir) / "kube-controller-manager"),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        "--leader-elect=false",
        "--allocate-node-cidrs=true",
        f"--cluster-cidr={config.pod_cidr}",
        "--node-cidr-mask-size=24",
        f"--service-cluster-ip-range={config.service_cidr}",
        f"--root-ca-file={pki / 'ca.crt'}",
        f"--service-account-private-key-file={pki / 'sa.key'}",
        "--use-service-account-credentials=true",
        f"--cluster-signing-cert-file={pki / 'ca.crt'}",
        f"--cluster-signing-key-file={pki / 'ca.key'}",
        "--controllers=*",
        "--profiling=false",
        "--v=1",
    ]


def scheduler_argv(config: ClusterConfig, layout: Layout) -> list[str]:
    kubeconfig = layout.kubeconfig("kube-scheduler")
    return [
        str(Path(config.bin_dir) / "kube-scheduler"),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        "--leader-elect=false",
        "--profiling=false",
        "--v=1",
    ]


def containerd_config(config: ClusterConfig, layout: Layout) -> str:
    """containerd 2 (version 4, its current form) with the CRI plugin set for a rootful,
    SYS_RESOURCE-less host, reading the DRA driver's CDI specs."""
    root = Path(config.containerd_root)
    images = "plugins.'io.containerd.cri.v1.images'"
    runtime = "plugins.'io.containerd.cri.v1.runtime'"
    return f"""version = 4
root = '{root}'
state = '{layout.containerd / "state"}'
# Not the host's /etc/containerd/conf.d: this cluster's settings are all here.
imports = []
disabled_plugins = ['io.containerd.snapshotter.v1.aufs', 'io.containerd.snapshotter.v1.btrfs',
  'io.containerd.snapshotter.v1.zfs', 'io.containerd.snapshotter.v1.devmapper']

[plugins.'io.containerd.server.v1.grpc']
  address = '{config.containerd_socket}'

[plugins.'io.containerd.server.v1.ttrpc']
  address = '{config.containerd_socket}.ttrpc'

[plugins.'io.containerd.server.v1.metrics']
  address = ''

[plugins.'io.containerd.internal.v1.opt']
  path = '{root / "opt"}'

# NRI (on by default since 2.0) would listen on the host's /var/run/nri; nothing uses it.
[plugins.'io.containerd.nri.v1.nri']
  disable = true

[{images}]
  snapshotter = 'overlayfs'

  [{images}.pinned_images]
    sandbox = '{SANDBOX_IMAGE}'
{_registry_hosts_section(config, layout)}
[{runtime}]
  # Root here lacks CAP_SYS_RESOURCE: without this every sandbox fails to start.
  restrict_oom_score_adj = true
  enable_selinux = false
  # CDI is always on in containerd 2: the DRA driver's specs reach the containers.
  cdi_spec_dirs = ['{dra.control_for(config).cdi_dir}']

  [{runtime}.containerd]
    default_runtime_name = 'runc'

    [{runtime}.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'

      [{runtime}.containerd.runtimes.runc.options]
        SystemdCgroup = false
        # Not /run/containerd/runc: keep runc's state with the cluster's.
        Root = '{layout.containerd / "runc"}'

  [{runtime}.cni]
    bin_dirs = ['/usr/lib/cni']
    conf_dir = '{layout.cni_conf_dir}'
    max_conf_num = 1

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = '127.0.0.1'
"""


def _registry_hosts_section(config: ClusterConfig, layout: Layout) -> str:
    """Where containerd finds the registry's hosts.toml (its CA), when there is one."""
    if not config.registry:
        return ""
    images = "plugins.'io.containerd.cri.v1.images'"
    return (
        "\n  # The cluster's registry: trusted through its CA (registry_hosts_file);\n"
        "  # pulled with each pod's imagePullSecrets.\n"
        f"  [{images}.registry]\n"
        f"    config_path = '{layout.registry_hosts}'\n"
    )


def registry_paths(config: ClusterConfig) -> registry.RegistryPaths:
    """The cluster's registry files: in its state, its layers in the cache."""
    return registry.paths_for(
        state_dir=config.cluster_state, cache=config.cache_dir, cluster_name=config.name
    )


def registry_endpoint(config: ClusterConfig) -> registry.Endpoint:
    return registry.Endpoint(config.control_plane_ip, REGISTRY_PORT)


def registry_hosts_file(config: ClusterConfig, layout: Layout) -> registry.HostsFile:
    """This node's containerd `hosts.toml` for the cluster's registry."""
    return registry.containerd_hosts(
        layout.registry_hosts, registry_endpoint(config), registry_paths(config).ca
    )


def containerd_argv(layout: Layout) -> list[str]:
    return [str(CONTAINERD_BIN_DIR / "containerd"), f"--config={layout.containerd / 'config.toml'}"]


def cni_conflist(config: ClusterConfig, layout: Layout, subnet: str) -> str:
    """Bridge + host-local on the node's /24 (subnet); no masquerade: nothing leaves the node."""
    return json.dumps(
        {
            "cniVersion": "1.0.0",
            "name": config.cni_network_name,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": "cni0",
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": subnet}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(layout.cni_ipam),
                    },
                }
            ],
        },
        indent=2,
    )


# `node pressure NAME --on`: a soft threshold the node is always past. The kubelet's
# memory.available is the host's capacity less the whole host's working set, far under
# 99% of it on any host, so the kubelet reports MemoryPressure=True at its next
# housekeeping pass (10 s): soft thresholds set the condition before their grace period
# is out, and with an hour's grace nothing is evicted. `--off` restarts the kubelet
# without it, and a new kubelet starts with no pressure remembered, so the condition
# clears at its first status update; the short transition period keeps it from
# outliving the threshold by the default 5 min should the kubelet ever see it unmet.
MEMORY_PRESSURE_EVICTION = """evictionSoft:
  memory.available: "99%"
evictionSoftGracePeriod:
  memory.available: "1h"
evictionPressureTransitionPeriod: 10s
"""


def kubelet_config(config: ClusterConfig, layout: Layout, *, memory_pressure: bool = False) -> str:
    """The kubelet's configuration; `memory_pressure` puts the node under real kubelet
    MemoryPressure without evicting anyone (MEMORY_PRESSURE_EVICTION, `node pressure`)."""
    pki = layout.pki
    pressure = MEMORY_PRESSURE_EVICTION if memory_pressure else ""
    return f"""apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine's memory controller is cgroup v1; kubelet 1.37 refuses v1 otherwise.
failCgroupV1: false
cgroupDriver: cgroupfs
# Every pod cgroup under one root named after the cluster, so `down` finds them.
cgroupRoot: {config.cgroup_root}
containerRuntimeEndpoint: unix://{config.containerd_socket}
address: {config.node_ip}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: {pki / "ca.crt"}
authorization:
  mode: Webhook
tlsCertFile: {pki / "kubelet-server.crt"}
tlsPrivateKeyFile: {pki / "kubelet-server.key"}
clusterDomain: cluster.local
clusterDNS:
- {config.dns_service_ip}
# The host's resolvers must not leak into pods: the cluster reaches nothing outside.
resolvConf: {layout.conf / "resolv.conf"}
podLogsDir: {layout.pod_logs}
failSwapOn: false
# An image another pod pulled with a secret is not everyone's: a pod asking for a
# registry image already on the node must hold credentials the registry accepts
# (the multi-tenant setting). The project's own images, imported into containerd
# (nothing to pull them from), are exempt.
imagePullCredentialsVerificationPolicy: NeverVerifyAllowlistedImages
preloadedImagesVerificationAllowlist:
- localhost/fusebox/*
# Imported images cannot be pulled again here: never garbage-collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "200Mi"
  nodefs.available: "2%"
  nodefs.inodesFree: "2%"
  imagefs.available: "2%"
maxPods: 110
serializeImagePulls: false
# Mounted ConfigMaps and Secrets are rewritten when the kubelet syncs the pod: every
# 10 s here instead of the default minute, so a live edit (quality, canned answers, a
# Prometheus config) lands in seconds in tests. Production clusters keep the minute.
syncFrequency: 10s
{pressure}"""


def kubelet_argv(config: ClusterConfig, layout: Layout) -> list[str]:
    return [
        str(Path(config.bin_dir) / "kubelet"),
        f"--config={layout.kubelet_config}",
        f"--kubeconfig={layout.kubeconfig('kubelet')}",
        f"--root-dir={layout.kubelet_root}",
        f"--cert-dir={layout.kubelet_root / 'pki'}",
        f"--hostname-override={config.node_name}",
        f"--node-ip={config.node_ip}",
        "--v=1",
    ]


def kube_proxy_config(config: ClusterConfig, layout: Layout) -> str:
    return f"""apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: {layout.kubeconfig("kube-proxy")}
mode: iptables
clusterCIDR: {config.pod_cidr}
hostnameOverride: {config.node_name}
bindAddress: {config.node_ip}
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# Zero: leave the (partly machine-wide) conntrack sysctls alone.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
"""


def kube_proxy_argv(config: ClusterConfig, layout: Layout) -> list[str]:
    return [
        str(Path(config.bin_dir) / "kube-proxy"),
        f"--config={layout.conf / 'kube-proxy.yaml'}",
        "--v=1",
    ]


def kube_router_argv(config: ClusterConfig, layout: Layout) -> list[str]:
    """kube-router's network policy controller only: no BGP routing, no service proxy.

    It enforces NetworkPolicy with iptables and ipsets inside the node; the
    bridge CNI and kube-proxy keep doing the rest.
    """
    return [
        str(Path(config.bin_dir) / "kube-router"),
        f"--kubeconfig={layout.kubeconfig('kube-router')}",
        "--run-firewall=true",
        "--run-router=false",
        "--run-service-proxy=false",
        "--run-loadbalancer=false",
        f"--hostname-override={config.node_name}",
        f"--service-cluster-ip-range={config.service_cidr}",
        "--health-port=20244",
        "--metrics-port=0",
        "--v=1",
    ]


def argv_for(component: str, config: ClusterConfig, layout: Layout) -> list[str]:
    builders = {
        "etcd": lambda: etcd_argv(config, layout),
        "kube-apiserver": lambda: apiserver_argv(config, layout),
        "kube-controller-manager": lambda: controller_manager_argv(config, layout),
        "kube-scheduler": lambda: scheduler_argv(config, layout),
        "containerd": lambda: containerd_argv(layout),
        "kubelet": lambda: kubelet_argv(config, layout),
        "kube-proxy": lambda: kube_proxy_argv(config, layout),
        "device-plugin": lambda: gpu.device_plugin_argv(config, layout.kubelet_root),
        dra.COMPONENT: lambda: dra.driver_argv(
            config, layout.kubelet_root, layout.kubeconfig("kubelet")
        ),
        "kube-router": lambda: kube_router_argv(config, layout),
        "registry": lambda: registry.serve_argv(registry_paths(config)),
    }
    return builders[component]()


# Binaries the cluster runs, by where they come from, for clear errors.
BUILT_BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "kube-proxy",
    "kube-router",
    "kubectl",
    gpu.PLUGIN_BINARY,
    dra.DRIVER_BINARY,
)
SYSTEM_BINARIES = (
    "runc",
    "iptables",
    "ip",
    "nsenter",
    "openssl",
    "conntrack",
    "ipset",
)
PROGRAM_NAMES = frozenset(
    {*BUILT_BINARIES, "containerd", "containerd-shim-runc-v2", "nsenter", "registry"}
)
