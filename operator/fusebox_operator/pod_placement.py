"""Where an inference pod runs and who it is: `spec.pod`, and the chart's defaults for it.

Why: a platform team's GPU pools are tainted, spread over zones, pulled from
private registries and run under a RuntimeClass; none of that is Fusebox's to
decide, so a service (and the chart, for every service) says it in the Pod
API's own words. Everything else in the pod (security context, probes,
resources, env, volumes, containers) is Fusebox's: those names are refused
with a message saying so, and the labels and annotations Fusebox sets cannot
be overridden. Parsing and merging live here, apart from spec.py, because the
operator reads the same section twice: per service from the spec, and once
from the chart's `inference.pod` (settings.py). Pure: no client, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from fusebox_contract.model_fetch import FETCH_CONTAINER
from fusebox_operator.crd_schema import spec_schema

Manifest = dict[str, Any]

FUSEBOX_KEY_PREFIX = "fusebox.dev/"
"""Label and annotation keys under Fusebox's own domain are all reserved."""
FUSEBOX_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
)
"""The labels manifests.common_labels sets besides fusebox.dev/*: the Service,
the PDB and the NetworkPolicy select the pods by them."""
FUSEBOX_ANNOTATIONS = ("prometheus.io/scrape", "prometheus.io/port")
"""The annotations the pod template carries besides fusebox.dev/*."""

SERVER_CONTAINER = "server"
SIDECAR_CONTAINER = "sidecar"
POD_CONTAINERS = (SERVER_CONTAINER, SIDECAR_CONTAINER, FETCH_CONTAINER)
"""Every container an inference pod may have (the fetcher only for hf:// sources):
an AppArmor annotation naming another is refused by the API server."""
APPARMOR_ANNOTATION_PREFIX = "container.apparmor.security.beta.kubernetes.io/"
SECCOMP_ANNOTATION_PREFIXES = (
    "seccomp.security.alpha.kubernetes.io/",
    "container.seccomp.security.alpha.kubernetes.io/",
)
CONFINEMENT_ANNOTATION_PREFIXES = (APPARMOR_ANNOTATION_PREFIX, *SECCOMP_ANNOTATION_PREFIXES)
"""Annotations that choose a container's AppArmor or seccomp profile."""
CONFINED_PROFILES = ("runtime/default", "docker/default")

OWNED_FIELDS: dict[str, str] = {
    "securityContext": "restricted Pod Security is Fusebox's, whatever else is set",
    "containers": "Fusebox renders the server and its sidecar",
    "initContainers": "Fusebox renders the server and its sidecar",
    "ephemeralContainers": "Fusebox renders the server and its sidecar",
    "volumes": "Fusebox mounts the model claims, the admin token and its config",
    "volumeMounts": "Fusebox mounts the model claims, the admin token and its config",
    "resources": "Fusebox sizes memory and CPU from memory, server.cpu and gpu",
    "resourceClaims": "gpu.deviceClassName makes the pod's ResourceClaim",
    "env": "server.env passes variables through; the rest is wired from the spec",
    "command": "Fusebox runs the server and the sidecar",
    "args": "Fusebox runs the server and the sidecar",
    "livenessProbe": "probes follow telemetry.wedgeAfterSeconds",
    "readinessProbe": "probes follow telemetry.wedgeAfterSeconds",
    "startupProbe": "probes follow telemetry.wedgeAfterSeconds",
    "hostNetwork": "restricted Pod Security forbids it",
    "hostPID": "restricted Pod Security forbids it",
    "hostIPC": "restricted Pod Security forbids it",
    "hostUsers": "restricted Pod Security is Fusebox's",
    "privileged": "restricted Pod Security forbids it",
    "capabilities": "restricted Pod Security drops them all",
    "shareProcessNamespace": "the sidecar reads the server's memory through it",
    "automountServiceAccountToken": "inference pods never call the API server",
    "terminationGracePeriodSeconds": "it follows server.requestTimeoutSeconds",
    "nodeName": "the scheduler places the pod (nodeSelector, affinity)",
    "imagePullPolicy": "Fusebox sets IfNotPresent; pin an image by digest",
}
"""Pod fields a service may not set, each with the reason given in the refusal."""

QUALIFIED_NAME_PATTERN = (
    r"^(([a-z0-9]([-a-z0-9]*[a-z0-9])?)(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
"""A label key (also a taint key, a topologyKey): [DNS-subdomain prefix/]name; the
chart's values.schema.json holds the same pattern (definitions.qualifiedName)."""
QUALIFIED_NAME_MAX_LENGTH = 317  # a 253-character prefix, '/', a 63-character name
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
"""A label value (also an Equal toleration's value); definitions.labelValue in the chart."""
_QUALIFIED_NAME = re.compile(QUALIFIED_NAME_PATTERN)
_LABEL_VALUE = re.compile(LABEL_VALUE_PATTERN)
QUALIFIED_NAME_RULE = "[prefix/]name, the name at most 63 letters, digits, '-', '_' or '.'"
LABEL_VALUE_RULE = "at most 63 letters, digits, '-', '_' or '.', alphanumeric at both ends"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_DNS_SUBDOMAIN = re.compile(DNS_SUBDOMAIN_PATTERN)
DNS_SUBDOMAIN_MAX_LENGTH = 253
_IMAGE = re.compile(r"^[^\s]+$")
TOLERATION_KEYS = ("key", "operator", "value", "effect", "tolerationSeconds")
TOLERATION_OPERATORS = ("Exists", "Equal")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
AFFINITY_KEYS = ("nodeAffinity", "podAffinity", "podAntiAffinity")
REQUIRED_TERMS = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED_TERMS = "preferredDuringSchedulingIgnoredDuringExecution"
SPREAD_KEYS = (
    "maxSkew",
    "topologyKey",
    "whenUnsatisfiable",
    "labelSelector",
    "minDomains",
    "matchLabelKeys",
    "nodeAffinityPolicy",
    "nodeTaintsPolicy",
)
SPREAD_WHEN_UNSATISFIABLE = ("DoNotSchedule", "ScheduleAnyway")
INT32_MAX = 2**31 - 1  # maxSkew, minDomains and a preferred term's weight are int32
AFFINITY_WEIGHT_RANGE = (1, 100)
NODE_POLICIES = ("Honor", "Ignore")  # nodeAffinityPolicy, nodeTaintsPolicy


class PlacementError(ValueError):
    """`spec.pod` (or the chart's inference.pod) cannot be rendered as written."""


@dataclass(frozen=True)
class PodPlacement:
    """`spec.pod` parsed. None (or empty, for the maps): not set, so a default applies.

    Lists replace a default list whole; maps (nodeSelector, labels, annotations)
    merge key by key with the service's value winning; affinity is one value.
    """

    tolerations: tuple[Manifest, ...] | None = None
    affinity: Manifest | None = None
    node_selector: tuple[tuple[str, str], ...] = ()
    topology_spread_constraints: tuple[Manifest, ...] | None = None
    image_pull_secrets: tuple[str, ...] | None = None
    runtime_class_name: str | None = None
    priority_class_name: str | None = None
    service_account_name: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()
    image: str | None = None


_MAPS = ("node_selector", "labels", "annotations")


def merge_placement(defaults: PodPlacement, own: PodPlacement) -> PodPlacement:
    """The service's placement over the chart's: per field, the service's value wins."""
    merged: dict[str, Any] = {}
    for field in fields(PodPlacement):
        mine, theirs = getattr(own, field.name), getattr(defaults, field.name)
        if field.name in _MAPS:
            merged[field.name] = tuple(sorted((dict(theirs) | dict(mine)).items()))
        else:
            merged[field.name] = theirs if mine is None else mine
    return replace(own, **merged)


def pod_field_names() -> tuple[str, ...]:
    """The keys `spec.pod` admits: the CRD's own list (the parser never repeats it)."""
    return spec_schema().children("pod")


def is_reserved_label(key: str) -> bool:
    return key.startswith(FUSEBOX_KEY_PREFIX) or key in FUSEBOX_LABELS


def is_reserved_annotation(key: str) -> bool:
    return key.startswith(FUSEBOX_KEY_PREFIX) or key in FUSEBOX_ANNOTATIONS


def parse_placement(
    raw: Any, where: str = "spec.pod", allowed: tuple[str, ...] | None = None
) -> PodPlacement:
    """Parse a `spec.pod` section; `where` names it in a refusal (the chart's is
    inference.pod); `allowed` narrows the keys (the chart has no `image`)."""
    if raw is None:
        return PodPlacement()
    if not isinstance(raw, Mapping):
        raise PlacementError(f"{where} must be an object, got {type(raw).__name__}")
    known = pod_field_names() if allowed is None else allowed
    for key in raw:
        if key in OWNED_FIELDS:
            raise PlacementError(
                f"{where}.{key} cannot be set: Fusebox owns it ({OWNED_FIELDS[key]})"
            )
        if key not in known:
            raise PlacementError(
                f"{where}.{key} is not a field of {where} (it takes {', '.join(known)})"
            )
    return PodPlacement(
        tolerations=_tolerations(raw.get("tolerations"), f"{where}.tolerations"),
        affinity=_affinity(raw.get("affinity"), f"{where}.affinity"),
        node_selector=_string_map(
            raw.get("nodeSelector"), f"{where}.nodeSelector", label_values=True
        ),
        topology_spread_constraints=_spread(
            raw.get("topologySpreadConstraints"), f"{where}.topologySpreadConstraints"
        ),
        image_pull_secrets=_pull_secrets(raw.get("imagePullSecrets"), f"{where}.imagePullSecrets"),
        runtime_class_name=_object_name(raw.get("runtimeClassName"), f"{where}.runtimeClassName"),
        priority_class_name=_object_name(
            raw.get("priorityClassName"), f"{where}.priorityClassName"
        ),
        service_account_name=_object_name(
            raw.get("serviceAccountName"), f"{where}.serviceAccountName"
        ),
        labels=_reserved_free(
            _string_map(raw.get("labels"), f"{where}.labels", label_values=True),
            f"{where}.labels",
            is_reserved_label,
        ),
        annotations=_confined(
            _reserved_free(
                _string_map(raw.get("annotations"), f"{where}.annotations", label_values=False),
                f"{where}.annotations",
                is_reserved_annotation,
            ),
            f"{where}.annotations",
        ),
        image=_image(raw.get("image"), f"{where}.image"),
    )


def check_gpu_selector(placement: PodPlacement, gpu_label: str, product: str) -> None:
    """A nodeSelector may repeat gpu.product's key with the same value, never another."""
    chosen = dict(placement.node_selector).get(gpu_label)
    if product and chosen is not None and chosen != product:
        raise PlacementError(
            f"spec.pod.nodeSelector[{gpu_label!r}] is {chosen!r} but gpu.product is "
            f"{product!r}: the pod would select two products; set gpu.product only"
        )


def _list(raw: Any, where: str) -> list[Any] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise PlacementError(f"{where} must be a list, got {type(raw).__name__}")
    return raw


def _entry(item: Any, where: str, keys: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(item, Mapping):
        raise PlacementError(f"{where} must be an object, got {type(item).__name__}")
    extra = sorted(set(item) - set(keys))
    if extra:
        raise PlacementError(f"{where}.{extra[0]} is not a field (it takes {', '.join(keys)})")
    return item


def _text(item: Mapping[str, Any], key: str, where: str) -> str | None:
    value = item.get(key)
    if value is not None and not isinstance(value, str):
        raise PlacementError(f"{where}.{key} must be a string, got {type(value).__name__}")
    return value


def _tolerations(raw: Any, where: str) -> tuple[Manifest, ...] | None:
    items = _list(raw, where)
    if items is None:
        return None
    parsed: list[Manifest] = []
    for index, item in enumerate(items):
        at = f"{where}[{index}]"
        entry = _entry(item, at, TOLERATION_KEYS)
        for key in ("key", "operator", "value", "effect"):
            _text(entry, key, at)
        operator = entry.get("operator", "Equal")
        if operator not in TOLERATION_OPERATORS:
            raise PlacementError(f"{at}.operator must be Exists or Equal, got {operator!r}")
        if operator == "Exists" and entry.get("value"):
            raise PlacementError(f"{at}.value must be empty when operator is Exists")
        taint_key = entry.get("key")
        if not taint_key and operator != "Exists":
            raise PlacementError(f"{at}: an empty key needs operator Exists")
        if taint_key:
            _qualified_name(taint_key, f"{at}.key")
        value = entry.get("value")
        if value and _LABEL_VALUE.fullmatch(value) is None:
            raise PlacementError(f"{at}.value {value!r} is not a label value ({LABEL_VALUE_RULE})")
        effect = entry.get("effect")
        if effect not in (None, "", *TAINT_EFFECTS):
            raise PlacementError(f"{at}.effect must be one of {', '.join(TAINT_EFFECTS)}")
        seconds = entry.get("tolerationSeconds")
        if seconds is not None:
            if isinstance(seconds, bool) or not isinstance(seconds, int):
                raise PlacementError(f"{at}.tolerationSeconds must be a whole number")
            if effect != "NoExecute":
                raise PlacementError(f"{at}.tolerationSeconds needs effect NoExecute")
        parsed.append(dict(entry))
    return tuple(parsed)


def _affinity(raw: Any, where: str) -> Manifest | None:
    if raw is None:
        return None
    entry = _entry(raw, where, AFFINITY_KEYS)
    for key, value in entry.items():
        if not isinstance(value, Mapping):
            raise PlacementError(f"{where}.{key} must be an object")
        _affinity_terms(value, f"{where}.{key}", node=key == "nodeAffinity")
    return dict(entry)


def _affinity_terms(raw: Mapping[str, Any], where: str, *, node: bool) -> None:
    """The shape of a nodeAffinity, podAffinity or podAntiAffinity: its two fields,
    lists of objects, but a nodeAffinity's required terms are one object holding a
    non-empty nodeSelectorTerms list. A pod (anti-)affinity term needs its topologyKey
    and a preferred one its weight (1-100): the API server refuses the Deployment
    without them, so they are refused here, naming the term. A term's other fields
    (selectors, operators) are the Pod API's, left to the API server."""
    entry = _entry(raw, where, (REQUIRED_TERMS, PREFERRED_TERMS))
    for key, value in entry.items():
        at = f"{where}.{key}"
        if node and key == REQUIRED_TERMS:
            selector = _entry(value, at, ("nodeSelectorTerms",))
            terms = selector.get("nodeSelectorTerms")
            if not isinstance(terms, list) or not terms:
                raise PlacementError(f"{at}.nodeSelectorTerms must be a non-empty list")
            _objects(terms, f"{at}.nodeSelectorTerms")
            continue
        items = _list(value, at) or []
        _objects(items, at)
        if node:
            continue
        for index, item in enumerate(items):
            if key == REQUIRED_TERMS:
                _pod_affinity_term(item, f"{at}[{index}]")
                continue
            weight = item.get("weight")
            low, high = AFFINITY_WEIGHT_RANGE
            if isinstance(weight, bool) or not isinstance(weight, int) or not low <= weight <= high:
                raise PlacementError(f"{at}[{index}].weight must be a whole number {low}-{high}")
            term = item.get("podAffinityTerm")
            if not isinstance(term, Mapping):
                raise PlacementError(f"{at}[{index}].podAffinityTerm must be an object")
            _pod_affinity_term(term, f"{at}[{index}].podAffinityTerm")


def _pod_affinity_term(term: Mapping[str, Any], where: str) -> None:
    topology_key = _text(term, "topologyKey", where)
    if not topology_key:
        raise PlacementError(f"{where}.topologyKey is required (the domain the pods share)")
    _qualified_name(topology_key, f"{where}.topologyKey")


def _objects(items: list[Any], where: str) -> None:
    for index, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise PlacementError(f"{where}[{index}] must be an object, got {type(item).__name__}")


def _spread(raw: Any, where: str) -> tuple[Manifest, ...] | None:
    items = _list(raw, where)
    if items is None:
        return None
    parsed: list[Manifest] = []
    pairs: set[tuple[str, str]] = set()
    for index, item in enumerate(items):
        at = f"{where}[{index}]"
        entry = _entry(item, at, SPREAD_KEYS)
        skew = entry.get("maxSkew")
        if isinstance(skew, bool) or not isinstance(skew, int) or not 1 <= skew <= INT32_MAX:
            raise PlacementError(f"{at}.maxSkew must be a whole number 1 to at most {INT32_MAX}")
        topology_key = _text(entry, "topologyKey", at)
        if not topology_key:
            raise PlacementError(f"{at}.topologyKey is required")
        _qualified_name(topology_key, f"{at}.topologyKey")
        if entry.get("whenUnsatisfiable") not in SPREAD_WHEN_UNSATISFIABLE:
            raise PlacementError(
                f"{at}.whenUnsatisfiable must be one of {', '.join(SPREAD_WHEN_UNSATISFIABLE)}"
            )
        for key in ("nodeAffinityPolicy", "nodeTaintsPolicy"):
            if entry.get(key) not in (None, *NODE_POLICIES):
                raise PlacementError(f"{at}.{key} must be one of {', '.join(NODE_POLICIES)}")
        # The API server refuses two constraints with the same pair (a Deployment it
        # would never create): one of them must go, or differ in whenUnsatisfiable.
        pair = (topology_key, str(entry["whenUnsatisfiable"]))
        if pair in pairs:
            raise PlacementError(
                f"{at} repeats topologyKey {pair[0]!r} with whenUnsatisfiable {pair[1]}: "
                "each pair may appear once"
            )
        pairs.add(pair)
        _spread_extras(entry, at)
        parsed.append(dict(entry))
    return tuple(parsed)


def _spread_extras(entry: Mapping[str, Any], at: str) -> None:
    """The optional fields the CRD types but does not bound: refused here as the API
    server refuses them, at the latest when it creates the Deployment (the Pod API's
    rules on minDomains), rather than on every reconcile after."""
    domains = entry.get("minDomains")
    if domains is not None:
        if (
            isinstance(domains, bool)
            or not isinstance(domains, int)
            or not 1 <= domains <= INT32_MAX
        ):
            raise PlacementError(f"{at}.minDomains must be a whole number 1 to {INT32_MAX}")
        if entry.get("whenUnsatisfiable") != "DoNotSchedule":
            raise PlacementError(f"{at}.minDomains needs whenUnsatisfiable DoNotSchedule")
    keys = entry.get("matchLabelKeys")
    if keys is not None and (
        not isinstance(keys, list) or not all(isinstance(key, str) for key in keys)
    ):
        raise PlacementError(f"{at}.matchLabelKeys must be a list of label keys")
    selector = entry.get("labelSelector")
    if selector is not None and not isinstance(selector, Mapping):
        raise PlacementError(f"{at}.labelSelector must be an object")
    if keys and selector is None:
        raise PlacementError(
            f"{at}.matchLabelKeys needs a labelSelector: the keys narrow the pods it selects"
        )
    for index, key in enumerate(keys or ()):
        _qualified_name(key, f"{at}.matchLabelKeys[{index}]")


def _qualified_name(text: str, where: str) -> None:
    if len(text) > QUALIFIED_NAME_MAX_LENGTH or _QUALIFIED_NAME.fullmatch(text) is None:
        raise PlacementError(f"{where} {text!r} is not a qualified name ({QUALIFIED_NAME_RULE})")


def _pull_secrets(raw: Any, where: str) -> tuple[str, ...] | None:
    items = _list(raw, where)
    if items is None:
        return None
    names: list[str] = []
    for index, item in enumerate(items):
        at = f"{where}[{index}]"
        name = _object_name(_entry(item, at, ("name",)).get("name"), f"{at}.name")
        if name is None:
            raise PlacementError(f"{at}.name is required")
        if name in names:
            raise PlacementError(f"{where} names {name} twice")
        names.append(name)
    return tuple(names)


def _object_name(raw: Any, where: str) -> str | None:
    if raw is None:
        return None
    if (
        not isinstance(raw, str)
        or len(raw) > DNS_SUBDOMAIN_MAX_LENGTH
        or _DNS_SUBDOMAIN.fullmatch(raw) is None
    ):
        raise PlacementError(
            f"{where} {raw!r} must be an object name (lower-case DNS subdomain, at most "
            f"{DNS_SUBDOMAIN_MAX_LENGTH} characters)"
        )
    return raw


def _string_map(raw: Any, where: str, *, label_values: bool) -> tuple[tuple[str, str], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise PlacementError(f"{where} must map names to strings, got {type(raw).__name__}")
    for key, value in raw.items():
        if (
            not isinstance(key, str)
            or len(key) > QUALIFIED_NAME_MAX_LENGTH
            or _QUALIFIED_NAME.fullmatch(key) is None
        ):
            raise PlacementError(
                f"{where} key {key!r} is not a qualified name ([prefix/]name, at most "
                f"{QUALIFIED_NAME_MAX_LENGTH} characters)"
            )
        if not isinstance(value, str):
            raise PlacementError(f"{where}[{key!r}] must be a string, got {type(value).__name__}")
        if label_values and _LABEL_VALUE.fullmatch(value) is None:
            raise PlacementError(
                f"{where}[{key!r}] {value!r} is not a label value ({LABEL_VALUE_RULE})"
            )
    return tuple(sorted(raw.items()))


def _reserved_free(
    pairs: tuple[tuple[str, str], ...], where: str, reserved: Callable[[str], bool]
) -> tuple[tuple[str, str], ...]:
    for key, _ in pairs:
        if reserved(key):
            raise PlacementError(
                f"{where}[{key!r}] cannot be set: Fusebox sets it (keys under "
                f"{FUSEBOX_KEY_PREFIX} and the ones it selects or scrapes pods by are its own)"
            )
    return pairs


def _confined(pairs: tuple[tuple[str, str], ...], where: str) -> tuple[tuple[str, str], ...]:
    """AppArmor and seccomp annotations may only name the runtime's default profile or
    a node's own (`localhost/...`), as restricted Pod Security allows: an `unconfined`
    one would loosen the pod wherever the namespace does not enforce that profile.

    And only what the API server accepts with the pod Fusebox renders: an AppArmor
    annotation must name one of its containers (else the Deployment is refused), and
    a seccomp one must agree with the seccompProfile RuntimeDefault Fusebox sets
    (else every pod is refused, with only a FailedCreate on the ReplicaSet to say so).
    """
    for key, value in pairs:
        # A seccomp annotation is held to the narrower rule below: one message, one rule.
        if key.startswith(APPARMOR_ANNOTATION_PREFIX) and not (
            value in CONFINED_PROFILES or value.startswith("localhost/")
        ):
            raise PlacementError(
                f"{where}[{key!r}] cannot be {value!r}: Fusebox's pods keep restricted Pod"
                f" Security (only {', '.join(CONFINED_PROFILES)} or localhost/PROFILE)"
            )
        container = key.removeprefix(APPARMOR_ANNOTATION_PREFIX)
        if container != key and container not in POD_CONTAINERS:
            raise PlacementError(
                f"{where}[{key!r}] names no container of the pod: {container!r} "
                f"(they are {', '.join(POD_CONTAINERS)})"
            )
        if key.startswith(SECCOMP_ANNOTATION_PREFIXES) and value not in CONFINED_PROFILES:
            raise PlacementError(
                f"{where}[{key!r}] cannot be {value!r}: Fusebox's pods keep restricted Pod"
                f" Security with seccompProfile RuntimeDefault, which the API server"
                f" requires the annotation to match ({' or '.join(CONFINED_PROFILES)})"
            )
    return pairs


def _image(raw: Any, where: str) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, str) or not raw or _IMAGE.fullmatch(raw) is None:
        raise PlacementError(f"{where} must be an image reference without whitespace")
    return raw
