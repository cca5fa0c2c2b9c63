"""The hooks' API calls: server-side apply of CRDs, and InferenceServices listed
and deleted. The only part of chart_hooks that talks to the API server.

Why synchronous and short: a hook is a one-shot Job with a deadline; every wait
here is bounded, and every failure becomes a HookError whose message names the
object and the server's reason, which the Job's log (and its pod's termination
message) carry to whoever runs helm.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import kubernetes
from kubernetes.client.exceptions import ApiException

from fusebox_operator.chart_hooks import crds, services
from fusebox_operator.kube import SERVICE_GROUP, SERVICE_PLURAL, SERVICE_VERSION

FIELD_MANAGER = "fusebox-chart"
REQUEST_TIMEOUT_SECONDS = 30
POLL_SECONDS = 0.5
APPLY_PATCH = "application/apply-patch+yaml"
REFUSED_STATUSES = (400, 422)
"""The API server's answers to an apply that refuse the CRD itself (BadRequest, Invalid)."""

Clock = Callable[[], float]


class HookError(RuntimeError):
    """A hook cannot go on; the message says what and why, for the Job's log."""


class HookRefused(HookError):
    """The cluster's state says no and would say it again (services remain, a CRD is
    missing or refused by the API server): the Job fails at once rather than retrying
    (cli.EXIT_REFUSED)."""


def api_client(kubeconfig: str | None = None) -> kubernetes.client.ApiClient:
    """The Job's service account in a pod, else KUBECONFIG / ~/.kube/config."""
    if kubeconfig is None:
        try:
            kubernetes.config.load_incluster_config()  # type: ignore[no-untyped-call]
            return kubernetes.client.ApiClient()
        except kubernetes.config.ConfigException:
            pass
    return kubernetes.config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call,no-any-return]


def server_reason(error: ApiException) -> tuple[str, str]:
    """The Status object's reason and message, else the HTTP status and body."""
    try:
        status = json.loads(error.body or "")
        return str(status.get("reason") or error.status), str(status.get("message") or "")
    except (ValueError, AttributeError):
        return str(error.status), str(error.body or error.reason or "")


def read_crd_files(folder: Path) -> dict[str, str]:
    """The mounted ConfigMap: one key per crds/ file (its ..data links skipped)."""
    return {
        path.name: path.read_text(encoding="utf-8")
        for path in sorted(folder.iterdir())
        if path.suffix in (".yaml", ".yml") and not path.name.startswith(".")
    }


def _read_crd(extensions: Any, name: str) -> dict[str, Any] | None:
    try:
        response = extensions.read_custom_resource_definition(
            name, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_SECONDS
        )
    except ApiException as error:
        if error.status == 404:
            return None
        raise HookError(crds.refused_message(name, *server_reason(error))) from error
    body: dict[str, Any] = json.loads(response.data)
    return body


def _apply_crd(extensions: Any, name: str, document: Mapping[str, Any], dry_run: bool) -> None:
    """One forced server-side apply; a 400 or 422 (the CRD itself refused) is a
    HookRefused, any other error a HookError (a retry may pass)."""
    try:
        extensions.patch_custom_resource_definition(
            name,
            dict(document),
            field_manager=FIELD_MANAGER,
            force=True,
            dry_run="All" if dry_run else None,
            _content_type=APPLY_PATCH,
            _preload_content=False,
            _request_timeout=REQUEST_TIMEOUT_SECONDS,
        )
    except ApiException as error:
        refused = HookRefused if error.status in REFUSED_STATUSES else HookError
        raise refused(crds.refused_message(name, *server_reason(error))) from error


def apply_crds(
    api: kubernetes.client.ApiClient,
    documents: Sequence[Mapping[str, Any]],
    timeout_seconds: float,
    clock: Clock = time.monotonic,
) -> list[str]:
    """Server-side apply every CRD (forcing conflicts: the chart owns these fields),
    then wait for each to be Established; returns their names. Each apply is first
    made as a dry run, so a CRD the API server refuses fails the hook before any
    CRD changed.

    A CRD that does not exist yet is refused before the apply: creating one would
    need `create` on every CRD (RBAC cannot restrict create by name), which the
    hook's role does not grant.
    """
    extensions = kubernetes.client.ApiextensionsV1Api(api)
    names = [str(d["metadata"]["name"]) for d in documents]
    # Every CRD is checked before any is changed: a half-upgraded set is worse than none.
    for name in names:
        if _read_crd(extensions, name) is None:
            raise HookRefused(crds.missing_message(name))
    # The same for what the API server would refuse: every apply is tried as a dry run
    # (validated, admitted, not stored) before the first is made.
    for dry_run in (True, False):
        for name, document in zip(names, documents, strict=True):
            _apply_crd(extensions, name, document, dry_run)
    deadline = clock() + timeout_seconds
    for name in names:
        while True:
            state = crds.establishment(_read_crd(extensions, name) or {})
            if state.established:
                break
            if clock() >= deadline:
                raise HookError(crds.not_established_message(name, state, timeout_seconds))
            time.sleep(POLL_SECONDS)
    return names


def list_services(
    api: kubernetes.client.ApiClient, scope: services.NamespaceScope
) -> list[services.ServiceRef]:
    """The InferenceServices in scope; none when the CRD is not served at all."""
    objects = kubernetes.client.CustomObjectsApi(api)
    args = (SERVICE_GROUP, SERVICE_VERSION)
    items: list[dict[str, Any]] = []
    try:
        if scope.namespaces is None:
            response = objects.list_cluster_custom_object(
                *args, SERVICE_PLURAL, _request_timeout=REQUEST_TIMEOUT_SECONDS
            )
            items.extend(cast(dict[str, Any], response)["items"])
        else:
            for namespace in scope.namespaces:
                response = objects.list_namespaced_custom_object(
                    *args, namespace, SERVICE_PLURAL, _request_timeout=REQUEST_TIMEOUT_SECONDS
                )
                items.extend(cast(dict[str, Any], response)["items"])
    except ApiException as error:
        if error.status == 404:  # no InferenceService CRD: nothing can be stranded
            return []
        reason, message = server_reason(error)
        raise HookError(f"listing InferenceServices failed ({reason}): {message}") from error
    return services.services_in_scope(items, scope)


def delete_services(
    api: kubernetes.client.ApiClient,
    found: Sequence[services.ServiceRef],
    scope: services.NamespaceScope,
    timeout_seconds: float,
    clock: Clock = time.monotonic,
) -> None:
    """Delete each service, then wait (bounded) until the operator has released
    their finalizers and none in scope is left."""
    objects = kubernetes.client.CustomObjectsApi(api)
    for service in found:
        try:
            objects.delete_namespaced_custom_object(
                SERVICE_GROUP,
                SERVICE_VERSION,
                service.namespace,
                SERVICE_PLURAL,
                service.name,
                _request_timeout=REQUEST_TIMEOUT_SECONDS,
            )
        except ApiException as error:
            if error.status == 404:
                continue
            reason, message = server_reason(error)
            raise HookError(
                f"deleting InferenceService {service} failed ({reason}): {message}"
            ) from error
    deadline = clock() + timeout_seconds
    while remaining := list_services(api, scope):
        if clock() >= deadline:
            raise HookError(services.still_present_message(remaining, timeout_seconds))
        time.sleep(POLL_SECONDS)


def guard_uninstall(
    api: kubernetes.client.ApiClient,
    scope: services.NamespaceScope,
    release: str,
    release_namespace: str,
    delete: bool,
    timeout_seconds: float,
    clock: Clock = time.monotonic,
    revision: int | None = None,
    chart_version: str | None = None,
) -> list[services.ServiceRef]:
    """Pass when no InferenceService is in scope; otherwise refuse naming them, or
    (with `delete`) delete them and wait. Returns the services deleted."""
    found = list_services(api, scope)
    if not found:
        return []
    if not delete:
        raise HookRefused(
            services.refusal_message(found, release, release_namespace, revision, chart_version)
        )
    delete_services(api, found, scope, timeout_seconds, clock)
    return found
