"""Kube.apply writes only on drift: nothing for a child that carries the manifest, a
merge patch for a moved ConfigMap, a replace for a Deployment edited by hand (its
template hash unchanged), a replicas patch for one scaled by hand unless the
autoscaler owns the count. A fake of the dynamic client's resource records writes.
The admin Secret is read before it is created, so a resync of an untouched
service sends the apiserver no write at all, not even a refused one."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic.exceptions import NotFoundError

from fusebox_operator.kube import Kube
from fusebox_operator.manifests import TEMPLATE_HASH_ANNOTATION


class Raw:
    """The unserialized response the dynamic client returns with serialize=False."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.data = json.dumps(body).encode()


class FakeResource:
    """One object's store; every write is recorded as (verb, body)."""

    def __init__(self, current: dict[str, Any] | None) -> None:
        self.current = current
        self.writes: list[tuple[str, dict[str, Any]]] = []

    def get(self, name: str, namespace: str, serialize: bool = True) -> Raw:
        assert not serialize, "read raw JSON: the ResourceInstance wrapping costs CPU"
        if self.current is None:
            raise NotFoundError(ApiException(status=404, reason="Not Found"))
        return Raw(self.current)

    def create(self, body: dict[str, Any], namespace: str) -> None:
        self.writes.append(("create", body))

    def patch(self, body: dict[str, Any], **_: Any) -> None:
        self.writes.append(("patch", body))

    def replace(self, body: dict[str, Any], **_: Any) -> None:
        self.writes.append(("replace", body))


def apply(manifest: dict[str, Any], current: dict[str, Any] | None, scale: bool = True) -> Any:
    kube = object.__new__(Kube)  # no API client: _resource is the fake
    resource = FakeResource(current)
    kube._resource = lambda _: resource  # type: ignore[method-assign]
    applied = asyncio.run(kube.apply(manifest, scale=scale))
    return applied, resource.writes


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
    assert writes == [("patch", {"spec": {"replicas": 2}})]
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
