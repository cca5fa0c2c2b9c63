"""Every object the chart makes has a name the API server accepts, however long
the release name (Helm allows 53 characters) or fullnameOverride (the schema
allows 63): a Job's name goes into its pods' `job-name` label, so above 63
characters the hook Job is refused and every `helm upgrade` or `helm uninstall`
fails, although `helm install` (which runs no hook) succeeded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .conftest import CHART, VALUES_DIR, load_documents, run_helm

DNS_LABEL_LENGTH = 63
LONGEST_RELEASE = "team-chat-inference-operator-production-eu-west1-blue"
LONGEST_OVERRIDE = "fusebox-operator-for-the-team-chat-inference-platform-in-euwest"


def rendered(helm: Path, release: str, *sets: str) -> list[dict[str, Any]]:
    """Every document helm would create, hooks and all options included."""
    args = ["template", release, str(CHART), "--namespace", "fusebox-system"]
    args += ["--values", str(VALUES_DIR / "all-options.yaml"), "--set", "fullnameOverride="]
    for pair in ("monitoring.prometheusRule.enabled=true", "uninstall.deleteServices=true", *sets):
        args += ["--set", pair]
    result = run_helm(helm, *args)
    assert result.returncode == 0, result.stderr
    return load_documents(result.stdout)


def names(documents: list[dict[str, Any]], kind: str) -> set[str]:
    return {doc["metadata"]["name"] for doc in documents if doc["kind"] == kind}


@pytest.mark.parametrize(
    ("release", "sets"),
    [
        (LONGEST_RELEASE, ()),
        ("fusebox", (f"fullnameOverride={LONGEST_OVERRIDE}",)),
    ],
    ids=["53-character release name", "63-character fullnameOverride"],
)
def test_every_object_name_and_label_fits_a_dns_label_and_references_still_resolve(
    helm: Path, release: str, sets: tuple[str, ...]
) -> None:
    assert len(LONGEST_RELEASE) == 53 and len(LONGEST_OVERRIDE) == DNS_LABEL_LENGTH
    documents = rendered(helm, release, *sets)
    jobs = [doc for doc in documents if doc["kind"] == "Job"]
    assert len(jobs) == 2  # the CRD upgrade and the uninstall guard
    for doc in documents:
        name = doc["metadata"]["name"]
        assert len(name) <= DNS_LABEL_LENGTH, f"{doc['kind']} {name} ({len(name)})"
        for labels in (doc["metadata"].get("labels") or {}, pod_labels(doc)):
            for key, value in labels.items():
                assert len(str(value)) <= DNS_LABEL_LENGTH, f"{doc['kind']} {name}: {key}"
    # Shortened names are shortened alike: each reference names a rendered object.
    accounts = names(documents, "ServiceAccount")
    for job in jobs:
        pod = job["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] in accounts
        configmaps = [v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v]
        assert set(configmaps) <= names(documents, "ConfigMap")
    for binding in (doc for doc in documents if doc["kind"].endswith("RoleBinding")):
        role_kind = binding["roleRef"]["kind"]
        assert binding["roleRef"]["name"] in names(documents, role_kind)
        for subject in binding["subjects"]:
            assert subject["name"] in accounts
    # The alert on the inference targets reads the PodMonitor's job by its name.
    (inference,) = (m for m in names(documents, "PodMonitor") if m.endswith("-inference"))
    (rule,) = (doc for doc in documents if doc["kind"] == "PrometheusRule")
    expressions = [r["expr"] for group in rule["spec"]["groups"] for r in group["rules"]]
    assert any(f'job="fusebox-system/{inference}"' in expr for expr in expressions)


def pod_labels(document: dict[str, Any]) -> dict[str, Any]:
    template = (document.get("spec") or {}).get("template") or {}
    labels: dict[str, Any] = (template.get("metadata") or {}).get("labels") or {}
    return labels


def test_a_fullname_override_that_cannot_name_a_service_is_refused(helm: Path) -> None:
    """The operator's Service is named by it, and a Service name starts with a letter."""
    result = run_helm(
        helm, "template", "fusebox", str(CHART), "--set-string", "fullnameOverride=1fusebox"
    )
    assert result.returncode != 0, "rendered"
    assert "at '/fullnameOverride'" in result.stderr, result.stderr
