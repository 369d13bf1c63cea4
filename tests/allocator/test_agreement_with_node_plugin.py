"""The allocator and the node plugin, both with their defaults, agree on consumable capacity.

On a server that keeps the fields (1.34 with the gate, every release from 1.36) and on one that
drops them, shares of one card land on that card together: the node plugin publishes what the
allocator expects, so no share takes a whole card.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from testkit import eventually

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube import names
from dra_gateway.kube.resources import NODES, RESOURCE_CLAIMS, RESOURCE_SLICES
from dra_gateway.node_plugin.inventory import load_inventory
from dra_gateway.node_plugin.plugin import NodePlugin, PluginSettings

from .conftest import (
    World,
    check_no_overcommit,
    node,
    running_controller,
    share_claim_spec,
    ungated,
)

NODE = "gpu-node-1"
INVENTORY = """\
gpus:
  - index: 0
    uuid: GPU-7c9d1e2f-3a4b-4c5d-8e6f-7a8b9c0d1e2f
    productName: NVIDIA A100-SXM4-80GB
    memory: 80Gi
    sharing: shared
"""


class GateOff(MemoryCluster):
    """An API server with DRAConsumableCapacity off: the gated fields do not survive."""

    async def create(self, rt: Any, obj: dict[str, Any], *, namespace: str | None = None,
                     dry_run: bool = False) -> dict[str, Any]:
        return await super().create(rt, _drop(rt, obj), namespace=namespace, dry_run=dry_run)

    async def update(self, rt: Any, obj: dict[str, Any], **kw: Any) -> dict[str, Any]:
        return await super().update(rt, _drop(rt, obj), **kw)


def _drop(rt: Any, obj: dict[str, Any]) -> dict[str, Any]:
    if rt is RESOURCE_SLICES:
        for device in obj["spec"].get("devices") or []:
            device.pop("allowMultipleAllocations", None)
            for capacity in (device.get("capacity") or {}).values():
                capacity.pop("requestPolicy", None)
    return obj


@contextlib.asynccontextmanager
async def node_plugin(cluster: MemoryCluster) -> AsyncIterator[NodePlugin]:
    root = Path(tempfile.mkdtemp(prefix="np-"))  # unix socket paths are short
    try:
        (root / "inventory.yaml").write_text(INVENTORY)
        settings = PluginSettings(node_name=NODE, plugins_dir=root / "plugins",
                                  registry_dir=root / "registry", cdi_dir=root / "cdi",
                                  state_dir=root / "state")
        plugin = NodePlugin(settings, cluster,
                            discover=lambda: load_inventory(root / "inventory.yaml"))
        started = asyncio.Event()
        task = asyncio.create_task(plugin.run(started=started))
        try:
            await asyncio.wait_for(started.wait(), 5)
            await asyncio.wait_for(plugin.publisher.synced.wait(), 5)
            yield plugin
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _ungated(world: World, name: str) -> Any:
    return lambda: ungated(world, name)


@pytest.mark.parametrize(("cluster_type", "native"), [(MemoryCluster, True), (GateOff, False)])
async def test_with_their_defaults_both_components_agree_and_shares_share_a_card(
        cluster_type: type[MemoryCluster], native: bool) -> None:
    cluster = cluster_type()
    world = World(cluster, native=native)
    await world.setup(nodes=0)
    await cluster.create(NODES, node(NODE))
    async with node_plugin(cluster) as plugin, running_controller(cluster) as controller:
        assert plugin.consumable_capacity is native
        assert controller.consumable_capacity is native
        for name in ("a", "b", "c", "d"):
            await world.gated_pod(name, [share_claim_spec(memory_gib=20)])
        for name in ("a", "b", "c", "d"):
            await eventually(_ungated(world, name))
            (claim,) = await world.claims_of(name)
            (result,) = claim["status"]["allocation"]["devices"]["results"]
            assert (result["pool"], result["device"]) == (NODE, "gpu-0")
            assert ("consumedCapacity" in result) is native
            assert (names.ANNOTATION_SHARES in (claim["metadata"].get("annotations") or {})
                    ) is not native
        check_no_overcommit(cluster.objects(RESOURCE_CLAIMS), cluster.objects(RESOURCE_SLICES))
