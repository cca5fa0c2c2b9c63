"""The chart tests install releases of their own, each watching its test's namespace:
those namespaces are named helm-e2e-*, outside the `e2e-*` glob the suite's operator
release watches, so two operators never act on one InferenceService."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ..conftest import Cluster, fresh_namespace, namespace_name


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    with fresh_namespace(cluster, namespace_name("helm-e2e", request)) as name:
        yield name
