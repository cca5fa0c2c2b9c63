"""The only module that talks to the Kubernetes API (besides kopf itself).

Why: keeping every API call here gives one place for timeouts, error
classification and the create-or-update rules (a child is written only when
it no longer carries what was rendered, drift.differences; the Deployment is
replaced, never merge-patched; the admin Secret is created once and never
rewritten). The official client is synchronous, so its calls run in a worker
thread and the kopf event loop never blocks on the network; the watches have a
thread each. The children's writes (and the reads that settle a refused one) go
instead through an aiohttp session of the operator's own with the client's
credentials (ApiRequests): through the client and a thread each cost 1.2 ms of
CPU, the largest single share of a new service's (decisions/operator-api-cost.md,
sixth and seventh passes).
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

import aiohttp
import kubernetes
import urllib3
from kubernetes.client.exceptions import ApiException

from fusebox_contract.wiring import ADMIN_TOKEN_KEY
from fusebox_operator.admin_secret import admin_token, controller_uid
from fusebox_operator.child_store import UNKNOWN, ChildStore
from fusebox_operator.deletion_cost import deletion_cost_patch
from fusebox_operator.drift import Applied, differences
from fusebox_operator.endpoint_store import EndpointStore
from fusebox_operator.endpoints import EndpointsRead, slice_endpoints
from fusebox_operator.manifests import (
    SERVER_CONTAINER,
    SERVICE_LABEL,
    TEMPLATE_HASH_ANNOTATION,
    memory_quantity,
    memory_resize_patch,
)
from fusebox_operator.observations import PodView
from fusebox_operator.pod_store import PodStore, StoredPod
from fusebox_operator.pod_view import controlling_deployment, pod_view
from fusebox_operator.settings import OperatorSettings
from fusebox_operator.sizing import NODE_PRODUCT_LABEL, NODE_VRAM_LABEL

T = TypeVar("T")
REQUEST_TIMEOUT_SECONDS = 15
SERVICE_GROUP, SERVICE_VERSION, SERVICE_PLURAL = "fusebox.dev", "v1alpha1", "inferenceservices"
WATCH_RETRY_SECONDS = 5  # the pause before listing again after a failed watch
KOPF_REQUEST_CONNECTIONS = 16
"""Connections kopf may hold to the apiserver for its requests (status patches, events,
finalizers), besides one per watch stream. kopf's own pool has no limit, and each of
its connections keeps asyncio's 256 KiB TLS read buffer and OpenSSL's state while it
idles in the pool. Every service's telemetry timer wakes on one 2.5 s grid, so their
status patches arrive together and the pool grew with the fleet: 117 more such buffers
at 300 services than at 100 (docs/decisions/operator-memory.md). A request beyond the
bound waits for a free connection inside its own timeout; at 2,000 services about 50
status patches a second leave 16 connections mostly idle."""

log = logging.getLogger(__name__)


class KubeError(RuntimeError):
    """An API call failed in a way a retry later may fix."""


REFUSAL_MESSAGE_CHARS = 1024
"""How much of the API server's words a refusal keeps: they go into a condition."""


class ChildRefused(KubeError):
    """The API server refused a child as rendered (422, reason Invalid): the spec asks
    for something the Kubernetes API does not accept. A retry as such will not fix
    it, so the reconcile says so in status, naming the child, the fields and the API
    server's words (`causes`: (field, message) pairs from the Status' details;
    `message`: its message, used where it lists no cause)."""

    def __init__(
        self,
        kind: str,
        namespace: str,
        name: str,
        causes: tuple[tuple[str, str], ...],
        message: str,
    ) -> None:
        said = "; ".join(f"{field}: {text}" if field else text for field, text in causes)
        words = (said or message or "Unprocessable Entity")[:REFUSAL_MESSAGE_CHARS]
        super().__init__(f"the API server refused {kind} {namespace}/{name}: {words}")
        self.kind, self.causes, self.message = kind, causes, message


def load_config() -> None:
    """In-cluster credentials when running as a pod, else KUBECONFIG / ~/.kube/config."""
    try:
        kubernetes.config.load_incluster_config()  # type: ignore[no-untyped-call]
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()  # type: ignore[no-untyped-call]


def kopf_connection_limit(settings: OperatorSettings) -> int | None:
    """How many connections kopf's session may hold: KOPF_REQUEST_CONNECTIONS plus its
    watch streams, which hold theirs for minutes (the InferenceService watch and the
    peering watch, per namespace or once for all). None (no bound) with namespace
    globs: kopf then watches every matching namespace, a count not known at startup,
    and a bound below the streams would leave the requests no connection at all."""
    namespaces = settings.watch_namespaces
    if any(mark in name for name in namespaces for mark in "*?!"):
        return None
    streams_per_scope = 1 if settings.standalone else 2
    return KOPF_REQUEST_CONNECTIONS + streams_per_scope * max(1, len(namespaces))


def api_session(
    tls: ssl.SSLContext | bool,
    headers: Mapping[str, str],
    connections: int | None,
    proxy: str | None = None,
    trust_env: bool = False,
) -> aiohttp.ClientSession:
    """The session kopf talks to the apiserver through, as kopf builds its own but with
    at most `connections` connections (None: no bound, kopf's default). Made inside
    the event loop (the login handler is async): aiohttp binds a session to its loop."""
    connector = aiohttp.TCPConnector(limit=connections or 0, ssl=tls)
    return aiohttp.ClientSession(
        connector=connector, headers=dict(headers), proxy=proxy, trust_env=trust_env
    )


CHILD_WRITE_CONNECTIONS = 8
"""Connections the children's writes may hold. They ran on asyncio's default thread pool
(min(32, CPUs + 4) threads: 6 on a 2-core host) through the client's pool, so about as
many were in flight at once; a burst of new services queues for a connection here, no
longer for a thread, and the wait is not counted in a request's timeout."""
WRITE_TIMEOUT = aiohttp.ClientTimeout(
    total=None, sock_connect=10, sock_read=REQUEST_TIMEOUT_SECONDS
)
NOT_FOUND, CONFLICT, UNPROCESSABLE = 404, 409, 422
# The children's kinds are built in (manifests.build_children), so their paths are known
# without discovery: kind -> the resource's plural.
CHILD_PLURALS: dict[str, str] = {
    "Secret": "secrets",
    "ConfigMap": "configmaps",
    "Service": "services",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "NetworkPolicy": "networkpolicies",
    "ResourceClaimTemplate": "resourceclaimtemplates",
    "Deployment": "deployments",
}


def child_path(manifest: Mapping[str, Any], name: str | None = None) -> str:
    """The manifest's collection in its namespace, or the object `name` in it."""
    api_version, meta = str(manifest["apiVersion"]), manifest["metadata"]
    group = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = f"{group}/namespaces/{meta['namespace']}/{CHILD_PLURALS[str(manifest['kind'])]}"
    return path if name is None else f"{path}/{name}"


def _admin_secret_of(manifest: Mapping[str, Any]) -> tuple[str, str, str]:
    """(namespace, name, owner uid) of a rendered and adopted admin Secret."""
    meta = manifest["metadata"]
    return str(meta["namespace"]), str(meta["name"]), controller_uid(manifest) or ""


class Refused(Exception):
    """The apiserver answered with an error status. `reason` is its status line's text, as
    the client library's ApiException carried it, so a KubeError reads as it did;
    `answer` the Status object it sent, when it sent one (refusal_of reads it)."""

    def __init__(self, status: int, reason: str, answer: Mapping[str, Any] | None = None) -> None:
        super().__init__(f"{status} {reason}")
        self.status, self.reason = status, reason
        self.answer: Mapping[str, Any] = answer or {}


def status_object(answer: bytes) -> Mapping[str, Any] | None:
    """The metav1.Status of an error answer, None when it is not one (a proxy's page)."""
    try:
        found = json.loads(answer)
    except ValueError:
        return None
    return found if isinstance(found, dict) and found.get("kind") == "Status" else None


def refusal_of(refused: Refused, kind: str, namespace: str, name: str) -> ChildRefused | KubeError:
    """A refused write of a child as the reconcile tells it: a ChildRefused for the API
    server's validation (422 Invalid), naming each field it gave, else a KubeError
    with the status line as before (a conflict, a quota, a webhook down: retried)."""
    answer = refused.answer
    if refused.status != UNPROCESSABLE or answer.get("reason") != "Invalid":
        return KubeError(f"{kind} {namespace}/{name}: {refused.reason}")
    details = answer.get("details")
    listed = details.get("causes") if isinstance(details, Mapping) else None
    causes = tuple(
        (str(cause.get("field") or ""), str(cause.get("message") or ""))
        for cause in (listed if isinstance(listed, list) else [])
        if isinstance(cause, Mapping)
    )
    return ChildRefused(kind, namespace, name, causes, str(answer.get("message") or ""))


def tls_context(configuration: Any) -> ssl.SSLContext:
    """The client library's TLS settings (its rest.py pool arguments) as an SSL context."""
    context = ssl.create_default_context(
        cafile=configuration.ssl_ca_cert, cadata=configuration.ca_cert_data
    )
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif configuration.assert_hostname is False:
        context.check_hostname = False
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file)
    return context


class ApiRequests:
    """JSON requests to the apiserver on an aiohttp session, as the client library makes
    them: its host, TLS, proxy and User-Agent (the apiserver names the field manager of a
    write after it, so managedFields read as before), and its bearer token computed per
    request, so the client's refresh hook still renews an expiring token (in a pod, the
    projected service-account token is read again).

    Why not the client: a request through it and a worker thread cost 1.2 ms of CPU in
    the fleet bench's profile, one on this session about 0.4 (decisions/operator-api-cost.md,
    seventh pass: 38.4 -> 34.0 ms per new service). The session is opened in the
    running event loop on first use (aiohttp binds a session to its loop), and again if
    a later call runs in another loop (tests run one per `asyncio.run`; `close` the one
    before).
    """

    def __init__(self, configuration: Any, headers: Mapping[str, str], connections: int) -> None:
        self._configuration = configuration
        self._base = str(configuration.host).rstrip("/")
        self._tls = tls_context(configuration)
        self._headers = dict(headers)
        self._connections = connections
        hostname = configuration.tls_server_name or configuration.assert_hostname
        self._server_hostname = hostname if isinstance(hostname, str) and hostname else None
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _open(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._loop is not loop:
            self._session = api_session(
                self._tls, self._headers, self._connections, proxy=self._configuration.proxy
            )
            self._loop = loop
        return self._session

    def _auth(self) -> dict[str, str]:
        headers = {}
        for setting in self._configuration.auth_settings().values():
            if setting["in"] == "header" and setting["value"]:
                headers[setting["key"]] = setting["value"]
        return headers

    async def send(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """The apiserver's JSON answer; Refused for an error status. Transport errors
        (aiohttp.ClientError, TimeoutError) pass through."""
        headers = {"Accept": "application/json", **self._auth()}
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body)
        async with self._open().request(
            method,
            self._base + path,
            data=data,
            headers=headers,
            timeout=WRITE_TIMEOUT,
            server_hostname=self._server_hostname,
        ) as response:
            answer = await response.read()
            if not 200 <= response.status < 300:
                raise Refused(response.status, response.reason or "", status_object(answer))
        found: dict[str, Any] = json.loads(answer)
        return found

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _body(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest without apiVersion and kind: what a patch sends and drift compares."""
    return {k: v for k, v in manifest.items() if k not in ("apiVersion", "kind")}


# What the client library raises when it gets no answer from the API server: urllib3's
# errors (MaxRetryError around a refused or reset connection, ProtocolError, its read
# and connect timeouts) and the socket's and TLS layer's own (OSError).
UNREACHABLE_ERRORS: tuple[type[Exception], ...] = (urllib3.exceptions.HTTPError, OSError)


def unreachable(what: str, error: BaseException) -> KubeError:
    """A call that got no answer, as a KubeError naming the API server unreachable and the
    error's kind (and its cause's, for urllib3's MaxRetryError): never the error's own
    words, which repeat the request's URL and headers."""
    kinds = [type(error).__name__]
    cause = getattr(error, "reason", None) or error.__cause__
    if isinstance(cause, BaseException):
        kinds.append(type(cause).__name__)
    return KubeError(f"{what}: the API server is unreachable ({': '.join(kinds)})")


async def _run(function: Callable[[], T], what: str) -> T:
    """`function` (a client call) in a worker thread. An ApiException (an answer) and a
    KubeError pass through; an error that means no answer came is a KubeError
    (`unreachable`), so every caller's `except KubeError` covers an unreachable API
    server too."""
    try:
        return await asyncio.to_thread(function)
    except UNREACHABLE_ERRORS as error:
        raise unreachable(what, error) from error


def _recorded(store: ChildStore | None, kind: str, written: dict[str, Any] | None) -> None:
    """Keep the apiserver's answer to the operator's own write (None: nothing written)."""
    if store is not None and written is not None and store.synced(kind):
        store.record(kind, written)


class ScopeWatch:
    """One LIST, then a WATCH from its resourceVersion, of one kind in one scope.

    A scope is a namespace, or None for all. It runs in a daemon thread of its
    own: the client is synchronous and a watch blocks for minutes, while the
    shared worker pool is for short calls. A stream the apiserver ends
    resumes where it stopped; a 410 (that resourceVersion is compacted away)
    or any failure marks the store lost and lists again, after a failure
    only once WATCH_RETRY_SECONDS have passed.

    Neither the LIST nor the events are turned into the client's typed objects:
    each object reaches the store as the apiserver's JSON. Typing a running
    pod's event cost 1.0-1.2 ms of CPU against 0.05 ms for its JSON, and the stores
    read a dozen fields (pod_view.py) or compare JSON (child_store.py).
    Subclasses fill their store: `replace`, `put`, `remove` and `lost`.
    """

    def __init__(
        self,
        list_namespaced: Callable[..., Any],
        list_all: Callable[..., Any],
        namespace: str | None,
        what: str,
        server_timeout_seconds: int,
        client_timeout_seconds: int,
        watch_factory: Callable[[], Any],
    ) -> None:
        # kopf's watch timeouts: the apiserver ends each stream after the first,
        # the client gives up on a silent one after the second.
        self._server_timeout = server_timeout_seconds
        self._client_timeout = client_timeout_seconds
        self.scope = namespace or "all namespaces"
        self.what = what
        self._args: tuple[str, ...] = ()
        if namespace is None:
            self._list = _untyped(list_all)
        else:
            self._list, self._args = _untyped(list_namespaced), (namespace,)
        self._watch_factory = watch_factory
        self._watch: Any = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self.run, name=f"{what} watch {self.scope}")
        self._thread.daemon = True

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._watch is not None:
            self._watch.stop()

    def run(self) -> None:
        version = ""
        while not self._stopping.is_set():
            try:
                version = self.follow(version or self.relist())
            except Exception as error:  # noqa: BLE001  any failure: list again, never die
                self.failed(error)
                version = ""
                if self._stopping.is_set():
                    return
                if isinstance(error, ApiException) and error.status == 410:
                    continue  # expired: the next LIST is the remedy, at once
                log.warning("%s watch (%s) failed: %s; listing again", self.what, self.scope, error)
                self._stopping.wait(WATCH_RETRY_SECONDS)

    def relist(self) -> str:
        """Fill the store from a LIST; the resourceVersion to watch from."""
        answer = self._list(
            *self._args,
            label_selector=SERVICE_LABEL,
            _request_timeout=REQUEST_TIMEOUT_SECONDS,
            _preload_content=False,
        )
        listed = json.loads(answer.data)
        self.replace(listed.get("items") or [])
        return str(listed["metadata"]["resourceVersion"])

    def follow(self, version: str) -> str:
        """Apply the watch's events until the apiserver ends it; the version to resume from."""
        for event in self._stream(version):
            if self._stopping.is_set():
                break
            item = event["object"]
            version = item.get("metadata", {}).get("resourceVersion") or version
            if event["type"] == "BOOKMARK":
                continue
            if event["type"] == "DELETED":
                self.remove(item)
            else:
                self.put(item)
        return version

    def replace(self, items: list[dict[str, Any]]) -> None:
        raise NotImplementedError

    def put(self, item: dict[str, Any]) -> None:
        raise NotImplementedError

    def remove(self, item: dict[str, Any]) -> None:
        raise NotImplementedError

    def lost(self) -> None:
        raise NotImplementedError

    def failed(self, error: Exception) -> None:
        """The LIST or the watch failed (a 410 included): the store may have missed events."""
        self.lost()

    def _stream(self, version: str) -> Any:
        watch = self._watch = self._watch_factory()
        return watch.stream(
            self._list,
            *self._args,
            label_selector=SERVICE_LABEL,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=self._server_timeout,
            _request_timeout=(10, self._client_timeout),
        )


def _untyped(method: Callable[..., Any]) -> Callable[..., Any]:
    """The client method without its docstring, so the watch finds no type to build and
    hands each event's object over as JSON (errors, a 410 among them, still raise)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return method(*args, **kwargs)

    return call


class PodWatch(ScopeWatch):
    """The Fusebox pods of one scope, kept in a PodStore for the ticks."""

    def __init__(
        self,
        core: Any,
        namespace: str | None,
        store: PodStore,
        server_timeout_seconds: int,
        client_timeout_seconds: int,
        watch_factory: Callable[[], Any] = kubernetes.watch.Watch,
    ) -> None:
        super().__init__(
            core.list_namespaced_pod,
            core.list_pod_for_all_namespaces,
            namespace,
            "pod",
            server_timeout_seconds,
            client_timeout_seconds,
            watch_factory,
        )
        self.store = store

    def replace(self, items: list[dict[str, Any]]) -> None:
        self.store.replace(_stored(pod) for pod in items)

    def put(self, item: dict[str, Any]) -> None:
        self.store.put(_stored(item))

    def remove(self, item: dict[str, Any]) -> None:
        self.store.remove(item["metadata"]["namespace"], item["metadata"]["name"])

    def lost(self) -> None:
        self.store.lost()


def _stored(pod: Mapping[str, Any]) -> StoredPod:
    metadata = pod["metadata"]
    return StoredPod(
        namespace=metadata["namespace"],
        labels=dict(metadata.get("labels") or {}),
        deployment=controlling_deployment(pod),
        view=pod_view(pod),
    )


# The child kinds kept by a watch (child_store.py), with the client and its LIST
# methods (namespaced, all namespaces). The admin Secret is not among them: watching
# Secrets needs list and watch of every Secret in scope, which the operator's role
# does not grant (operator/rbac/clusterrole.yaml); a resync reads it by name.
WATCHED_CHILD_KINDS: dict[str, tuple[str, str, str]] = {
    "ConfigMap": ("CoreV1Api", "list_namespaced_config_map", "list_config_map_for_all_namespaces"),
    "Service": ("CoreV1Api", "list_namespaced_service", "list_service_for_all_namespaces"),
    "PodDisruptionBudget": (
        "PolicyV1Api",
        "list_namespaced_pod_disruption_budget",
        "list_pod_disruption_budget_for_all_namespaces",
    ),
    "NetworkPolicy": (
        "NetworkingV1Api",
        "list_namespaced_network_policy",
        "list_network_policy_for_all_namespaces",
    ),
    "Deployment": ("AppsV1Api", "list_namespaced_deployment", "list_deployment_for_all_namespaces"),
}


class ChildWatch(ScopeWatch):
    """One child kind of one scope, kept in a ChildStore as the apiserver's JSON (the
    drift comparison reads JSON)."""

    def __init__(
        self,
        api_client: Any,
        kind: str,
        namespace: str | None,
        store: ChildStore,
        server_timeout_seconds: int,
        client_timeout_seconds: int,
        watch_factory: Callable[[], Any] = kubernetes.watch.Watch,
    ) -> None:
        api_name, namespaced, everywhere = WATCHED_CHILD_KINDS[kind]
        api = getattr(kubernetes.client, api_name)(api_client)
        super().__init__(
            getattr(api, namespaced),
            getattr(api, everywhere),
            namespace,
            kind,
            server_timeout_seconds,
            client_timeout_seconds,
            watch_factory,
        )
        self.kind = kind
        self.store = store

    def replace(self, items: list[dict[str, Any]]) -> None:
        self.store.replace(self.kind, items)

    def put(self, item: dict[str, Any]) -> None:
        self.store.put(self.kind, item)

    def remove(self, item: dict[str, Any]) -> None:
        self.store.remove(self.kind, item)

    def lost(self) -> None:
        self.store.lost(self.kind)


class EndpointSliceWatch(ScopeWatch):
    """The EndpointSlices of the Fusebox Services of one scope, kept in an EndpointStore.

    Selected by `fusebox.dev/service` like the pods: the slice controller copies a
    Service's labels onto its slices, so no other Service's slice reaches the operator.
    """

    def __init__(
        self,
        api_client: Any,
        namespace: str | None,
        store: EndpointStore,
        server_timeout_seconds: int,
        client_timeout_seconds: int,
        watch_factory: Callable[[], Any] = kubernetes.watch.Watch,
    ) -> None:
        api = kubernetes.client.DiscoveryV1Api(api_client)
        super().__init__(
            api.list_namespaced_endpoint_slice,
            api.list_endpoint_slice_for_all_namespaces,
            namespace,
            "endpointslice",
            server_timeout_seconds,
            client_timeout_seconds,
            watch_factory,
        )
        self.store = store

    def replace(self, items: list[dict[str, Any]]) -> None:
        self.store.replace(
            (item["metadata"]["namespace"], item["metadata"]["name"], slice_endpoints(item))
            for item in items
        )

    def put(self, item: dict[str, Any]) -> None:
        metadata = item["metadata"]
        self.store.put(metadata["namespace"], metadata["name"], slice_endpoints(item))

    def remove(self, item: dict[str, Any]) -> None:
        self.store.remove(item["metadata"]["namespace"], item["metadata"]["name"])

    def lost(self) -> None:
        self.store.lost("the EndpointSlice watch stopped", time.time())

    def failed(self, error: Exception) -> None:
        self.store.lost(slices_unread(error), time.time())


def slices_unread(error: Exception) -> str:
    """Why the EndpointSlices could not be read, in an on-call engineer's words (never the
    request's URL or headers, which an ApiException's text repeats)."""
    if isinstance(error, ApiException):
        answer = f"the API server answered {error.status} {error.reason}"
        if error.status in (401, 403):
            return f"{answer}: the operator may not list and watch endpointslices.discovery.k8s.io"
        if error.status == 410:
            return f"{answer}: the watch expired, listing again"
        return answer
    if isinstance(error, UNREACHABLE_ERRORS):
        return str(unreachable("EndpointSlices", error))
    return f"EndpointSlices: {type(error).__name__}"


class Kube:
    def __init__(self, configuration: kubernetes.client.Configuration | None = None) -> None:
        """`configuration`: the client library's (None: its default, as load_config set it)."""
        self.api_client = kubernetes.client.ApiClient(configuration)
        self.core = kubernetes.client.CoreV1Api(self.api_client)
        self.custom = kubernetes.client.CustomObjectsApi(self.api_client)
        self.requests = ApiRequests(
            self.api_client.configuration, self.api_client.default_headers, CHILD_WRITE_CONNECTIONS
        )
        self._pod_stores: dict[str | None, PodStore] = {}
        self._pod_watches: list[PodWatch] = []
        self._child_stores: dict[str | None, ChildStore] = {}
        self._child_watches: list[ChildWatch] = []
        self._endpoint_stores: dict[str | None, EndpointStore] = {}
        self._endpoint_watches: list[EndpointSliceWatch] = []
        self._endpoints_since: float | None = None  # when the EndpointSlice watches started

    # ----- nodes -----
    async def node_vram_mib(self, product: str) -> list[int]:
        """nvidia.com/gpu.memory (MiB) of the nodes a pod of this product could land on."""
        selector = f"{NODE_PRODUCT_LABEL}={product}" if product else NODE_VRAM_LABEL

        def call() -> list[int]:
            # Raw JSON: typing each Node (its images, its conditions) only to read one
            # label cost more than the rest of a new service's reconcile on 25 nodes.
            answer: Any = self.core.list_node(
                label_selector=selector,
                _request_timeout=REQUEST_TIMEOUT_SECONDS,
                _preload_content=False,
            )
            values = []
            for node in json.loads(answer.data).get("items") or []:
                raw = ((node.get("metadata") or {}).get("labels") or {}).get(NODE_VRAM_LABEL)
                if isinstance(raw, str) and raw.isdigit():
                    values.append(int(raw))
            return values

        return await _run(call, f"nodes labelled {selector}")

    # ----- InferenceServices -----
    async def read_service_status(self, namespace: str, name: str) -> dict[str, Any]:
        """The InferenceService's status as stored now ({} before anything wrote it)."""

        def call() -> dict[str, Any]:
            found = self.custom.get_namespaced_custom_object(
                *(SERVICE_GROUP, SERVICE_VERSION, namespace, SERVICE_PLURAL, name),
                _request_timeout=REQUEST_TIMEOUT_SECONDS,
            )
            return dict(cast(dict[str, Any], found).get("status") or {})

        try:
            return await _run(call, f"InferenceService {namespace}/{name}")
        except ApiException as error:
            raise KubeError(f"InferenceService {namespace}/{name}: {error.reason}") from error

    async def actions_told(self, namespace: str, name: str, ids: Sequence[str]) -> set[str]:
        """Of the action ids `ids`, those an Event on the InferenceService already names
        (an action's event ends with `[id]`: status.transition_events). Events that cannot
        be read name none: the action is then told again, a rare second event rather
        than an action told nowhere."""
        selector = f"involvedObject.kind=InferenceService,involvedObject.name={name}"

        def call() -> set[str]:
            answer: Any = self.core.list_namespaced_event(
                namespace,
                field_selector=selector,
                _request_timeout=REQUEST_TIMEOUT_SECONDS,
                _preload_content=False,
            )
            items = json.loads(answer.data).get("items") or []
            messages = [str(event.get("message") or "") for event in items]
            return {i for i in ids if any(f"[{i}]" in message for message in messages)}

        try:
            return await _run(call, f"events of InferenceService {namespace}/{name}")
        except (ApiException, KubeError) as error:
            reason = error.reason if isinstance(error, ApiException) else str(error)
            log.warning(
                "%s/%s: events unread, replayed actions told again: %s", namespace, name, reason
            )
            return set()

    # ----- children -----
    async def apply(self, manifest: dict[str, Any], scale: bool = True) -> Applied:
        """Create the object, or bring it to the manifest when it differs; writes only then.

        The child is compared as the watch last saw it (child_store.py) when its
        kind is watched and synced, else as a GET reads it. Every write carries
        the resourceVersion it was computed from, so a view that has fallen
        behind is refused (409) and the child is read again and compared once
        more, never written over. With `scale` False a Deployment keeps the
        replicas it has (the autoscaler's).
        """
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        namespace = manifest["metadata"]["namespace"]
        store = self._child_store(namespace)
        try:
            known = store.get(kind, namespace, name) if store is not None else UNKNOWN
            if isinstance(known, dict) or known is None:
                try:
                    return await self._bring(manifest, known, scale, store)
                except Refused as refused:
                    if refused.status not in (CONFLICT, NOT_FOUND):
                        raise
                    # the watch's view was behind the apiserver's: read it
            current = await self._read_child(manifest)
            try:
                return await self._bring(manifest, current, scale, store)
            except Refused as refused:
                if refused.status == CONFLICT and current is None:
                    return Applied(manifest, "unchanged")  # created concurrently
                raise
        except Refused as error:
            raise refusal_of(error, kind, namespace, name) from error
        except (aiohttp.ClientError, TimeoutError) as error:
            raise unreachable(f"{kind} {namespace}/{name}", error) from error

    async def _read_child(self, manifest: Mapping[str, Any]) -> dict[str, Any] | None:
        """The child as the apiserver holds it now (None: absent)."""
        try:
            return await self.requests.send(
                "GET", child_path(manifest, manifest["metadata"]["name"])
            )
        except Refused as refused:
            if refused.status == NOT_FOUND:
                return None
            raise

    async def _bring(
        self,
        manifest: dict[str, Any],
        current: dict[str, Any] | None,
        scale: bool,
        store: ChildStore | None,
    ) -> Applied:
        """One attempt to make `current` (None: absent) say what the manifest says."""
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        if current is None:
            written = await self.requests.send("POST", child_path(manifest), manifest)
            _recorded(store, kind, written)
            return Applied(manifest, "created")
        if kind == "Deployment":
            if not scale:
                replicas = current["spec"].get("replicas", manifest["spec"]["replicas"])
                manifest = {**manifest, "spec": {**manifest["spec"], "replicas": replicas}}
            applied, changed = await self._update_deployment(current, manifest)
            _recorded(store, kind, changed)
            return applied
        body = _body(manifest)
        drifted = differences(body, current)
        if not drifted:
            return Applied(manifest, "unchanged")
        # The version compared against: a merge patch carrying it is refused if stale.
        version = current["metadata"]["resourceVersion"]
        written = await self.requests.send(
            "PATCH",
            child_path(manifest, name),
            {**body, "metadata": {**body["metadata"], "resourceVersion": version}},
            content_type="application/merge-patch+json",
        )
        _recorded(store, kind, written)
        return Applied(manifest, "updated", drifted)

    async def _update_deployment(
        self, current: dict[str, Any], manifest: dict[str, Any]
    ) -> tuple[Applied, dict[str, Any] | None]:
        meta = manifest["metadata"]
        path = child_path(manifest, meta["name"])
        version = current["metadata"]["resourceVersion"]
        wanted_hash = meta["annotations"][TEMPLATE_HASH_ANNOTATION]
        current_hash = (current["metadata"].get("annotations") or {}).get(TEMPLATE_HASH_ANNOTATION)
        # The count is compared on its own below: a hand scale is a patch, not a replace.
        spec = {key: value for key, value in manifest["spec"].items() if key != "replicas"}
        wanted = {**_body(manifest), "spec": spec}
        drifted = (
            ["metadata.annotations." + TEMPLATE_HASH_ANNOTATION]
            if current_hash != wanted_hash
            else differences(wanted, current)
        )
        if drifted:
            if current["spec"].get("replicas") != manifest["spec"]["replicas"]:
                drifted = [*drifted, "spec.replicas"]  # the replace sets it too
            # Replace: a merge patch would keep stale list entries (env, volumes).
            body = dict(manifest)
            body["metadata"] = {**meta, "resourceVersion": version}
            written = await self.requests.send("PUT", path, body)
            return Applied(manifest, "updated", drifted), written
        if current["spec"].get("replicas") != manifest["spec"]["replicas"]:
            written = await self.requests.send(
                "PATCH",
                path,
                {
                    "metadata": {"resourceVersion": version},
                    "spec": {"replicas": manifest["spec"]["replicas"]},
                },
                content_type="application/merge-patch+json",
            )
            return Applied(manifest, "scaled", ["spec.replicas"]), written
        return Applied(manifest, "unchanged"), None

    async def create_secret_once(
        self, manifest: dict[str, Any], likely_absent: bool = False
    ) -> bool:
        """Create the admin-token Secret if absent; True when created. Never overwrites.

        It reads before it creates: every resync calls this, and a create refused
        with 409 would be a failed write per service per interval in the
        apiserver's request metrics and audit log. For a service just created
        (`likely_absent`) the read would only say 404: it creates at once, and a
        Secret already there is a 409 and one read. A Secret already there must be
        this service's (admin_secret.admin_token): else AdminSecretRefused.
        """
        held = None if likely_absent else await self._admin_token_held(*_admin_secret_of(manifest))
        return held is None and await self._create_secret(manifest) is None

    async def _create_secret(self, manifest: dict[str, Any]) -> str | None:
        """POST the admin Secret: None when created; else (409) the token of the one
        already there, there before us or created concurrently (AdminSecretRefused
        where it is not this service's)."""
        namespace, name, owner_uid = _admin_secret_of(manifest)
        try:
            await self.requests.send("POST", child_path(manifest), manifest)
            return None
        except Refused as refused:
            if refused.status != CONFLICT:
                raise KubeError(f"Secret {namespace}/{name}: {refused.reason}") from refused
        except (aiohttp.ClientError, TimeoutError) as error:
            raise unreachable(f"Secret {namespace}/{name}", error) from error
        return await self.read_admin_token(namespace, name, owner_uid)

    async def close(self) -> None:
        """Close the children's session (the watches stop with stop_watching)."""
        await self.requests.close()

    async def check_secret(self, manifest: dict[str, Any]) -> tuple[bool, str]:
        """The admin Secret as a resync sees it, in one read: (created, the token it holds).

        Absent (deleted outside Fusebox): created from `manifest`, whose token is then the
        one held. Present: its token, which may have been rotated since the last read;
        AdminSecretRefused where it is no longer this service's Secret.
        """
        held = await self._admin_token_held(*_admin_secret_of(manifest))
        if held is not None:
            return False, held
        held = await self._create_secret(manifest)
        if held is None:
            return True, str(manifest["stringData"][ADMIN_TOKEN_KEY])
        return False, held  # created meanwhile

    async def read_admin_token(self, namespace: str, name: str, owner_uid: str) -> str:
        """The token of the service `owner_uid`'s admin Secret `name`: a KubeError where
        it cannot be read, AdminSecretRefused where it is not that service's."""
        held = await self._admin_token_held(namespace, name, owner_uid)
        if held is None:
            raise KubeError(f"Secret {namespace}/{name}: Not Found")
        return held

    async def _admin_token_held(self, namespace: str, name: str, owner_uid: str) -> str | None:
        """The token of the Secret the apiserver holds at that name (None: absent), if it
        is the service `owner_uid`'s (else AdminSecretRefused)."""
        where = {"namespace": namespace, "name": name}
        try:
            served = await self._read_child(
                {"apiVersion": "v1", "kind": "Secret", "metadata": where}
            )
        except Refused as error:
            raise KubeError(f"Secret {namespace}/{name}: {error.reason}") from error
        except (aiohttp.ClientError, TimeoutError) as error:
            raise unreachable(f"Secret {namespace}/{name}", error) from error
        return None if served is None else admin_token(served, owner_uid)

    # ----- pods -----
    def watch_pods(self, settings: OperatorSettings) -> None:
        """Keep the Fusebox pods in memory: one watch per namespace, or one for all."""
        for scope in settings.pod_watch_scopes:
            store = self._pod_stores[scope] = PodStore()
            watch = PodWatch(
                self.core,
                scope,
                store,
                settings.watch_server_timeout_seconds,
                settings.watch_client_timeout_seconds,
            )
            self._pod_watches.append(watch)
            watch.start()

    def watch_children(self, settings: OperatorSettings) -> None:
        """Keep the watched child kinds in memory: per scope, one watch per kind."""
        for scope in settings.pod_watch_scopes:
            store = self._child_stores[scope] = ChildStore()
            for kind in WATCHED_CHILD_KINDS:
                watch = ChildWatch(
                    self.api_client,
                    kind,
                    scope,
                    store,
                    settings.watch_server_timeout_seconds,
                    settings.watch_client_timeout_seconds,
                )
                self._child_watches.append(watch)
                watch.start()

    def watch_endpoints(self, settings: OperatorSettings) -> None:
        """Keep the Fusebox Services' EndpointSlices in memory: per scope, one watch."""
        self._endpoints_since = time.time()
        for scope in settings.pod_watch_scopes:
            store = self._endpoint_stores[scope] = EndpointStore(self._endpoints_since)
            watch = EndpointSliceWatch(
                self.api_client,
                scope,
                store,
                settings.watch_server_timeout_seconds,
                settings.watch_client_timeout_seconds,
            )
            self._endpoint_watches.append(watch)
            watch.start()

    def service_endpoints(self, namespace: str, service: str) -> EndpointsRead | None:
        """The ready endpoints of the Service's slices as the watch holds them; no request.
        None when no EndpointSlice watch was started; a namespace none covers reads as
        never listed since they started."""
        if self._endpoints_since is None:
            return None
        store = self._endpoint_stores.get(namespace) or self._endpoint_stores.get(None)
        if store is None:
            cause = f"no EndpointSlice watch covers namespace {namespace}"
            return EndpointsRead(service, None, self._endpoints_since, cause)
        return store.read(namespace, service)

    def _child_store(self, namespace: str) -> ChildStore | None:
        return self._child_stores.get(namespace) or self._child_stores.get(None)

    def children_touched(self, namespace: str, service: str) -> bool:
        """Whether a watch saw a child of this service deleted or edited since last asked."""
        store = self._child_store(namespace)
        return store is not None and store.take_touched(namespace, service)

    def stop_watching(self) -> None:
        for watch in [*self._pod_watches, *self._child_watches, *self._endpoint_watches]:
            watch.stop()

    async def list_pods(
        self, namespace: str, labels: Mapping[str, str], deployment: str
    ) -> list[PodView]:
        """The pods carrying `labels` that `deployment` controls (a pod someone else made
        with the label is not the service's: pod_view.controlling_deployment), from the
        watched store when it is synced, else one LIST."""
        store = self._pod_stores.get(namespace) or self._pod_stores.get(None)
        watched = store.select(namespace, labels, deployment) if store is not None else None
        if watched is not None:
            return watched
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))

        def call() -> list[PodView]:
            # Unread (the client's stubs say V1PodList): the pods' JSON, as the watch reads it.
            answer: Any = self.core.list_namespaced_pod(
                namespace,
                label_selector=selector,
                _request_timeout=REQUEST_TIMEOUT_SECONDS,
                _preload_content=False,
            )
            items = json.loads(answer.data).get("items") or []
            return [pod_view(pod) for pod in items if controlling_deployment(pod) == deployment]

        try:
            return await _run(call, f"pods in {namespace}")
        except ApiException as error:
            raise KubeError(f"pods in {namespace}: {error.reason}") from error

    async def delete_pod(self, namespace: str, name: str, grace_seconds: int | None = None) -> bool:
        """Delete (the Deployment replaces it); False when it was already gone."""

        def call() -> bool:
            try:
                self.core.delete_namespaced_pod(
                    name,
                    namespace,
                    grace_period_seconds=grace_seconds,
                    _request_timeout=REQUEST_TIMEOUT_SECONDS,
                )
                return True
            except ApiException as error:
                if error.status == 404:
                    return False
                raise KubeError(f"delete pod {namespace}/{name}: {error.reason}") from error

        return await _run(call, f"delete pod {namespace}/{name}")

    async def set_deletion_costs(self, namespace: str, costs: Mapping[str, int]) -> None:
        """Annotate each pod with its pod-deletion-cost (deletion_cost.py), one merge patch
        a pod; a pod already gone is skipped. Refused or unreachable: a KubeError."""
        for name, cost in sorted(costs.items()):
            what = f"pod-deletion-cost of pod {namespace}/{name}"
            try:
                await self.requests.send(
                    "PATCH",
                    f"/api/v1/namespaces/{namespace}/pods/{name}",
                    deletion_cost_patch(cost),
                    content_type="application/merge-patch+json",
                )
            except Refused as refused:
                if refused.status != NOT_FOUND:
                    raise KubeError(f"{what}: {refused.reason}") from refused
            except (aiohttp.ClientError, TimeoutError) as error:
                raise unreachable(what, error) from error

    async def resize_server_memory(
        self, namespace: str, name: str, limit_bytes: int
    ) -> tuple[str, str] | None:
        """Ask the kubelet to grow the server container's memory in place (`pods/resize`).

        Returns (old limit, new limit) as quantities, or None when the pod is gone.
        The kubelet applies it where the node has room; otherwise the pod's
        PodResizePending condition says Deferred or Infeasible.
        """

        def call() -> tuple[str, str] | None:
            try:
                pod = self.core.read_namespaced_pod(
                    name, namespace, _request_timeout=REQUEST_TIMEOUT_SECONDS
                )
                containers = pod.spec.containers if pod.spec else []
                server = next(c for c in containers if c.name == SERVER_CONTAINER)
                limits = (server.resources and server.resources.limits) or {}
                requests = (server.resources and server.resources.requests) or {}
                old = str(limits.get("memory", ""))
                body = memory_resize_patch(limit_bytes, requests.get("memory") == old)
                self.core.patch_namespaced_pod_resize(
                    name, namespace, body, _request_timeout=REQUEST_TIMEOUT_SECONDS
                )
            except ApiException as error:
                if error.status == 404:
                    return None
                raise KubeError(f"resize pod {namespace}/{name}: {error.reason}") from error
            return old, memory_quantity(limit_bytes)

        return await _run(call, f"resize pod {namespace}/{name}")

    async def scale_deployment(self, namespace: str, name: str, replicas: int) -> bool:
        """Set the service's Deployment to `replicas`; True when it changed."""

        def call() -> bool:
            apps = kubernetes.client.AppsV1Api(self.api_client)
            try:
                current = apps.read_namespaced_deployment(
                    name, namespace, _request_timeout=REQUEST_TIMEOUT_SECONDS
                )
                if current.spec and current.spec.replicas == replicas:
                    return False
                apps.patch_namespaced_deployment(
                    name,
                    namespace,
                    {"spec": {"replicas": replicas}},
                    _request_timeout=REQUEST_TIMEOUT_SECONDS,
                )
            except ApiException as error:
                raise KubeError(f"scale deployment {namespace}/{name}: {error.reason}") from error
            return True

        return await _run(call, f"scale deployment {namespace}/{name}")

    async def deployment_replicas(self, namespace: str, name: str) -> tuple[int, int] | None:
        """(desired, ready) of the service's Deployment, or None when absent."""

        def call() -> tuple[int, int] | None:
            apps = kubernetes.client.AppsV1Api(self.api_client)
            try:
                deployment = apps.read_namespaced_deployment(
                    name, namespace, _request_timeout=REQUEST_TIMEOUT_SECONDS
                )
            except ApiException as error:
                if error.status == 404:
                    return None
                raise KubeError(f"deployment {namespace}/{name}: {error.reason}") from error
            desired = deployment.spec.replicas if deployment.spec else 0
            ready = deployment.status.ready_replicas if deployment.status else 0
            return (desired or 0, ready or 0)

        return await _run(call, f"deployment {namespace}/{name}")
