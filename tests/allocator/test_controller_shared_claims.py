"""Claims shared by several gated pods (named directly, not from a template).

Two pods naming one claim can be planned by two workers at once. While the first pod's plan
is being written, the second must not plan the shared claim again: that would replace the
first plan's reservation in the planner's state and leave its card free for a third pod,
while the first write still lands on it.
"""

from __future__ import annotations

import asyncio

from testkit import eventually

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import Object
from dra_gateway.kube.resources import PODS, RESOURCE_CLAIMS, RESOURCE_SLICES, ResourceType

from .conftest import (
    NAMESPACE,
    LaggingClaimWatch,
    World,
    check_no_overcommit,
    is_ungated,
    running_controller,
    whole_claim_spec,
)


class SlowAllocations(LaggingClaimWatch):
    """Writes of status.allocation wait until `go` is set."""

    def __init__(self, inner: MemoryCluster) -> None:
        super().__init__(inner)
        self.go = asyncio.Event()
        self.waiting = 0

    async def update(self, rt: ResourceType, obj: Object, *, namespace: str | None = None,
                     subresource: str | None = None) -> Object:
        if rt is RESOURCE_CLAIMS and subresource == "status" and (
                obj.get("status") or {}).get("allocation"):
            self.waiting += 1
            await self.go.wait()
        return await self.inner.update(rt, obj, namespace=namespace, subresource=subresource)


def standalone_claim(name: str) -> Object:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NAMESPACE}, "spec": whole_claim_spec()}


def gated_pod(name: str, claim_name: str) -> Object:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"containers": [{"name": "main", "image": "cuda:12",
                                     "resources": {"claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
                     "schedulingGates": [{"name": names.SCHEDULING_GATE}]}}


async def test_a_shared_claim_being_written_for_one_pod_is_not_planned_again_for_another(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=2)
    cluster = SlowAllocations(memory_cluster)
    await memory_cluster.create(RESOURCE_CLAIMS, standalone_claim("shared"), namespace=NAMESPACE)
    await memory_cluster.create(RESOURCE_CLAIMS, standalone_claim("other"), namespace=NAMESPACE)
    async with running_controller(cluster):
        await memory_cluster.create(PODS, gated_pod("first", "shared"), namespace=NAMESPACE)
        await eventually(lambda: cluster.waiting == 1)
        # While the shared claim's allocation is in flight, a second user and a third pod.
        await memory_cluster.create(PODS, gated_pod("second", "shared"), namespace=NAMESPACE)
        await asyncio.sleep(0.1)
        await memory_cluster.create(PODS, gated_pod("third", "other"), namespace=NAMESPACE)
        await eventually(lambda: cluster.waiting == 2)
        await asyncio.sleep(0.1)
        cluster.go.set()

        async def all_ungated() -> bool:
            pods = [await world.pod(n) for n in ("first", "second", "third")]
            return all(is_ungated(p) for p in pods)

        await eventually(all_ungated)
        claims = memory_cluster.objects(RESOURCE_CLAIMS)
        check_no_overcommit(claims, memory_cluster.objects(RESOURCE_SLICES))
        devices = {c["metadata"]["name"]: [r["device"] for r in
                                           c["status"]["allocation"]["devices"]["results"]]
                   for c in claims}
        assert sorted(devices["shared"] + devices["other"]) == ["gpu-0", "gpu-1"]
