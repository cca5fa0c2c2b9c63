"""A real Prometheus for e2e tests: localcluster's monitoring addon, and its HTTP API.

The session fixture runs `python -m localcluster monitoring` once (idempotent:
server-side apply of the Prometheus Operator's CRDs, the operator, one
Prometheus in `monitoring`) and leaves it installed for later sessions; a
test reaches Prometheus' HTTP API through `kubectl port-forward`, as a user
would.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from localcluster import monitoring_addon

from .conftest import Cluster, PortForward, _localcluster

INSTALL_TIMEOUT_SECONDS = 600
PROMETHEUS_POD = f"prometheus-{monitoring_addon.PROMETHEUS_NAME}-0"


@dataclass(frozen=True)
class PrometheusApi:
    """Prometheus' HTTP API (v1) at `url`."""

    url: str

    def get(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=30) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expression: str) -> list[dict[str, Any]]:
        """An instant query's result: one {metric, value} per series (vectors only)."""
        data = self.get("/api/v1/query", query=expression)
        assert data["resultType"] == "vector", data
        return list(data["result"])

    def targets(self) -> list[dict[str, Any]]:
        return list(self.get("/api/v1/targets", state="active")["activeTargets"])

    def alerts(self) -> list[dict[str, Any]]:
        return list(self.get("/api/v1/alerts")["alerts"])

    def rule_groups(self) -> list[dict[str, Any]]:
        return list(self.get("/api/v1/rules", type="alert")["groups"])


@pytest.fixture(scope="session")
def monitoring_installed(cluster: Cluster) -> None:
    """The addon installed (or confirmed); left installed: it is the cluster's, not the test's."""
    installed = _localcluster("monitoring", timeout=INSTALL_TIMEOUT_SECONDS)
    if installed.returncode != 0:
        tail = "\n".join((installed.stdout + installed.stderr).splitlines()[-40:])
        pytest.fail(f"`python -m localcluster monitoring` failed; its output ends:\n{tail}")


@pytest.fixture
def prometheus(cluster: Cluster, monitoring_installed: None) -> Iterator[PrometheusApi]:
    with PortForward(
        cluster, monitoring_addon.NAMESPACE, PROMETHEUS_POD, monitoring_addon.PROMETHEUS_PORT
    ) as forward:
        yield PrometheusApi(forward.url)
