"""The allocator controller under GPU policies, on the embedded API: quota, queue, isolation."""

from __future__ import annotations

from typing import Any

from testkit import eventually

from dra_gateway.allocator.conditions import QUOTA_CONDITION
from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import Object
from dra_gateway.kube.resources import (
    DEVICE_CLASSES,
    EVENTS,
    GPU_QUOTAS,
    GPU_SHARING_POLICIES,
    NAMESPACES,
    PODS,
)

from .conftest import (
    NAMESPACE,
    World,
    running_controller,
    share_claim_spec,
    ungated,
    whole_claim_spec,
)


def gpu_quota(namespace: str, name: str, **hard: Any) -> Object:
    return {"apiVersion": names.API_VERSION, "kind": "GPUQuota",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"hard": hard}}


def condition(pod: Object) -> Object | None:
    for entry in (pod.get("status") or {}).get("conditions") or ():
        if entry.get("type") == QUOTA_CONDITION:
            return dict(entry)
    return None


def card_holders(claims: list[Object]) -> dict[tuple[str, str], set[str]]:
    holders: dict[tuple[str, str], set[str]] = {}
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation")
        for result in (allocation or {}).get("devices", {}).get("results", ()):
            holders.setdefault((result["pool"], result["device"]), set()).add(
                claim["metadata"]["namespace"])
    return holders


async def test_a_pod_past_the_quota_waits_with_its_condition_and_is_placed_when_usage_frees(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=2)
    await memory_cluster.create(GPU_QUOTAS, gpu_quota(NAMESPACE, "team-a-gpu", memory="40Gi"),
                                namespace=NAMESPACE)
    async with running_controller(memory_cluster) as controller:
        for name in ("p1", "p2"):
            await world.gated_pod(name, [share_claim_spec(memory_gib=20, cores=10)])
            await eventually(lambda name=name: ungated(world, name))  # type: ignore[misc]
        await world.gated_pod("p3", [share_claim_spec(memory_gib=20, cores=10)])

        async def held() -> Object | None:
            found = condition(await world.pod("p3"))
            return found if found and found["status"] == "True" else None

        waiting = await eventually(held)
        assert waiting["reason"] == "QuotaExceeded"
        assert waiting["message"] == ("exceeded quota team-a-gpu: requested memory=20Gi, used "
                                      "memory=40Gi, limited memory=40Gi")
        events = memory_cluster.objects(EVENTS)
        assert any(e["reason"] == "QuotaExceeded" and e["involvedObject"]["name"] == "p3"
                   and e["message"] == waiting["message"] for e in events)
        assert not await ungated(world, "p3")

        async def status_written() -> Object | None:
            quota = await memory_cluster.get(GPU_QUOTAS, "team-a-gpu", namespace=NAMESPACE)
            return quota.get("status") if quota.get("status", {}).get("used") else None

        assert await eventually(status_written) == {"hard": {"memory": "40Gi"},
                                                    "used": {"memory": "40Gi"}}
        registry = controller.metrics.registry
        assert registry.get_sample_value("dra_gateway_allocator_pending_pods",
                                         {"reason": "QuotaExceeded"}) == 1
        labels = {"quota_namespace": NAMESPACE, "quota": "team-a-gpu", "resource": "memory"}
        assert registry.get_sample_value("dra_gateway_allocator_quota_used", labels) == 40 << 30
        assert registry.get_sample_value("dra_gateway_allocator_quota_hard", labels) == 40 << 30

        await world.finish("p1")
        await eventually(lambda: ungated(world, "p3"))
        cleared = condition(await world.pod("p3"))
        assert cleared is not None
        assert cleared["status"] == "False"
        assert cleared["reason"] == "QuotaAvailable"


async def test_waiting_pods_are_placed_in_creation_order_as_usage_frees(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=2)
    await memory_cluster.create(GPU_QUOTAS, gpu_quota(NAMESPACE, "q", memory="40Gi"),
                                namespace=NAMESPACE)
    async with running_controller(memory_cluster):
        await world.gated_pod("a-first", [share_claim_spec(memory_gib=30, cores=10)])
        await eventually(lambda: ungated(world, "a-first"))
        await world.gated_pod("b-big", [share_claim_spec(memory_gib=20, cores=10)])

        async def reason_of(name: str) -> str | None:
            found = condition(await world.pod(name))
            return found["reason"] if found and found["status"] == "True" else None

        assert await eventually(lambda: reason_of("b-big")) == "QuotaExceeded"
        # Fits the 10Gi left, but a pod created earlier waits for the quota.
        await world.gated_pod("c-small", [share_claim_spec(memory_gib=8, cores=10)])
        assert await eventually(lambda: reason_of("c-small")) == "QueuedForQuota"
        assert not await ungated(world, "c-small")
        await world.finish("a-first")
        await eventually(lambda: ungated(world, "b-big"))
        await eventually(lambda: ungated(world, "c-small"))


async def test_an_isolated_tenant_never_shares_a_card_with_another(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=2)
    for ns in ("team-a", "team-b", "team-c"):
        await memory_cluster.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": {"name": ns,
                                                              "labels": {"isolated": "yes"}}})
    await memory_cluster.create(GPU_SHARING_POLICIES, {
        "apiVersion": names.API_VERSION, "kind": "GPUSharingPolicy",
        "metadata": {"name": "tenants"},
        "spec": {"namespaceSelector": {"matchLabels": {"isolated": "yes"}},
                 "isolation": {"mode": "Namespace"}}})
    async with running_controller(memory_cluster):
        for n, ns in enumerate(("team-a", "team-b", "team-a", "team-b")):
            await world.gated_pod(f"p{n}", [share_claim_spec(memory_gib=10, cores=10)],
                                  namespace=ns)
            await eventually(lambda n=n: ungated(world, f"p{n}"))  # type: ignore[misc]
        await world.gated_pod("late", [share_claim_spec(memory_gib=10, cores=10)],
                              namespace="team-c")

        async def refused() -> str | None:
            for event in memory_cluster.objects(EVENTS):
                if event["involvedObject"]["name"] == "late":
                    return str(event["message"])
            return None

        message = await eventually(refused)
        assert "(isolation)" in message
        assert "GPUSharingPolicy tenants" in message
        claims = [c for n in range(4) for c in await world.claims_of(f"p{n}")]
        holders = card_holders(claims)
        assert len(holders) == 2
        assert all(len(namespaces) == 1 for namespaces in holders.values()), holders


def legacy_pod(name: str, limits: dict[str, str], *, node: str | None = None) -> Object:
    """A pod a legacy device plugin serves: its legacy names stay, it is not gated."""
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "cuda:12",
                                            "resources": {"limits": limits}}]}
    if node is not None:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE,
                         "annotations": {names.TRANSLATION_LABEL: "disabled"}},
            "spec": spec, "status": {"phase": "Running" if node else "Pending"}}


async def test_a_quota_counts_legacy_pods_with_translated_ones_and_frees_when_they_end(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=4)
    await memory_cluster.create(GPU_QUOTAS, gpu_quota(NAMESPACE, "gpus", devices=2),
                                namespace=NAMESPACE)
    # A legacy pod holds one card through the device plugin (another node; no claim at all).
    await memory_cluster.create(PODS, legacy_pod("legacy", {"nvidia.com/gpu": "1"},
                                                 node="legacy-node"), namespace=NAMESPACE)
    async with running_controller(memory_cluster):
        await world.gated_pod("t1", [whole_claim_spec(1)])
        await eventually(lambda: ungated(world, "t1"))
        await world.gated_pod("t2", [whole_claim_spec(1)])

        async def held() -> Object | None:
            found = condition(await world.pod("t2"))
            return found if found and found["status"] == "True" else None

        waiting = await eventually(held)
        assert waiting["message"] == ("exceeded quota gpus: requested devices=1, used "
                                      "devices=2, limited devices=2")

        async def status_used() -> Object | None:
            quota = await memory_cluster.get(GPU_QUOTAS, "gpus", namespace=NAMESPACE)
            used = (quota.get("status") or {}).get("used")
            return used if used == {"devices": 2} else None

        assert await eventually(status_used) == {"devices": 2}
        assert not await ungated(world, "t2")
        await memory_cluster.delete(PODS, "legacy", namespace=NAMESPACE)
        await eventually(lambda: ungated(world, "t2"))


async def test_a_legacy_share_is_charged_what_its_translation_would_cost(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=2)
    await memory_cluster.create(GPU_QUOTAS, gpu_quota(NAMESPACE, "mem", memory="40Gi"),
                                namespace=NAMESPACE)
    # HAMi: 2 cards of 16384 MiB each: 32Gi of the 40Gi.
    await memory_cluster.create(PODS, legacy_pod("hami", {
        "nvidia.com/gpu": "2", "nvidia.com/gpumem": "16384", "nvidia.com/gpucores": "30"}),
        namespace=NAMESPACE)
    async with running_controller(memory_cluster):
        await world.gated_pod("fits", [share_claim_spec(memory_gib=8, cores=10)])
        await eventually(lambda: ungated(world, "fits"))
        await world.gated_pod("over", [share_claim_spec(memory_gib=8, cores=10)])

        async def reason() -> str | None:
            found = condition(await world.pod("over"))
            return found["message"] if found and found["status"] == "True" else None

        assert await eventually(reason) == ("exceeded quota mem: requested memory=8Gi, used "
                                            "memory=40Gi, limited memory=40Gi")
        await world.finish("fits")
        await eventually(lambda: ungated(world, "over"))


async def test_legacy_charges_follow_what_device_classes_declare(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=2)
    await memory_cluster.create(GPU_QUOTAS, gpu_quota(NAMESPACE, "gpus", devices=2),
                                namespace=NAMESPACE)
    await memory_cluster.create(PODS, legacy_pod("legacy", {"nvidia.com/gpu": "1"},
                                                 node="legacy-node"), namespace=NAMESPACE)
    async with running_controller(memory_cluster):
        async def used(devices: int) -> bool:
            quota = await memory_cluster.get(GPU_QUOTAS, "gpus", namespace=NAMESPACE)
            return ((quota.get("status") or {}).get("used") or {}).get("devices") == devices

        await eventually(lambda: used(1))
        # From now on kube-scheduler serves nvidia.com/gpu through claims of this class: the
        # pod is no legacy plugin's any more, and is charged again at once.
        await memory_cluster.create(DEVICE_CLASSES, {
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": "gpu.example.com"},
            "spec": {"extendedResourceName": "nvidia.com/gpu"}})
        await eventually(lambda: used(0))
