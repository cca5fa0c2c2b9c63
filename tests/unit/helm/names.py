"""Names the chart derives, as the tests expect them (unit and e2e)."""

from __future__ import annotations

import hashlib


def cluster_scoped_name(fullname: str, namespace: str, suffix: str = "") -> str:
    """The chart's name for a ClusterRole or ClusterRoleBinding of a release
    (fusebox.clusterScopedName): fullname, release namespace and suffix, cut to 54
    with 8 hex of the whole name's sha256 when past a DNS label's 63."""
    whole = "-".join(part for part in (fullname, namespace, suffix) if part)
    if len(whole) <= 63:
        return whole
    return f"{whole[:54].removesuffix('-')}-{hashlib.sha256(whole.encode()).hexdigest()[:8]}"
