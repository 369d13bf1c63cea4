"""A watch that lags behind the controller's own writes must not make a device look free.

The controller applies its writes to the mirror as soon as they succeed (finalizer, then
allocation); the watch delivers the same changes later, one by one. The older of those events
must not roll the mirror back to a claim without its allocation: for as long as it stood, the
planner would see the card free and hand it out a second time.
"""

from __future__ import annotations

import asyncio

from testkit import eventually

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube import names
from dra_gateway.kube.resources import PODS, RESOURCE_CLAIMS, RESOURCE_SLICES

from .conftest import (
    NAMESPACE,
    LaggingClaimWatch,
    World,
    check_no_overcommit,
    is_ungated,
    running_controller,
    ungated,
    whole_claim_spec,
)


async def test_a_lagging_watch_event_older_than_our_write_does_not_free_the_card(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=1)
    cluster = LaggingClaimWatch(memory_cluster)
    # A claim of its own, named by the second pod directly: its arrival is not held back.
    await memory_cluster.create(RESOURCE_CLAIMS, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "second-gpu", "namespace": NAMESPACE},
        "spec": whole_claim_spec()}, namespace=NAMESPACE)
    async with running_controller(cluster) as controller:
        await eventually(lambda: controller.claims.get(NAMESPACE, "second-gpu"))
        pod = await world.gated_pod("first", [whole_claim_spec()], create_claims=False)
        # Play the claim controller by hand: the claim first, the pod's claim status later.
        claim = await memory_cluster.create(RESOURCE_CLAIMS, {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "first-gpu", "namespace": NAMESPACE, "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": "first",
                 "uid": pod["metadata"]["uid"], "controller": True,
                 "blockOwnerDeletion": True}]},
            "spec": whole_claim_spec()}, namespace=NAMESPACE)
        name = claim["metadata"]["name"]
        await eventually(lambda: controller.claims.get(NAMESPACE, name))
        cluster.hold = True
        await memory_cluster.patch(PODS, "first", {"status": {"resourceClaimStatuses": [
            {"name": "gpu-0", "resourceClaimName": name}]}}, namespace=NAMESPACE,
            subresource="status")
        # The claim is written twice (finalizer, allocation) while its watch stands still.
        await eventually(lambda: ungated(world, "first"))
        assert (controller.claims.get(NAMESPACE, name) or {}).get("status", {}).get("allocation")
        # The watch now brings the finalizer write alone: the mirror must stay allocated.
        cluster.let_through(1)
        await asyncio.sleep(0.05)
        assert (controller.claims.get(NAMESPACE, name) or {}).get("status", {}).get(
            "allocation"), "a stale watch event rolled the mirror back"
        # A pod asking for the only card meanwhile must not get it.
        await memory_cluster.create(PODS, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "second", "namespace": NAMESPACE},
            "spec": {"containers": [{"name": "main", "image": "cuda:12",
                                     "resources": {"claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": "second-gpu"}],
                     "schedulingGates": [{"name": names.SCHEDULING_GATE}]}},
            namespace=NAMESPACE)
        await asyncio.sleep(0.2)
        check_no_overcommit(memory_cluster.objects(RESOURCE_CLAIMS),
                            memory_cluster.objects(RESOURCE_SLICES))
        cluster.let_through(1000)
        await asyncio.sleep(0.1)
        assert not is_ungated(await world.pod("second"))
        check_no_overcommit(memory_cluster.objects(RESOURCE_CLAIMS),
                            memory_cluster.objects(RESOURCE_SLICES))
