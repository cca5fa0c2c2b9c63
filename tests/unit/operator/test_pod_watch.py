"""The pod watch: one LIST, then events keep the store current; the ticks read the store.

A fake core client answers the LISTs and a fake watch plays scripted event
streams, so the loop's rules are checked in the test's own thread: a stream
the apiserver ends resumes from the last resourceVersion (a bookmark's
included), a 410 lists again at once, any other failure marks the store lost
(ticks then LIST themselves) and lists again after a pause.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes
import pytest
from kubernetes.client import (
    V1ListMeta,
    V1ObjectMeta,
    V1OwnerReference,
    V1Pod,
    V1PodList,
    V1PodStatus,
)
from kubernetes.client.exceptions import ApiException

from fusebox_operator import kube as kube_module
from fusebox_operator.kube import Kube, PodWatch
from fusebox_operator.manifests import SERVICE_LABEL
from fusebox_operator.pod_store import PodStore
from fusebox_operator.settings import OperatorSettings

from .served import served

Event = dict[str, Any]


def pod(
    name: str,
    service: str = "chat",
    namespace: str = "team",
    phase: str = "Running",
    owner: str | None = None,
) -> V1Pod:
    """A pod the service's Deployment (named as the service) made through its ReplicaSet,
    unless `owner` names another controlling ReplicaSet ("" for none)."""
    owner = f"{service}-5d8f7c9b4" if owner is None else owner
    return V1Pod(
        metadata=V1ObjectMeta(
            name=name,
            namespace=namespace,
            uid=f"uid-{name}",
            labels={SERVICE_LABEL: service, "pod-template-hash": "5d8f7c9b4"},
            owner_references=[
                V1OwnerReference(
                    api_version="apps/v1",
                    kind="ReplicaSet",
                    name=owner,
                    uid=f"uid-{owner}",
                    controller=True,
                )
            ]
            if owner
            else None,
            resource_version="0",
        ),
        status=V1PodStatus(phase=phase),
    )


def event(kind: str, item: V1Pod, version: str) -> Event:
    """A watch event as the untyped watch hands it over: the object as the API's JSON."""
    item.metadata.resource_version = version
    return {"type": kind, "object": served(item), "raw_object": served(item)}


def bookmark(version: str) -> Event:
    marked = {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": version}}
    return {"type": "BOOKMARK", "object": marked, "raw_object": marked}


class Answer:
    """What a client method returns with `_preload_content=False`: the body unread."""

    def __init__(self, pods: list[V1Pod], version: str) -> None:
        listed = V1PodList(items=pods, metadata=V1ListMeta(resource_version=version))
        self.data = json.dumps(served(listed)).encode()


class FakeCore:
    """The LISTs, each answering the next prepared pod list, unread as the watch asks."""

    def __init__(self, lists: list[tuple[list[V1Pod], str]]) -> None:
        self.lists = lists
        self.selectors: list[str] = []

    def list_pod_for_all_namespaces(self, **kwargs: Any) -> Answer:
        assert kwargs["_preload_content"] is False  # JSON, never the typed V1PodList
        self.selectors.append(kwargs["label_selector"])
        items, version = self.lists.pop(0)
        return Answer(items, version)

    def list_namespaced_pod(self, namespace: str, **kwargs: Any) -> Answer:
        return self.list_pod_for_all_namespaces(**kwargs)


Script = Callable[[PodWatch], Iterator[Event]]


class FakeWatches:
    """Each new watch plays the next script; records the version each resumed from."""

    def __init__(self, scripts: list[Script]) -> None:
        self.scripts = scripts
        self.versions: list[str] = []
        self.pod_watch: PodWatch | None = None

    def __call__(self) -> FakeWatches:
        return self

    def stream(self, _func: Any, *_args: Any, **kwargs: Any) -> Iterator[Event]:
        self.versions.append(kwargs["resource_version"])
        assert kwargs["label_selector"] == SERVICE_LABEL
        # kopf's watch timeouts, from the settings the chart sets
        assert kwargs["timeout_seconds"] == 300
        assert kwargs["_request_timeout"] == (10, 330)
        assert self.pod_watch is not None
        return self.scripts.pop(0)(self.pod_watch)

    def stop(self) -> None:
        pass


def names(store: PodStore, service: str = "chat", namespace: str = "team") -> list[str] | None:
    views = store.select(namespace, {SERVICE_LABEL: service}, service)
    return None if views is None else [view.name for view in views]


def watch_with(core: FakeCore, scripts: list[Script]) -> tuple[PodWatch, FakeWatches, PodStore]:
    store = PodStore()
    watches = FakeWatches(scripts)
    pod_watch = PodWatch(core, None, store, 300, 330, watch_factory=watches)
    watches.pod_watch = pod_watch
    return pod_watch, watches, store


def test_events_after_the_list_keep_the_store_current_and_a_410_lists_again() -> None:
    seen: dict[str, Any] = {}

    def first(_: PodWatch) -> Iterator[Event]:
        seen["listed"] = names(store)
        yield event("MODIFIED", pod("chat-a", phase="Pending"), "11")
        yield event("DELETED", pod("chat-b"), "12")
        yield event("ADDED", pod("chat-c"), "13")
        yield event("ADDED", pod("other-a", service="other"), "14")
        yield bookmark("20")  # the stream ends here: the apiserver's timeout

    def expired(_: PodWatch) -> Iterator[Event]:
        seen["resumed"] = names(store)
        seen["phase"] = {
            v.name: v.phase for d in ("chat", "other") for v in store.select("team", {}, d) or []
        }
        raise ApiException(status=410, reason="Expired")
        yield  # pragma: no cover

    def last(watch: PodWatch) -> Iterator[Event]:
        seen["relisted"] = names(store)
        watch.stop()
        return iter(())

    core = FakeCore([([pod("chat-b"), pod("chat-a")], "10"), ([pod("chat-d")], "30")])
    pod_watch, watches, store = watch_with(core, [first, expired, last])

    pod_watch.run()

    assert seen["listed"] == ["chat-a", "chat-b"]  # by name, as a LIST answers
    assert seen["resumed"] == ["chat-a", "chat-c"]
    assert seen["phase"] == {"chat-a": "Pending", "chat-c": "Running", "other-a": "Running"}
    assert seen["relisted"] == ["chat-d"]  # the LIST replaced everything
    assert watches.versions == ["10", "20", "30"]  # the bookmark's version resumed
    assert core.selectors == [SERVICE_LABEL, SERVICE_LABEL]
    assert names(store, namespace="elsewhere") == []


def test_a_failed_watch_marks_the_store_lost_until_the_next_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kube_module, "WATCH_RETRY_SECONDS", 0)
    seen: dict[str, Any] = {}

    def broken(_: PodWatch) -> Iterator[Event]:
        yield event("ADDED", pod("chat-b"), "11")
        raise ConnectionResetError("reset by peer")

    def last(watch: PodWatch) -> Iterator[Event]:
        seen["relisted"] = names(store)
        watch.stop()
        return iter(())

    core = FakeCore([([pod("chat-a")], "10"), ([pod("chat-a"), pod("chat-b")], "15")])
    pod_watch, watches, store = watch_with(core, [broken, last])
    lost: list[bool] = []
    original_lost = store.lost

    def record_lost() -> None:
        original_lost()
        lost.append(store.synced)

    store.lost = record_lost  # type: ignore[method-assign]

    pod_watch.run()

    assert lost == [False]  # not synced between the failure and the LIST
    assert seen["relisted"] == ["chat-a", "chat-b"]
    assert watches.versions == ["10", "15"]


def test_a_store_not_yet_synced_answers_none_and_a_synced_one_filters() -> None:
    store = PodStore()
    assert store.select("team", {SERVICE_LABEL: "chat"}, "chat") is None
    pods = [pod("chat-a"), pod("chat-a", namespace="other"), pod("x", service="x")]
    store.replace(kube_module._stored(served(item)) for item in pods)
    assert names(store) == ["chat-a"]
    store.lost()
    assert names(store) is None


class ListingCore:
    def __init__(self) -> None:
        self.calls = 0

    def list_namespaced_pod(self, namespace: str, **kwargs: Any) -> Answer:
        assert kwargs["_preload_content"] is False
        self.calls += 1
        return Answer([pod("chat-listed")], "1")


def test_ticks_read_a_synced_store_and_list_only_while_it_is_not() -> None:
    kube = object.__new__(Kube)
    core = ListingCore()
    kube.core = core  # type: ignore[assignment]
    store = PodStore()
    kube._pod_stores = {None: store}

    listed = asyncio.run(kube.list_pods("team", {SERVICE_LABEL: "chat"}, "chat"))
    assert [view.name for view in listed] == ["chat-listed"]
    assert core.calls == 1

    store.replace([kube_module._stored(served(pod("chat-watched")))])
    watched = asyncio.run(kube.list_pods("team", {SERVICE_LABEL: "chat"}, "chat"))
    assert [view.name for view in watched] == ["chat-watched"]
    assert core.calls == 1  # no request


@pytest.mark.parametrize(
    ("watched", "scopes"),
    [
        ("", (None,)),
        ("team-a, team-b", ("team-a", "team-b")),
        # A kopf pattern names no namespace: one cluster-wide watch serves them all.
        ("e2e-*", (None,)),
        ("team-a,team-?", (None,)),
        ("!kube-system", (None,)),
    ],
)
def test_the_pod_watch_covers_named_namespaces_one_by_one_and_patterns_cluster_wide(
    watched: str, scopes: tuple[str | None, ...]
) -> None:
    settings = OperatorSettings.from_env({"FUSEBOX_WATCH_NAMESPACES": watched})
    assert settings.pod_watch_scopes == scopes


def test_a_service_in_a_namespace_matched_by_a_pattern_reads_the_cluster_wide_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started: list[str] = []
    monkeypatch.setattr(PodWatch, "start", lambda self: started.append(self.scope))
    kube = object.__new__(Kube)
    core = FakeCore([])
    kube.core = core  # type: ignore[assignment]
    kube._pod_stores, kube._pod_watches = {}, []
    kube.watch_pods(OperatorSettings.from_env({"FUSEBOX_WATCH_NAMESPACES": "e2e-*"}))
    assert started == ["all namespaces"]
    kube._pod_stores[None].replace([kube_module._stored(served(pod("chat-a", namespace="e2e-x")))])

    listed = asyncio.run(kube.list_pods("e2e-x", {SERVICE_LABEL: "chat"}, "chat"))

    assert [view.name for view in listed] == ["chat-a"]
    assert core.selectors == []  # no LIST: the watched store answered


def test_the_client_watch_hands_the_pod_watch_json_not_typed_pods() -> None:
    # The client's Watch types an event's object after the method's declared return
    # type; the watch's methods declare none, so each pod stays the API's JSON.
    core = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient())
    typed = kubernetes.watch.Watch().get_return_type(core.list_pod_for_all_namespaces)
    assert typed in ("V1Pod", kubernetes.client.V1Pod)
    pod_watch = PodWatch(core, "team", PodStore(), 300, 330)
    assert not kubernetes.watch.Watch().get_return_type(pod_watch._list)
    raw = json.dumps({"type": "MODIFIED", "object": served(pod("chat-a"))})
    assert isinstance(kubernetes.watch.Watch().unmarshal_event(raw, None)["object"], dict)


@pytest.mark.parametrize(
    "owner",
    [
        "",  # no controller: a pod someone made by hand with the service's label
        "chat-6f5c8d7b9",  # a ReplicaSet whose name does not end in the pod's template hash
        "chatbot-5d8f7c9b4",  # another Deployment's ReplicaSet
    ],
)
def test_a_pod_with_the_service_label_that_its_deployment_did_not_make_is_not_the_services(
    owner: str,
) -> None:
    kube = object.__new__(Kube)
    core = ListingCoreOf([pod("chat-a"), pod("chat-impostor", owner=owner)])
    kube.core = core  # type: ignore[assignment]
    store = PodStore()
    kube._pod_stores = {None: store}

    listed = asyncio.run(kube.list_pods("team", {SERVICE_LABEL: "chat"}, "chat"))
    assert [view.name for view in listed] == ["chat-a"]

    store.replace(
        [kube_module._stored(served(p)) for p in (pod("chat-a"), pod("chat-impostor", owner=owner))]
    )
    watched = asyncio.run(kube.list_pods("team", {SERVICE_LABEL: "chat"}, "chat"))
    assert [view.name for view in watched] == ["chat-a"]


class ListingCoreOf:
    def __init__(self, pods: list[V1Pod]) -> None:
        self.pods = pods

    def list_namespaced_pod(self, namespace: str, **kwargs: Any) -> Answer:
        return Answer(self.pods, "1")
