"""Which InferenceServices stand in the way of `helm uninstall`, and what to say.

Pure: the pre-delete hook lists InferenceServices where the release's operator
watches (the chart's watchNamespaces, read as the operator reads
FUSEBOX_WATCH_NAMESPACES) and, when any remain, refuses with their names. kopf's
finalizer is on every service; with the operator gone their deletion (and their
namespace's) would wait forever.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

NAMED_AT_MOST = 20
"""How many services a message names before it gives only the count of the rest."""

PATTERN_MARKS = "*?!"
"""What makes a watchNamespaces entry a kopf pattern rather than a namespace's name."""


@dataclass(frozen=True, order=True)
class ServiceRef:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class NamespaceScope:
    """Where the release's operator acts: `namespaces` to list one by one, or None
    for a cluster-wide list kept to the namespaces `patterns` match (none: all)."""

    namespaces: tuple[str, ...] | None
    patterns: tuple[str, ...] = ()

    def covers(self, namespace: str) -> bool:
        if self.namespaces is not None:
            return namespace in self.namespaces
        return not self.patterns or any(matches(namespace, p) for p in self.patterns)


def parse_watch_namespaces(value: str) -> tuple[str, ...]:
    """FUSEBOX_WATCH_NAMESPACES' format: comma-separated, blanks dropped."""
    return tuple(part.strip() for part in value.split(",") if part.strip())


def namespace_scope(watch_namespaces: Sequence[str]) -> NamespaceScope:
    """Names are listed where they are (the hook's Roles are there); a kopf pattern
    ("team-*", "!kube-system") names no namespace, so the list is cluster-wide and
    filtered as kopf filters; nothing at all means the whole cluster."""
    if not watch_namespaces:
        return NamespaceScope(None)
    if any(mark in entry for entry in watch_namespaces for mark in PATTERN_MARKS):
        return NamespaceScope(None, tuple(watch_namespaces))
    return NamespaceScope(tuple(dict.fromkeys(watch_namespaces)))


def matches(namespace: str, pattern: str) -> bool:
    """kopf's reading of one glob: "!glob" is every namespace but those it matches."""
    if pattern.startswith("!"):
        return not fnmatch.fnmatchcase(namespace, pattern[1:])
    return fnmatch.fnmatchcase(namespace, pattern)


def services_in_scope(
    items: Iterable[Mapping[str, Any]], scope: NamespaceScope
) -> list[ServiceRef]:
    """The listed InferenceServices the release's operator watches, sorted."""
    found = {
        ServiceRef(item["metadata"]["namespace"], item["metadata"]["name"])
        for item in items
        if scope.covers(item["metadata"]["namespace"])
    }
    return sorted(found)


def named(services: Sequence[ServiceRef], at_most: int = NAMED_AT_MOST) -> str:
    """ "a/x, b/y" for a few; the first `at_most` and "and N more" for many."""
    shown = ", ".join(str(s) for s in services[:at_most])
    rest = len(services) - at_most
    return f"{shown} and {rest} more" if rest > 0 else shown


def refusal_message(
    services: Sequence[ServiceRef],
    release: str,
    namespace: str,
    revision: int | None = None,
    chart_version: str | None = None,
) -> str:
    """Why `helm uninstall` stopped, which services, and the three ways on. A refused
    uninstall leaves the release "uninstalling", which `helm upgrade` will not touch:
    the ways that change a value go through `helm rollback` to `revision` (the one being
    uninstalled) first. `helm upgrade` needs the chart as well as the release; where the
    chart came from (a path, a repository, an OCI reference) is not in the release, so
    the command names it CHART, pinned to `chart_version`, the one rolled back to."""
    count = len(services)
    noun = "InferenceService remains" if count == 1 else "InferenceServices remain"
    target = str(revision) if revision is not None else "REVISION"
    version = f" --version {chart_version}" if chart_version else ""
    return (
        f"helm uninstall {release} -n {namespace} refused: {count} {noun} where its"
        f" operator watches: {named(services)}. Each carries kopf's finalizer, which only"
        f" a running operator releases; uninstalled first, their deletion (and their"
        f" namespace's) would never finish. Either delete them first"
        f" (`kubectl delete inferenceservices --all -n NAMESPACE`), then uninstall again;"
        f" or have the uninstall delete them while the operator runs: this refusal left"
        f" the release 'uninstalling', which `helm upgrade` refuses, so"
        f" `helm rollback {release} {target} -n {namespace}` (it deploys this revision"
        f" again), then `helm upgrade {release} CHART{version} -n {namespace}"
        f" --reuse-values --set uninstall.deleteServices=true` (CHART: the chart the"
        f" release was installed from, e.g. oci://REGISTRY/charts/fusebox or a"
        f" checkout's helm/fusebox), then uninstall again; or set"
        f" uninstall.guard=false the same way to leave them behind."
    )


def still_present_message(services: Sequence[ServiceRef], timeout_seconds: float) -> str:
    """Deleted, but their finalizers were not released in time (is the operator running?)."""
    return (
        f"the InferenceServices were deleted, but after {timeout_seconds:g}s"
        f" {len(services)} still exist: {named(services)}. The operator releases their finalizers;"
        f" check that it runs (`kubectl get pods -l app.kubernetes.io/name=fusebox-operator`"
        f" and its logs), then run helm uninstall again."
    )
