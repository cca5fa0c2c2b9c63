"""The runbook covers what a user can see: every sidecar metric, every
condition and every event the operator can post; day-one's manifests and
install values hold on a real, multi-node pool, not only on the lab's node."""

from __future__ import annotations

import re
from typing import Any

import yaml

from fusebox_contract.names import ConditionType, EventReason
from fusebox_operator.spec import parse_spec

from .conftest import REPO

RUNBOOK = (REPO / "docs" / "runbook.md").read_text()
DAY_ONE = (REPO / "docs" / "day-one.md").read_text()
DAY_ONE_BLOCK = re.compile(r"<!-- day-one: (?P<step>[\w-]+) -->\n```sh\n(?P<body>.*?)\n```", re.S)
HEREDOC = re.compile(r"<<EOF\n(?P<text>.*?)\nEOF\n", re.S)
SHELL_DEFAULT = re.compile(r"\$\{\w+:-(?P<default>[^}]*)\}")
SHELL_VARIABLE = re.compile(r"\$\w+")


def day_one_documents(step: str | None = None) -> list[dict[str, Any]]:
    """The YAML that day-one's block `step` (None: every block) writes through a
    heredoc, its shell variables set to their defaults or a placeholder, as bash
    would expand them."""
    bodies = [m["body"] for m in DAY_ONE_BLOCK.finditer(DAY_ONE) if step in (None, m["step"])]
    assert bodies, f"no day-one block {step}"
    documents: list[dict[str, Any]] = []
    for heredoc in HEREDOC.finditer("\n".join(bodies) + "\n"):
        text = SHELL_DEFAULT.sub(lambda m: m["default"], heredoc["text"])
        text = SHELL_VARIABLE.sub("placeholder", text)
        documents.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return documents


def test_runbook_explains_every_documented_sidecar_metric() -> None:
    metrics_doc = (REPO / "docs" / "metrics.md").read_text()
    # Metric names as they appear in the metric tables (first column).
    documented = set(re.findall(r"^\| `(fusebox_[a-z0-9_]+)", metrics_doc, flags=re.MULTILINE))
    assert len(documented) > 20
    missing = sorted(name for name in documented if name not in RUNBOOK)
    assert missing == []


def test_runbook_explains_every_condition_and_event() -> None:
    names = {*ConditionType, *EventReason}
    missing = sorted(name.value for name in names if f"`{name.value}`" not in RUNBOOK)
    assert missing == []


def test_a_day_one_cache_claim_shared_by_replicas_asks_read_write_many() -> None:
    """Replicas spread over the pool's nodes; a ReadWriteOnce volume attaches to one,
    so the others never start and the block's `kubectl wait` for Ready times out."""
    documents = [d for d in day_one_documents() if "kind" in d]
    claims = {d["metadata"]["name"]: d for d in documents if d["kind"] == "PersistentVolumeClaim"}
    shared = [
        d
        for d in documents
        if d["kind"] == "InferenceService"
        and d["spec"].get("replicas", 1) > 1
        and d["spec"]["model"].get("cache", {}).get("claimName") in claims
    ]
    assert shared, "no day-one block shares a cache claim across replicas any more"
    for service in shared:
        claim = claims[service["spec"]["model"]["cache"]["claimName"]]
        assert claim["spec"]["accessModes"] == ["ReadWriteMany"], claim


def test_day_one_install_values_name_the_namespace_prometheus_scrapes_from() -> None:
    """The NetworkPolicies admit scrapes from monitoring.scrapeNamespace only."""
    [values] = day_one_documents("install")
    assert values["monitoring"]["podMonitor"]["enabled"] is True
    assert values["monitoring"]["scrapeNamespace"], values["monitoring"]


OPERATOR_DOC = (REPO / "docs" / "operator.md").read_text()
# One source of each scheme spec.model.source takes (docs/api.md lists them).
MODEL_SOURCES = {
    "pvc": "pvc://models/chat",
    "file": "file:///models/chat",
    "s3": "s3://bucket/chat",
    "hf": "hf://org/chat",
}
REFUSED_SCHEME = re.compile(r"`(\w+)://`\s+is\s+refused")


def test_the_operator_doc_never_calls_a_model_source_the_operator_fetches_refused() -> None:
    """It said `hf://` was refused while the parser accepted it and the pod fetched it."""
    for source in MODEL_SOURCES.values():  # each is a model.source the operator takes
        parse_spec({"model": {"name": "chat", "source": source}, "gpu": {"count": 0}})
    said_refused = set(REFUSED_SCHEME.findall(" ".join(OPERATOR_DOC.split())))
    assert said_refused & set(MODEL_SOURCES) == set()
