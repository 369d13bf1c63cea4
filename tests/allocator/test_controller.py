"""The allocator controller's protocol: gate, finalizer, allocation, release, events."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import kubernetes_validate
from testkit import eventually

from dra_gateway.allocator.controller import ControllerSettings
from dra_gateway.devkit.sim.controlplane import SimulatedControllers
from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import ApiError, Forbidden
from dra_gateway.kube.resources import EVENTS, NODES, PODS, RESOURCE_CLAIMS, RESOURCE_SLICES

from .conftest import (
    FAST,
    NAMESPACE,
    World,
    check_no_overcommit,
    is_ungated,
    running_controller,
    share_claim_spec,
    ungated,
    whole_claim_spec,
)


def node_of(claim: dict[str, Any]) -> str:
    terms = claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"]
    return str(terms[0]["matchFields"][0]["values"][0])


async def test_a_gated_pod_gets_every_claim_allocated_on_one_node_then_loses_only_its_gate(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=2, gpus=2)
    async with running_controller(memory_cluster) as controller:
        await world.gated_pod("train", [share_claim_spec(memory_gib=20, cores=30),
                                        whole_claim_spec()])
        pod = await eventually(lambda: ungated(world, "train"))
        assert not pod["spec"].get("schedulingGates")
        claims = await world.claims_of("train")
        assert all(names.FINALIZER in c["metadata"]["finalizers"] for c in claims)
        assert len({node_of(c) for c in claims}) == 1
        shared = claims[0]["status"]["allocation"]["devices"]["results"][0]
        assert shared["consumedCapacity"] == {"memory": "20Gi", "cores": "30"}
        assert shared["shareID"]
        for claim in claims:
            kubernetes_validate.validate(claim, "1.34", strict=True)
        assert controller.consumable_capacity is True
        assert controller.metrics.consumable_capacity._value.get() == 1
        check_no_overcommit(await _all_claims(memory_cluster), memory_cluster.objects(
            RESOURCE_SLICES))


async def test_every_allocation_carries_a_timestamp_so_a_1_36_scheduler_can_bind_the_pod(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=2)
    before = datetime.now(UTC).replace(microsecond=0)
    # The stand-in scheduler fills a missing allocationTimestamp as kube-scheduler does from
    # 1.36, and the API refuses that change: without the field the pod would never bind.
    async with running_controller(memory_cluster), SimulatedControllers(
            memory_cluster, retry_delay=0.05, binding_conditions=True).running():
        await world.gated_pod("bind", [share_claim_spec(memory_gib=8), whole_claim_spec()])
        await eventually(lambda: ungated(world, "bind"))
        await memory_cluster.patch(PODS, "bind", {"spec": {"schedulingGates": None}},
                                   namespace=NAMESPACE)

        async def bound() -> str | None:
            return (await world.pod("bind"))["spec"].get("nodeName")

        assert await eventually(bound) == "node-0"
    for claim in await world.claims_of("bind"):
        stamp = claim["status"]["allocation"]["allocationTimestamp"]
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", stamp)  # metav1.Time
        written = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        assert before <= written <= datetime.now(UTC) + timedelta(seconds=1)
        assert [r["name"] for r in claim["status"]["reservedFor"]] == ["bind"]
        kubernetes_validate.validate(claim, "1.34", strict=True)


async def test_the_allocation_reserves_the_claim_for_its_pod_so_binding_writes_no_claim(
        world: World, memory_cluster: MemoryCluster) -> None:
    # kube-scheduler's PreBind skips a claim already reserved for the pod, as it does for a
    # claim it allocated itself: one status write per claim, the allocator's.
    await world.setup(nodes=1, gpus=2)
    status_writes: list[str] = []
    original_update = memory_cluster.update

    async def update(rt: Any, obj: Any, **kw: Any) -> dict[str, Any]:
        if rt is RESOURCE_CLAIMS and kw.get("subresource") == "status":
            status_writes.append(obj["metadata"]["name"])
        return await original_update(rt, obj, **kw)

    memory_cluster.update = update  # type: ignore[method-assign,assignment]
    async with running_controller(memory_cluster), SimulatedControllers(
            memory_cluster, retry_delay=0.05).running():
        await world.gated_pod("reserved", [share_claim_spec(memory_gib=8), whole_claim_spec()])
        await eventually(lambda: ungated(world, "reserved"))
        pod = await world.pod("reserved")
        claims = await world.claims_of("reserved")
        for claim in claims:
            assert claim["status"]["reservedFor"] == [
                {"resource": "pods", "name": "reserved", "uid": pod["metadata"]["uid"]}]
            kubernetes_validate.validate(claim, "1.34", strict=True)
        await memory_cluster.patch(PODS, "reserved", {"spec": {"schedulingGates": None}},
                                   namespace=NAMESPACE)

        async def bound() -> str | None:
            return (await world.pod("reserved"))["spec"].get("nodeName")

        assert await eventually(bound) == "node-0"
    assert sorted(status_writes) == sorted(c["metadata"]["name"] for c in claims)


async def test_the_gate_stays_until_every_claim_of_the_pod_exists(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=2)
    async with running_controller(memory_cluster) as controller:
        await world.gated_pod("waits", [share_claim_spec(memory_gib=10)], create_claims=False)
        await asyncio.sleep(0.2)
        assert not is_ungated(await world.pod("waits"))
        assert controller.stats.plans == 0
        await world.create_claims("waits", [share_claim_spec(memory_gib=10)])
        await eventually(lambda: ungated(world, "waits"))
        (claim,) = await world.claims_of("waits")
        assert claim["status"]["allocation"]


async def test_an_unplaceable_pod_gets_one_warning_event_and_is_placed_once_capacity_comes(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=1, memory_gib=40)
    async with running_controller(memory_cluster):
        await world.gated_pod("big", [share_claim_spec(memory_gib=60)])

        def events() -> list[dict[str, Any]]:
            return [e for e in memory_cluster.objects(EVENTS)
                    if e["involvedObject"]["name"] == "big"]

        await eventually(lambda: [e for e in events() if e["count"] >= 3])
        (event,) = events()
        assert event["reason"] == "AllocationFailed"
        assert event["type"] == "Warning"
        assert event["involvedObject"]["uid"] == world.pods["big"]["metadata"]["uid"]
        assert event["message"]
        kubernetes_validate.validate(event, "1.34", strict=True)
        assert not is_ungated(await world.pod("big"))
        await world.add_node("node-big", gpus=1, memory_gib=80)
        await eventually(lambda: ungated(world, "big"))
        (claim,) = await world.claims_of("big")
        assert node_of(claim) == "node-big"


async def test_a_deleted_pod_has_its_claims_released_and_their_finalizer_removed(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=1)
    async with running_controller(memory_cluster):
        await world.gated_pod("short", [whole_claim_spec()])
        await eventually(lambda: ungated(world, "short"))
        await memory_cluster.delete(PODS, "short", namespace=NAMESPACE)
        # The claim is garbage collected once the allocator lets go of it.
        await eventually(lambda: not memory_cluster.objects(RESOURCE_CLAIMS))
        # The card is free again for the next pod.
        await world.gated_pod("next", [whole_claim_spec()])
        await eventually(lambda: ungated(world, "next"))


async def test_a_finished_pod_has_its_claims_released_but_the_claims_stay(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=1)
    async with running_controller(memory_cluster) as controller:
        await world.gated_pod("job", [share_claim_spec(memory_gib=30)])
        await eventually(lambda: ungated(world, "job"))
        await world.finish("job", "Failed")

        async def released() -> bool:
            (claim,) = await world.claims_of("job")
            return not claim.get("status", {}).get("allocation") and names.FINALIZER not in (
                claim["metadata"].get("finalizers") or [])

        await eventually(released)
        assert controller.stats.claims_released == 1


async def test_a_claim_allocated_by_someone_else_is_kept_and_pins_the_other_claims(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=3, gpus=2)
    pod = await world.gated_pod("pinned", [whole_claim_spec(), share_claim_spec(memory_gib=8)],
                                create_claims=False)
    first, second = await world.create_claims(
        "pinned", [whole_claim_spec(), share_claim_spec(memory_gib=8)])
    first["status"] = {"allocation": {
        "devices": {"results": [{"request": "gpu", "driver": names.DRIVER, "pool": "node-2",
                                 "device": "gpu-1"}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["node-2"]}]}]}}}
    await memory_cluster.update(RESOURCE_CLAIMS, first, namespace=NAMESPACE,
                                subresource="status")
    del pod, second
    async with running_controller(memory_cluster):
        await eventually(lambda: ungated(world, "pinned"))
        claims = await world.claims_of("pinned")
        assert [node_of(c) for c in claims] == ["node-2", "node-2"]
        assert claims[0]["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-1"
        # The scheduler's allocation is not ours to release: no finalizer was added to it.
        assert names.FINALIZER not in (claims[0]["metadata"].get("finalizers") or [])
        assert claims[1]["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"


async def test_in_the_fallback_world_shares_are_recorded_in_annotations(
        memory_cluster: MemoryCluster) -> None:
    world = World(memory_cluster, native=False)
    await world.setup(nodes=1, gpus=1)
    settings = ControllerSettings(**{**FAST.__dict__, "consumable_capacity": False})
    async with running_controller(memory_cluster, settings) as controller:
        await world.gated_pod("a", [share_claim_spec(memory_gib=50)])
        await world.gated_pod("b", [share_claim_spec(memory_gib=50)])
        await eventually(lambda: ungated(world, "a"))
        await asyncio.sleep(0.1)
        assert not is_ungated(await world.pod("b"))  # 50 + 50 > 80 on the only card
        (claim,) = await world.claims_of("a")
        result = claim["status"]["allocation"]["devices"]["results"][0]
        assert "shareID" not in result
        assert "consumedCapacity" not in result
        assert names.ANNOTATION_SHARES in claim["metadata"]["annotations"]
        assert controller.metrics.consumable_capacity._value.get() == 0
        await world.finish("a")
        await eventually(lambda: ungated(world, "b"))
        (released,) = await world.claims_of("a")
        assert names.ANNOTATION_SHARES not in (released["metadata"].get("annotations") or {})


async def test_the_controller_detects_a_server_that_drops_consumable_capacity() -> None:
    class DropsGatedFields(MemoryCluster):
        """An API server with DRAConsumableCapacity off: the gated field does not survive."""

        async def create(self, rt: Any, obj: dict[str, Any], *, namespace: str | None = None,
                         dry_run: bool = False) -> dict[str, Any]:
            if rt is RESOURCE_SLICES:
                for device in obj["spec"].get("devices") or []:
                    device.pop("allowMultipleAllocations", None)
            return await super().create(rt, obj, namespace=namespace, dry_run=dry_run)

    cluster = DropsGatedFields()
    await World(cluster, native=False).setup(nodes=1, gpus=1)
    async with running_controller(cluster) as controller:
        assert controller.consumable_capacity is False
        assert controller.state.settings.consumable_capacity is False
        assert controller.metrics.consumable_capacity._value.get() == 0


async def test_a_pod_is_planned_again_when_its_allocation_is_wiped_while_still_gated(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=2)
    allowed = asyncio.Event()
    original_patch = memory_cluster.patch
    calls: list[str] = []

    async def patch(rt: Any, name: str, body: Any, **kw: Any) -> dict[str, Any]:
        # Hold the gate removal back until the allocation has been wiped.
        if rt is PODS and kw.get("patch_type") == "json":
            calls.append(name)
            if not allowed.is_set():
                raise ApiError("try later", code=503, reason="ServiceUnavailable")
        return await original_patch(rt, name, body, **kw)

    memory_cluster.patch = patch  # type: ignore[method-assign,assignment]
    async with running_controller(memory_cluster) as controller:
        await world.gated_pod("wiped", [share_claim_spec(memory_gib=10)])
        await eventually(lambda: calls)
        (claim,) = await world.claims_of("wiped")
        assert claim["status"]["allocation"]
        claim["status"] = {}
        await memory_cluster.update(RESOURCE_CLAIMS, claim, namespace=NAMESPACE,
                                    subresource="status")
        plans = controller.stats.plans
        allowed.set()
        await eventually(lambda: ungated(world, "wiped"))
        (claim,) = await world.claims_of("wiped")
        assert claim["status"]["allocation"]
        assert controller.stats.plans > plans


async def test_the_gate_goes_without_reading_back_the_claims_the_same_sync_allocated(
        world: World, memory_cluster: MemoryCluster) -> None:
    # The write's answer confirms the allocation; a claim allocated by an earlier sync (the
    # gate removal failed then) is read from the API before the gate goes.
    await world.setup(nodes=1, gpus=2)
    reads: list[str] = []
    original_get = memory_cluster.get
    failing = {"later"}

    async def get(rt: Any, name: str, **kw: Any) -> dict[str, Any]:
        if rt is RESOURCE_CLAIMS:
            reads.append(name)
        return await original_get(rt, name, **kw)

    original_patch = memory_cluster.patch

    async def patch(rt: Any, name: str, body: Any, **kw: Any) -> dict[str, Any]:
        if rt is PODS and kw.get("patch_type") == "json" and name in failing:
            failing.discard(name)
            raise ApiError("try later", code=503, reason="ServiceUnavailable")
        return await original_patch(rt, name, body, **kw)

    memory_cluster.get = get  # type: ignore[method-assign,assignment]
    memory_cluster.patch = patch  # type: ignore[method-assign,assignment]
    async with running_controller(memory_cluster):
        await world.gated_pod("now", [share_claim_spec(memory_gib=10)])
        await eventually(lambda: ungated(world, "now"))
        assert reads == []
        await world.gated_pod("later", [share_claim_spec(memory_gib=10)])
        await eventually(lambda: ungated(world, "later"))
        read = list(reads)
        (claim,) = await world.claims_of("later")
        assert read == [claim["metadata"]["name"]]


async def _all_claims(cluster: MemoryCluster) -> list[dict[str, Any]]:
    return cluster.objects(RESOURCE_CLAIMS)


async def test_a_partial_allocation_that_pins_the_pod_where_it_no_longer_fits_is_undone(
        memory_cluster: MemoryCluster) -> None:
    world = World(memory_cluster)
    await world.setup(nodes=0)
    await world.add_node("node-0", gpus=1)
    await world.add_node("node-1", gpus=2)
    await world.gated_pod("pair", [whole_claim_spec(), whole_claim_spec()],
                          create_claims=False)
    first, _ = await world.create_claims("pair", [whole_claim_spec(), whole_claim_spec()])
    # As if an earlier allocator wrote one claim and stopped before the other.
    first["metadata"]["finalizers"] = [names.FINALIZER]
    first = await memory_cluster.update(RESOURCE_CLAIMS, first, namespace=NAMESPACE)
    first["status"] = {"allocation": {
        "devices": {"results": [{"request": "gpu", "driver": names.DRIVER, "pool": "node-0",
                                 "device": "gpu-0"}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["node-0"]}]}]}}}
    await memory_cluster.update(RESOURCE_CLAIMS, first, namespace=NAMESPACE,
                                subresource="status")
    async with running_controller(memory_cluster):
        await eventually(lambda: ungated(world, "pair"))
        claims = await world.claims_of("pair")
        assert [node_of(c) for c in claims] == ["node-1", "node-1"]
        check_no_overcommit(memory_cluster.objects(RESOURCE_CLAIMS),
                            memory_cluster.objects(RESOURCE_SLICES))


async def test_repeated_failures_update_the_event_at_most_once_per_interval(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=1, memory_gib=40)
    settings = ControllerSettings(**{**FAST.__dict__, "event_interval": 3600.0})
    async with running_controller(memory_cluster, settings) as controller:
        await world.gated_pod("big", [share_claim_spec(memory_gib=60)])
        await eventually(lambda: controller.stats.failures >= 5)
        (event,) = [e for e in memory_cluster.objects(EVENTS)
                    if e["involvedObject"]["name"] == "big"]
        assert event["count"] == 1


async def test_without_a_dry_run_the_mode_is_learned_from_the_first_published_slice() -> None:
    class NoDryRun(MemoryCluster):
        """RBAC without create on ResourceSlices: the probe is refused."""

        async def create(self, rt: Any, obj: dict[str, Any], *, namespace: str | None = None,
                         dry_run: bool = False) -> dict[str, Any]:
            if dry_run:
                raise Forbidden('resourceslices.resource.k8s.io is forbidden: User '
                                '"system:serviceaccount:dra-gateway:allocator" cannot create '
                                'resource "resourceslices"')
            return await super().create(rt, obj, namespace=namespace, dry_run=dry_run)

    cluster = NoDryRun()
    world = World(cluster)
    await world.setup(nodes=0)
    async with running_controller(cluster) as controller:
        assert controller.consumable_capacity is None
        await world.add_node("node-0", gpus=1)
        await eventually(lambda: controller.consumable_capacity is True)
        assert controller.metrics.consumable_capacity._value.get() == 1
        await world.gated_pod("native", [share_claim_spec(memory_gib=8)])
        await eventually(lambda: ungated(world, "native"))
        (claim,) = await world.claims_of("native")
        assert claim["status"]["allocation"]["devices"]["results"][0]["shareID"]


async def test_node_heartbeats_do_not_replan_unplaceable_pods_but_a_resource_change_does(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=1, memory_gib=40)
    slow_backoff = ControllerSettings(base_delay=30.0, max_delay=60.0,
                                      retry_unplaceable_after=0.01, identity="test-allocator")
    async with running_controller(memory_cluster, slow_backoff) as controller:
        await world.gated_pod("big", [share_claim_spec(memory_gib=60)])
        await eventually(lambda: controller.stats.failures >= 1)
        for second in range(20):
            await memory_cluster.patch(NODES, "node-0", {"status": {"conditions": [
                {"type": "Ready", "status": "True",
                 "lastHeartbeatTime": f"2025-01-01T00:00:{second:02d}Z"}]}},
                subresource="status")
            await asyncio.sleep(0.02)
        assert controller.stats.plans == 1
        await memory_cluster.patch(NODES, "node-0", {"metadata": {"labels": {"pool": "a"}}})
        await eventually(lambda: controller.stats.plans >= 2)


async def test_an_unreachable_api_during_detection_does_not_end_the_term() -> None:
    class Unreachable(MemoryCluster):
        """The API server drops the first connections of the term (a restart, a network blip)."""

        failures = 2

        async def create(self, rt: Any, obj: dict[str, Any], *, namespace: str | None = None,
                         dry_run: bool = False) -> dict[str, Any]:
            if dry_run and self.failures:
                self.failures -= 1
                raise ConnectionRefusedError(111, "Connect call failed")
            return await super().create(rt, obj, namespace=namespace, dry_run=dry_run)

    cluster = Unreachable()
    world = World(cluster)
    await world.setup(nodes=1, gpus=1)
    async with running_controller(cluster) as controller:
        assert controller.consumable_capacity is True  # learned from the published slice
        await world.gated_pod("after-blip", [share_claim_spec(memory_gib=8)])
        await eventually(lambda: ungated(world, "after-blip"))


async def test_pods_ending_all_the_time_replan_an_unplaceable_pod_at_most_once_per_interval(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=1, memory_gib=40)
    churn = ControllerSettings(base_delay=30.0, max_delay=60.0, retry_unplaceable_after=0.01,
                               unplaceable_retry_interval=0.5, identity="test-allocator")
    async with running_controller(memory_cluster, churn) as controller:
        await world.gated_pod("big", [share_claim_spec(memory_gib=60)])
        await eventually(lambda: controller.stats.failures >= 1)
        # Other workloads come and go on the node: each one ending frees CPU and memory.
        for i in range(30):
            await memory_cluster.create(PODS, {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"batch-{i}", "namespace": NAMESPACE},
                "spec": {"nodeName": "node-0", "containers": [
                    {"name": "c", "image": "i", "resources": {"requests": {"cpu": "1"}}}]}},
                namespace=NAMESPACE)
            await asyncio.sleep(0.01)
            await memory_cluster.delete(PODS, f"batch-{i}", namespace=NAMESPACE)
            await asyncio.sleep(0.02)
        # About 1 s of churn: the first plan, then one retry per 0.5 s at most.
        assert 2 <= controller.stats.plans <= 4
