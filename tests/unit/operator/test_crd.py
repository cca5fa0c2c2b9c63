"""The CRD is structural, documented, and admits exactly what spec.py accepts.

"Whatever the API server admits, the operator accepts": every bound, enum,
default and pattern in the schema is checked against parse_spec here. The
defaults and bounds are declared once, in the CRD: the parser reads them from
the copy the operator package carries, so changing one there changes what
the parser does (shown below with an edited schema).
"""

from __future__ import annotations

import copy
import importlib.util
import math
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from fusebox_contract.model_fetch import HF_SOURCE_PATTERN, S3_SOURCE_PATTERN
from fusebox_contract.names import DegradationTier, Dtype, LatencyMetric, Quantization
from fusebox_contract.settings import RESERVED_ENV_NAMES
from fusebox_operator import pod_placement
from fusebox_operator import spec as spec_module
from fusebox_operator.crd_schema import CRD_RESOURCE, SpecSchema, spec_schema
from fusebox_operator.gpu_products import GPU_GENERATIONS
from fusebox_operator.spec import AutoscalingMetric, Mode, SpecError, parse_spec

from .conftest import REPO

CRD_PATH = REPO / "crds" / "inferenceservice.yaml"
CRD = yaml.safe_load(CRD_PATH.read_text(encoding="utf-8"))
SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def walk(schema: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, child in (schema.get("properties") or {}).items():
        yield from walk(child, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from walk(schema["additionalProperties"], f"{path}{{}}")


def test_every_field_has_a_type_and_a_description() -> None:
    missing = [
        path
        for path, node in walk(SCHEMA, "")
        if ("type" not in node and not node.get("x-kubernetes-int-or-string"))
        or not str(node.get("description", "")).strip()
    ]
    assert missing == []


SCHEMA_KEYWORDS = {
    "type",
    "description",
    "properties",
    "items",
    "additionalProperties",
    "required",
    "default",
    "enum",
    "pattern",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "minLength",
    "maxLength",
    "maxItems",
    "maxProperties",
    "format",
    "x-kubernetes-validations",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-int-or-string",
}


def test_every_schema_node_uses_only_known_keywords() -> None:
    # Catches YAML slips such as an unquoted comma in a flow-mapping description.
    unknown = [(path, sorted(set(node) - SCHEMA_KEYWORDS)) for path, node in walk(SCHEMA, "")]
    assert [entry for entry in unknown if entry[1]] == []


def test_schema_is_structural() -> None:
    # Structural: no value validation without a type, objects declare their properties
    # (or preserve unknown fields explicitly), no $ref or anyOf at the field roots.
    for path, node in walk(SCHEMA, ""):
        assert "$ref" not in node, path
        if node.get("type") == "object" and path.count(".") > 1:
            assert (
                "properties" in node
                or "additionalProperties" in node
                or node.get("x-kubernetes-preserve-unknown-fields") is True
            ), path


def test_names_scope_and_subresources() -> None:
    names = CRD["spec"]["names"]
    assert (names["plural"], names["shortNames"], names["categories"]) == (
        "inferenceservices",
        ["fis"],
        ["fusebox"],
    )
    version = CRD["spec"]["versions"][0]
    assert CRD["spec"]["scope"] == "Namespaced"
    # kubectl scale, an HPA or KEDA: the replicas the operator applies, the pods it counts.
    assert version["subresources"] == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
    }
    columns = [c["name"].upper() for c in version["additionalPrinterColumns"]]
    assert columns == [
        "READY", "BREAKER", "TIER", "VARIANT", "GPU-MEM", "RSS", "OOM-IN", "SEEN", "REPLICAS",
        "AGE",
    ]  # fmt: skip


def schema_defaults(node: dict[str, Any]) -> Any:
    """The object the API server would default an empty object of this schema to."""
    result = {}
    for name, child in (node.get("properties") or {}).items():
        if "default" in child:
            value = child["default"]
            result[name] = schema_defaults(child) if value == {} else value
    return result


SPEC_SCHEMA = SCHEMA["properties"]["spec"]
MODEL = {"name": "chat", "source": "pvc://models/tiny"}


def apply_defaults(node: dict[str, Any], value: Any) -> Any:
    """What the API server stores for `value` under `node`: defaults filled in, recursively."""
    if node.get("type") == "object" and isinstance(value, dict):
        result = dict(value)
        for name, child in (node.get("properties") or {}).items():
            if name not in result and "default" in child:
                result[name] = copy.deepcopy(child["default"])
            if name in result:
                result[name] = apply_defaults(child, result[name])
        return result
    if node.get("type") == "array" and isinstance(value, list):
        return [apply_defaults(node.get("items") or {}, item) for item in value]
    return value


def test_crd_defaults_equal_spec_py_defaults() -> None:
    defaulted = apply_defaults(SPEC_SCHEMA, {"model": MODEL, "fallback": {}})
    assert defaulted["fallback"] == {"quantization": "int8"}
    assert parse_spec(defaulted) == parse_spec({"model": MODEL, "fallback": {}})


def test_only_model_defaulted_by_the_crd_is_a_valid_spec() -> None:
    defaulted = apply_defaults(SPEC_SCHEMA, {"model": MODEL})
    assert "tiers" not in defaulted["degradation"]  # no schema default that needs a fallback
    parsed = parse_spec(defaulted)
    assert parsed.fallback is None
    assert DegradationTier.FALLBACK_MODEL not in parsed.degradation.tiers


def numeric_fields(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    for name, child in (node.get("properties") or {}).items():
        child_path = f"{path}.{name}" if path else name
        if child.get("type") in ("integer", "number"):
            yield child_path, child
        yield from numeric_fields(child, child_path)


NUMERIC_FIELDS = dict(numeric_fields(SPEC_SCHEMA, ""))

COMPANIONS: dict[str, Callable[[float], dict[str, Any]]] = {
    # Cross-field rules (CEL and parser alike): a value at one bound needs its
    # partner moved out of the way.
    "breaker.latency.p99ThresholdMillis": lambda v: {
        "breaker": {"halfOpen": {"p99RecoveryMillis": v / 2}}
    },
    "breaker.halfOpen.p99RecoveryMillis": lambda v: {
        "breaker": {"latency": {"p99ThresholdMillis": 3.6e6}}
    },
    "telemetry.scrapeIntervalSeconds": lambda v: {
        "telemetry": {"wedgeAfterSeconds": 3600, "scrapeTimeoutSeconds": 0.1}
    },
    "telemetry.scrapeTimeoutSeconds": lambda v: {
        "telemetry": {"scrapeIntervalSeconds": 300, "wedgeAfterSeconds": 3600}
    },
    "telemetry.wedgeAfterSeconds": lambda v: {
        "telemetry": {"scrapeIntervalSeconds": 1, "scrapeTimeoutSeconds": 0.1}
    },
    # The fetch fields apply to a fetched source only (region to s3:// only).
    **{
        f"model.{field}": lambda v: {"model": {"source": "s3://models/tiny"}}
        for field in (
            "endpoint",
            "region",
            "credentials.secretName",
            "cache.claimName",
            "cache.sizeLimit",
        )
    },
    # maxReplicas is required, and bounds minReplicas from above.
    **{
        f"autoscaling.{field}": lambda v: {"autoscaling": {"maxReplicas": 100}}
        for field in (
            "minReplicas",
            "metric",
            "scaleUpStabilizationSeconds",
            "scaleDownStabilizationSeconds",
        )
    },
    # A pod's queue must be able to pass the target (server.maxQueue > target x 1.1).
    "autoscaling.targetPerReplica": lambda v: {
        "autoscaling": {"maxReplicas": 100},
        "server": {"maxQueue": 100000},
    },
}


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    result = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merge(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def spec_setting(path: str, value: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {}
    node = raw
    *parents, leaf = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    companion = COMPANIONS[path](value) if path in COMPANIONS else {}
    return merge(merge({"model": MODEL, "fallback": {}}, companion), raw)


def step(schema: dict[str, Any]) -> float:
    return 1 if schema["type"] == "integer" else 1e-6


def unbounded_numbers(node: dict[str, Any], path: str) -> Iterator[str]:
    """Numbers without a minimum or a maximum, list items and map values included."""
    for name, child in walk(node, path):
        if child.get("type") in ("integer", "number") and not {"minimum", "maximum"} <= set(child):
            yield name


def test_the_api_changes_name_every_number_the_schema_leaves_unbounded() -> None:
    # The "Changes" text of docs/api.md (scripts/gen_api_docs.py) says every number has
    # the operator's bounds but the Kubernetes ones spec.pod passes through, by name.
    script = REPO / "scripts" / "gen_api_docs.py"
    loaded = importlib.util.spec_from_file_location("gen_api_docs_changes", script)
    assert loaded is not None and loaded.loader is not None
    generator = importlib.util.module_from_spec(loaded)
    sys.modules[loaded.name] = generator  # dataclasses look their module up
    loaded.loader.exec_module(generator)
    [claim] = [c for c in generator.CHANGES if "minimum and maximum" in c]
    unbounded = list(unbounded_numbers(SPEC_SCHEMA, "spec"))
    assert unbounded, "every number bounded: drop the exceptions from the claim"
    for path in unbounded:
        assert f"`{path.rpartition('.')[2]}`" in claim or f".{path.rpartition('.')[2]}`" in claim


def test_every_numeric_field_has_a_minimum_and_a_maximum() -> None:
    unbounded = [p for p, s in NUMERIC_FIELDS.items() if "minimum" not in s or "maximum" not in s]
    assert unbounded == []


@pytest.mark.parametrize("path", sorted(NUMERIC_FIELDS))
def test_the_crd_bounds_of_every_number_are_the_operator_bounds(path: str) -> None:
    schema = NUMERIC_FIELDS[path]
    low = schema["minimum"] + (step(schema) if schema.get("exclusiveMinimum") else 0)
    high = schema["maximum"]
    for admitted in (low, high, schema.get("default", low)):
        parse_spec(spec_setting(path, admitted))
    # Just outside the schema the operator refuses too, so the two agree exactly.
    for refused in (low - step(schema), high + step(schema)):
        with pytest.raises(SpecError):
            parse_spec(spec_setting(path, refused))


def test_the_operator_package_carries_the_canonical_crd() -> None:
    # The parser's defaults and bounds come from this copy (scripts/gen_api_docs.py writes it).
    packaged = REPO / "operator" / "fusebox_operator" / Path(*CRD_RESOURCE)
    assert packaged.read_bytes() == CRD_PATH.read_bytes()
    assert (
        spec_schema().field("telemetry.wedgeAfterSeconds").default
        == (SPEC_SCHEMA["properties"]["telemetry"]["properties"]["wedgeAfterSeconds"]["default"])
    )


def edited_schema(path: str, **keywords: Any) -> SpecSchema:
    """The shipped CRD with `keywords` set on the schema node of spec field `path`."""
    crd = copy.deepcopy(CRD)
    node = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for part in path.split("."):
        node = node["properties"][part]
    node.update(keywords)
    return SpecSchema(crd)


@pytest.mark.parametrize("path", sorted(NUMERIC_FIELDS))
def test_a_maximum_lowered_in_the_schema_is_the_parsers_maximum(path: str) -> None:
    schema = NUMERIC_FIELDS[path]
    low = schema["minimum"] + (step(schema) if schema.get("exclusiveMinimum") else 0)
    lowered = (low + schema["maximum"]) / 2
    if schema["type"] == "integer":
        lowered = math.floor(lowered)
    edited = edited_schema(path, maximum=lowered)
    parse_spec(spec_setting(path, lowered), schema=edited)
    with pytest.raises(SpecError, match=re.escape(path.rpartition(".")[2])):
        parse_spec(spec_setting(path, schema["maximum"]), schema=edited)


# A value above these maxima breaks a cross-field rule with its partner's own maximum.
CAPPED_BY_ANOTHER_FIELD = {
    "autoscaling.minReplicas",
    "breaker.halfOpen.p99RecoveryMillis",
    "breaker.latency.p99ThresholdMillis",
}


@pytest.mark.parametrize("path", sorted(set(NUMERIC_FIELDS) - CAPPED_BY_ANOTHER_FIELD))
def test_a_maximum_raised_in_the_schema_is_the_parsers_maximum(path: str) -> None:
    # No number left in spec.py holds the old maximum.
    raised = NUMERIC_FIELDS[path]["maximum"] * 2
    with pytest.raises(SpecError):
        parse_spec(spec_setting(path, raised))
    parse_spec(spec_setting(path, raised), schema=edited_schema(path, maximum=raised))


def test_a_minimum_made_exclusive_in_the_schema_refuses_the_minimum() -> None:
    edited = edited_schema("breaker.resource.cooldownSeconds", minimum=1, exclusiveMinimum=True)
    raw = {"model": MODEL, "breaker": {"resource": {"cooldownSeconds": 1}}}
    parse_spec(raw)
    with pytest.raises(SpecError, match=re.escape("cooldownSeconds must be in (1, 86400], got 1")):
        parse_spec(raw, schema=edited)


def other_value(path: str, node: dict[str, Any]) -> Any:
    """A valid value for the field other than its CRD default."""
    if "enum" in node:
        return node["enum"][-1] if node["enum"][-1] != node["default"] else node["enum"][0]
    if node.get("type") in ("integer", "number"):
        low = node["minimum"] + (step(node) if node.get("exclusiveMinimum") else 0)
        return low if low != node["default"] else node["maximum"]
    if node.get("type") == "boolean":
        return not node["default"]
    return OTHER_STRINGS[path]


OTHER_STRINGS = {
    "model.revision": "v2",
    "model.endpoint": "http://s3.example.com:9000",
    "model.region": "eu-west-1",
    "model.credentials.secretName": "model-credentials",
    "model.cache.claimName": "model-cache",
    "model.cache.sizeLimit": "40Gi",
    "gpu.product": "NVIDIA-L4",
    "gpu.deviceClassName": "gpu.example.com",
    "memory.limit": "64Gi",
    "memory.nodeAvailableFloor": "2Gi",
    "server.cpu": "2",
    "server.prefixCache.maxBytes": "512Mi",
}


def defaulted_fields(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    for name, child in (node.get("properties") or {}).items():
        child_path = f"{path}.{name}" if path else name
        if "default" in child and child.get("type") != "object":
            yield child_path, child
        yield from defaulted_fields(child, child_path)


DEFAULTED_FIELDS = dict(defaulted_fields(SPEC_SCHEMA, ""))


@pytest.mark.parametrize("path", sorted(DEFAULTED_FIELDS))
def test_a_default_changed_in_the_schema_is_the_parsers_default(path: str) -> None:
    value = other_value(path, DEFAULTED_FIELDS[path])
    # The field left out, with the schema's default moved to `value`: as if the spec said it.
    left_out = spec_setting(path, value)
    *parents, leaf = path.split(".")
    section = left_out
    for part in parents:
        section = section[part]
    del section[leaf]
    edited = edited_schema(path, default=value)
    assert parse_spec(left_out, schema=edited) == parse_spec(spec_setting(path, value))
    assert parse_spec(left_out, schema=edited) != parse_spec(left_out)


def test_the_spec_dataclasses_default_as_the_crd_does() -> None:
    # Tests build GpuSpec and AutoscalingSpec without a spec: their defaults are the CRD's.
    assert spec_module.GpuSpec() == parse_spec({"model": MODEL}).gpu
    parsed = parse_spec({"model": MODEL, "autoscaling": {"maxReplicas": 1}}).autoscaling
    assert parsed is not None
    unsized = replace(parsed, pod_max_queue=None, pod_max_concurrency=None)
    assert unsized == spec_module.AutoscalingSpec()


def enum_fields(node: dict[str, Any], path: str) -> Iterator[tuple[str, list[Any]]]:
    if "enum" in node:
        yield path, node["enum"]
    for name, child in (node.get("properties") or {}).items():
        yield from enum_fields(child, f"{path}.{name}" if path else name)
    if isinstance(node.get("items"), dict):
        yield from enum_fields(node["items"], path)


ENUMS = dict(enum_fields(SPEC_SCHEMA, ""))


def test_enums_are_the_contract_enums() -> None:
    assert ENUMS == {
        "model.dtype": [d.value for d in Dtype],
        "fallback.quantization": [q.value for q in Quantization],
        "breaker.latency.metric": [m.value for m in LatencyMetric],
        "degradation.tiers": [t.value for t in DegradationTier],
        "autoscaling.metric": [m.value for m in AutoscalingMetric],
        "mode": [m.value for m in Mode],
        # spec.pod's are the Pod API's (pod_placement.py checks them the same way).
        "pod.tolerations.operator": list(pod_placement.TOLERATION_OPERATORS),
        "pod.tolerations.effect": ["", *pod_placement.TAINT_EFFECTS],
        "pod.topologySpreadConstraints.whenUnsatisfiable": list(
            pod_placement.SPREAD_WHEN_UNSATISFIABLE
        ),
        "pod.topologySpreadConstraints.nodeAffinityPolicy": list(pod_placement.NODE_POLICIES),
        "pod.topologySpreadConstraints.nodeTaintsPolicy": list(pod_placement.NODE_POLICIES),
    }


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (path, value)
        for path, values in ENUMS.items()
        if not path.startswith("pod.")  # in lists: test_pod_placement.py tries them
        for value in values
    ],
)
def test_every_enum_value_of_the_crd_parses(path: str, value: str) -> None:
    raw = spec_setting(path, [value] if path == "degradation.tiers" else value)
    if path == "fallback.quantization" and value == "none":
        raw["fallback"]["source"] = "pvc://models/other"
    parse_spec(raw)


def rules(node: dict[str, Any]) -> list[str]:
    return [rule["rule"] for rule in node.get("x-kubernetes-validations") or []]


def matched_patterns(node: dict[str, Any]) -> set[str]:
    return {p for rule in rules(node) for p in re.findall(r"self\.matches\('([^']*)'\)", rule)}


def test_cel_patterns_are_the_parser_patterns() -> None:
    props = SPEC_SCHEMA["properties"]
    source_patterns = {
        spec_module.PVC_SOURCE_PATTERN,
        spec_module.FILE_SOURCE_PATTERN,
        spec_module.PARENT_SEGMENT_PATTERN,
    }
    fetched_patterns = {S3_SOURCE_PATTERN, HF_SOURCE_PATTERN}
    model = props["model"]["properties"]
    assert matched_patterns(model["source"]) == source_patterns | fetched_patterns
    assert matched_patterns(props["fallback"]["properties"]["source"]) == source_patterns
    assert matched_patterns(model["endpoint"]) == {spec_module.ENDPOINT_PATTERN}
    secret = model["credentials"]["properties"]["secretName"]
    claim = model["cache"]["properties"]["claimName"]
    assert matched_patterns(secret) == matched_patterns(claim) == {spec_module.OBJECT_NAME_PATTERN}
    size = model["cache"]["properties"]["sizeLimit"]
    assert matched_patterns(size) == {spec_module.MEMORY_QUANTITY_PATTERN}
    limit = props["memory"]["properties"]["limit"]
    assert matched_patterns(limit) == {spec_module.MEMORY_QUANTITY_PATTERN}
    cpu = props["server"]["properties"]["cpu"]
    assert spec_module.CPU_QUANTITY_PATTERN in matched_patterns(cpu)
    prefix_cache = props["server"]["properties"]["prefixCache"]["properties"]["maxBytes"]
    assert matched_patterns(prefix_cache) == {spec_module.MEMORY_QUANTITY_PATTERN}
    product = props["gpu"]["properties"]["product"]
    assert product["pattern"] == spec_module.LABEL_VALUE_PATTERN
    assert product["maxLength"] == 63


def test_reserved_env_names_in_the_crd_are_the_contract_list() -> None:
    name = SPEC_SCHEMA["properties"]["server"]["properties"]["env"]["items"]["properties"]["name"]
    (rule,) = rules(name)
    listed = re.findall(r"'([A-Z_]+)'", rule)
    assert listed == sorted(RESERVED_ENV_NAMES)


@pytest.mark.parametrize(
    ("source", "admitted"),
    [
        ("pvc://models/tiny", True),
        ("pvc://models", True),
        (f"pvc://{'c' * 63}/x", True),
        (f"pvc://{'c' * 64}/x", False),
        ("pvc://models/a b", False),
        ("pvc://models/a\tb", False),
        ("pvc://Models/x", False),
        ("file:///opt/model", True),
        ("file://opt/model", False),
        ("file:///", False),
        ("pvc://models/../../etc", False),
        ("pvc://models/a/..", False),
        ("pvc://models/a..b/...", True),
        ("file:///opt/../etc", False),
    ],
)
def test_source_patterns_admit_what_the_parser_accepts(source: str, admitted: bool) -> None:
    # Python's `re` reads these patterns as RE2 does (ASCII classes, no lookaround),
    # and re.search finds what CEL's matches() finds.
    pattern = (
        spec_module.PVC_SOURCE_PATTERN
        if source.startswith("pvc")
        else (spec_module.FILE_SOURCE_PATTERN)
    )
    in_mount = re.search(spec_module.PARENT_SEGMENT_PATTERN, source) is None
    assert (re.search(pattern, source) is not None and in_mount) is admitted
    raw = {"model": {"name": "c", "source": source}}
    if admitted:
        parse_spec(raw)
    else:
        with pytest.raises(SpecError):
            parse_spec(raw)


def test_fetched_sources_are_refused_for_the_fallback_by_a_rule_with_a_message() -> None:
    source = SPEC_SCHEMA["properties"]["fallback"]["properties"]["source"]
    refusals = [
        rule["message"]
        for rule in source["x-kubernetes-validations"]
        if "s3://" in rule["rule"]
        and "hf://" in rule["rule"]
        and "model.source only" in rule["message"]
    ]
    assert len(refusals) == 1
    with pytest.raises(SpecError, match="model.source only"):
        parse_spec({"model": MODEL, "fallback": {"source": "hf://org/repo"}})


def test_a_revision_on_an_s3_source_is_refused_by_a_rule_with_the_parsers_message() -> None:
    model = SPEC_SCHEMA["properties"]["model"]
    default = model["properties"]["revision"]["default"]
    [rule] = [
        r
        for r in model["x-kubernetes-validations"]
        if "self.revision" in r["rule"] and "s3://" in r["rule"]
    ]
    assert f"self.revision == '{default}'" in rule["rule"]
    with pytest.raises(SpecError) as refused:
        parse_spec({"model": {**MODEL, "source": "s3://models/tiny", "revision": "v2"}})
    # The API server's message is the parser's, less the value it quotes.
    assert rule["message"] == str(refused.value).replace(" 'v2'", "")
    parse_spec({"model": {**MODEL, "source": "s3://models/tiny", "revision": default}})


@pytest.mark.parametrize(
    "source", ["hf://org/repo@v1", "hf://org/repo", "hf://org/re.po_x-1@a1b2c3/x"]
)
def test_an_at_sign_in_an_hf_source_is_its_revision_as_the_rules_contains_reads_it(
    source: str,
) -> None:
    # The CEL rule below tells @REVISION by self.source.contains('@'): the parser's.
    if not re.fullmatch(HF_SOURCE_PATTERN, source):
        with pytest.raises(SpecError):
            parse_spec({"model": {**MODEL, "source": source}})
        return
    parsed = parse_spec({"model": {**MODEL, "source": source}}).model.source
    assert ("@" in source) is bool(parsed.revision)


def test_a_revision_beside_hf_at_revision_is_refused_by_a_rule_with_the_parsers_message() -> None:
    model = SPEC_SCHEMA["properties"]["model"]
    default = model["properties"]["revision"]["default"]
    [rule] = [r for r in model["x-kubernetes-validations"] if "contains('@')" in r["rule"]]
    assert "self.source.startsWith('hf://')" in rule["rule"]
    assert f"self.revision == '{default}'" in rule["rule"]
    with pytest.raises(SpecError) as refused:
        parse_spec({"model": {**MODEL, "source": "hf://org/repo@v1", "revision": "v2"}})
    # The API server's message is the parser's, less the value it quotes.
    assert rule["message"] == str(refused.value).replace(" 'v2'", "")
    parse_spec({"model": {**MODEL, "source": "hf://org/repo@v1", "revision": default}})
    parse_spec({"model": {**MODEL, "source": "hf://org/repo", "revision": "v2"}})


def test_a_cache_size_limit_beside_a_claim_is_refused_by_a_rule_with_the_parsers_message() -> None:
    cache = SPEC_SCHEMA["properties"]["model"]["properties"]["cache"]
    default = cache["properties"]["sizeLimit"]["default"]
    [rule] = cache["x-kubernetes-validations"]
    assert "self.claimName == ''" in rule["rule"]
    assert f"self.sizeLimit == '{default}'" in rule["rule"]
    source = "s3://models/tiny"
    with pytest.raises(SpecError) as refused:
        parse_spec(
            {"model": {**MODEL, "source": source, "cache": {"claimName": "c", "sizeLimit": "4Gi"}}}
        )
    assert rule["message"] == str(refused.value).replace(" '4Gi'", "")
    for admitted in ({"claimName": "c", "sizeLimit": default}, {"sizeLimit": "4Gi"}):
        parse_spec({"model": {**MODEL, "source": source, "cache": admitted}})


def test_an_empty_blocked_term_is_refused_by_the_schema_and_the_parser_alike() -> None:
    quality = SPEC_SCHEMA["properties"]["breaker"]["properties"]["quality"]
    assert quality["properties"]["blockedTerms"]["items"]["minLength"] == 1
    with pytest.raises(
        SpecError, match=r"spec.breaker.quality.blockedTerms\[1\] must not be empty"
    ):
        parse_spec({"model": MODEL, "breaker": {"quality": {"blockedTerms": ["secret", ""]}}})
    parse_spec({"model": MODEL, "breaker": {"quality": {"blockedTerms": ["s"]}}})


@pytest.mark.parametrize(
    ("endpoint", "admitted"),
    [
        ("127.0.0.1:7070", True),
        ("http://s3.lab:65535", True),
        ("https://s3.lab/", True),
        ("s3.lab:65536", False),
        ("http://s3.lab:99999", False),
    ],
)
def test_an_endpoint_port_beyond_65535_is_refused_as_the_parser_does(
    endpoint: str, admitted: bool
) -> None:
    assert (re.search(spec_module.ENDPOINT_PATTERN, endpoint) is not None) is admitted
    raw = {"model": {**MODEL, "source": "s3://models/tiny", "endpoint": endpoint}}
    if admitted:
        parse_spec(raw)
    else:
        with pytest.raises(SpecError, match="65535"):
            parse_spec(raw)


@pytest.mark.parametrize(
    ("endpoint", "source", "admitted"),
    [
        ("https://s3.example.com/minio", "s3://models/tiny", False),
        ("s3.lab:9000/x", "s3://models/tiny", False),
        ("http://s3.lab:9000/", "s3://models/tiny", True),
        ("http://s3.lab:9000", "s3://models/tiny", True),
        ("https://hub.lab/mirror", "hf://org/repo", True),  # a hub mirror may sit under a path
    ],
)
def test_an_s3_endpoint_with_a_path_is_refused_by_a_rule_with_the_parsers_message(
    endpoint: str, source: str, admitted: bool
) -> None:
    model = SPEC_SCHEMA["properties"]["model"]
    [rule] = [r for r in model["x-kubernetes-validations"] if "self.endpoint.matches" in r["rule"]]
    assert f"matches('{spec_module.S3_ENDPOINT_WITH_PATH_PATTERN}')" in rule["rule"]
    with_path = re.search(spec_module.S3_ENDPOINT_WITH_PATH_PATTERN, endpoint) is not None
    assert (not (source.startswith("s3://") and with_path)) is admitted
    raw = {"model": {**MODEL, "source": source, "endpoint": endpoint}}
    if admitted:
        parse_spec(raw)
        return
    with pytest.raises(SpecError) as refused:
        parse_spec(raw)
    assert rule["message"] == str(refused.value).replace(f" {endpoint!r}", "")


def test_canned_answers_without_their_tier_are_refused_by_a_rule_with_the_parsers_message() -> None:
    degradation = SPEC_SCHEMA["properties"]["degradation"]
    [rule] = [r for r in degradation["x-kubernetes-validations"] if "cannedAnswers" in r["rule"]]
    assert rule["message"] == spec_module.CANNED_WITHOUT_TIER
    assert "'canned-answers' in self.tiers" in rule["rule"]
    canned = {"hi": "busy, try again"}
    with pytest.raises(SpecError, match="cannedAnswers has no effect"):
        parse_spec(
            {"model": MODEL, "degradation": {"tiers": ["no-streaming"], "cannedAnswers": canned}}
        )
    # The default tiers hold canned-answers; an empty map says nothing.
    parse_spec({"model": MODEL, "degradation": {"cannedAnswers": canned}})
    parse_spec({"model": MODEL, "degradation": {"tiers": ["no-streaming"], "cannedAnswers": {}}})


def test_cross_field_rules_mirror_the_parser() -> None:
    spec_rules = " ".join(rules(SPEC_SCHEMA))
    assert "'fallback-model' in self.degradation.tiers" in spec_rules
    assert "self.fallback.quantization in ['int4', 'fp8']" in spec_rules
    assert "wedgeAfterSeconds > self.telemetry.scrapeIntervalSeconds" in spec_rules
    assert "scrapeTimeoutSeconds <= self.telemetry.scrapeIntervalSeconds" in spec_rules
    breaker_rules = " ".join(rules(SPEC_SCHEMA["properties"]["breaker"]))
    assert "p99RecoveryMillis < self.latency.p99ThresholdMillis" in breaker_rules
    fallback_rules = " ".join(rules(SPEC_SCHEMA["properties"]["fallback"]))
    assert "self.quantization != 'none'" in fallback_rules


def product_rules() -> dict[str, set[str]]:
    """The GPU product patterns each quantization's CEL rule admits, by quantization."""
    found: dict[str, set[str]] = {}
    for rule in rules(SPEC_SCHEMA):
        quantization = re.search(r"self\.fallback\.quantization != '([a-z0-9]+)'", rule)
        if quantization and "gpu.product" in rule:
            patterns = re.findall(r"upperAscii\(\)\.matches\('([^']*)'\)", rule)
            found[quantization.group(1)] = set(patterns)
    return found


def test_the_product_rules_admit_the_generations_that_reach_each_quantization() -> None:
    expected = {
        quantization.value: {
            g.product_pattern for g in GPU_GENERATIONS if g.compute_capability >= capability
        }
        for quantization in Quantization
        if (capability := quantization.min_compute_capability) is not None
    }
    assert product_rules() == expected


@pytest.mark.parametrize(
    "product",
    ["Tesla-T4", "Tesla-V100-SXM2-16GB", "NVIDIA-A100-SXM4-80GB", "NVIDIA-A10G",
     "NVIDIA-L4", "NVIDIA-H100-80GB-HBM3", "NVIDIA-RTX-A6000", "Quadro-RTX-4000",
     "NVIDIA-GeForce-RTX-3090", "NVIDIA-GeForce-RTX-2080-Ti", "Acme-X1"],
)  # fmt: skip
@pytest.mark.parametrize("quantization", ["int4", "fp8"])
def test_a_product_rule_admits_what_the_parser_accepts(product: str, quantization: str) -> None:
    # What the CEL rule computes, in Python: any of its patterns found in the product.
    admitted = any(re.search(pattern, product.upper()) for pattern in product_rules()[quantization])
    raw = {
        "model": MODEL,
        "gpu": {"product": product},
        "fallback": {"quantization": quantization},
    }
    if admitted:
        parse_spec(raw)
    else:
        with pytest.raises(SpecError, match=f"fallback.quantization {quantization}"):
            parse_spec(raw)


def test_the_autoscaling_rule_uses_the_autoscalers_tolerance_and_the_defaults() -> None:
    (rule,) = [r for r in rules(SPEC_SCHEMA) if "autoscaling.targetPerReplica" in r]
    assert f"* {1 + spec_module.AUTOSCALING_TOLERANCE:g}" in rule
    server = SPEC_SCHEMA["properties"]["server"]["properties"]
    target = SPEC_SCHEMA["properties"]["autoscaling"]["properties"]["targetPerReplica"]
    assert f"self.server.maxQueue : {server['maxQueue']['default']})" in rule
    assert f"self.server.maxConcurrency : {server['maxConcurrency']['default']})" in rule
    assert f"self.autoscaling.targetPerReplica : {float(target['default'])})" in rule


def test_the_cpu_rule_bounds_the_cores_as_the_parser_does() -> None:
    cpu = SPEC_SCHEMA["properties"]["server"]["properties"]["cpu"]
    bounds = re.findall(r"compareTo\(quantity\('([0-9]+)'\)\) <= 0", " ".join(rules(cpu)))
    assert bounds == [str(spec_module.MAX_CPU_CORES)]


def test_every_gpu_only_field_requires_a_gpu() -> None:
    gpu = SPEC_SCHEMA["properties"]["gpu"]
    gpu_rules = " ".join(rules(gpu)) + " ".join(rules(SPEC_SCHEMA))
    for field in ("memoryGiB", "deviceClassName", "product"):
        assert re.search(rf"has\(self\.(gpu\.)?{field}\)", gpu_rules), field
        with pytest.raises(SpecError, match=f"gpu.{field} requires gpu.count > 0"):
            value = 16 if field == "memoryGiB" else "gpu.nvidia.com"
            parse_spec({"model": MODEL, "gpu": {"count": 0, field: value}})


def test_gpu_count_above_one_is_refused_with_a_message() -> None:
    count = SPEC_SCHEMA["properties"]["gpu"]["properties"]["count"]
    assert count["maximum"] == 1
    assert "not supported yet" in count["x-kubernetes-validations"][0]["message"]


def test_ratio_and_percent_bounds_are_in_the_schema() -> None:
    breaker = SCHEMA["properties"]["spec"]["properties"]["breaker"]["properties"]
    admit = breaker["halfOpen"]["properties"]["admitPercent"]
    assert (admit["minimum"], admit["maximum"]) == (1, 100)
    rate = breaker["quality"]["properties"]["maxFailureRate"]
    assert rate["exclusiveMinimum"] is True and rate["maximum"] == 1


def test_the_object_name_rule_is_the_parsers_and_checks_only_a_create() -> None:
    (rule,) = SCHEMA["x-kubernetes-validations"]
    assert re.findall(r"self\.metadata\.name\.matches\('([^']*)'\)", rule["rule"]) == [
        spec_module.SERVICE_NAME_PATTERN
    ]
    assert f"size(self.metadata.name) <= {spec_module.SERVICE_NAME_MAX_LENGTH}" in rule["rule"]
    # A name never changes: an object made before the rule stays editable and deletable.
    assert rule["optionalOldSelf"] is True and rule["rule"].startswith("oldSelf.hasValue() ||")
    assert "metadata.name must be a DNS-1035 label" in rule["message"]
    assert "at most 63 characters" in rule["message"]
