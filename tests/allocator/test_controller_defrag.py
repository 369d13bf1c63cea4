"""The allocator and defrag: devices held for a pod go to that pod and no other, holds past
their deadline let go, and the allocator's own defrag mode moves pods for a pod that waits."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from testkit import eventually

from dra_gateway.allocator.eviction import holds as holdfmt
from dra_gateway.allocator.eviction.defrag import DefragMode
from dra_gateway.allocator.eviction.store import write_records
from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube import names
from dra_gateway.kube.resources import CONFIG_MAPS, PODS
from dra_gateway.kube.runtime.leader import LeadershipLost

from .conftest import (
    FAST,
    World,
    is_ungated,
    record_evictions,
    running_controller,
    ungated,
    whole_claim_spec,
)

NAMESPACE = "dra-gateway"


def _hold(pod_uid: str, *, until: datetime) -> holdfmt.Hold:
    return holdfmt.Hold(pod_uid, "default/big", "node-0", {"held-claim": {
        "devices": {"results": [{"request": "gpu", "driver": names.DRIVER, "pool": "node-0",
                                 "device": "gpu-0"}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{
            "key": "metadata.name", "operator": "In", "values": ["node-0"]}]}]}}}, until)


async def _gated_for(world: World, name: str, seconds: float) -> bool:
    await asyncio.sleep(seconds)
    return not is_ungated(await world.pod(name))


async def test_a_held_device_goes_to_its_pod_and_to_no_newcomer(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=1)
    settings = replace(FAST, namespace=NAMESPACE)
    async with running_controller(memory_cluster, settings) as controller:
        big = await world.gated_pod("big", [whole_claim_spec()], create_claims=False)
        hold = _hold(big["metadata"]["uid"], until=datetime.now(UTC) + timedelta(minutes=5))
        await write_records(memory_cluster, NAMESPACE, {hold.key: hold.value()})
        await eventually(lambda: big["metadata"]["uid"] in controller.planning.holds)
        await world.gated_pod("other", [whole_claim_spec()])
        assert await _gated_for(world, "other", 0.5), "a newcomer took the held card"
        await world.create_claims("big", [whole_claim_spec()])
        await eventually(lambda: ungated(world, "big"))
        assert controller.planning.holds == {}
        assert await _gated_for(world, "other", 0.3)  # the card is big's now


async def test_a_hold_past_its_deadline_holds_nothing(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=1)
    settings = replace(FAST, namespace=NAMESPACE, holds_check_interval=0.1)
    async with running_controller(memory_cluster, settings) as controller:
        big = await world.gated_pod("big", [whole_claim_spec()], create_claims=False)
        hold = _hold(big["metadata"]["uid"], until=datetime.now(UTC) + timedelta(seconds=1))
        await write_records(memory_cluster, NAMESPACE, {hold.key: hold.value()})
        await eventually(lambda: bool(controller.planning.holds))
        await world.gated_pod("other", [whole_claim_spec()])
        await eventually(lambda: ungated(world, "other"), within=5)
        assert controller.planning.holds == {}


async def test_the_allocators_defrag_moves_shares_for_a_pod_that_waits(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=2)
    settings = replace(FAST, namespace=NAMESPACE, strategy="spread", defrag=True,
                       defrag_after=0.0, defrag_interval=0.2, defrag_wait=1.0)
    async with running_controller(memory_cluster, settings) as controller:
        await _bound_shares(world, memory_cluster)
        cards = {(await world.claims_of(n))[0]["status"]["allocation"]["devices"]["results"][0][
            "device"] for n in ("a", "b")}
        assert cards == {"gpu-0", "gpu-1"}
        await world.add_node("node-1", gpus=1)  # room for both shares, not for two cards
        await world.gated_pod("big", [whole_claim_spec(count=2)])
        big = await eventually(lambda: ungated(world, "big"), within=15)
        assert big is not None
        claim = (await world.claims_of("big"))[0]
        results = claim["status"]["allocation"]["devices"]["results"]
        assert {(r["pool"], r["device"]) for r in results} == {("node-0", "gpu-0"),
                                                                ("node-0", "gpu-1")}
        records = await _records(memory_cluster)
        assert records is not None
        assert sorted(m.pod.split("/")[1] for m in records.moved) == ["a", "b"]
        # Counted once the round has waited for the moved pods' replacements (none here).
        await eventually(lambda: controller.metrics.defrag_pods_helped._value.get() == 1,
                         within=10)
        assert controller.metrics.defrag_moves.labels("evicted")._value.get() == 2


async def _bound_shares(world: World, cluster: MemoryCluster) -> None:
    """A share on each of node-0's two cards, from a ReplicaSet, bound (the simulator has
    neither a scheduler nor a ReplicaSet controller here)."""
    for name in ("a", "b"):
        await world.gated_pod(name, [_share(30)])
        await eventually(lambda name=name: ungated(world, name))  # type: ignore[misc]
        await cluster.patch(PODS, name, {"metadata": {"ownerReferences": [{
            "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "rs-uid",
            "controller": True}]}, "spec": {"nodeName": "node-0"}},
            namespace=world.pods[name]["metadata"]["namespace"])


def _share(percent: int) -> dict[str, object]:
    from .conftest import share_claim_spec

    return share_claim_spec(memory_gib=80 * percent // 100, cores=percent)


async def _records(cluster: MemoryCluster) -> holdfmt.Records | None:
    try:
        config_map = await cluster.get(CONFIG_MAPS, holdfmt.CONFIG_MAP, namespace=NAMESPACE)
    except Exception:
        return None
    records = holdfmt.read(config_map)
    return records if records.moved else None



async def test_a_defrag_round_whose_leader_lost_its_lease_moves_nothing_and_writes_nothing(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=2)
    evicted = record_evictions(memory_cluster)
    settings = replace(FAST, namespace=NAMESPACE, strategy="spread", defrag_after=0.0,
                       defrag_wait=1.0)
    async with running_controller(memory_cluster, settings) as controller:
        await _bound_shares(world, memory_cluster)
        await world.add_node("node-1", gpus=1)
        await world.gated_pod("big", [whole_claim_spec(count=2)])
        await asyncio.sleep(0.2)
        checks = 0

        def fence() -> None:
            # The Lease is lost once the round has planned and begun to carry its plan out.
            nonlocal checks
            checks += 1
            if checks > 1:
                raise LeadershipLost("a standby took the Lease")

        mode = DefragMode(memory_cluster, settings, snapshot=controller.snapshot,
                          metrics=controller.metrics, fence=fence)
        with pytest.raises(LeadershipLost):
            await mode.round()
        assert evicted == []
        assert memory_cluster.objects(CONFIG_MAPS) == [], "a fenced replica wrote records"
