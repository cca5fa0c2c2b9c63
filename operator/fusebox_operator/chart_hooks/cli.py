"""Arguments of the chart's hook Jobs and their exit codes: 0 done; 1 failed, with a
one-line reason (an API error: a retry may pass); 2 bad arguments; 3 refused, with a
one-line reason (the cluster's state or the chart's files say no, and would again:
the Jobs' podFailurePolicy fails them at once instead of retrying)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from fusebox_operator.chart_hooks import cluster, crds, services

DEFAULT_CRDS_DIR = "/etc/fusebox/crds"
EXIT_FAILED, EXIT_REFUSED = 1, 3


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(
        prog="python -m fusebox_operator.chart_hooks",
        description="The Fusebox chart's Helm hooks (run as Jobs by helm).",
    )
    root.add_argument("--kubeconfig", help="default: in-cluster, else KUBECONFIG")
    commands = root.add_subparsers(dest="command", required=True, metavar="COMMAND")
    apply = commands.add_parser(
        "apply-crds", help="pre-upgrade: server-side apply the chart's CRDs, wait for Established"
    )
    apply.add_argument("--crds-dir", type=Path, default=Path(DEFAULT_CRDS_DIR))
    apply.add_argument("--timeout-seconds", type=float, default=60.0)
    guard = commands.add_parser(
        "guard-uninstall",
        help="pre-delete: refuse while InferenceServices remain where the operator watches",
    )
    guard.add_argument("--release", required=True, help="the Helm release (for the message)")
    guard.add_argument("--release-namespace", required=True)
    guard.add_argument(
        "--revision", type=int, help="the release revision being uninstalled (for the message)"
    )
    guard.add_argument(
        "--chart-version", help="the release's chart version (for the message's helm upgrade)"
    )
    guard.add_argument(
        "--watch-namespaces", default="", help="the chart's watchNamespaces, comma-separated"
    )
    guard.add_argument(
        "--delete-services",
        action="store_true",
        help="delete them and wait for them to be gone instead of refusing",
    )
    guard.add_argument("--timeout-seconds", type=float, default=240.0)
    return root


def main(argv: Sequence[str] | None = None) -> int:
    arguments = parser().parse_args(argv)
    try:
        api = cluster.api_client(arguments.kubeconfig)
        if arguments.command == "apply-crds":
            documents = crds.chart_crds(cluster.read_crd_files(arguments.crds_dir))
            names = cluster.apply_crds(api, documents, arguments.timeout_seconds)
            print(f"applied and Established: {', '.join(names)}")
            return 0
        scope = services.namespace_scope(
            services.parse_watch_namespaces(arguments.watch_namespaces)
        )
        deleted = cluster.guard_uninstall(
            api,
            scope,
            arguments.release,
            arguments.release_namespace,
            arguments.delete_services,
            arguments.timeout_seconds,
            revision=arguments.revision,
            chart_version=arguments.chart_version,
        )
        if deleted:
            print(f"deleted, and gone: {services.named(deleted)}")
        else:
            print("no InferenceService where the operator watches: uninstall may go on")
        return 0
    except (cluster.HookRefused, crds.ChartCrdError) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_REFUSED
    except (cluster.HookError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_FAILED
