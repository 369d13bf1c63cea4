"""Pods waiting for the gateway are served highest priority first, then oldest, as
kube-scheduler's queue serves them: a burst of low-priority pods never holds back a
high-priority one queued behind it."""

from __future__ import annotations

import asyncio

from testkit import eventually

from dra_gateway.devkit.sim.memory import MemoryCluster

from .conftest import World, running_controller, ungated, whole_claim_spec


async def test_a_contested_card_goes_to_the_pod_of_highest_priority(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=1)
    # A burst of low-priority pods is waiting when the high-priority one arrives.
    for i in range(12):
        await world.gated_pod(f"low-{i}", [whole_claim_spec(1)], priority=10)
    # Last by name and by creation: only its priority puts it first.
    await world.gated_pod("zz-high", [whole_claim_spec(1)], priority=1000)
    async with running_controller(memory_cluster):
        await eventually(lambda: ungated(world, "zz-high"))
        await asyncio.sleep(0.3)
        assert [name for name in (f"low-{i}" for i in range(12))
                if await ungated(world, name)] == []


async def test_pods_of_one_priority_are_served_oldest_first(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=1)
    await world.gated_pod("old", [whole_claim_spec(1)], priority=5)
    await asyncio.sleep(1.1)  # creationTimestamp counts whole seconds
    for i in range(6):
        await world.gated_pod(f"new-{i}", [whole_claim_spec(1)], priority=5)
    async with running_controller(memory_cluster):
        await eventually(lambda: ungated(world, "old"))
