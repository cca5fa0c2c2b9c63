"""`render` on specs a user may write by mistake, or to probe: exit 0, or exit 2 with an
InvalidSpec message that names the field; never exit 1, never a traceback (issue 32, N8).

The API server cannot carry NaN or infinities, but render reads YAML, which can; and a
spec of the wrong type (a string where a number is, a list where a mapping is, a boolean
where a number is: `True` is an int in Python) must be refused as the API server refuses
it. The numeric, string, list and object fields are walked out of the CRD, so a new field
is probed without a row here.
"""

from __future__ import annotations

import copy
import io
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from fusebox_operator.render import EXIT_INVALID_SPEC, main

from .conftest import REPO

CRD = yaml.safe_load((REPO / "crds" / "inferenceservice.yaml").read_text(encoding="utf-8"))
SPEC_SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
MODEL = {"name": "chat", "source": "pvc://models/tiny"}
CPU_SPEC: dict[str, Any] = {"model": MODEL, "gpu": {"count": 0}}
GPU_SPEC: dict[str, Any] = {"model": MODEL, "gpu": {"count": 1, "memoryGiB": 24}}
# What a field needs beside it to be read at all.
NEEDS = {"autoscaling": {"autoscaling": {"maxReplicas": 2}}, "gpu": GPU_SPEC}


def fields(node: Mapping[str, Any], path: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for name, child in (node.get("properties") or {}).items():
        child_path = f"{path}.{name}" if path else name
        yield child_path, child
        yield from fields(child, child_path)


FIELDS = dict(fields(SPEC_SCHEMA, ""))


def setting(path: str, value: Any) -> dict[str, Any]:
    """A valid spec with `value` at `path`."""
    section = path.split(".")[0]
    raw = copy.deepcopy(GPU_SPEC if section == "gpu" else CPU_SPEC)
    for key, extra in NEEDS.get(section, {}).items():
        raw.setdefault(key, copy.deepcopy(extra))
    node = raw
    *parents, leaf = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return raw


def render_spec(tmp_path: Path, spec: Any, *flags: str) -> tuple[int, str, str]:
    document = {
        "apiVersion": "fusebox.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "probe"},
        "spec": spec,
    }
    path = tmp_path / "probe.yaml"
    # yaml writes NaN and infinities as .nan and .inf, which it reads back as floats.
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    code = main([str(path), *flags], out, err)  # an exception fails the test: a traceback
    return code, out.getvalue(), err.getvalue()


def hostile_values(schema: Mapping[str, Any]) -> list[Any]:
    if schema.get("x-kubernetes-int-or-string"):
        return [math.nan, math.inf, 1.5, True, -1, "lots", ["x"], {"x": "y"}, 10**400]
    kind = schema.get("type")
    if kind in ("integer", "number"):
        return [math.nan, math.inf, -math.inf, True, "5", [5], {"n": 5}, 10**400]
    if kind == "string":
        return [7, 1.5, True, ["x"], {"x": "y"}]
    if kind == "boolean":
        return ["false", "true", 0, 1, ["x"]]
    if kind == "array":
        return ["x", 7, {"x": "y"}, [{"x": ["y"]}], [7]]
    return ["x", 7, True, ["x"]]  # an object


GENERATED = [
    pytest.param(path, value, id=f"{path}={value!r}"[:80])
    for path, schema in FIELDS.items()
    for value in hostile_values(schema)
]


@pytest.mark.parametrize(("path", "value"), GENERATED)
def test_a_value_of_the_wrong_kind_in_any_field_is_an_invalid_spec_naming_it(
    tmp_path: Path, path: str, value: Any
) -> None:
    code, out, err = render_spec(tmp_path, setting(path, value))
    if code == 0:
        # Only an empty list or mapping where a list belongs reads as the default.
        pytest.fail(f"{path}={value!r} was rendered:\n{out[:300]}")
    assert code == EXIT_INVALID_SPEC, err
    assert err.startswith("InvalidSpec: InferenceService probe: ")
    named = path if path != "replicas" else "spec.replicas"
    assert named in err, err


def spec(**sections: Any) -> dict[str, Any]:
    raw = copy.deepcopy(CPU_SPEC)
    raw.update(copy.deepcopy(sections))
    return raw


def gpu(product: str, quantization: str) -> dict[str, Any]:
    return {
        "model": MODEL,
        "gpu": {"count": 1, "product": product},
        "fallback": {"quantization": quantization},
    }


# (id, spec, flags, the exit, the fields the message must name)
CASES: list[tuple[str, Any, tuple[str, ...], int, tuple[str, ...]]] = [
    ("spec-a-list", [1], (), 2, ("spec",)),
    ("spec-a-string", "chat", (), 2, ("spec",)),
    ("spec-a-number", 5, (), 2, ("spec",)),
    ("spec-empty", {}, (), 2, ("spec.model",)),
    ("model-a-list", {"model": [MODEL]}, (), 2, ("model",)),
    # N6: a source that leaves its mount.
    ("pvc-up-twice", spec(model={**MODEL, "source": "pvc://models/../../etc"}), (), 2,
     ("model.source", "'..'")),
    ("pvc-up-at-end", spec(model={**MODEL, "source": "pvc://models/tiny/.."}), (), 2,
     ("model.source",)),
    ("file-up", spec(model={**MODEL, "source": "file:///opt/../etc"}), (), 2, ("model.source",)),
    ("fallback-up", spec(fallback={"source": "pvc://models/../x", "quantization": "none"}), (),
     2, ("fallback.source",)),
    ("fallback-file-up", spec(fallback={"source": "file:///../../x"}), (), 2,
     ("fallback.source",)),
    ("dots-in-a-name", spec(model={**MODEL, "source": "pvc://models/v1..v2"}), (), 0, ()),
    # N7: CPU beyond any node.
    ("cpu-100000", spec(server={"cpu": "100000"}), (), 2, ("server.cpu",)),
    ("cpu-1025", spec(server={"cpu": "1025"}), (), 2, ("server.cpu",)),
    ("cpu-millis", spec(server={"cpu": "1024001m"}), (), 2, ("server.cpu",)),
    ("cpu-max", spec(server={"cpu": "1024"}), (), 0, ()),
    ("cpu-an-int", spec(server={"cpu": 4}), (), 2, ("server.cpu",)),
    ("cpu-zero-int", spec(server={"cpu": 0}), (), 2, ("server.cpu",)),
    # N5 and friends: GPU-only fields without a GPU.
    ("memory-gib-no-gpu", spec(gpu={"count": 0, "memoryGiB": 80}), (), 2, ("gpu.memoryGiB",)),
    ("product-no-gpu", spec(gpu={"count": 0, "product": "NVIDIA-L4"}), (), 2, ("gpu.product",)),
    ("class-no-gpu", spec(gpu={"count": 0, "deviceClassName": "gpu.nvidia.com"}), (), 2,
     ("gpu.deviceClassName",)),
    ("int4-no-gpu", spec(fallback={"quantization": "int4"}), (), 2, ("fallback.quantization",)),
    ("fp8-no-gpu", spec(fallback={"quantization": "fp8"}), (), 2, ("fallback.quantization",)),
    # N3: a quantization below its compute capability.
    ("int4-on-t4", gpu("Tesla-T4", "int4"), (), 2, ("fallback.quantization", "Tesla-T4")),
    ("int4-on-v100", gpu("Tesla-V100-SXM2-16GB", "int4"), (), 2,
     ("fallback.quantization", "Tesla-V100-SXM2-16GB")),
    ("fp8-on-t4", gpu("Tesla-T4", "fp8"), (), 2, ("fallback.quantization",)),
    ("fp8-on-a100", gpu("NVIDIA-A100-SXM4-80GB", "fp8"), (), 2, ("fallback.quantization",)),
    ("awq-on-t4", gpu("Tesla-T4", "awq"), (), 2, ("fallback.quantization",)),
    ("awq-on-h100", gpu("NVIDIA-H100-80GB-HBM3", "awq"), (), 2, ("fallback.quantization",)),
    ("awq-on-v100", gpu("Tesla-V100-SXM2-32GB", "awq"), (), 2, ("fallback.quantization",)),
    ("fp8-on-v100", gpu("Tesla-V100-SXM2-32GB", "fp8"), (), 2,
     ("fallback.quantization", "Volta (7.0)")),
    ("int4-on-t4-nodes", {**gpu("", "int4"), "gpu": {"count": 1}}, ("--gpu-product",
     "Tesla-T4"), 2, ("fallback.quantization", "Tesla-T4")),
    ("int4-on-a100", gpu("NVIDIA-A100-SXM4-80GB", "int4"), (), 0, ()),
    ("fp8-on-h100", gpu("NVIDIA-H100-80GB-HBM3", "fp8"), (), 0, ()),
    ("int8-on-t4", gpu("Tesla-T4", "int8"), (), 0, ()),
    # N1: a queue cap the autoscaling target cannot pass.
    ("queue-0", spec(server={"maxQueue": 0}, autoscaling={"maxReplicas": 3}), (), 2,
     ("server.maxQueue", "autoscaling.targetPerReplica")),
    ("queue-at-target", spec(server={"maxQueue": 4}, autoscaling={"maxReplicas": 3}), (), 2,
     ("server.maxQueue", "autoscaling.targetPerReplica")),
    ("target-above-default-queue", spec(autoscaling={"maxReplicas": 3,
     "targetPerReplica": 100}), (), 2, ("server.maxQueue", "autoscaling.targetPerReplica")),
    ("in-flight-small", spec(server={"maxQueue": 0, "maxConcurrency": 2},
     autoscaling={"maxReplicas": 3, "metric": "inFlight"}), (), 2,
     ("server.maxConcurrency", "autoscaling.targetPerReplica")),
    ("queue-above-target", spec(server={"maxQueue": 5}, autoscaling={"maxReplicas": 3}), (),
     0, ()),
    # N8: values YAML reads as something else.
    ("allow-swap-string", spec(memory={"allowSwap": "false"}), (), 2, ("memory.allowSwap",)),
    ("headroom-nan", spec(memory={"headroomRatio": math.nan}), (), 2,
     ("memory.headroomRatio",)),
    ("for-seconds-nan", spec(breaker={"latency": {"forSeconds": math.nan}}), (), 2,
     ("breaker.latency.forSeconds",)),
    ("gpu-memory-nan", {"model": MODEL, "gpu": {"memoryGiB": math.nan}}, (), 2,
     ("gpu.memoryGiB",)),
    ("gpu-memory-inf", {"model": MODEL, "gpu": {"memoryGiB": math.inf}}, (), 2,
     ("gpu.memoryGiB",)),
    ("count-true", spec(gpu={"count": True}), (), 2, ("gpu.count",)),
    ("replicas-true", spec(replicas=True), (), 2, ("spec.replicas",)),
    ("limit-huge", spec(memory={"limit": "9" * 400}), (), 2, ("memory.limit",)),
    ("limit-an-int", spec(memory={"limit": 17179869184}), (), 2, ("memory.limit",)),
    ("max-queue-huge", spec(server={"maxQueue": 10**400}), (), 2, ("server.maxQueue",)),
    ("env-value-a-number", spec(server={"env": [{"name": "X", "value": 5}]}), (), 2,
     ("server.env",)),
    ("env-an-assignment", spec(server={"env": ["X=1"]}), (), 2, ("server.env",)),
    ("env-twice", spec(server={"env": [{"name": "X", "value": "1"}, {"name": "X"}]}), (), 2,
     ("server.env",)),
    ("tiers-a-mapping-inside", spec(degradation={"tiers": [{"no-streaming": 1}]}), (), 2,
     ("degradation.tiers",)),
    ("canned-a-number", spec(degradation={"cannedAnswers": {"hi": 5}}), (), 2,
     ("degradation.cannedAnswers",)),
    ("metric-a-list", spec(breaker={"latency": {"metric": ["ttft"]}}), (), 2,
     ("breaker.latency.metric",)),
    ("rss-a-list", spec(breaker={"resource": {"rss": [0.5]}}), (), 2, ("breaker.resource.rss",)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("spec_value", "flags", "exit_code", "named"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
def test_a_hostile_spec_renders_or_is_an_invalid_spec_naming_the_field(
    tmp_path: Path, spec_value: Any, flags: tuple[str, ...], exit_code: int, named: tuple[str, ...]
) -> None:
    code, out, err = render_spec(tmp_path, spec_value, *flags)
    assert code == exit_code, err or out[:300]
    if exit_code == 0:
        assert out.startswith("apiVersion: v1\nkind: Secret")
    else:
        assert out == ""
        assert err.startswith("InvalidSpec: InferenceService probe: ")
        for field in named:
            assert field in err, err


def test_there_are_enough_hostile_specs() -> None:
    assert len(CASES) >= 40 and len(GENERATED) >= 200


@pytest.mark.parametrize("metadata", [["probe"], "probe", {"name": 7}])
def test_metadata_without_a_name_is_no_inference_service_and_says_so(
    tmp_path: Path, metadata: Any
) -> None:
    path = tmp_path / "probe.yaml"
    document = {"kind": "InferenceService", "metadata": metadata, "spec": CPU_SPEC}
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    err = io.StringIO()
    assert main([str(path)], io.StringIO(), err) == 1
    assert err.getvalue() == "render: an InferenceService needs metadata.name\n"


def test_a_yaml_alias_inside_its_own_value_is_said_not_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "probe.yaml"
    path.write_text(
        "kind: InferenceService\nmetadata: {name: probe}\n"
        "spec:\n  model: {name: chat, source: 'pvc://models/m'}\n"
        "  server:\n    templates: &loop [*loop]\n",
        encoding="utf-8",
    )
    err = io.StringIO()
    assert main([str(path)], io.StringIO(), err) == 1
    assert "nests itself" in err.getvalue()
