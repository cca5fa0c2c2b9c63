"""The children of every InferenceService in one watch scope, as the watches saw them.

Why: the drift resync compared each service's children with what it renders,
and read them with a GET each: six GETs per service per resync, 6 of the 9.7
API requests per service per minute at 250 services (bench/operator_scale_bench.py).
One watch per child kind and scope keeps this store current instead, so a
resync compares against memory, and a write carries the resourceVersion it
was computed from (a stale view is refused by the apiserver, never written
over). A child deleted or edited outside Fusebox shows here as an event, and
the store names its service, so the service is repaired at its next tick
rather than at its next periodic resync.

The watches' threads write and the event loop reads, so every access holds
the lock. A kind that is not synced (before its first LIST, or after its
watch lost its place) answers `UNKNOWN`: the caller reads the apiserver,
never a view that may have missed an event. Kept objects are the apiserver's
JSON, so the drift comparison (drift.differences) reads the same form as a GET.
"""

from __future__ import annotations

import json
import threading
import zlib
from collections.abc import Iterable, Mapping
from typing import Any, Final

from fusebox_operator.manifests import SERVICE_LABEL

Child = dict[str, Any]
Key = tuple[str, str, str]  # kind, namespace, name
Packed = bytes  # a kept child as compact JSON, deflated, without its resourceVersion
Held = tuple[str, Packed]  # (resourceVersion, packed): how the store keeps a child


class _Unknown:
    """The store cannot say: its kind is not watched or not synced."""

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Final = _Unknown()
# Written by the apiserver or a controller, never by whoever edits a child: a change
# of these alone (a Deployment's rollout status, a new resourceVersion) is not drift.
SERVER_OWNED_METADATA = ("resourceVersion", "managedFields", "generation")
# The Deployment controller numbers each rollout in this annotation. No rendered child
# sets it, so drift never compares it; counted as an edit, it touched every new service
# a moment after its create (the controller's first sync), and the resync that followed
# found nothing to put back: about 1.4 ms of a new service's 37 ms of operator CPU
# (decisions/operator-api-cost.md, sixth pass). An edit of the Deployment's template
# still touches it, by the template.
CONTROLLER_ANNOTATIONS = ("deployment.kubernetes.io/revision",)


def what_an_editor_sets(child: Mapping[str, Any]) -> dict[str, Any]:
    """The child without its status and the metadata only the apiserver or a controller
    writes."""
    kept = {key: value for key, value in child.items() if key != "status"}
    metadata = child.get("metadata") or {}
    edited = {k: v for k, v in metadata.items() if k not in SERVER_OWNED_METADATA}
    annotations = edited.get("annotations")
    if isinstance(annotations, Mapping) and any(a in annotations for a in CONTROLLER_ANNOTATIONS):
        edited["annotations"] = {
            k: v for k, v in annotations.items() if k not in CONTROLLER_ANNOTATIONS
        }
    kept["metadata"] = edited
    return kept


def kept(child: Mapping[str, Any]) -> Child:
    """What the store holds of a child: no status and no managedFields. Drift never reads
    them, and on a Deployment they are most of the object (the store's memory grows with
    the services)."""
    held = {key: value for key, value in child.items() if key != "status"}
    metadata = child.get("metadata") or {}
    held["metadata"] = {k: v for k, v in metadata.items() if k != "managedFields"}
    return held


def _version(child: Mapping[str, Any]) -> str:
    return str((child.get("metadata") or {}).get("resourceVersion") or "")


def _pack(child: Mapping[str, Any]) -> Packed:
    """Compact JSON, deflated: held as nested dicts, 500 services' rendered children took
    23.4 MiB (tracemalloc) against 3.7 MiB as text, and a resync reads each child once
    a minute, so unpacking on read costs far less than holding dicts. The apiserver's
    objects (its defaults filled in) are larger than rendered ones, about 10 KiB of text
    per service in the fleet bench; deflate (its fastest level, tens of microseconds
    per child) keeps about a fifth of that (docs/decisions/operator-memory.md). The same
    child always packs to the same bytes, so comparing packed children still tells
    whether one moved. The resourceVersion is held beside the bytes (`Held`), so a
    change of status alone (a new version, nothing else) packs to the same bytes."""
    held = kept(child)
    held["metadata"].pop("resourceVersion", None)
    return zlib.compress(json.dumps(held, separators=(",", ":")).encode(), 1)


def _hold(child: Mapping[str, Any]) -> Held:
    return _version(child), _pack(child)


def _unpack(held: Held) -> Child:
    version, packed = held
    child: Child = json.loads(zlib.decompress(packed))
    if version:
        child.setdefault("metadata", {})["resourceVersion"] = version
    return child


def _key(kind: str, child: Mapping[str, Any]) -> Key:
    metadata = child.get("metadata") or {}
    return kind, str(metadata.get("namespace") or ""), str(metadata.get("name") or "")


def _service(child: Mapping[str, Any]) -> tuple[str, str] | None:
    """(namespace, service) of the InferenceService that owns the child, from its label."""
    metadata = child.get("metadata") or {}
    owner = (metadata.get("labels") or {}).get(SERVICE_LABEL)
    return (str(metadata.get("namespace") or ""), str(owner)) if owner else None


class ChildStore:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._children: dict[Key, Held] = {}
        self._synced: set[str] = set()
        self._touched: set[tuple[str, str]] = set()  # services whose children moved

    def replace(self, kind: str, children: Iterable[Child]) -> None:
        """Everything a fresh LIST of `kind` returned; synced from here on.

        A child gone or changed since the last view (events the watch missed)
        touches its service, as the events would have.
        """
        fresh = {_key(kind, child): _hold(child) for child in children}
        with self._lock:
            before = {key: child for key, child in self._children.items() if key[0] == kind}
            for key, held in before.items():
                if key not in fresh:
                    self._touch(_unpack(held))
            for key, held in fresh.items():
                if key in before and before[key][1] != held[1]:
                    self._touch_if_moved(before[key], held)
            for key in before:
                del self._children[key]
            self._children.update(fresh)
            self._synced.add(kind)

    def put(self, kind: str, child: Child) -> None:
        """A watch event: added or modified. An edit of what an editor sets touches the
        service; a new child does not (a create is the operator's own, or a resync's).

        The event of a version the store holds already (the operator's own write,
        recorded from the apiserver's answer) is not packed again: the apiserver gives
        every change a new resourceVersion, so nothing moved. That is the ADDED event of
        each child the operator creates, five per new service."""
        key, version = _key(kind, child), _version(child)
        with self._lock:
            known = self._children.get(key)
        if known is not None and version and known[0] == version:
            return
        held = _hold(child)
        with self._lock:
            known = self._children.get(key)
            if known is not None and known[1] != held[1]:
                self._touch_if_moved(known, held)
            self._children[key] = held

    def remove(self, kind: str, child: Mapping[str, Any]) -> None:
        """A watch event: deleted (or no longer carrying the service label)."""
        with self._lock:
            self._children.pop(_key(kind, child), None)
            self._touch(child)

    def record(self, kind: str, child: Child) -> None:
        """The operator's own write, as the apiserver answered it: kept, touching nothing,
        so the watch event that follows finds nothing moved."""
        held = _hold(child)
        with self._lock:
            self._children[_key(kind, child)] = held

    def lost(self, kind: str) -> None:
        """The watch of `kind` may have missed events: UNKNOWN until the next LIST."""
        with self._lock:
            self._synced.discard(kind)

    def synced(self, kind: str) -> bool:
        with self._lock:
            return kind in self._synced

    def get(self, kind: str, namespace: str, name: str) -> Child | None | _Unknown:
        """The child as last seen, None when it does not exist, UNKNOWN when not synced."""
        with self._lock:
            if kind not in self._synced:
                return UNKNOWN
            held = self._children.get((kind, namespace, name))
        return None if held is None else _unpack(held)

    def take_touched(self, namespace: str, service: str) -> bool:
        """Whether a child of this service moved since the last call (and forget it)."""
        with self._lock:
            if (namespace, service) not in self._touched:
                return False
            self._touched.discard((namespace, service))
            return True

    def _touch_if_moved(self, before: Held, after: Held) -> None:
        old, new = _unpack(before), _unpack(after)
        if what_an_editor_sets(old) != what_an_editor_sets(new):
            self._touch(new)

    def _touch(self, child: Mapping[str, Any]) -> None:
        owner = _service(child)
        if owner is not None:
            self._touched.add(owner)
