"""Kube.apply writes only on drift: nothing for a child that carries the manifest, a
merge patch for a moved ConfigMap, a replace for a Deployment edited by hand (its
template hash unchanged), a replicas patch for one scaled by hand unless the
autoscaler owns the count. A fake of the dynamic client's resource records writes.
The admin Secret is read before it is created, so a resync of an untouched
service sends the apiserver no write at all, not even a refused one.

With a synced child store (the watches' view, child_store.py) apply reads no
child from the apiserver: it compares against the store, creates what the store
says is absent, and writes with the store's resourceVersion; a view behind the
apiserver's is refused (409) and read again, never written over."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic.exceptions import ConflictError, NotFoundError

from fusebox_operator.child_store import ChildStore
from fusebox_operator.kube import Kube
from fusebox_operator.manifests import TEMPLATE_HASH_ANNOTATION


class Raw:
    """The unserialized response the dynamic client returns with serialize=False."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.data = json.dumps(body).encode()


class FakeResource:
    """One object's store; every call is recorded as (verb, body) in `calls`, writes in
    `writes`. A write whose resourceVersion is not the stored one is refused (409)."""

    def __init__(self, current: dict[str, Any] | None) -> None:
        self.current = current
        self.writes: list[tuple[str, dict[str, Any]]] = []
        self.calls: list[str] = []

    def get(self, name: str, namespace: str, serialize: bool = True) -> Raw:
        assert not serialize, "read raw JSON: the ResourceInstance wrapping costs CPU"
        self.calls.append("get")
        if self.current is None:
            raise NotFoundError(ApiException(status=404, reason="Not Found"))
        return Raw(self.current)

    def _write(self, verb: str, body: dict[str, Any]) -> Raw:
        self.calls.append(verb)
        version = (body.get("metadata") or {}).get("resourceVersion")
        if verb == "create" and self.current is not None:
            raise ConflictError(ApiException(status=409, reason="AlreadyExists"))
        if verb != "create" and self.current is None:
            raise NotFoundError(ApiException(status=404, reason="Not Found"))
        if version is not None and self.current is not None:
            if version != self.current["metadata"]["resourceVersion"]:
                raise ConflictError(ApiException(status=409, reason="Conflict"))
        self.writes.append((verb, body))
        written = copy.deepcopy(body)
        written.setdefault("metadata", {})["resourceVersion"] = "8"
        return Raw(written)

    def create(self, body: dict[str, Any], namespace: str, serialize: bool = True) -> Raw:
        return self._write("create", body)

    def patch(self, body: dict[str, Any], **_: Any) -> Raw:
        return self._write("patch", body)

    def replace(self, body: dict[str, Any], **_: Any) -> Raw:
        return self._write("replace", body)


def apply(
    manifest: dict[str, Any],
    current: dict[str, Any] | None,
    scale: bool = True,
    store: ChildStore | None = None,
) -> Any:
    kube = object.__new__(Kube)  # no API client: _resource is the fake
    kube._child_stores = {} if store is None else {None: store}
    resource = FakeResource(current)
    kube._resource = lambda _: resource  # type: ignore[method-assign]
    applied = asyncio.run(kube.apply(manifest, scale=scale))
    return applied, resource.writes


def apply_with_store(
    manifest: dict[str, Any], current: dict[str, Any] | None, seen: dict[str, Any] | None
) -> tuple[Any, FakeResource, ChildStore]:
    """Apply with a synced store that saw `seen` (None: nothing) where the apiserver
    holds `current`."""
    store = ChildStore()
    store.replace(manifest["kind"], [] if seen is None else [seen])
    kube = object.__new__(Kube)
    kube._child_stores = {None: store}
    resource = FakeResource(current)
    kube._resource = lambda _: resource  # type: ignore[method-assign]
    return asyncio.run(kube.apply(manifest)), resource, store


def config_map(answer: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "chat-config", "namespace": "team"},
        "data": {"canned-answers.json": answer},
    }


def deployment(replicas: int = 2, image: str = "fusebox/inference:1") -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "chat",
            "namespace": "team",
            "annotations": {TEMPLATE_HASH_ANNOTATION: "abc"},
        },
        "spec": {
            "replicas": replicas,
            "strategy": {"rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "template": {"spec": {"containers": [{"name": "server", "image": image}]}},
        },
    }


def stored(manifest: dict[str, Any], **spec: Any) -> dict[str, Any]:
    current = copy.deepcopy(manifest)
    current["metadata"]["resourceVersion"] = "7"
    current["spec" if "spec" in current else "data"].update(spec)
    return current


def test_a_child_that_carries_the_manifest_is_not_written() -> None:
    applied, writes = apply(config_map("{}"), stored(config_map("{}")))
    assert (applied.outcome, writes) == ("unchanged", [])


def test_a_missing_child_is_created() -> None:
    applied, writes = apply(config_map("{}"), None)
    assert applied.outcome == "created" and [verb for verb, _ in writes] == ["create"]


def test_a_moved_config_map_is_merge_patched_and_named() -> None:
    applied, writes = apply(config_map('{"hi": "hello"}'), stored(config_map("{}")))
    assert applied.outcome == "updated"
    assert applied.drifted == ["data.canned-answers.json"]
    assert [verb for verb, _ in writes] == ["patch"]


def test_a_deployment_edited_by_hand_is_replaced_though_its_hash_is_unchanged() -> None:
    edited = stored(deployment(), template={"spec": {"containers": [{"name": "server"}]}})
    edited["spec"]["template"]["spec"]["containers"][0]["image"] = "someone/else:2"
    applied, writes = apply(deployment(), edited)
    assert applied.outcome == "updated"
    assert applied.drifted == ["spec.template.spec.containers[0].image"]
    ((verb, body),) = writes
    assert verb == "replace" and body["metadata"]["resourceVersion"] == "7"
    # Scaled by hand as well: the replace puts the count back too, and says so.
    edited["spec"]["replicas"] = 1
    applied, writes = apply(deployment(), edited)
    assert applied.drifted == ["spec.template.spec.containers[0].image", "spec.replicas"]
    assert writes[0][1]["spec"]["replicas"] == 2


def test_a_deployment_scaled_by_hand_gets_the_count_back_unless_the_autoscaler_owns_it() -> None:
    applied, writes = apply(deployment(replicas=2), stored(deployment(), replicas=5))
    assert applied.outcome == "scaled"
    assert writes == [("patch", {"metadata": {"resourceVersion": "7"}, "spec": {"replicas": 2}})]
    applied, writes = apply(deployment(replicas=2), stored(deployment(), replicas=5), scale=False)
    assert (applied.outcome, writes) == ("unchanged", [])


class FakeCore:
    """The core client's Secret calls, each recorded as (verb, name)."""

    def __init__(self, exists: bool, race: bool = False) -> None:
        self.exists, self.race = exists, race
        self.calls: list[str] = []

    def read_namespaced_secret(self, name: str, namespace: str, **_: Any) -> None:
        self.calls.append("read")
        if not self.exists:
            raise ApiException(status=404, reason="Not Found")

    def create_namespaced_secret(self, namespace: str, body: dict[str, Any], **_: Any) -> None:
        self.calls.append("create")
        if self.race:
            raise ApiException(status=409, reason="AlreadyExists")


def create_secret_once(core: FakeCore) -> bool:
    kube = object.__new__(Kube)
    kube.core = core  # type: ignore[assignment]
    secret = {"kind": "Secret", "metadata": {"name": "chat-admin", "namespace": "team"}}
    return asyncio.run(kube.create_secret_once(secret))


def test_an_existing_secret_is_read_and_never_created_again() -> None:
    core = FakeCore(exists=True)
    assert create_secret_once(core) is False
    assert core.calls == ["read"]


def test_a_missing_secret_is_created_and_a_concurrent_create_is_not_an_error() -> None:
    core = FakeCore(exists=False)
    assert create_secret_once(core) is True
    assert core.calls == ["read", "create"]
    assert create_secret_once(FakeCore(exists=False, race=True)) is False


def test_with_a_synced_store_an_unchanged_child_costs_no_request() -> None:
    current = stored(config_map("{}"))
    applied, resource, _ = apply_with_store(config_map("{}"), current, current)
    assert (applied.outcome, resource.calls) == ("unchanged", [])


def test_with_a_synced_store_a_missing_child_is_created_without_a_read() -> None:
    applied, resource, store = apply_with_store(config_map("{}"), None, None)
    assert (applied.outcome, resource.calls) == ("created", ["create"])
    # The apiserver's answer is kept: the next resync compares against it.
    assert store.get("ConfigMap", "team", "chat-config") is not None


def test_a_drifted_child_is_patched_with_the_version_the_store_saw() -> None:
    current = stored(config_map("{}"))
    applied, resource, store = apply_with_store(config_map('{"hi": "hello"}'), current, current)
    assert applied.outcome == "updated" and resource.calls == ["patch"]
    assert resource.writes[0][1]["metadata"]["resourceVersion"] == "7"
    kept = store.get("ConfigMap", "team", "chat-config")
    assert isinstance(kept, dict) and kept["metadata"]["resourceVersion"] == "8"


def test_a_store_behind_the_apiserver_is_refused_then_read_and_compared_again() -> None:
    seen = stored(config_map("{}"))  # the store missed the operator's last write
    current = stored(config_map('{"hi": "hello"}'))
    current["metadata"]["resourceVersion"] = "9"
    applied, resource, _ = apply_with_store(config_map('{"hi": "hello"}'), current, seen)
    assert resource.calls == ["patch", "get"]  # refused (409), read, found as rendered
    assert (applied.outcome, resource.writes) == ("unchanged", [])


def test_a_child_the_store_missed_being_created_is_read_and_compared() -> None:
    current = stored(config_map("{}"))
    applied, resource, _ = apply_with_store(config_map("{}"), current, None)
    assert resource.calls == ["create", "get"]  # AlreadyExists, then read
    assert applied.outcome == "unchanged"


def test_a_child_deleted_since_the_store_saw_it_is_created_again() -> None:
    seen = stored(config_map("{}"))
    applied, resource, _ = apply_with_store(config_map('{"hi": "x"}'), None, seen)
    assert resource.calls == ["patch", "get", "create"]
    assert applied.outcome == "created"


def test_each_kind_is_looked_up_in_discovery_once() -> None:
    lookups: list[tuple[str, str]] = []

    class Resources:
        def get(self, api_version: str, kind: str) -> str:
            lookups.append((api_version, kind))
            return f"{kind} handle"

    kube = object.__new__(Kube)
    kube.dynamic = type("Dynamic", (), {"resources": Resources()})()
    kube._resources = {}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment"}
    service = {"apiVersion": "v1", "kind": "Service"}

    handles = [kube._resource(m) for m in (deployment, service, deployment, service)]

    assert handles == ["Deployment handle", "Service handle"] * 2
    assert lookups == [("apps/v1", "Deployment"), ("v1", "Service")]
