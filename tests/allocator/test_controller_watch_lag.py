"""A watch that lags behind the controller's own writes must not make a device look free.

The controller applies its writes to the mirror as soon as they succeed (finalizer, then
allocation); the watch delivers the same changes later, one by one. The older of those events
must not roll the mirror back to a claim without its allocation: for as long as it stood, the
planner would see the card free and hand it out a second time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from dra_gateway.kube import names
from dra_gateway.kube.cluster.memory import MemoryCluster
from dra_gateway.kube.cluster.port import Object, ObjectList, PatchType, WatchEvent
from dra_gateway.kube.resources import PODS, RESOURCE_CLAIMS, RESOURCE_SLICES, ResourceType

from .conftest import (
    NAMESPACE,
    World,
    check_no_overcommit,
    eventually,
    is_ungated,
    running_controller,
    whole_claim_spec,
)


class LaggingClaimWatch:
    """A cluster whose ResourceClaim watches hold events back while `hold` is set."""

    def __init__(self, inner: MemoryCluster) -> None:
        self.inner = inner
        self.hold = False
        self.released = 0  # held events let through so far
        self._changed = asyncio.Event()

    def let_through(self, count: int) -> None:
        self.released += count
        self._changed.set()

    async def get(self, rt: ResourceType, name: str, *, namespace: str | None = None) -> Object:
        return await self.inner.get(rt, name, namespace=namespace)

    async def list(self, rt: ResourceType, *, namespace: str | None = None,
                   label_selector: str | None = None,
                   field_selector: str | None = None) -> ObjectList:
        return await self.inner.list(rt, namespace=namespace, label_selector=label_selector,
                                     field_selector=field_selector)

    async def watch(self, rt: ResourceType, *, namespace: str | None = None,
                    resource_version: str | None = None, label_selector: str | None = None,
                    field_selector: str | None = None,
                    timeout_seconds: float | None = None) -> AsyncIterator[WatchEvent]:
        held = 0
        async for event in self.inner.watch(rt, namespace=namespace,
                                            resource_version=resource_version,
                                            label_selector=label_selector,
                                            field_selector=field_selector,
                                            timeout_seconds=timeout_seconds):
            if rt is RESOURCE_CLAIMS and self.hold:
                held += 1
                while held > self.released:
                    self._changed.clear()
                    await self._changed.wait()
            yield event

    async def create(self, rt: ResourceType, obj: Object, *, namespace: str | None = None,
                     dry_run: bool = False) -> Object:
        return await self.inner.create(rt, obj, namespace=namespace, dry_run=dry_run)

    async def update(self, rt: ResourceType, obj: Object, *, namespace: str | None = None,
                     subresource: str | None = None) -> Object:
        return await self.inner.update(rt, obj, namespace=namespace, subresource=subresource)

    async def patch(self, rt: ResourceType, name: str, patch: Any, *,
                    namespace: str | None = None, patch_type: PatchType = "merge",
                    subresource: str | None = None) -> Object:
        return await self.inner.patch(rt, name, patch, namespace=namespace,
                                      patch_type=patch_type, subresource=subresource)

    async def delete(self, rt: ResourceType, name: str, *, namespace: str | None = None,
                     resource_version: str | None = None) -> Object | None:
        return await self.inner.delete(rt, name, namespace=namespace,
                                       resource_version=resource_version)

    async def close(self) -> None:
        await self.inner.close()


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
        await eventually(lambda: _ungated(world, "first"))
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


async def _ungated(world: World, name: str) -> Object | None:
    pod = await world.pod(name)
    return pod if is_ungated(pod) else None
