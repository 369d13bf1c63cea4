"""Fixtures of the real-node tier: the gateway on a real control plane whose GPU node is a real
kubelet with containerd (tests/realnode/support.py), on the oldest supported release and on the
newest (one at a time, each torn down before the next).

The newest control plane, 1.38.0-beta.0, gets 1.37.2's kubelet: 1.38.0-beta.0's kubelet imports
a module the Go module proxy does not serve (hack/build-node.sh says which). A kubelet one minor
older than its control plane is what every cluster runs during an upgrade.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from e2e.support import find_helm

from realnode.support import SETUPS, Cluster, real_node_cluster


@pytest.fixture(scope="package", params=SETUPS, ids=[s[0] for s in SETUPS])
def cluster(request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    setup_id, plane_version, kubelet_version = request.param
    helm = find_helm()
    work = tmp_path_factory.mktemp(f"realnode-{setup_id}")
    with real_node_cluster(plane_version, kubelet_version, helm, work) as installed:
        yield installed


def pytest_collection_modifyitems(items: list[Any]) -> None:
    realnode = [i for i in items if "tests/realnode/" in str(i.fspath).replace("\\", "/")]
    for item in realnode:
        item.add_marker(pytest.mark.timeout(1800))
    # Within each setup, the legacy device plugin's tests last: the node stays Legacy for the
    # five minutes the kubelet keeps a departed plugin's devices. A stable sort on (setup,
    # legacy) keeps pytest's grouping by setup, so each cluster is still made once.
    setups = [s[0] for s in SETUPS]

    def order(item: Any) -> tuple[int, int]:
        setup = getattr(getattr(item, "callspec", None), "params", {}).get("cluster")
        position = setups.index(setup[0]) if setup in SETUPS else len(setups)
        return position, int(item.fspath.basename == "test_legacy.py")

    positions = [items.index(i) for i in realnode]
    for index, item in zip(positions, sorted(realnode, key=order), strict=True):
        items[index] = item
