from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from testkit import EXAMPLES

from dra_gateway.kube.cluster.memory import MemoryCluster
from dra_gateway.kube.resources import NODES

from .claimdata import NODE

INVENTORIES = EXAMPLES / "inventory"


@pytest.fixture
def h100x8() -> Path:
    return INVENTORIES / "h100x8.yaml"


@pytest.fixture
def mixed() -> Path:
    return INVENTORIES / "mixed-mig.yaml"


@pytest.fixture
def root() -> Iterator[Path]:
    # Unix socket paths are limited to 107 bytes; pytest's tmp_path can be longer.
    path = Path(tempfile.mkdtemp(prefix="np-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def cluster() -> AsyncIterator[MemoryCluster]:
    """An in-memory cluster holding the plugin's Node."""
    memory = MemoryCluster()
    await memory.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    yield memory
    await memory.close()
