"""The Fusebox pods of one watch scope, as the last LIST and the watch since saw them.

Why: telemetry needs each service's pods every scrape interval. Listing them
from the apiserver per service per tick cost 39 LISTs a second at 200
services (bench/operator_bench.py scale); one watch per scope keeps this
store current instead (kube.PodWatch), and a tick reads it without a request.
The watch's thread writes and the event loop reads, so every access holds the
lock. A store that is not synced (before the first LIST, or after the watch
lost its place) answers None: the caller lists from the apiserver, never
from a view that may have missed an event.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from fusebox_operator.observations import PodView


@dataclass(frozen=True)
class StoredPod:
    namespace: str
    labels: Mapping[str, str]
    deployment: str  # the Deployment whose ReplicaSet controls it, "" for none (pod_view.py)
    view: PodView


class PodStore:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pods: dict[tuple[str, str], StoredPod] = {}
        self._synced = False

    def replace(self, pods: Iterable[StoredPod]) -> None:
        """Everything a fresh LIST returned; the store is synced from here on."""
        fresh = {(pod.namespace, pod.view.name): pod for pod in pods}
        with self._lock:
            self._pods = fresh
            self._synced = True

    def put(self, pod: StoredPod) -> None:
        with self._lock:
            self._pods[(pod.namespace, pod.view.name)] = pod

    def remove(self, namespace: str, name: str) -> None:
        with self._lock:
            self._pods.pop((namespace, name), None)

    def lost(self) -> None:
        """The watch may have missed events: answer None until the next LIST."""
        with self._lock:
            self._synced = False

    @property
    def synced(self) -> bool:
        with self._lock:
            return self._synced

    def select(
        self, namespace: str, labels: Mapping[str, str], deployment: str
    ) -> list[PodView] | None:
        """The namespace's pods carrying every label that `deployment` controls, by name;
        None while not synced."""
        with self._lock:
            if not self._synced:
                return None
            chosen = [
                pod.view
                for (pod_namespace, _), pod in self._pods.items()
                if pod_namespace == namespace
                and pod.deployment == deployment
                and all(pod.labels.get(key) == value for key, value in labels.items())
            ]
        return sorted(chosen, key=lambda view: view.name)
