"""kube-score on everything Fusebox puts in a cluster: no unexplained CRITICAL.

The chart (rendered with the README's install values, and again with every
optional object on) and the children the operator builds for each example
InferenceService go through the real kube-score binary (built from the Go
module proxy by `make setup-binaries`). Every CRITICAL finding must be listed,
with its reason, in the table under "## kube-score" in docs/security.md: the
document is the allowlist. A row kube-score no longer reports fails too, so
the table never justifies something that is gone.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import CHART, REPO, run_helm

KUBE_SCORE = REPO / ".cache" / "bin" / "kube-score"
SECURITY_DOC = REPO / "docs" / "security.md"
EXAMPLES = sorted((REPO / "crds" / "examples").glob("*.yaml"))
README_SETS = (
    "image.repository=registry.example.com/fusebox/operator",
    "image.tag=0.1.0",
    "image.pullPolicy=IfNotPresent",
    "inferenceImage=registry.example.com/fusebox/inference:0.1.0",
)
EVERY_OPTION_SETS = (
    "replicaCount=2",
    "watchNamespaces={team-a,team-b}",
    "monitoring.podMonitor.enabled=true",
    "grafana.dashboard.enabled=true",
)
GRADE_CRITICAL = 1
"""kube-score's JSON grade of a CRITICAL finding (WARNING is 5, OK 10)."""


@dataclass(frozen=True, order=True)
class Finding:
    check: str
    obj: str
    """Kind/name, e.g. Deployment/fusebox-operator."""


@pytest.fixture(scope="module")
def kube_score() -> Path:
    if not KUBE_SCORE.exists():
        pytest.fail(
            "no kube-score binary: run `make setup-binaries` (it builds .cache/bin/kube-score)"
        )
    return KUBE_SCORE


def rendered_chart(helm: Path, sets: tuple[str, ...]) -> str:
    args = ["template", "fusebox", str(CHART), "--namespace", "fusebox-system"]
    for pair in sets:
        args += ["--set", pair]
    result = run_helm(helm, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout


def rendered_children(example: Path) -> str:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "fusebox_operator",
            "render",
            str(example),
            "--gpu-memory-mib",
            "81920",
            "--gpu-product",
            "NVIDIA-H100-80GB-HBM3",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def critical_findings(kube_score: Path, manifests: str) -> dict[Finding, list[str]]:
    """Each CRITICAL (check, Kind/name) kube-score reports, with its comments."""
    result = subprocess.run(
        [str(kube_score), "score", "--output-format", "json", "-"],
        input=manifests,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    # kube-score exits 1 when it finds a CRITICAL; anything else is a failure to run.
    assert result.returncode in (0, 1), result.stderr
    found: dict[Finding, list[str]] = {}
    for scored in json.loads(result.stdout):
        obj = f"{scored['type_meta']['kind']}/{scored['object_meta']['name']}"
        for check in scored["checks"]:
            if check["grade"] == GRADE_CRITICAL and not check["skipped"]:
                comments = [
                    f"{c.get('path', '')}: {c['summary']}".lstrip(": ")
                    for c in check["comments"] or []
                ]
                found.setdefault(Finding(check["check"]["id"], obj), []).extend(comments)
    return found


def justified_findings(document: str) -> dict[Finding, str]:
    """The table under '## kube-score': | check | object(s) | why |.

    The object cell lists one or more `Kind/name`, comma-separated.
    """
    section = re.search(r"^## kube-score\n(.*?)(?=^## |\Z)", document, re.M | re.S)
    assert section, "docs/security.md has no '## kube-score' section"
    justified: dict[Finding, str] = {}
    for line in section.group(1).splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) != 3 or set(cells[0]) <= {"-", ":"}:
            continue
        check, objects, why = (cell.strip("`") for cell in cells)
        if check == "check":  # the header row
            continue
        assert why, f"no justification for {check} in docs/security.md"
        for obj in objects.split(","):
            justified[Finding(check, obj.strip().strip("`"))] = why
    assert justified, "the kube-score table in docs/security.md has no rows"
    return justified


@pytest.fixture(scope="module")
def reported(helm: Path, kube_score: Path) -> dict[Finding, list[str]]:
    sources = [
        rendered_chart(helm, README_SETS),
        rendered_chart(helm, README_SETS + EVERY_OPTION_SETS),
        *(rendered_children(example) for example in EXAMPLES),
    ]
    found: dict[Finding, list[str]] = {}
    for manifests in sources:
        for finding, comments in critical_findings(kube_score, manifests).items():
            found.setdefault(finding, []).extend(comments)
    return found


def test_every_critical_finding_is_justified_in_the_security_doc(
    reported: dict[Finding, list[str]],
) -> None:
    justified = justified_findings(SECURITY_DOC.read_text())
    unexplained = sorted(set(reported) - set(justified))
    assert not unexplained, "CRITICAL kube-score findings not justified in docs/security.md:\n" + (
        "\n".join(
            f"  {f.check} on {f.obj}: {'; '.join(sorted(set(reported[f])))}" for f in unexplained
        )
    )


def test_every_justification_names_a_finding_kube_score_still_reports(
    reported: dict[Finding, list[str]],
) -> None:
    justified = justified_findings(SECURITY_DOC.read_text())
    stale = sorted(set(justified) - set(reported))
    assert not stale, "docs/security.md justifies findings kube-score no longer reports: " + (
        ", ".join(f"{f.check} on {f.obj}" for f in stale)
    )


def test_the_examples_cover_each_kind_of_inference_pod() -> None:
    # CPU-only, GPU with a fallback: the children differ (GPU limits, tolerations).
    assert {p.stem for p in EXAMPLES} >= {"cpu-only", "llama-h100", "tiny-chat"}


def test_the_table_parser_reads_several_objects_per_row() -> None:
    document = (
        "## kube-score\n\n| check | object | why |\n|---|---|---|\n"
        "| `container-image-pull-policy` | `Deployment/a`, `Deployment/b` | pinned tags |\n"
        "\n## Next\n| x | y | z |\n"
    )
    assert justified_findings(document) == {
        Finding("container-image-pull-policy", "Deployment/a"): "pinned tags",
        Finding("container-image-pull-policy", "Deployment/b"): "pinned tags",
    }
