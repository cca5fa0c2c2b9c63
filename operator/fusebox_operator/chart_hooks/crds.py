"""Which CRDs the pre-upgrade hook applies, and how to say what went wrong with one.

Pure: the hook reads the chart's crds/ files (carried to the Job in a ConfigMap)
and the CRDs' status as the API server returns them; this module turns them into
the objects to apply and into messages that name the CRD and the server's reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

CRD_API_VERSION = "apiextensions.k8s.io/v1"
CRD_KIND = "CustomResourceDefinition"


class ChartCrdError(ValueError):
    """A file of the chart's crds/ is not what the hook may apply (a chart defect)."""


def chart_crds(files: Mapping[str, str]) -> list[dict[str, Any]]:
    """Every CRD in the chart's crds/ files, in file-name then document order.

    Anything else in those files (another kind, a CRD without a name) is refused
    with the file's name: the hook applies cluster-scoped API definitions with a
    forced field manager, so it must never apply what it does not recognise.
    """
    found: list[dict[str, Any]] = []
    for file_name in sorted(files):
        try:
            documents = list(yaml.safe_load_all(files[file_name]))
        except yaml.YAMLError as error:
            raise ChartCrdError(f"{file_name}: not YAML ({error})") from error
        for document in documents:
            if document is None:  # a comment-only document, e.g. before the first ---
                continue
            if not isinstance(document, dict) or (
                document.get("apiVersion"),
                document.get("kind"),
            ) != (CRD_API_VERSION, CRD_KIND):
                kind = document.get("kind") if isinstance(document, dict) else type(document)
                raise ChartCrdError(f"{file_name}: a {kind} is not an {CRD_API_VERSION} {CRD_KIND}")
            name = (document.get("metadata") or {}).get("name")
            if not name:
                raise ChartCrdError(f"{file_name}: a {CRD_KIND} without metadata.name")
            found.append(document)
    if not found:
        raise ChartCrdError(f"no {CRD_KIND} in {', '.join(sorted(files)) or 'the crds directory'}")
    return found


@dataclass(frozen=True)
class Establishment:
    """Whether the API server serves a CRD, and if not, the reason it gives."""

    established: bool
    reason: str = ""
    message: str = ""


def establishment(crd: Mapping[str, Any]) -> Establishment:
    """Established=True, else the most telling reason the server reports.

    A CRD whose names clash with another's never becomes Established, and the
    server says why on NamesAccepted, so a False NamesAccepted is reported first.
    """
    conditions = {c.get("type"): c for c in (crd.get("status") or {}).get("conditions") or [] if c}
    established = conditions.get("Established") or {}
    if established.get("status") == "True":
        return Establishment(True)
    names = conditions.get("NamesAccepted") or {}
    if names.get("status") == "False":
        return Establishment(False, names.get("reason", ""), names.get("message", ""))
    if established:
        return Establishment(False, established.get("reason", ""), established.get("message", ""))
    return Establishment(False, "NoConditions", "the API server has not reported on it yet")


def refused_message(name: str, reason: str, message: str) -> str:
    """The API server rejected the apply itself (an invalid CRD, a forbidden field)."""
    return f"CRD {name}: the API server refused the upgrade ({reason}): {message}"


def not_established_message(name: str, state: Establishment, timeout_seconds: float) -> str:
    return (
        f"CRD {name}: applied but not Established after {timeout_seconds:g}s"
        f" ({state.reason or 'no reason given'}): {state.message or 'no message'}"
    )


def missing_message(name: str) -> str:
    """The hook upgrades CRDs; it may not create one (its role patches named CRDs only)."""
    return (
        f"CRD {name} does not exist, and the upgrade hook only upgrades CRDs (its role"
        f" may get and patch the chart's CRDs, not create one). Apply it once with"
        f" `kubectl apply --server-side -f crds/` from the chart, or upgrade with"
        f" --set crds.upgradeOnHelmUpgrade=false if you manage the CRDs yourself"
        f" (e.g. installed with --skip-crds)."
    )
