"""`kubectl fusebox`: arguments, the API calls, and `views` to print or patch.

Why a module of its own: it is the only part of the plugin that talks to the
API server (InferenceServices and their Events, and a merge patch of one
annotation); it never reaches a pod. kubectl runs a plugin with the user's
environment, so KUBECONFIG, `--kubeconfig`, `--context` and `-n` mean what
they mean to kubectl.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import kubernetes
from kubernetes.client.exceptions import ApiException

from fusebox_operator.kube import SERVICE_GROUP, SERVICE_PLURAL, SERVICE_VERSION
from fusebox_operator.kubectl_plugin import views

USAGE_ERROR = 2


class PluginError(RuntimeError):
    """A failure to tell the user in one line (exit 1)."""


def parser() -> argparse.ArgumentParser:
    # kubectl's own flags go before or after the command (`kubectl fusebox explain chat
    # -n team`), as with kubectl: the commands take them too, and a value given
    # after the command wins (SUPPRESS: one not given there keeps the root's).
    cluster_flags = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    root = argparse.ArgumentParser(
        prog="kubectl fusebox",
        description="Read and steer Fusebox InferenceServices (through the API server only).",
    )
    for parser_ in (root, cluster_flags):
        parser_.add_argument(
            "--kubeconfig", help="kubeconfig file (default: KUBECONFIG or ~/.kube/config)"
        )
        parser_.add_argument("--context", help="kubeconfig context (default: the current one)")
        parser_.add_argument(
            "-n", "--namespace", help="namespace (default: the context's, else default)"
        )
    commands = root.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, text: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, help=text, parents=[cluster_flags])

    status = command("status", "services: mode, breaker, tier, variant, last action and why")
    status.add_argument("-A", "--all-namespaces", action="store_true")
    for name, text in (
        (
            "explain",
            "the figures and thresholds behind a service's state, and the ladder's next rung",
        ),
        ("history", "a service's actions with memory before -> after, and its events"),
        ("resume", "remove fusebox.dev/pause-actions: the operator acts again"),
        ("unpin", "remove fusebox.dev/pin-tier: the policy steps the tier again"),
    ):
        command(name, text).add_argument("service")
    pause = command("pause", "set fusebox.dev/pause-actions: decide, post WouldAct, act on nothing")
    pause.add_argument("service")
    pause.add_argument("reason", nargs="?", default="", help="why (shown in status and events)")
    reset = command("reset", "set fusebox.dev/reset-breaker to a new value: close the breaker once")
    reset.add_argument("service")
    reset.add_argument("--token", help="the value to set (default: the current UTC time)")
    pin = command("pin", "set fusebox.dev/pin-tier: hold a degradation tier")
    pin.add_argument("service")
    pin.add_argument("tier", help="none, or a tier the service lists in spec.degradation.tiers")
    return root  # fmt: skip


class Cluster:
    """The API calls the plugin makes: InferenceServices, their Events, one patch."""

    def __init__(self, kubeconfig: str | None, context: str | None, namespace: str | None):
        try:
            kubernetes.config.load_kube_config(config_file=kubeconfig, context=context)  # type: ignore[no-untyped-call]
            _, active = kubernetes.config.list_kube_config_contexts(config_file=kubeconfig)  # type: ignore[no-untyped-call]
        except (kubernetes.config.ConfigException, OSError) as error:
            raise PluginError(f"cannot load the kubeconfig: {error}") from error
        if context is not None:
            contexts, _ = kubernetes.config.list_kube_config_contexts(config_file=kubeconfig)  # type: ignore[no-untyped-call]
            active = next((c for c in contexts if c.get("name") == context), active)
        self.namespace = (
            namespace or (active or {}).get("context", {}).get("namespace") or "default"
        )
        self.objects = kubernetes.client.CustomObjectsApi()
        self.core = kubernetes.client.CoreV1Api()

    def services(self, all_namespaces: bool) -> list[dict[str, Any]]:
        args = (SERVICE_GROUP, SERVICE_VERSION)
        if all_namespaces:
            found = self.objects.list_cluster_custom_object(*args, SERVICE_PLURAL)
        else:
            found = self.objects.list_namespaced_custom_object(
                *args, self.namespace, SERVICE_PLURAL
            )
        return list(cast(dict[str, Any], found).get("items") or [])

    def service(self, name: str) -> dict[str, Any]:
        try:
            body = self.objects.get_namespaced_custom_object(
                SERVICE_GROUP, SERVICE_VERSION, self.namespace, SERVICE_PLURAL, name
            )
        except ApiException as error:
            if error.status == 404:
                raise PluginError(f"InferenceService {self.namespace}/{name} not found") from error
            raise
        return cast(dict[str, Any], body)

    def events(self, name: str) -> list[dict[str, Any]]:
        selector = f"involvedObject.kind=InferenceService,involvedObject.name={name}"
        found = self.core.list_namespaced_event(self.namespace, field_selector=selector)
        # As the API sends them (camelCase keys), the shape views.history reads.
        plain = self.core.api_client.sanitize_for_serialization(found)
        return list(cast(dict[str, Any], plain).get("items") or [])

    def patch(self, name: str, patch: dict[str, Any]) -> None:
        self.service(name)  # a missing service is named, not a bare 404
        self.objects.patch_namespaced_custom_object(
            SERVICE_GROUP, SERVICE_VERSION, self.namespace, SERVICE_PLURAL, name, patch
        )


def default_token(now: float) -> str:
    return dt.datetime.fromtimestamp(now, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def run(args: argparse.Namespace, cluster: Cluster, now: Callable[[], float]) -> str:
    """The command's output; raises PluginError or ValueError for the user's mistakes."""
    command = args.command
    if command == "status":
        return views.status_table(cluster.services(args.all_namespaces), now())
    if command == "explain":
        return views.explain(cluster.service(args.service), now())
    if command == "history":
        return views.history(cluster.service(args.service), cluster.events(args.service))
    where = f"inferenceservice {cluster.namespace}/{args.service}"
    if command == "pause":
        reason = args.reason or "paused with kubectl fusebox"
        cluster.patch(args.service, views.pause_patch(reason))
        return f"{where}: paused ({reason}); the operator decides and acts on nothing"
    if command == "resume":
        cluster.patch(args.service, views.resume_patch())
        return f"{where}: resumed; the operator acts from its next tick"
    if command == "reset":
        token = args.token or default_token(now())
        cluster.patch(args.service, views.reset_patch(token))
        return f"{where}: breaker reset requested ({token}); see `kubectl fusebox explain`"
    if command == "pin":
        cluster.patch(args.service, views.pin_patch(cluster.service(args.service), args.tier))
        return f"{where}: tier pinned at {args.tier}"
    assert command == "unpin", command
    cluster.patch(args.service, views.unpin_patch())
    return f"{where}: tier unpinned; the policy steps it again"


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        cluster = Cluster(args.kubeconfig, args.context, args.namespace)
        print(run(args, cluster, time.time))
    except ValueError as error:  # a bad tier, refused before anything is written
        print(f"error: {error}", file=sys.stderr)
        return USAGE_ERROR
    except PluginError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except ApiException as error:
        print(f"error: the API server answered {error.status} {error.reason}", file=sys.stderr)
        return 1
    return 0
