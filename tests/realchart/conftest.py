"""Fixtures of the chart-on-a-real-node tier (tests/realchart/support.py), on the oldest
supported release and on the newest (1.38.0-beta.0's control plane with 1.37.2's kubelet, as in
tests/realnode), one at a time. A package of its own: one real node runs on a machine at a time,
and the real-node tier's is gone before this one's starts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e.support import REPO, find_helm
from gotools import build_go_tool
from realnode.support import SETUPS

from realchart.support import ChartCluster, chart_cluster


@pytest.fixture(scope="package", params=SETUPS, ids=[s[0] for s in SETUPS])
def chart(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
          gateway_image: tuple[Path, str]) -> Iterator[ChartCluster]:
    setup_id, plane_version, kubelet_version = request.param
    work = tmp_path_factory.mktemp(f"realchart-{setup_id}")
    with chart_cluster(plane_version, kubelet_version, find_helm(), work,
                       gateway_image) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def prometheus_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Prometheus server of the version tests/helm/promtool pins."""
    return build_go_tool(REPO / "tests" / "helm" / "promtool", tmp_path_factory.mktemp("prom"),
                         "Prometheus", "github.com/prometheus/prometheus/cmd/prometheus")


def pytest_collection_modifyitems(items: list[Any]) -> None:
    for item in items:
        if "tests/realchart/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.timeout(900))
