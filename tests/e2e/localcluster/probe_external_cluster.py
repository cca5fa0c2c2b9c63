"""Run by test_external_cluster.py in a child pytest (not collected on its own).

It proves what the `cluster` fixture hands out when FUSEBOX_KUBECONFIG is set.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def test_cluster_fixture_uses_the_named_kubeconfig(cluster: Any) -> None:
    assert cluster.kubeconfig == Path(os.environ["FUSEBOX_KUBECONFIG"])
    assert cluster.local is False
    nodes = cluster.kubectl("get", "nodes", "-o", "name").stdout.split()
    assert nodes == [f"node/{os.environ['PROBE_EXPECTED_NODE']}"]
