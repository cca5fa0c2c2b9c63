"""The parser refuses what the API server refuses by the CRD schema's shape alone:
a field the schema does not declare, and a string, list or map over its maxLength,
maxItems or maxProperties, each with a message naming the field's full path.

In a cluster the API server does this first; `render` (docs/api.md, "Validate before
applying") has only the parser. Every bound is walked out of the CRD, and a bounded
field without a row here fails `test_every_bound_in_the_crd_has_a_row`.
"""

from __future__ import annotations

import copy
import io
import json
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from fusebox_contract.names import DegradationTier
from fusebox_operator.crd_schema import spec_schema
from fusebox_operator.render import EXIT_INVALID_SPEC, main
from fusebox_operator.spec import SpecError, parse_applied, parse_spec
from fusebox_operator.spec_size import SPEC_RECORD_BUDGET_BYTES

from .conftest import REPO

CRD = yaml.safe_load((REPO / "crds" / "inferenceservice.yaml").read_text(encoding="utf-8"))
SPEC_SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
BOUND_KEYWORDS = ("maxLength", "maxItems", "maxProperties")
MODEL = {"name": "chat", "source": "pvc://models/tiny"}
S3_MODEL = {"name": "chat", "source": "s3://bucket/prefix"}
HF_MODEL = {"name": "chat", "source": "hf://org/repo"}
BASE: dict[str, Any] = {"model": MODEL, "gpu": {"count": 0}}


def bounds(node: Mapping[str, Any], path: str) -> Iterator[tuple[str, int]]:
    """(path, bound) of every bounded node below .spec: `[]` an item, `{}` a map's value."""
    for keyword in BOUND_KEYWORDS:
        if keyword in node:
            yield path, node[keyword]
    for name, child in (node.get("properties") or {}).items():
        yield from bounds(child, f"{path}.{name}" if path else name)
    if isinstance(node.get("items"), Mapping):
        yield from bounds(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), Mapping):
        yield from bounds(node["additionalProperties"], f"{path}{{}}")


BOUNDS = dict(bounds(SPEC_SCHEMA, ""))


def spec(**sections: Any) -> dict[str, Any]:
    """A valid CPU spec with `sections` replacing its own."""
    return copy.deepcopy(BASE) | sections


def text(size: int, prefix: str = "") -> str:
    return prefix + "a" * (size - len(prefix))


def qualified_name(size: int) -> str:
    """A label key of `size` characters: a prefix, '/', a 63-character name."""
    return "a" * (size - 64) + "/" + "a" * 63


def quantity(size: int, unit: str) -> str:
    """A valid quantity of exactly `size` characters: 1.000...0<unit>."""
    return "1." + "0" * (size - 2 - len(unit)) + unit


def tiers(count: int) -> list[str]:
    """`count` tiers; past all of them, the first again."""
    every = [tier.value for tier in DegradationTier]
    return (every * 2)[:count]


def spread_keys(keys: list[str]) -> dict[str, Any]:
    """A spread constraint narrowed by `keys` (matchLabelKeys needs a labelSelector)."""
    return {
        "maxSkew": 1,
        "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"fusebox.dev/service": "chat"}},
        "matchLabelKeys": keys,
    }


FALLBACK = {"source": "pvc://models/small", "quantization": "int8"}
GPU = {"count": 1, "memoryGiB": 24}

# Per bounded field: a spec whose value there has `size` characters, items or entries
# (valid at the bound), and the path a refusal names.
ROWS: dict[str, tuple[Callable[[int], dict[str, Any]], str]] = {
    "model.name": (lambda n: spec(model=MODEL | {"name": text(n)}), "spec.model.name"),
    "model.source": (
        lambda n: spec(model={"name": "chat", "source": text(n, "pvc://models/")}),
        "spec.model.source",
    ),
    "model.revision": (lambda n: spec(model=MODEL | {"revision": text(n)}), "spec.model.revision"),
    "model.endpoint": (
        # A hub mirror's URL may have a path (an s3:// endpoint may not).
        lambda n: spec(model=HF_MODEL | {"endpoint": text(n, "https://mirror/")}),
        "spec.model.endpoint",
    ),
    "model.region": (lambda n: spec(model=S3_MODEL | {"region": text(n)}), "spec.model.region"),
    "model.credentials.secretName": (
        lambda n: spec(model=S3_MODEL | {"credentials": {"secretName": text(n)}}),
        "spec.model.credentials.secretName",
    ),
    "model.cache.claimName": (
        lambda n: spec(model=S3_MODEL | {"cache": {"claimName": text(n)}}),
        "spec.model.cache.claimName",
    ),
    "model.cache.sizeLimit": (
        lambda n: spec(model=S3_MODEL | {"cache": {"sizeLimit": quantity(n, "Gi")}}),
        "spec.model.cache.sizeLimit",
    ),
    "fallback.source": (
        lambda n: spec(fallback=FALLBACK | {"source": text(n, "pvc://models/")}),
        "spec.fallback.source",
    ),
    "gpu.product": (lambda n: spec(gpu=GPU | {"product": text(n, "X")}), "spec.gpu.product"),
    "gpu.deviceClassName": (
        lambda n: spec(gpu=GPU | {"deviceClassName": text(n)}),
        "spec.gpu.deviceClassName",
    ),
    "memory.limit": (lambda n: spec(memory={"limit": quantity(n, "Gi")}), "spec.memory.limit"),
    "memory.nodeAvailableFloor": (
        lambda n: spec(memory={"nodeAvailableFloor": quantity(n, "Gi")}),
        "spec.memory.nodeAvailableFloor",
    ),
    "server.prefixCache.maxBytes": (
        lambda n: spec(server={"prefixCache": {"maxBytes": quantity(n, "Mi")}}),
        "spec.server.prefixCache.maxBytes",
    ),
    "server.templates": (
        lambda n: spec(server={"templates": [f"t{i}" for i in range(n)]}),
        "spec.server.templates",
    ),
    "server.templates[]": (
        lambda n: spec(server={"templates": [text(n)]}),
        "spec.server.templates[0]",
    ),
    "server.env[].name": (
        lambda n: spec(server={"env": [{"name": text(n, "V"), "value": ""}]}),
        "spec.server.env[0].name",
    ),
    "server.env[].value": (
        lambda n: spec(server={"env": [{"name": "V", "value": text(n)}]}),
        "spec.server.env[0].value",
    ),
    "server.cpu": (lambda n: spec(server={"cpu": quantity(n, "")}), "spec.server.cpu"),
    "server.env": (
        lambda n: spec(server={"env": [{"name": f"V{i}", "value": ""} for i in range(n)]}),
        "spec.server.env",
    ),
    "breaker.quality.blockedTerms": (
        lambda n: spec(breaker={"quality": {"blockedTerms": [f"b{i}" for i in range(n)]}}),
        "spec.breaker.quality.blockedTerms",
    ),
    "breaker.quality.blockedTerms[]": (
        lambda n: spec(breaker={"quality": {"blockedTerms": [text(n)]}}),
        "spec.breaker.quality.blockedTerms[0]",
    ),
    "degradation.tiers": (
        lambda n: spec(fallback=FALLBACK, degradation={"tiers": tiers(n)}),
        "spec.degradation.tiers",
    ),
    "degradation.cannedAnswers": (
        lambda n: spec(degradation={"cannedAnswers": {f"p{i}": "a" for i in range(n)}}),
        "spec.degradation.cannedAnswers",
    ),
    "degradation.cannedAnswers{}": (
        lambda n: spec(degradation={"cannedAnswers": {"p": text(n)}}),
        "spec.degradation.cannedAnswers['p']",
    ),
    "pod.tolerations": (
        lambda n: spec(
            pod={"tolerations": [{"key": f"k{i}", "operator": "Exists"} for i in range(n)]}
        ),
        "spec.pod.tolerations",
    ),
    "pod.tolerations[].key": (
        lambda n: spec(pod={"tolerations": [{"key": qualified_name(n), "operator": "Exists"}]}),
        "spec.pod.tolerations[0].key",
    ),
    "pod.tolerations[].value": (
        lambda n: spec(pod={"tolerations": [{"key": "k", "value": text(n)}]}),
        "spec.pod.tolerations[0].value",
    ),
    "pod.nodeSelector": (
        lambda n: spec(pod={"nodeSelector": {f"k{i}": "v" for i in range(n)}}),
        "spec.pod.nodeSelector",
    ),
    "pod.nodeSelector{}": (
        lambda n: spec(pod={"nodeSelector": {"k0": text(n)}}),
        "spec.pod.nodeSelector['k0']",
    ),
    "pod.topologySpreadConstraints": (
        lambda n: spec(
            pod={
                "topologySpreadConstraints": [
                    {"maxSkew": 1, "topologyKey": f"k{i}", "whenUnsatisfiable": "ScheduleAnyway"}
                    for i in range(n)
                ]
            }
        ),
        "spec.pod.topologySpreadConstraints",
    ),
    "pod.topologySpreadConstraints[].topologyKey": (
        lambda n: spec(
            pod={
                "topologySpreadConstraints": [
                    {
                        "maxSkew": 1,
                        "topologyKey": qualified_name(n),
                        "whenUnsatisfiable": "DoNotSchedule",
                    }
                ]
            }
        ),
        "spec.pod.topologySpreadConstraints[0].topologyKey",
    ),
    "pod.topologySpreadConstraints[].matchLabelKeys": (
        lambda n: spec(
            pod={"topologySpreadConstraints": [spread_keys([f"k{i}" for i in range(n)])]}
        ),
        "spec.pod.topologySpreadConstraints[0].matchLabelKeys",
    ),
    "pod.topologySpreadConstraints[].matchLabelKeys[]": (
        lambda n: spec(pod={"topologySpreadConstraints": [spread_keys([qualified_name(n)])]}),
        "spec.pod.topologySpreadConstraints[0].matchLabelKeys[0]",
    ),
    "pod.imagePullSecrets": (
        lambda n: spec(pod={"imagePullSecrets": [{"name": f"s{i}"} for i in range(n)]}),
        "spec.pod.imagePullSecrets",
    ),
    "pod.imagePullSecrets[].name": (
        lambda n: spec(pod={"imagePullSecrets": [{"name": text(n)}]}),
        "spec.pod.imagePullSecrets[0].name",
    ),
    "pod.runtimeClassName": (
        lambda n: spec(pod={"runtimeClassName": text(n)}),
        "spec.pod.runtimeClassName",
    ),
    "pod.priorityClassName": (
        lambda n: spec(pod={"priorityClassName": text(n)}),
        "spec.pod.priorityClassName",
    ),
    "pod.serviceAccountName": (
        lambda n: spec(pod={"serviceAccountName": text(n)}),
        "spec.pod.serviceAccountName",
    ),
    "pod.labels": (
        lambda n: spec(pod={"labels": {f"k{i}": "v" for i in range(n)}}),
        "spec.pod.labels",
    ),
    "pod.labels{}": (lambda n: spec(pod={"labels": {"k0": text(n)}}), "spec.pod.labels['k0']"),
    "pod.annotations": (
        lambda n: spec(pod={"annotations": {f"k{i}": "v" for i in range(n)}}),
        "spec.pod.annotations",
    ),
    "pod.annotations{}": (
        lambda n: spec(pod={"annotations": {"k0": text(n)}}),
        "spec.pod.annotations['k0']",
    ),
    "pod.image": (
        lambda n: spec(pod={"image": text(n, "registry.example/fusebox@sha256:")}),
        "spec.pod.image",
    ),
}


def test_every_bound_in_the_crd_has_a_row() -> None:
    assert set(ROWS) == set(BOUNDS)


@pytest.mark.parametrize("path", sorted(BOUNDS))
def test_a_value_at_its_crd_bound_is_accepted(path: str) -> None:
    build, _ = ROWS[path]
    parse_spec(build(BOUNDS[path]))


@pytest.mark.parametrize("path", sorted(BOUNDS))
def test_a_value_one_past_its_crd_bound_is_refused_naming_the_field(path: str) -> None:
    build, named = ROWS[path]
    with pytest.raises(SpecError) as refused:
        parse_spec(build(BOUNDS[path] + 1))
    assert named in str(refused.value)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (spec(replica=2), "spec.replica: unknown field (did you mean replicas?)"),
        (
            spec(server={"maxConcurency": 16}),
            "spec.server.maxConcurency: unknown field (did you mean maxConcurrency?)",
        ),
        (
            spec(breaker={"latency": {"p99Threshold": 900}}),
            "spec.breaker.latency.p99Threshold: unknown field (did you mean p99ThresholdMillis?)",
        ),
        (
            spec(server={"env": [{"name": "A", "valueFrom": {}}]}),
            "spec.server.env[0].valueFrom: unknown field (did you mean value?)",
        ),
        (spec(model=MODEL | {"sha256": "x"}), "spec.model.sha256: unknown field"),
        (spec(status={}), "spec.status: unknown field"),
    ],
)
def test_an_unknown_field_is_refused_naming_its_full_path(
    raw: dict[str, Any], message: str
) -> None:
    with pytest.raises(SpecError) as refused:
        parse_spec(raw)
    assert str(refused.value) == message


def test_a_typo_is_named_before_a_check_that_its_default_fails() -> None:
    # The default targetPerReplica (4) against maxQueue 2: the typo, not the target, is
    # what the user got wrong.
    raw = spec(server={"maxQueue": 2, "maxConcurency": 16}, autoscaling={"maxReplicas": 2})
    with pytest.raises(SpecError, match=r"^spec\.server\.maxConcurency: unknown field"):
        parse_spec(raw)


def test_the_pod_apis_own_fields_inside_affinity_and_label_selector_pass_through() -> None:
    # x-kubernetes-preserve-unknown-fields: the API server checks them on the pods.
    term = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    raw = spec(
        pod={
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
                }
            },
            "topologySpreadConstraints": [
                {
                    "maxSkew": 1,
                    "topologyKey": "topology.kubernetes.io/zone",
                    "whenUnsatisfiable": "DoNotSchedule",
                    "labelSelector": {"matchLabels": {"fusebox.dev/service": "chat"}},
                }
            ],
        }
    )
    parsed = parse_spec(raw)
    assert parsed.pod.affinity == raw["pod"]["affinity"]


def test_a_pod_field_fusebox_owns_is_still_refused_as_fusebox_s() -> None:
    with pytest.raises(SpecError, match=r"spec\.pod\.hostPID cannot be set: Fusebox owns it"):
        parse_spec(spec(pod={"hostPID": True}))


def test_a_running_spec_with_a_field_the_crd_no_longer_declares_stays_watched() -> None:
    # status.appliedSpec is text the API server never prunes: a spec applied before a
    # field was dropped keeps its pods protected, as with check_servable.
    applied = parse_applied(json.dumps(spec(server={"retiredSetting": 1})))
    assert applied.model.name == "chat"


def render(tmp_path: Path, raw: dict[str, Any]) -> tuple[int, str]:
    document = {
        "apiVersion": "fusebox.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "probe"},
        "spec": raw,
    }
    path = tmp_path / "probe.yaml"
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    return main([str(path)], out, err), err.getvalue()


def test_render_refuses_an_unknown_field_with_exit_2(tmp_path: Path) -> None:
    code, err = render(tmp_path, spec(server={"maxConcurency": 16}))
    assert code == EXIT_INVALID_SPEC
    assert "spec.server.maxConcurency: unknown field (did you mean maxConcurrency?)" in err


def test_render_refuses_an_over_long_model_source_with_exit_2(tmp_path: Path) -> None:
    code, err = render(tmp_path, spec(model={"name": "chat", "source": text(513, "pvc://models/")}))
    assert code == EXIT_INVALID_SPEC
    assert "spec.model.source must be at most 512 characters, got 513" in err


SPREAD = {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone"}


@pytest.mark.parametrize(
    ("constraint", "named"),
    [
        ({"whenUnsatisfiable": "DoNotSchedule", "minDomains": 0}, "minDomains"),
        ({"whenUnsatisfiable": "DoNotSchedule", "minDomains": "3"}, "minDomains"),
        ({"whenUnsatisfiable": "ScheduleAnyway", "minDomains": 3}, "minDomains"),
        ({"whenUnsatisfiable": "DoNotSchedule", "matchLabelKeys": "team"}, "matchLabelKeys"),
        ({"whenUnsatisfiable": "DoNotSchedule", "labelSelector": ["app"]}, "labelSelector"),
    ],
)
def test_a_spread_constraint_the_pod_api_refuses_is_refused_naming_the_field(
    constraint: dict[str, Any], named: str
) -> None:
    # The CRD types these without bounds; the API server refuses the rest when it
    # creates the Deployment, so render must say it first.
    raw = spec(pod={"topologySpreadConstraints": [SPREAD | constraint]})
    with pytest.raises(SpecError, match=rf"spec\.pod\.topologySpreadConstraints\[0\]\.{named}"):
        parse_spec(raw)


def test_a_spread_constraint_with_min_domains_and_match_label_keys_is_accepted() -> None:
    constraint = SPREAD | {
        "whenUnsatisfiable": "DoNotSchedule",
        "minDomains": 3,
        "matchLabelKeys": ["pod-template-hash"],
        "labelSelector": {"matchLabels": {"fusebox.dev/service": "chat"}},
    }
    parsed = parse_spec(spec(pod={"topologySpreadConstraints": [constraint]}))
    assert parsed.pod.topology_spread_constraints == (constraint,)


# A map's keys, which a structural schema cannot bound: a CEL rule on the map does.
KEY_BOUND = re.compile(r"self\.all\(k, size\(k\) <= (\d+)\)")


def key_bounds(node: Mapping[str, Any], path: str) -> Iterator[tuple[str, int]]:
    """(path, bound) of every map below .spec whose keys a CEL rule bounds."""
    if isinstance(node.get("additionalProperties"), Mapping):
        rules = " ".join(rule["rule"] for rule in node.get("x-kubernetes-validations") or [])
        found = KEY_BOUND.search(rules)
        yield path, int(found.group(1)) if found else -1
    for name, child in (node.get("properties") or {}).items():
        yield from key_bounds(child, f"{path}.{name}" if path else name)
    if isinstance(node.get("items"), Mapping):
        yield from key_bounds(node["items"], f"{path}[]")


KEY_BOUNDS = dict(key_bounds(SPEC_SCHEMA, ""))
# Per map: a spec whose one key has `size` characters (valid at the bound).
KEY_ROWS: dict[str, Callable[[int], dict[str, Any]]] = {
    "degradation.cannedAnswers": lambda n: spec(degradation={"cannedAnswers": {text(n): "a"}}),
    "pod.nodeSelector": lambda n: spec(pod={"nodeSelector": {qualified_name(n): "v"}}),
    "pod.labels": lambda n: spec(pod={"labels": {qualified_name(n): "v"}}),
    "pod.annotations": lambda n: spec(pod={"annotations": {qualified_name(n): "v"}}),
}


def test_every_map_in_the_crd_bounds_its_keys_and_has_a_row() -> None:
    assert set(KEY_ROWS) == set(KEY_BOUNDS)
    assert all(bound > 0 for bound in KEY_BOUNDS.values()), KEY_BOUNDS


@pytest.mark.parametrize("path", sorted(KEY_BOUNDS))
def test_a_key_at_its_crd_bound_is_accepted_and_one_past_it_refused(path: str) -> None:
    parse_spec(KEY_ROWS[path](KEY_BOUNDS[path]))
    with pytest.raises(SpecError) as refused:
        parse_spec(KEY_ROWS[path](KEY_BOUNDS[path] + 1))
    assert f"spec.{path}" in str(refused.value)


# The Pod API's own terms, typed by the CRD as open objects the API server checks on the
# pods: no schema keyword bounds their inside (left out of the worst case below).
OPEN_OBJECTS = {
    "pod.affinity.nodeAffinity",
    "pod.affinity.podAffinity",
    "pod.affinity.podAntiAffinity",
    "pod.topologySpreadConstraints[].labelSelector",
}
NUMBER_CHARACTERS = 24  # the longest JSON a number the schema admits is written as
WORST_SPEC_CHARACTERS = 100 * 1024
ANNOTATIONS_LIMIT_BYTES = 256 * 1024  # Kubernetes' TotalAnnotationSizeLimitB


def worst_characters(node: Mapping[str, Any], path: str, open_found: set[str]) -> int:
    """The most characters the JSON of a value `node` admits can take: every string at
    its maxLength (the longest enum value), every list and map full, every key at its
    bound; a node without a bound fails here, naming it."""
    if node.get("x-kubernetes-preserve-unknown-fields"):
        open_found.add(path)
        return len("{}")
    kind = node.get("type")
    if kind == "string" or node.get("x-kubernetes-int-or-string"):
        if "enum" in node:
            return 2 + max(len(str(value)) for value in node["enum"])
        assert "maxLength" in node, f"{path}: a string without maxLength"
        return 2 + int(node["maxLength"])
    if kind in ("integer", "number"):
        return NUMBER_CHARACTERS
    if kind == "boolean":
        return len("false")
    if kind == "array":
        assert "maxItems" in node, f"{path}: a list without maxItems"
        item = worst_characters(node["items"], f"{path}[]", open_found)
        return 2 + int(node["maxItems"]) * (item + 1)
    assert kind == "object", f"{path}: type {kind}"
    if isinstance(node.get("additionalProperties"), Mapping):
        assert "maxProperties" in node, f"{path}: a map without maxProperties"
        value = worst_characters(node["additionalProperties"], f"{path}{{}}", open_found)
        key = 2 + KEY_BOUNDS[path]
        return 2 + int(node["maxProperties"]) * (key + 1 + value + 1)
    fields = (node.get("properties") or {}).items()
    return 2 + sum(
        len(name) + 3 + worst_characters(child, f"{path}.{name}" if path else name, open_found) + 1
        for name, child in fields
    )


def test_the_largest_spec_the_crd_admits_leaves_kopfs_annotation_far_below_the_limit() -> None:
    """kopf keeps the spec it last handled in an annotation (handlers.configure); once
    the object's annotations passed 256 KiB its status patch was refused for good and
    the pods ran unwatched. Every string, list and map the CRD admits is bounded so
    that the fullest spec serialises to at most 100 KiB of characters: room beside
    kopf's copy for kubectl's last-applied one and the rest. Characters, not bytes:
    kopf's json.dumps writes a non-ASCII character as a 6-byte escape, an astral one
    as 12, so the parser checks the bytes too (spec_size.py, the tests below), at a
    budget every ASCII spec the CRD admits fits."""
    open_found: set[str] = set()
    worst = worst_characters(SPEC_SCHEMA, "", open_found)
    assert open_found == OPEN_OBJECTS
    assert worst <= WORST_SPEC_CHARACTERS <= SPEC_RECORD_BUDGET_BYTES, worst
    assert SPEC_RECORD_BUDGET_BYTES < ANNOTATIONS_LIMIT_BYTES / 2


def full_canned_answers(character: str) -> dict[str, Any]:
    """degradation.cannedAnswers at every CRD bound, in `character` repeated."""
    schema = SPEC_SCHEMA["properties"]["degradation"]["properties"]["cannedAnswers"]
    count, key = int(schema["maxProperties"]), KEY_BOUNDS["degradation.cannedAnswers"]
    answer = int(schema["additionalProperties"]["maxLength"])
    return {f"{i:03d}" + character * (key - 3): character * answer for i in range(count)}


def test_a_spec_of_chinese_text_at_the_crds_bounds_is_refused_in_bytes_naming_the_field() -> None:
    """Within every character bound, yet 150 KB as kopf records it (6 bytes a character)."""
    chinese = spec(degradation={"cannedAnswers": full_canned_answers("你")})
    assert not next(spec_schema().violations(chinese), None)  # the CRD admits it
    with pytest.raises(SpecError) as refused:
        parse_spec(chinese)
    message = str(refused.value)
    assert "spec.degradation.cannedAnswers takes" in message
    assert f"{SPEC_RECORD_BUDGET_BYTES}-byte budget" in message
    parse_spec(spec(degradation={"cannedAnswers": full_canned_answers("a")}))  # ASCII fits
    parse_applied(json.dumps(chinese))  # a spec the pods already run is still watched


def test_the_audits_oversized_specs_are_refused_naming_the_field() -> None:
    # Accepted before: 1000 canned answers (128 KB) and 100 templates of 2.9 KB.
    answers = {f"prompt {i} " + "x" * 50: "answer " + "y" * 50 for i in range(1000)}
    with pytest.raises(SpecError, match=r"spec\.degradation\.cannedAnswers"):
        parse_spec(spec(degradation={"cannedAnswers": answers}))
    templates = ["You are a helpful assistant. " * 100] * 100
    with pytest.raises(SpecError, match=r"spec\.server\.templates"):
        parse_spec(spec(server={"templates": templates}))
