"""Other gates first: a pod another admission system still holds (Kueue's
kueue.x-k8s.io/admission, KAI's, any other scheduling gate) gets no device from the gateway,
says so in its condition, and is placed within moments of the last other gate going."""

from __future__ import annotations

import asyncio

from testkit import eventually

from dra_gateway.allocator.conditions import GATES_CONDITION
from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import Object
from dra_gateway.kube.resources import PODS

from .conftest import NAMESPACE, World, running_controller, ungated, whole_claim_spec

KUEUE = "kueue.x-k8s.io/admission"


def _condition(pod: Object) -> Object | None:
    for entry in (pod.get("status") or {}).get("conditions") or ():
        if entry.get("type") == GATES_CONDITION:
            return dict(entry)
    return None


async def test_a_pod_behind_another_gate_holds_no_card_until_it_goes(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=1)
    async with running_controller(memory_cluster):
        await world.gated_pod("queued", [whole_claim_spec(1)], other_gates=(KUEUE,))

        async def says_so() -> Object | None:
            found = _condition(await world.pod("queued"))
            return found if found and found["status"] == "True" else None

        condition = await eventually(says_so)
        assert condition["reason"] == "OtherGates"
        assert condition["message"] == (
            f"waiting for the scheduling gate(s) {KUEUE} to be removed: the gateway allocates "
            "this pod's devices once its own gate is the last one left")
        # It holds nothing: a pod created after it gets the one card.
        await world.gated_pod("admitted", [whole_claim_spec(1)])
        await eventually(lambda: ungated(world, "admitted"))
        assert not any((c.get("status") or {}).get("allocation")
                       for c in await world.claims_of("queued"))
        assert not await ungated(world, "queued")
        await world.finish("admitted")
        await asyncio.sleep(0.2)
        assert not await ungated(world, "queued")  # the card is free, the queue still holds it
        # Kueue admits it: only the gateway's gate is left, and it is placed.
        await memory_cluster.patch(PODS, "queued", {"spec": {"schedulingGates": [
            {"name": names.SCHEDULING_GATE}]}}, namespace=NAMESPACE)
        await eventually(lambda: ungated(world, "queued"))
        cleared = _condition(await world.pod("queued"))
        assert cleared is not None
        assert (cleared["status"], cleared["reason"]) == ("False", "GatesRemoved")
