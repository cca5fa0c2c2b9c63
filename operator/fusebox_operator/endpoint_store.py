"""The EndpointSlices of the Fusebox Services in one watch scope, as last listed and watched.

Why: Ready must know whether the Service lists its serving pods (endpoints.py),
and a LIST per service per tick would cost the apiserver what the pod watch
saved (decisions/endpoint-slices.md). One watch per scope keeps this store
instead (kube.EndpointSliceWatch): the slices carry their Service's labels (the
slice controller copies them), so the watch selects `fusebox.dev/service` as the
pod watch does and sees no other Service's slices. Of each slice only its
Service and its ready endpoints are kept.

The watch's thread writes and the event loop reads, so every access holds the
lock. A store that is not current (before its first LIST, or after its watch
lost its place) still answers with what it last held, and since when and why
it is not current: endpoints.judge_endpoints decides what that may still say.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from fusebox_operator.endpoints import EndpointsRead, SliceEndpoints, merged

NOT_LISTED = "the EndpointSlice watch has not listed them yet"


class EndpointStore:
    def __init__(self, now: float) -> None:
        """`now`: when the watch starts; the store is not current from then."""
        self._lock = threading.Lock()
        # (namespace, Service) -> slice name -> its ready endpoints: a tick reads its own
        # Service's slices without going through the scope's.
        self._services: dict[tuple[str, str], dict[str, SliceEndpoints]] = {}
        self._service_of: dict[tuple[str, str], str] = {}  # (namespace, slice) -> Service
        self._listed = False  # any LIST answered yet
        self._unread_since: float | None = now
        self._cause = NOT_LISTED

    def replace(self, slices: Iterable[tuple[str, str, SliceEndpoints]]) -> None:
        """Everything a fresh LIST returned, as (namespace, slice name, endpoints)."""
        with self._lock:
            self._services, self._service_of = {}, {}
            for namespace, name, kept in slices:
                self._put(namespace, name, kept)
            self._listed = True
            self._unread_since, self._cause = None, ""

    def put(self, namespace: str, name: str, kept: SliceEndpoints) -> None:
        with self._lock:
            self._put(namespace, name, kept)

    def remove(self, namespace: str, name: str) -> None:
        with self._lock:
            self._remove(namespace, name)

    def _put(self, namespace: str, name: str, kept: SliceEndpoints) -> None:
        self._remove(namespace, name)  # its Service label may have changed
        self._services.setdefault((namespace, kept.service), {})[name] = kept
        self._service_of[(namespace, name)] = kept.service

    def _remove(self, namespace: str, name: str) -> None:
        service = self._service_of.pop((namespace, name), None)
        if service is None:
            return
        slices = self._services.get((namespace, service), {})
        slices.pop(name, None)
        if not slices:
            self._services.pop((namespace, service), None)

    def lost(self, cause: str, now: float) -> None:
        """The watch failed (`cause`, in a user's words): not current from `now`, or from
        when it last stopped being current; the slices stay as last seen."""
        with self._lock:
            if self._unread_since is None:
                self._unread_since = now
            self._cause = cause

    def read(self, namespace: str, service: str) -> EndpointsRead:
        with self._lock:
            slices = list((self._services.get((namespace, service)) or {}).values())
            held = merged(slices) if self._listed else None
            return EndpointsRead(service, held, self._unread_since, self._cause)
