"""Backends for the cluster behaviour suite: the in-memory cluster, direct and over HTTP.

Every behaviour test runs against each backend through the `Cluster` port; `Backend.memory`
is the cluster behind it, for the test helpers (expiring watches) that only it offers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.devkit.sim.server import serve, write_kubeconfig
from dra_gateway.kube.cluster.connect import connect
from dra_gateway.kube.cluster.port import Cluster

BACKENDS = ["memory", "kube"]


@dataclass
class Backend:
    name: str
    cluster: Cluster
    memory: MemoryCluster


@pytest.fixture(params=BACKENDS)
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    memory = MemoryCluster(history=20)
    if request.param == "memory":
        yield Backend("memory", memory, memory)
        await memory.close()
        return
    tmp = request.getfixturevalue("tmp_path")
    async with serve(memory, token="test-token") as server:
        kubeconfig = tmp / "kubeconfig"
        write_kubeconfig(kubeconfig, server.url, token="test-token")
        cluster = await connect("kube", str(kubeconfig))
        try:
            yield Backend("kube", cluster, memory)
        finally:
            await cluster.close()
            await memory.close()


@pytest.fixture
def cluster(backend: Backend) -> Cluster:
    return backend.cluster
