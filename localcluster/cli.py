"""`python -m localcluster up|down|restart|status|env|load-images|pv|node`: the command line.

Thin: parses flags into a ClusterConfig, calls lifecycle, maps its errors to
a message and exit status 1 (never a traceback for an expected failure).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from localcluster import (
    addons,
    containerd,
    gpu_cli,
    health,
    lifecycle,
    monitoring_addon,
    node_control,
    nodes,
    registry,
    storage,
    teardown,
)
from localcluster.components import (
    ADDON_COMPONENTS,
    ALIASES,
    COMPONENTS,
    canonical_component,
    registry_paths,
)
from localcluster.config import (
    ClusterConfig,
    ConfigError,
    build_config,
    default_name,
    load_saved,
    network_policy_asked,
)
from localcluster.kubectl import KubectlError
from localcluster.network import NetworkError
from localcluster.progress import ClusterError, Reporter


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m localcluster",
        description="A real Kubernetes of one node or more, each in its own network namespace, "
        "with simulated GPUs.",
    )
    parser.add_argument(
        "--name", help="cluster name (env FUSEBOX_LOCALCLUSTER_NAME; default fusebox)"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="start the cluster (or confirm it is up)")
    up.add_argument(
        "--nodes",
        type=int,
        help="how many nodes, each with its own kubelet, containerd and GPUs "
        "(env FUSEBOX_LOCALCLUSTER_NODES; default 1)",
    )
    up.add_argument("--netns", help="network namespace name (default: the cluster name)")
    up.add_argument("--host-veth", help="host end of the veth (default fbx0)")
    up.add_argument("--node-veth", help="node end of the veth (default fbx1)")
    up.add_argument(
        "--node-cidr",
        help="host<->nodes link: room for the host and every node "
        "(default 10.250.0.0/30 for one node, wider for more)",
    )
    up.add_argument("--pod-cidr", help="pod network (default 10.251.0.0/16)")
    up.add_argument("--service-cidr", help="Service ClusterIPs (default 10.252.0.0/16)")
    up.add_argument("--gpus", type=int, help="simulated nvidia.com/gpu count (default 1)")
    up.add_argument(
        "--gpu-product", help="nvidia.com/gpu.product label (default NVIDIA-H100-80GB-HBM3)"
    )
    up.add_argument("--gpu-memory-mib", type=int, help="nvidia.com/gpu.memory label (default 1024)")
    up.add_argument(
        "--no-images",
        action="store_true",
        help="do not load images (the node runs no pod; for quick checks)",
    )

    policy = up.add_mutually_exclusive_group()
    policy.add_argument(
        "--network-policy",
        dest="network_policy",
        action="store_true",
        default=None,
        help="enforce NetworkPolicy with kube-router (a new cluster's default; "
        "on a running cluster, turns it on)",
    )
    policy.add_argument(
        "--no-network-policy",
        dest="network_policy",
        action="store_false",
        help="enforce no NetworkPolicy: stop kube-router and remove its rules "
        "(env FUSEBOX_LOCALCLUSTER_NETWORK_POLICY=on|off; unset: a running cluster keeps "
        "what it runs)",
    )
    up.add_argument(
        "--images",
        help="load only these images, comma-separated (e.g. pause,coredns,testapp; "
        "env FUSEBOX_LOCALCLUSTER_IMAGES); default all",
    )

    sub.add_parser("down", help="stop everything and leave the host as it was")
    restart = sub.add_parser(
        "restart",
        help="restart components, keeping every object, image and pod",
        description="Stop and start each named component with the same state; "
        "wait until it serves. Components: "
        + ", ".join([*COMPONENTS, *ADDON_COMPONENTS])
        + "; also "
        + ", ".join(f"{a} ({c})" for a, c in ALIASES.items())
        + ".",
    )
    restart.add_argument("components", metavar="COMPONENT", nargs="+")
    restart.add_argument(
        "--node",
        metavar="NAME",
        help="restart these daemons of another node (containerd, kubelet, kube-proxy, "
        "device-plugin, dra-driver, kube-router); default node 1",
    )
    sub.add_parser("status", help="show each component (exit 0 only when all are healthy)")
    sub.add_parser("env", help="print shell exports for KUBECONFIG and PATH")
    load = sub.add_parser(
        "load-images",
        help="load built images into a running cluster's containerd",
        description="Import the built images (all, or those named) that a node's containerd "
        "lacks or holds in an older build; every node unless --node names one.",
    )
    load.add_argument(
        "images", metavar="IMAGE", nargs="*", help="e.g. inference operator (default all)"
    )
    load.add_argument("--node", metavar="NAME", help="only this node (default every node)")
    load.add_argument(
        "--discard-unpacked-layers",
        action="store_true",
        help="keep only the unpacked image, not its layer blobs as well: half the disk "
        "per node (the inference image: about 6 GB instead of 12), but an image rebuilt "
        "later sends all its layers again, not only the changed ones",
    )
    registry_cmd = sub.add_parser(
        "registry",
        help="push to the cluster's authenticated registry, or print a pull Secret",
        description="push [IMAGE...]: the built images (default all) and the chart, with the "
        "cluster's credentials; pull-secret --name N --namespace NS: a dockerconfigjson "
        "Secret for imagePullSecrets (apply it with kubectl apply -f -).",
    )
    registry_cmd.add_argument("registry_args", nargs=argparse.REMAINDER, metavar="push|pull-secret")
    sub.add_parser(
        "monitoring",
        help="install Prometheus under the Prometheus Operator in the `monitoring` namespace",
    )
    gpu_cli.add_parser(sub)

    node = sub.add_parser(
        "node",
        help="stop, start, drain, uncordon one node, or put it under memory pressure",
        description="stop: kill the node's kubelet, containerd, other daemons and pods at "
        "once, as if the machine died; start: bring them back and wait for Ready; drain: "
        "cordon and evict its pods within their PodDisruptionBudgets (kubectl drain); "
        "uncordon: schedule onto it again; pressure --on|--off: make the node's kubelet "
        "report MemoryPressure=True (a soft threshold it is past, an hour's grace: nothing "
        "is evicted) or take it off, restarting that kubelet only and waiting for the "
        "condition.",
    )
    node.add_argument("action", choices=("stop", "start", "drain", "uncordon", "pressure"))
    node.add_argument("node_name", metavar="NAME", help="the node (`kubectl get nodes`)")
    node.add_argument(
        "--timeout", type=float, default=300, help="seconds a drain may take (default 300)"
    )
    on_off = node.add_mutually_exclusive_group()
    on_off.add_argument(
        "--on", dest="pressure", action="store_true", default=None, help="pressure: put it on"
    )
    on_off.add_argument(
        "--off", dest="pressure", action="store_false", help="pressure: take it off"
    )

    pv = sub.add_parser("pv", help="create a `local` PersistentVolume backed by a directory")
    pv.add_argument("pv_name", metavar="NAME")
    pv.add_argument("--path", required=True, type=Path, help="absolute directory on this machine")
    pv.add_argument("--size", default="1Gi", help="capacity (default 1Gi)")
    pv.add_argument(
        "--access-mode",
        default="ReadWriteOnce",
        choices=("ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"),
    )
    return parser


def _require_saved(name: str) -> ClusterConfig:
    saved = load_saved(name, os.environ)
    if saved is None:
        raise ClusterError(f"cluster {name!r} is not up: run `python -m localcluster up`")
    return saved


def _node(config: ClusterConfig, node_name: str | None) -> ClusterConfig:
    """The view of the node `--node` names; node 1 (the cluster) without it."""
    return config if node_name is None else nodes.by_name(config, node_name)


def run(argv: Sequence[str]) -> int:
    args = _parser().parse_args(argv)
    name = args.name or default_name(os.environ)
    report = Reporter(sys.stderr)
    saved = load_saved(name, os.environ)
    if args.command == "up":
        config = build_config(
            name=name,
            env=os.environ,
            netns=args.netns,
            host_veth=args.host_veth,
            node_veth=args.node_veth,
            node_cidr=args.node_cidr,
            pod_cidr=args.pod_cidr,
            service_cidr=args.service_cidr,
            gpus=args.gpus,
            gpu_product=args.gpu_product,
            gpu_memory_mib=args.gpu_memory_mib,
            network_policy=args.network_policy,
            nodes=args.nodes,
        )
        wanted = args.images or os.environ.get("FUSEBOX_LOCALCLUSTER_IMAGES")
        only = tuple(n for n in wanted.split(",") if n) if wanted else None
        lifecycle.up(
            config,
            saved=saved,
            load_images=not args.no_images,
            only_images=only,
            network_policy=network_policy_asked(args.network_policy, os.environ),
            report=report,
        )
        return 0
    if args.command == "down":
        if saved is None:
            report.say(f"cluster {name!r} is not up")
            return 0
        problems = teardown.down(saved, report=report)
        if problems:
            print("could not remove:\n  " + "\n  ".join(problems), file=sys.stderr)
            return 1
        report.say(f"cluster {name!r} is down")
        return 0
    if args.command == "restart":
        config = _require_saved(name)
        asked = [(n, canonical_component(n)) for n in args.components]
        unknown = [n for n, c in asked if c is None]
        if unknown:
            raise ClusterError(
                f"unknown component {', '.join(unknown)}; one of "
                + ", ".join([*COMPONENTS, *ADDON_COMPONENTS, *ALIASES])
            )
        lifecycle.restart(
            _node(config, args.node), [c for _, c in asked if c is not None], report=report
        )
        return 0
    if args.command == "status":
        if saved is None:
            print(f"cluster {name!r}: down")
            return 1
        healthy, lines = health.status_lines(saved)
        print(f"cluster {name!r}: {'up' if healthy else 'NOT healthy'}")
        print("\n".join(lines))
        return 0 if healthy else 1
    if args.command == "env":
        config = saved or build_config(name=name, env=os.environ)
        print(f"export KUBECONFIG={config.kubeconfig}")
        print(f"export PATH={config.bin_dir}:$PATH")
        if config.registry:
            paths = registry_paths(config)
            print(f"export FUSEBOX_REGISTRY={config.registry_address}")
            print(f"export FUSEBOX_REGISTRY_CA={paths.ca}")
            print(f"export FUSEBOX_REGISTRY_AUTH={paths.auth_file}")
        return 0
    if args.command == "registry":
        config = _require_saved(name)
        if not config.registry:
            raise ClusterError(
                f"cluster {name!r} runs no registry (made before it existed, or with "
                "FUSEBOX_LOCALCLUSTER_REGISTRY=off): `down`, then `up` again"
            )
        return registry.main(
            [
                "--state",
                str(config.state),
                "--address",
                config.registry_address,
                *args.registry_args,
            ]
        )
    if args.command == "gpu":
        return gpu_cli.run(args, _node(_require_saved(name), args.node))
    if args.command == "monitoring":
        monitoring_addon.install_into(_require_saved(name), say=report.say)
        return 0
    if args.command == "load-images":
        config = _require_saved(name)
        views = nodes.all_nodes(config) if args.node is None else [_node(config, args.node)]
        for view in views:
            containerd.load_images_into_running(
                view,
                only=tuple(args.images) or None,
                discard_unpacked_layers=args.discard_unpacked_layers,
            )
        return 0
    if args.command == "node":
        view = nodes.by_name(_require_saved(name), args.node_name)
        if args.action == "stop":
            node_control.stop(view, report)
        elif args.action == "start":
            node_control.start(view, report)
        elif args.action == "drain":
            node_control.drain(view, report, timeout_seconds=args.timeout)
        elif args.action == "pressure":
            if args.pressure is None:
                raise ClusterError("node pressure: say --on or --off")
            node_control.pressure(view, report, on=args.pressure)
        else:
            node_control.uncordon(view, report)
        return 0
    if args.command == "pv":
        config = _require_saved(name)
        path: Path = args.path
        storage.check_directory(path)
        volume = storage.persistent_volume(
            config, name=args.pv_name, path=path, size=args.size, access_mode=args.access_mode
        )
        health.kubectl_for(config).apply(addons.as_list([volume]))
        print(f"persistentvolume/{args.pv_name} backed by {path}")
        return 0
    raise AssertionError(args.command)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return run(sys.argv[1:] if argv is None else argv)
    except (
        ConfigError,
        ClusterError,
        NetworkError,
        KubectlError,
        storage.StorageError,
    ) as err:
        print(f"localcluster: {err}", file=sys.stderr)
        return 1
    except PermissionError as err:
        print(f"localcluster: {err} (the cluster needs root)", file=sys.stderr)
        return 1
