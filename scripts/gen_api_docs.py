"""Regenerate what derives from the canonical CRD: docs/api.md and the two copies.

Why generated: crds/inferenceservice.yaml is the one source of types,
defaults, bounds and descriptions (`kubectl explain` reads the same text).
A hand-written reference would drift, and so would the Helm chart's crds/
copy and the operator package's (operator/fusebox_operator/crds/, where the
parser reads each field's default and bounds); all are rebuilt from the CRD
here, and unit tests fail when any is stale. The one part of the CRD that is
itself generated is the CEL list of reserved `server.env` names: it comes
from `fusebox_contract.settings.RESERVED_ENV_NAMES`, so the API server
refuses exactly the names the operator renders.

    python scripts/gen_api_docs.py           # rewrite the CRD list, docs/api.md, CRD copies
    python scripts/gen_api_docs.py --check   # exit 1 if any is stale
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from fusebox_contract.admin import AdminPath
from fusebox_contract.settings import RESERVED_ENV_NAMES
from fusebox_server.http.openai_parameters import PARAMETERS, Treatment
from fusebox_server.http.rendering import Kind

REPO = Path(__file__).resolve().parents[1]
CRD = REPO / "crds" / "inferenceservice.yaml"
OUTPUT = REPO / "docs" / "api.md"
CHART_CRD = REPO / "helm" / "fusebox" / "crds" / "inferenceservice.yaml"
OPERATOR_CRD = REPO / "operator" / "fusebox_operator" / "crds" / "inferenceservice.yaml"
"""The copy the operator image carries: spec.py reads its defaults and bounds from it."""

Schema = dict[str, Any]

RESERVED_RULE = re.compile(r"""(?m)^(?P<indent> *)- rule: "!\(self in \[[^\]]*\]\)"$""")
"""The CEL rule on `server.env[].name` whose list is generated."""

CHANGES = [
    "`fallback.quantization` is `none`, `int8`, `int4` or `fp8` (the server's own set; `awq`"
    " is gone). `int4` and `fp8` need `gpu.count >= 1`; `fp8` with a `gpu.product` below"
    " compute capability 8.9 (not Ada, Hopper or Blackwell) is reported as InvalidSpec.",
    "`model.dtype` reaches the server (`FUSEBOX_DTYPE`); `model.revision` reaches it"
    " (`FUSEBOX_MODEL_REVISION`) and the pods carry it as the annotation"
    " `fusebox.dev/model-revision`.",
    "No `spec.fallback` means no fallback at all: no `FUSEBOX_FALLBACK_*` env is rendered.",
    "`degradation.tiers` has no schema default: absent means `[no-streaming, fallback-model,"
    " canned-answers]` with a fallback and `[no-streaming, canned-answers]` without, so a spec"
    " with only `model` is valid. Listing `fallback-model` without `spec.fallback` is refused.",
    "`server.env` may not set any name the operator renders (the list above, generated from"
    " the contract); the API server and the operator refuse it.",
    "The server's env is rendered from the contract's settings; `FUSEBOX_TORCH_THREADS` is the"
    " whole cores of `server.cpu` (at least 1), `FUSEBOX_MAX_BODY_BYTES` follows"
    " `server.maxInputTokens`.",
    "The liveness probe follows `telemetry`: `periodSeconds` 10 and `failureThreshold`"
    " ceil((wedgeAfterSeconds + 2 x scrapeIntervalSeconds + 30) / 10) + 1, so the operator's"
    " wedge handling (event PodRestarted) acts before the kubelet restarts a container.",
    "`gpu.count` is at most 1 until the server places a model across GPUs.",
    "`python -m fusebox_operator render FILE` prints the children without a cluster (above).",
    "Every spec edit posts a `SpecApplied` event saying whether it rolls the pods, reaches"
    " them live through the ConfigMap, scales, or changes only the operator's decisions"
    " (above).",
    "`breaker.quality.sampleRate`, `maxOutputInputRatio` and `blockedTerms` reach the"
    " running servers through the ConfigMap's `quality.json` (`FUSEBOX_QUALITY_FILE`), no"
    " restart: an edit no longer rolls the pods. The server's `--quality-sample-rate`,"
    " `--quality-max-output-input-ratio` and `--quality-blocked-terms-file` became"
    " `--quality-file`.",
    "The schema admits exactly what the operator accepts: `memory.limit` is `auto` or a byte"
    " quantity, `server.cpu` a CPU quantity above zero, sources are `pvc://CLAIM[/path]`"
    " (claim a DNS label of at most 63 characters, no whitespace), `file:///path`,"
    " `s3://BUCKET[/PREFIX]` or `hf://ORG/NAME[@REVISION]` (these two for `model.source`"
    " only, fetched by the pod's `model-fetch` init container), `gpu.product` a label value,"
    " and every number of Fusebox's own has the operator's minimum and maximum; the three"
    " Kubernetes numbers `spec.pod` passes through (`tolerations[].tolerationSeconds`,"
    " `topologySpreadConstraints[].maxSkew` and `minDomains`) are checked by Kubernetes when"
    " the Deployment is applied (the operator refuses a `maxSkew` below 1 itself, with a"
    " message). Model volumes are named `model-0`, `model-1`, so any valid claim name fits.",
    "`degradation.tiers` are switches, not a ladder's floor: a level engages only the listed"
    " tiers at or below it. `[no-streaming, canned-answers]` with a fallback reaches canned"
    " answers without swapping the model, `[canned-answers]` keeps streaming, and an edit"
    " that drops `fallback-model` while pods serve the fallback swaps them back one at a time"
    f" (the admin API's `{AdminPath.DEGRADATION.method} {AdminPath.DEGRADATION}` takes the"
    " service's `tiers`).",
]
"""What changed in the API with issue 10 ("the seams"), stated in docs/api.md."""


EDIT_EXAMPLES: list[tuple[str, Any]] = [
    ("server.maxConcurrency", 3),
    ("memory.headroomRatio", 1.5),
    ("telemetry.wedgeAfterSeconds", 90),
    ("model.revision", "v2"),
    ("degradation.cannedAnswers", {"hi": "busy, try again"}),
    ("server.templates", ["You are a helpful assistant."]),
    ("breaker.quality.sampleRate", 0.2),
    ("breaker.quality.blockedTerms", ["secret"]),
    ("replicas", 3),
    ("breaker.latency.p99ThresholdMillis", 900),
    ("breaker.resource.cooldownSeconds", 10),
    ("degradation.tiers", ["no-streaming"]),
]
"""Edits shown in docs/api.md with the message the operator's own code gives for them."""


def edit_examples() -> Iterator[tuple[str, str]]:
    """(edit, SpecApplied message) for each of EDIT_EXAMPLES, from a GPU service's children."""
    from fusebox_operator.edits import edit_message
    from fusebox_operator.manifests import Manifest, build_children
    from fusebox_operator.settings import OperatorSettings
    from fusebox_operator.sizing import size_memory
    from fusebox_operator.spec import InferenceServiceSpec, parse_spec

    base: dict[str, Any] = {
        "model": {"name": "chat", "source": "pvc://models/chat"},
        "fallback": {},
        "gpu": {"count": 1},
    }

    def render(spec: InferenceServiceSpec) -> list[Manifest]:
        return build_children(
            spec, "chat", "team", size_memory(spec, [81920]), OperatorSettings(), "token"
        )

    for path, value in EDIT_EXAMPLES:
        raw = json.loads(json.dumps(base))
        node = raw
        *parents, leaf = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
        edited = parse_spec(raw)
        message = edit_message(base, edited, render(edited), render, 2)
        assert message is not None, path
        yield f"{path}: {json.dumps(value, ensure_ascii=False)}", message.replace("|", "\\|")


def render_crd(text: str) -> str:
    """The CRD text with the reserved env list regenerated from the contract."""
    names = ", ".join(f"'{name}'" for name in sorted(RESERVED_ENV_NAMES))
    rendered, count = RESERVED_RULE.subn(
        lambda match: f'{match["indent"]}- rule: "!(self in [{names}])"', text
    )
    if count != 1:
        raise SystemExit(f"{CRD}: expected one reserved-env rule, found {count}")
    return rendered


def type_of(schema: Schema) -> str:
    if schema.get("x-kubernetes-int-or-string"):
        return "integer or string"
    kind = str(schema.get("type", "any"))
    if kind == "array":
        return f"[]{type_of(schema.get('items') or {})}"
    if kind == "object" and "additionalProperties" in schema and not schema.get("properties"):
        value = schema["additionalProperties"]
        return f"map[string]{type_of(value) if isinstance(value, dict) else 'any'}"
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return "object (free-form)"
    return kind


def inline(value: Any) -> str:
    """A default or bound as compact JSON, safe inside a Markdown table cell."""
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    return f"`{text}`".replace("|", "\\|")


def constraints(schema: Schema) -> list[str]:
    found: list[str] = []
    if "enum" in schema:
        found.append("one of " + ", ".join(f"`{v}`" for v in schema["enum"]))
    if "minimum" in schema:
        op = ">" if schema.get("exclusiveMinimum") else "≥"
        found.append(f"{op} {schema['minimum']}")
    if "maximum" in schema:
        op = "<" if schema.get("exclusiveMaximum") else "≤"
        found.append(f"{op} {schema['maximum']}")
    for key, label in (
        ("maxLength", "at most {} characters"),
        ("maxItems", "at most {} items"),
        ("maxProperties", "at most {} entries"),
    ):
        if key in schema:
            found.append(label.format(schema[key]))
    if "pattern" in schema:
        found.append(f"matches `{schema['pattern']}`".replace("|", "\\|"))
    if "x-kubernetes-list-type" in schema:
        found.append(f"list type {schema['x-kubernetes-list-type']}")
    for rule in schema.get("x-kubernetes-validations") or []:
        found.append(f"rule: {rule['message']}")
    return found


def walk(schema: Schema, path: str) -> Iterator[tuple[str, Schema]]:
    """Every field below `schema`, depth first, as (dotted path, its schema)."""
    for name, child in (schema.get("properties") or {}).items():
        child_path = f"{path}.{name}" if path else name
        yield child_path, child
        if child.get("type") == "array":
            yield from walk(child.get("items") or {}, f"{child_path}[]")
        else:
            yield from walk(child, child_path)


def cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def field_table(schema: Schema, root: str) -> list[str]:
    lines = [
        "| field | type | default | meaning | validation |",
        "|---|---|---|---|---|",
    ]
    required_by_path: dict[str, set[str]] = {root: set(schema.get("required") or [])}
    for path, child in walk(schema, root):
        required_by_path[path] = set(child.get("required") or [])
        if child.get("type") == "array":
            required_by_path[f"{path}[]"] = set((child.get("items") or {}).get("required") or [])
        parent, _, name = path.rpartition(".")
        required = name in required_by_path.get(parent, set())
        default = inline(child["default"]) if "default" in child else ""
        meaning = cell(child.get("description", ""))
        if required:
            meaning = f"**Required.** {meaning}"
        rules = cell("; ".join(constraints(child)))
        lines.append(f"| `{path}` | {type_of(child)} | {default} | {meaning} | {rules} |")
    return lines


def render_api_docs(crd: Schema) -> str:
    version = crd["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]
    names = crd["spec"]["names"]
    group = crd["spec"]["group"]
    spec, status = schema["properties"]["spec"], schema["properties"]["status"]
    out = [
        "# InferenceService API reference",
        "",
        "<!-- Generated by scripts/gen_api_docs.py from crds/inferenceservice.yaml;"
        " do not edit by hand. -->",
        "",
        f"`{group}/{version['name']}`, kind `{names['kind']}`, {crd['spec']['scope'].lower()}"
        f" (plural `{names['plural']}`, short name `{', '.join(names.get('shortNames', []))}`,"
        f" category `{', '.join(names.get('categories', []))}`).",
        "",
        "Defaults are applied by the API server, so `kubectl get fis NAME -o yaml` shows them;"
        " `kubectl explain fis.spec.FIELD` prints the same descriptions. Quantities such as"
        " `16Gi` and `500m` follow Kubernetes resource quantity syntax.",
        "",
        "## Printer columns (`kubectl get fis`)",
        "",
        "| column | from | meaning |",
        "|---|---|---|",
    ]
    for column in version.get("additionalPrinterColumns") or []:
        meaning = cell(column.get("description", ""))
        out.append(f"| {column['name'].upper()} | `{column['jsonPath']}` | {meaning} |")
    out += [
        "",
        "## spec",
        "",
        cell(spec.get("description", "")),
        "",
        "Rules across fields (CEL, checked by the API server at create and update):",
        "",
    ]
    out += [
        f"- {rule['message']} (`{rule['rule']}`)"
        for rule in [
            *(schema.get("x-kubernetes-validations") or []),
            *(spec.get("x-kubernetes-validations") or []),
        ]
    ]
    out += [
        "",
        *field_table(spec, "spec"),
    ]
    out += [
        "",
        "### Reserved `server.env` names",
        "",
        "The operator renders these itself, or they choose the pod's GPUs outside"
        " scheduling (`NVIDIA_VISIBLE_DEVICES` and the like); generated from"
        " `fusebox_contract.settings.RESERVED_ENV_NAMES`. `server.env` may not set them:",
        "",
        ", ".join(f"`{name}`" for name in sorted(RESERVED_ENV_NAMES)) + ".",
        "",
        "### Validate before applying",
        "",
        "`python -m fusebox_operator render FILE [--gpu-memory-mib N] [--gpu-product NAME]"
        " [--namespace NS]` reads one or more InferenceService documents and prints, as"
        " multi-document YAML, the objects the operator would create (Secret, ConfigMap, Service,"
        " PodDisruptionBudget, NetworkPolicy, Deployment), through the same parser and builders."
        " The flags stand in for the nodes' `nvidia.com/gpu.memory` (MiB) and"
        " `nvidia.com/gpu.product` labels; without either, a GPU service needs `gpu.memoryGiB`"
        " or a known `gpu.product`. The admin token is shown as a placeholder. An invalid spec"
        " prints the operator's InvalidSpec message on stderr and exits 2. Like `kubectl"
        " apply`'s strict field validation, a field the CRD does not declare and a value over"
        " its maxLength, maxItems or maxProperties are refused, naming the field"
        " (`spec.server.maxConcurency: unknown field (did you mean maxConcurrency?)`)."
        " Feed the server container's env to `python -m fusebox_server --check-config` to"
        " check the server side.",
        "",
        "### Liveness and wedges",
        "",
        "The operator restarts a wedged server itself (event PodRestarted) once its stats are"
        " `telemetry.wedgeAfterSeconds` old, seen within two scrapes. The server's liveness probe"
        " is a backstop that may fire only after that plus 30 s: `periodSeconds` 10,"
        " `failureThreshold` = ceil((wedgeAfterSeconds + 2 x scrapeIntervalSeconds + 30) / 10) + 1"
        " (7 with the defaults, 14 with `wedgeAfterSeconds: 90`). No credit is taken for the"
        " server's 10 s heartbeat timeout: a wedged event loop cannot answer /healthz, so the"
        " first failing probe may come right after the wedge.",
        "",
        "### What an edit does",
        "",
        "On every spec edit the operator posts one Normal event `SpecApplied` that says what the"
        " edit does to the running pods, computed from the children it renders for the old and"
        " the new spec. Either the pods roll one at a time (the Deployment's `maxUnavailable: 1`,"
        " `maxSurge: 0`: on a GPU service each pod loads its model again), or the running"
        " servers reread a file of the ConfigMap without a restart (within the kubelet's"
        " ConfigMap sync, about a minute), or the replica count changes, or only the operator's"
        " own decisions change (from its next tick). Examples, produced by the operator's code"
        " when this page was generated:",
        "",
        "| edit | the SpecApplied message |",
        "|---|---|",
        *(f"| `{edit}` | {message} |" for edit, message in edit_examples()),
        "",
        "### Changes in this version",
        "",
        *(f"- {change}" for change in CHANGES),
    ]
    out += ["", "## status", "", cell(status.get("description", ""))]
    out += ["", *field_table(status, "status"), ""]
    out += parameter_section()
    return "\n".join(out)


TREATMENT_WORDS = {
    Treatment.HONOURED: "honoured",
    Treatment.REFUSED: "refused (400)",
    Treatment.CLIENT_SIDE: "client-side",
}


def parameter_section() -> list[str]:
    """What the server does with each parameter of the official `openai` client, from the
    server's own table (`fusebox_server.http.openai_parameters.PARAMETERS`)."""
    lines = [
        "## The server's OpenAI parameters",
        "",
        "What the inference server does with each parameter of `chat.completions.create` and"
        " `completions.create` (generated from `fusebox_server.http.openai_parameters`;"
        " docs/server.md explains the treatments). A refused parameter gets a 400 whose"
        ' `error.param` names it, unless it carries its "off" value.',
        "",
        "| parameter | routes | treatment | how / why |",
        "|---|---|---|---|",
    ]
    for row in PARAMETERS:
        routes = ", ".join(kind.value for kind in Kind if kind in row.routes)
        words = TREATMENT_WORDS[row.treatment]
        lines.append(f"| `{row.name}` | {routes} | {words} | {cell(row.how)} |")
    return [*lines, ""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Regenerate docs/api.md and the CRD copies.")
    parser.add_argument("--check", action="store_true", help="exit 1 if any is stale")
    args = parser.parse_args(argv)
    crd_bytes = render_crd(CRD.read_text(encoding="utf-8")).encode()
    wanted = {
        CRD: crd_bytes,
        OUTPUT: render_api_docs(yaml.safe_load(crd_bytes)).encode(),
        CHART_CRD: crd_bytes,
        OPERATOR_CRD: crd_bytes,
    }
    stale = [
        path for path, data in wanted.items() if not path.exists() or path.read_bytes() != data
    ]
    if args.check:
        for path in stale:
            print(f"{path} is stale: run `python scripts/gen_api_docs.py`", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_bytes(wanted[path])
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
