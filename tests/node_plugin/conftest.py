from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from testkit import EXAMPLES

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.devkit.simnode import install_hami_core
from dra_gateway.kube.resources import NODES, RESOURCE_CLAIMS
from dra_gateway.node_plugin import cdi
from dra_gateway.node_plugin.coexistence import CoexistenceSettings
from dra_gateway.node_plugin.devices import DeviceOptions
from dra_gateway.node_plugin.inventory import load_inventory
from dra_gateway.node_plugin.plugin import NodePlugin, PluginSettings

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


def plugin_settings(root: Path, *, poll_seconds: float = 2.0) -> PluginSettings:
    """Settings of a node plugin whose folders all live under `root`; its kubelet pod-resources
    socket is `root/pod-resources/kubelet.sock`, absent unless a test serves it (the plugin then
    judges legacy devices from the Node's status, which shows none). The node has HAMi-core
    (simulated under `root`)."""
    return PluginSettings(node_name=NODE, plugins_dir=root / "plugins",
                          registry_dir=root / "registry", cdi_dir=root / "cdi",
                          state_dir=root / "state",
                          devices=DeviceOptions(default_sharing="shared"),
                          enforcement=cdi.EnforcementSettings(
                              hami_library=str(install_hami_core(root / "hami-core"))),
                          coexistence=CoexistenceSettings(
                              socket=root / "pod-resources" / "kubelet.sock",
                              poll_seconds=poll_seconds))


@contextlib.asynccontextmanager
async def running_plugin(root: Path, cluster: MemoryCluster, inventory: Path,
                         settings: PluginSettings | None = None) -> AsyncIterator[NodePlugin]:
    """A node plugin serving `inventory` until the block ends."""
    plugin = NodePlugin(settings or plugin_settings(root), cluster,
                        discover=lambda: load_inventory(inventory))
    started = asyncio.Event()
    task = asyncio.create_task(plugin.run(started=started))
    await asyncio.wait_for(started.wait(), 5)
    try:
        yield plugin
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def allocated(cluster: MemoryCluster, obj: dict[str, Any]) -> dict[str, Any]:
    """Store a claim with its status (allocation), as the allocator would have written it."""
    status = obj.pop("status")
    created = await cluster.create(RESOURCE_CLAIMS, obj, namespace="ml")
    created["status"] = status
    return await cluster.update(RESOURCE_CLAIMS, created, namespace="ml", subresource="status")
