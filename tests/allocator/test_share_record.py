"""Without consumable capacity a share is recorded in status.allocation, where tenants cannot
write: editing or removing the shares annotation changes neither the planner's usage nor what
the next pod may take."""

from __future__ import annotations

import asyncio
import json

import pytest
from testkit import eventually

from dra_gateway.allocator.controller import ControllerSettings
from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.gpu.shares import recorded_shares
from dra_gateway.kube import names
from dra_gateway.kube.resources import RESOURCE_CLAIMS

from .conftest import (
    FAST,
    NAMESPACE,
    World,
    is_ungated,
    running_controller,
    share_claim_spec,
    ungated,
)

FALLBACK = ControllerSettings(**{**FAST.__dict__, "consumable_capacity": False})


@pytest.mark.parametrize("edit", ["shrink", "remove"])
async def test_a_tenants_edit_of_the_shares_annotation_does_not_free_the_card(
        memory_cluster: MemoryCluster, edit: str) -> None:
    world = World(memory_cluster, native=False)
    await world.setup(nodes=1, gpus=1)
    async with running_controller(memory_cluster, FALLBACK) as controller:
        await world.gated_pod("a", [share_claim_spec(memory_gib=50)])
        await eventually(lambda: ungated(world, "a"))
        (claim,) = await world.claims_of("a")
        (share,) = recorded_shares(claim)  # from the allocation's GpuShareAllocation config
        assert share.consumed_capacity[names.CAPACITY_MEMORY] == "50Gi"
        key = (names.DRIVER, share.pool, share.device)
        before = dict(controller.state.device_usage(key).consumed)
        # The tenant, who may update claims in the namespace, rewrites the annotation.
        annotations = dict(claim["metadata"]["annotations"])
        if edit == "remove":
            del annotations[names.ANNOTATION_SHARES]
        else:
            shrunk = json.loads(annotations[names.ANNOTATION_SHARES])
            shrunk[0]["consumedCapacity"] = {names.CAPACITY_MEMORY: "1Mi",
                                             names.CAPACITY_CORES: "1"}
            annotations[names.ANNOTATION_SHARES] = json.dumps(shrunk)
        claim["metadata"]["annotations"] = annotations
        await memory_cluster.update(RESOURCE_CLAIMS, claim, namespace=NAMESPACE)
        await eventually(lambda: controller.claims.get(NAMESPACE, claim["metadata"]["name"])[
            "metadata"].get("annotations") == annotations)
        assert controller.state.device_usage(key).consumed == before
        # 50 + 50 > 80: the card is still half taken, whatever the annotation says.
        await world.gated_pod("b", [share_claim_spec(memory_gib=50)])
        await eventually(lambda: controller.stats.failures > 0)
        await asyncio.sleep(0.1)
        assert not is_ungated(await world.pod("b"))
