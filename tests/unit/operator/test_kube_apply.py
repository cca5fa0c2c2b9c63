"""Kube.apply writes only on drift: nothing for a child that carries the manifest, a
merge patch for a moved ConfigMap, a replace for a Deployment edited by hand (its
template hash unchanged), a replicas patch for one scaled by hand unless the
autoscaler owns the count. The admin Secret is read before it is created, so a
resync of an untouched service sends the apiserver no write at all, not even a
refused one.

With a synced child store (the watches' view, child_store.py) apply reads no
child from the apiserver: it compares against the store, creates what the store
says is absent, and writes with the store's resourceVersion; a view behind the
apiserver's is refused (409) and read again, never written over.

The writes go over HTTP on the operator's own aiohttp session (kube.ApiRequests),
here to a fake apiserver on loopback that keeps one object per path and answers
as the apiserver does: 404 for an absent object, 409 for a create of one that
exists or a write carrying a stale resourceVersion. The session carries the client
library's credentials and User-Agent (the apiserver names the field manager after
it), its token computed per request so an expiring one is renewed, and an answer
the apiserver refuses reads as the client's ApiException did."""

from __future__ import annotations

import asyncio
import base64
import copy
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import kubernetes
import pytest
from aiohttp import web

from fusebox_operator.admin_secret import AdminSecretRefused
from fusebox_operator.child_store import ChildStore
from fusebox_operator.kube import CHILD_PLURALS, ChildRefused, Kube, KubeError, child_path
from fusebox_operator.manifests import TEMPLATE_HASH_ANNOTATION

TOKEN = "apply-test-token"


@dataclass
class FakeApiserver:
    """One object per path. Every request is recorded as (method, path) in `calls`,
    every accepted write as (method, body) in `writes`, and the headers of each in
    `headers`. A write whose resourceVersion is not the stored one is refused (409).
    `refuse` answers a method with a status of its own instead."""

    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    writes: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    content_types: list[str] = field(default_factory=list)
    refuse: dict[str, int] = field(default_factory=dict)
    refusal: dict[str, Any] = field(default_factory=lambda: {"kind": "Status"})  # its body
    version: int = 8

    async def handle(self, request: web.Request) -> web.Response:
        method, path = request.method, request.path
        self.calls.append((method, path))
        self.headers.append(dict(request.headers))
        body = await request.json() if request.can_read_body else None
        if body is not None:
            self.content_types.append(request.content_type)
        if method in self.refuse:
            return web.json_response(self.refusal, status=self.refuse[method])
        if method == "POST":
            path = f"{path}/{body['metadata']['name']}"
            if path in self.objects:
                return web.json_response({"reason": "AlreadyExists"}, status=409)
            return self._write(method, path, body, body, 201)
        current = self.objects.get(path)
        if current is None:
            return web.json_response({"reason": "NotFound"}, status=404)
        if method == "GET":
            return web.json_response(current)
        version = (body.get("metadata") or {}).get("resourceVersion")
        if version is not None and version != current["metadata"]["resourceVersion"]:
            return web.json_response({"reason": "Conflict"}, status=409)
        stored = merged(current, body) if method == "PATCH" else body
        return self._write(method, path, body, stored, 200)

    def _write(
        self, method: str, path: str, body: dict[str, Any], stored: dict[str, Any], status: int
    ) -> web.Response:
        self.writes.append((method, body))
        stored = copy.deepcopy(stored)
        stored["metadata"]["resourceVersion"] = str(self.version)
        self.version += 1
        self.objects[path] = stored
        return web.json_response(stored, status=status)


def merged(current: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """A JSON merge patch (RFC 7386) of `patch` onto `current`."""
    out = copy.deepcopy(current)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def against(
    apiserver: FakeApiserver,
    call: Callable[[Kube], Awaitable[Any]],
    store: ChildStore | None = None,
    configure: Callable[[kubernetes.client.Configuration], None] = lambda _: None,
) -> Any:
    """`call` on a Kube whose client library is configured for the fake apiserver."""

    async def run() -> Any:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", apiserver.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        configuration = kubernetes.client.Configuration(
            host=f"http://127.0.0.1:{runner.addresses[0][1]}",
            api_key={"authorization": TOKEN},
            api_key_prefix={"authorization": "Bearer"},
        )
        configure(configuration)
        kube = Kube(configuration)
        if store is not None:
            kube._child_stores = {None: store}
        try:
            return await call(kube)
        finally:
            await kube.close()
            await runner.cleanup()

    return asyncio.run(run())


def holding(current: dict[str, Any] | None) -> FakeApiserver:
    """A fake apiserver that holds `current` (None: nothing) at its path."""
    apiserver = FakeApiserver()
    if current is not None:
        apiserver.objects[child_path(current, current["metadata"]["name"])] = current
    return apiserver


def apply(
    manifest: dict[str, Any], current: dict[str, Any] | None, scale: bool = True
) -> tuple[Any, list[tuple[str, dict[str, Any]]]]:
    apiserver = holding(current)
    applied = against(apiserver, lambda kube: kube.apply(manifest, scale=scale))
    return applied, [(verb_of[method], body) for method, body in apiserver.writes]


verb_of = {"POST": "create", "PATCH": "patch", "PUT": "replace", "GET": "get"}


def apply_with_store(
    manifest: dict[str, Any], current: dict[str, Any] | None, seen: dict[str, Any] | None
) -> tuple[Any, FakeApiserver, ChildStore]:
    """Apply with a synced store that saw `seen` (None: nothing) where the apiserver
    holds `current`."""
    store = ChildStore()
    store.replace(manifest["kind"], [] if seen is None else [seen])
    apiserver = holding(current)
    applied = against(apiserver, lambda kube: kube.apply(manifest), store)
    return applied, apiserver, store


def verbs(apiserver: FakeApiserver) -> list[str]:
    return [verb_of[method] for method, _ in apiserver.calls]


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


SERVICE_UID = "0123abcd-0000-0000-0000-000000000000"
TOKEN = "t" * 43  # as long as secrets.token_urlsafe(32)


def secret(controller: str | None = SERVICE_UID, token: str = TOKEN) -> dict[str, Any]:
    """The admin Secret adopted by the service `controller` (None: by nothing)."""
    owners = [{"kind": "InferenceService", "uid": controller, "controller": True}]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": "chat-admin",
            "namespace": "team",
            **({"ownerReferences": owners} if controller else {}),
        },
        "data": {"token": base64.b64encode(token.encode()).decode()},
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
    apiserver = holding(stored(config_map("{}")))
    applied = against(apiserver, lambda kube: kube.apply(config_map('{"hi": "hello"}')))
    assert applied.outcome == "updated"
    assert applied.drifted == ["data.canned-answers.json"]
    assert verbs(apiserver) == ["get", "patch"]
    assert apiserver.content_types == ["application/merge-patch+json"]
    assert apiserver.objects[child_path(config_map(""), "chat-config")]["data"] == {
        "canned-answers.json": '{"hi": "hello"}'
    }


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


def create_secret_once(apiserver: FakeApiserver, likely_absent: bool = False) -> bool:
    created: bool = against(
        apiserver, lambda kube: kube.create_secret_once(secret(), likely_absent=likely_absent)
    )
    return created


def test_an_existing_secret_is_read_and_never_created_again() -> None:
    apiserver = holding(stored(secret()))
    assert create_secret_once(apiserver) is False
    assert verbs(apiserver) == ["get"]


def test_a_missing_secret_is_created_and_a_concurrent_create_is_not_an_error() -> None:
    apiserver = holding(None)
    assert create_secret_once(apiserver) is True
    assert verbs(apiserver) == ["get", "create"]
    assert apiserver.calls[-1] == ("POST", "/api/v1/namespaces/team/secrets")
    # A new service's Secret is created without a read; one there already is a 409, then
    # one read to see whose it is.
    raced = holding(stored(secret()))
    assert create_secret_once(raced, likely_absent=True) is False
    assert verbs(raced) == ["create", "get"]


@pytest.mark.parametrize("likely_absent", [False, True])
def test_a_secret_someone_else_made_is_refused_and_left_as_it_is(likely_absent: bool) -> None:
    apiserver = holding(stored(secret(controller=None)))
    with pytest.raises(AdminSecretRefused, match="has no controller") as refused:
        create_secret_once(apiserver, likely_absent=likely_absent)
    assert TOKEN not in str(refused.value)
    assert apiserver.writes == []
    # Made by Fusebox for another service of that name (deleted, made again): refused too.
    apiserver = holding(stored(secret(controller="another-uid")))
    with pytest.raises(AdminSecretRefused, match="controlled by uid another-uid"):
        create_secret_once(apiserver, likely_absent=likely_absent)


def test_a_secret_of_the_service_with_a_short_token_is_refused() -> None:
    apiserver = holding(stored(secret(token="guessable")))
    with pytest.raises(
        AdminSecretRefused, match="a token of 9 characters, fewer than 32"
    ) as refused:
        create_secret_once(apiserver)
    assert "guessable" not in str(refused.value)


def test_a_resync_check_refuses_a_foreign_secret_and_reads_a_rotated_one() -> None:
    rotated = "r" * 40
    held = against(holding(stored(secret(token=rotated))), lambda kube: kube.check_secret(secret()))
    assert held == (False, rotated)
    foreign = holding(stored(secret(controller=None)))
    with pytest.raises(AdminSecretRefused):
        against(foreign, lambda kube: kube.check_secret(secret()))
    assert foreign.writes == []
    with pytest.raises(AdminSecretRefused):
        against(foreign, lambda kube: kube.read_admin_token("team", "chat-admin", SERVICE_UID))


def test_with_a_synced_store_an_unchanged_child_costs_no_request() -> None:
    current = stored(config_map("{}"))
    applied, apiserver, _ = apply_with_store(config_map("{}"), current, current)
    assert (applied.outcome, apiserver.calls) == ("unchanged", [])


def test_with_a_synced_store_a_missing_child_is_created_without_a_read() -> None:
    applied, apiserver, store = apply_with_store(config_map("{}"), None, None)
    assert (applied.outcome, verbs(apiserver)) == ("created", ["create"])
    # The apiserver's answer is kept: the next resync compares against it.
    kept = store.get("ConfigMap", "team", "chat-config")
    assert isinstance(kept, dict) and kept["metadata"]["resourceVersion"] == "8"


def test_a_drifted_child_is_patched_with_the_version_the_store_saw() -> None:
    current = stored(config_map("{}"))
    applied, apiserver, store = apply_with_store(config_map('{"hi": "hello"}'), current, current)
    assert applied.outcome == "updated" and verbs(apiserver) == ["patch"]
    assert apiserver.writes[0][1]["metadata"]["resourceVersion"] == "7"
    kept = store.get("ConfigMap", "team", "chat-config")
    assert isinstance(kept, dict) and kept["metadata"]["resourceVersion"] == "8"


def test_a_store_behind_the_apiserver_is_refused_then_read_and_compared_again() -> None:
    seen = stored(config_map("{}"))  # the store missed the operator's last write
    current = stored(config_map('{"hi": "hello"}'))
    current["metadata"]["resourceVersion"] = "9"
    applied, apiserver, _ = apply_with_store(config_map('{"hi": "hello"}'), current, seen)
    assert verbs(apiserver) == ["patch", "get"]  # refused (409), read, found as rendered
    assert (applied.outcome, apiserver.writes) == ("unchanged", [])


def test_a_child_the_store_missed_being_created_is_read_and_compared() -> None:
    current = stored(config_map("{}"))
    applied, apiserver, _ = apply_with_store(config_map("{}"), current, None)
    assert verbs(apiserver) == ["create", "get"]  # AlreadyExists, then read
    assert applied.outcome == "unchanged"


def test_a_child_deleted_since_the_store_saw_it_is_created_again() -> None:
    seen = stored(config_map("{}"))
    applied, apiserver, _ = apply_with_store(config_map('{"hi": "x"}'), None, seen)
    assert verbs(apiserver) == ["patch", "get", "create"]
    assert applied.outcome == "created"


def test_a_write_the_apiserver_refuses_reads_as_the_client_library_said_it() -> None:
    # The text the handler turns into a TemporaryError: the status line's reason, as
    # kubernetes.client's ApiException carried it.
    apiserver = holding(None)
    apiserver.refuse["POST"] = 422
    with pytest.raises(KubeError, match=r"^ConfigMap team/chat-config: Unprocessable Entity$"):
        against(apiserver, lambda kube: kube.apply(config_map("{}")))
    apiserver.refuse["POST"] = 403
    with pytest.raises(KubeError, match=r"^Secret team/chat-admin: Forbidden$"):
        create_secret_once(apiserver, likely_absent=True)


TOPOLOGY_KEY = (
    "spec.template.spec.affinity.podAntiAffinity.requiredDuringScheduling"
    "IgnoredDuringExecution[0].topologyKey"
)
INVALID_DEPLOYMENT = {  # as kube-apiserver answers a Deployment its validation refuses
    "kind": "Status",
    "apiVersion": "v1",
    "status": "Failure",
    "message": f'Deployment.apps "chat" is invalid: {TOPOLOGY_KEY}: Required value: '
    "can not be empty",
    "reason": "Invalid",
    "details": {
        "name": "chat",
        "group": "apps",
        "kind": "Deployment",
        "causes": [
            {
                "reason": "FieldValueRequired",
                "message": "Required value: can not be empty",
                "field": TOPOLOGY_KEY,
            }
        ],
    },
    "code": 422,
}


def test_a_child_the_apiserver_finds_invalid_is_refused_naming_its_field_in_its_words() -> None:
    apiserver = holding(None)
    apiserver.refuse["POST"] = 422
    apiserver.refusal = INVALID_DEPLOYMENT
    with pytest.raises(ChildRefused) as refused:
        against(apiserver, lambda kube: kube.apply(deployment()))
    assert refused.value.kind == "Deployment"
    assert refused.value.causes == ((TOPOLOGY_KEY, "Required value: can not be empty"),)
    assert str(refused.value) == (
        "the API server refused Deployment team/chat: "
        f"{TOPOLOGY_KEY}: Required value: can not be empty"
    )
    # Without causes, the Status message is the API server's words.
    apiserver.refusal = {**INVALID_DEPLOYMENT, "details": {"kind": "Deployment"}}
    with pytest.raises(ChildRefused, match=r'refused Deployment team/chat: Deployment.apps "chat"'):
        against(apiserver, lambda kube: kube.apply(deployment()))


def test_an_apiserver_out_of_reach_is_a_kube_error() -> None:
    async def unreachable(kube: Kube) -> Any:
        kube.requests._base = "http://127.0.0.1:9"  # the discard port: nothing listens
        return await kube.apply(config_map("{}"))

    with pytest.raises(KubeError, match=r"^ConfigMap team/chat-config: "):
        against(holding(None), unreachable)


def test_writes_carry_the_client_librarys_token_and_user_agent() -> None:
    # The apiserver names the field manager of a write after the User-Agent's first
    # word: kept, managedFields read as they did through the client library.
    apiserver = holding(None)
    against(apiserver, lambda kube: kube.apply(config_map("{}")))
    assert verbs(apiserver) == ["get", "create"]
    for headers in apiserver.headers:
        assert headers["Authorization"] == f"Bearer {TOKEN}"
        assert headers["User-Agent"] == kubernetes.client.ApiClient().user_agent
        assert headers["User-Agent"].startswith("OpenAPI-Generator/")


def test_a_token_the_client_library_renews_is_sent_from_the_next_request() -> None:
    # In a pod, load_incluster_config's hook reads the projected token again when it
    # is due; the session asks the configuration per request, as the client does.
    renewals = iter(range(1, 100))

    def renew(configuration: kubernetes.client.Configuration) -> None:
        configuration.api_key["authorization"] = f"token-{next(renewals)}"

    def with_hook(configuration: kubernetes.client.Configuration) -> None:
        configuration.refresh_api_key_hook = renew

    async def two_writes(kube: Kube) -> None:
        await kube.apply(config_map("{}"))
        await kube.apply(deployment())

    apiserver = holding(None)
    against(apiserver, two_writes, configure=with_hook)
    assert verbs(apiserver) == ["get", "create", "get", "create"]
    assert [h["Authorization"] for h in apiserver.headers] == [
        f"Bearer token-{n}" for n in (1, 2, 3, 4)
    ]


@pytest.mark.parametrize(
    ("manifest", "path"),
    [
        (config_map("{}"), "/api/v1/namespaces/team/configmaps/chat-config"),
        (deployment(), "/apis/apps/v1/namespaces/team/deployments/chat"),
        (
            {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": {"name": "chat", "namespace": "team"},
            },
            "/apis/networking.k8s.io/v1/namespaces/team/networkpolicies/chat",
        ),
    ],
)
def test_a_childs_path_needs_no_discovery(manifest: dict[str, Any], path: str) -> None:
    assert child_path(manifest, manifest["metadata"]["name"]) == path


def test_every_kind_the_operator_renders_has_a_path() -> None:
    from fusebox_operator import manifests
    from fusebox_operator.settings import OperatorSettings
    from fusebox_operator.sizing import size_memory
    from fusebox_operator.spec import parse_spec

    kinds = set()
    for gpu in ({"count": 0}, {"count": 1, "memoryGiB": 80, "deviceClassName": "gpu.example"}):
        parsed = parse_spec({"model": {"name": "m", "source": "pvc://models/m"}, "gpu": gpu})
        children = manifests.build_children(
            parsed, "chat", "team", size_memory(parsed, [81920]), OperatorSettings.from_env({}), "t"
        )
        kinds |= {child["kind"] for child in children}
    assert kinds <= set(CHILD_PLURALS)
    assert "ResourceClaimTemplate" in kinds
