"""What Kubernetes 1.38 changes, in the allocator: what the API refuses is never written, and,
when others wrote it into a claim, counted safely and named (kube/api_rules.py); device taints
from DeviceTaintRules (on by default from 1.37) are honoured, a toleration without an effect
tolerating NoExecute as 1.38's eviction does."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from testkit import eventually

from dra_gateway.allocator.controller import Controller
from dra_gateway.allocator.invalidclaims import InvalidClaims
from dra_gateway.allocator.metrics import Metrics
from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import ObjectList
from dra_gateway.kube.resources import DEVICE_TAINT_RULES, EVENTS, RESOURCE_CLAIMS, ResourceType
from dra_gateway.policy.amounts import charges_of

from .conftest import (
    FAST,
    NAMESPACE,
    World,
    is_ungated,
    running_controller,
    share_claim_spec,
    ungated,
    whole_claim_spec,
)
from .planner_support import DRIVER, claim, cluster, gpu, place, pod, results

SHARE_ID = "0f0e0d0c-0b0a-4908-8706-050403020100"


def _other_writers_claim(name: str, device: str, consumed: dict[str, str],
                         pool: str = "n1") -> dict[str, Any]:
    c = claim(name, capacity={"memory": "1Gi", "cores": "1"})
    c["status"] = {"allocation": {
        "devices": {"results": [{"request": "main", "driver": DRIVER, "pool": pool,
                                 "device": device, "shareID": SHARE_ID,
                                 "consumedCapacity": consumed}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [pool]}]}]}}}
    return c


def test_a_negative_consumed_capacity_of_another_writer_holds_its_device_whole() -> None:
    state = cluster({"n1": [gpu(0), gpu(1)]})
    state.set_claim(_other_writers_claim("bad", "gpu-0", {"memory": "-8Gi", "cores": "10"}))
    # Counted as written, -8Gi would leave 24Gi free on a 16Gi card; it holds gpu-0 alone.
    first = claim("first", capacity={"memory": "16Gi", "cores": "50"})
    assert [r["device"] for r in results(place(state, pod("a"), first), first)] == ["gpu-1"]
    second = claim("second", capacity={"memory": "1Gi", "cores": "1"})
    assert place(state, pod("b"), second).node_name is None


def test_an_unparsable_consumed_capacity_holds_its_device_whole() -> None:
    state = cluster({"n1": [gpu(0)]})
    state.set_claim(_other_writers_claim("bad", "gpu-0", {"memory": "lots", "cores": "10"}))
    assert place(state, pod(), claim(capacity={"memory": "1Gi", "cores": "1"})).node_name is None


def test_a_valid_share_of_another_writer_still_leaves_room_beside_it() -> None:
    state = cluster({"n1": [gpu(0)]})
    state.set_claim(_other_writers_claim("ok", "gpu-0", {"memory": "8Gi", "cores": "10"}))
    c = claim(capacity={"memory": "8Gi", "cores": "10"})
    assert [r["device"] for r in results(place(state, pod(), c), c)] == ["gpu-0"]


def test_quota_charges_count_a_negative_share_as_the_whole_card() -> None:
    bad = _other_writers_claim("bad", "gpu-0", {"memory": "-8Gi", "cores": "10"})
    bad["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = names.GPU_CLASS
    device = {"capacity": {names.CAPACITY_MEMORY: {"value": "16Gi"},
                           names.CAPACITY_CORES: {"value": "100"}}}
    (charge,) = charges_of(bad, lambda key: device)
    assert (charge.memory, charge.cores, charge.whole) == (16 << 30, 100, True)


def test_a_claim_asking_a_negative_or_unnamed_capacity_is_refused_naming_the_field() -> None:
    state = cluster({"n1": [gpu(0)]})
    negative = claim("neg", capacity={"memory": "-1Gi", "cores": "10"})
    plan = place(state, pod("a"), negative)
    assert plan.node_name is None
    assert plan.reason is not None
    assert ("spec.devices.requests[0].exactly.capacity.requests[memory]: -1Gi must be greater "
            "than or equal to 0") in plan.reason
    unnamed = claim("bad", capacity={"a/b/c": "1"})
    plan = place(state, pod("b"), unnamed)
    assert plan.node_name is None
    assert "capacity.requests[a/b/c]: must not contain more than one slash" in str(plan.reason)


def test_the_planner_never_writes_a_consumed_capacity_the_api_refuses() -> None:
    # A driver may publish a negative capacity (the API does not forbid it); the share of it a
    # result would consume is refused by 1.38: the pod waits with the reason instead.
    odd = gpu(0)
    odd["capacity"]["example.com/slots"] = {"value": "-2"}
    state = cluster({"n1": [odd]})
    c = claim(capacity={"memory": "1Gi", "cores": "1"})
    plan = place(state, pod(), c)
    assert plan.node_name is None
    assert plan.allocations == {}
    assert plan.reason is not None
    assert plan.reason.startswith("ResourceClaim ns/c: the allocation planned on node n1 is not "
                                  "one the API accepts (status.allocation.devices.results[0]."
                                  "consumedCapacity[example.com/slots]: -2 must be greater than "
                                  "or equal to 0)")


async def test_the_controller_names_an_invalid_claim_with_a_warning_event_and_a_gauge(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=2, memory_gib=40)
    pod_ = await world.gated_pod("other", [share_claim_spec(memory_gib=4, cores=10)],
                                 create_claims=False)
    del pod_
    (bad,) = await world.create_claims("other", [share_claim_spec(memory_gib=4, cores=10)])
    bad["status"] = {"allocation": {
        "devices": {"results": [{"request": "gpu", "driver": names.DRIVER, "pool": "node-0",
                                 "device": "gpu-0",
                                 "shareID": SHARE_ID,
                                 "consumedCapacity": {"memory": "-4Gi", "cores": "10"}}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["node-0"]}]}]}}}
    await memory_cluster.update(RESOURCE_CLAIMS, bad, namespace=NAMESPACE, subresource="status")
    async with running_controller(memory_cluster) as controller:
        await world.gated_pod("next", [share_claim_spec(memory_gib=40, cores=10)])
        await eventually(lambda: ungated(world, "next"))
        (placed,) = await world.claims_of("next")
        # gpu-0 is held whole by the invalid claim: the 40Gi share goes to gpu-1.
        assert placed["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-1"

        def events() -> list[dict[str, Any]]:
            return [e for e in memory_cluster.objects(EVENTS)
                    if e["involvedObject"]["kind"] == "ResourceClaim"]

        (event,) = await eventually(events)
        assert event["reason"] == "InvalidAllocation"
        assert event["type"] == "Warning"
        assert event["involvedObject"] == {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "name": bad["metadata"]["name"], "namespace": NAMESPACE,
            "uid": bad["metadata"]["uid"]}
        assert ("status.allocation.devices.results[0].consumedCapacity[memory]: -4Gi must be "
                "greater than or equal to 0") in event["message"]
        assert controller.metrics.invalid_claims._value.get() == 1
        await memory_cluster.delete(RESOURCE_CLAIMS, bad["metadata"]["name"],
                                    namespace=NAMESPACE)

        async def cleared() -> bool:
            return controller.metrics.invalid_claims._value.get() == 0

        assert await eventually(cleared)


def test_invalid_claims_report_once_per_problem_and_forget_a_fixed_claim() -> None:
    class Recorder:
        def __init__(self) -> None:
            self.forgotten: list[str] = []

        def forget(self, uid: str) -> None:
            self.forgotten.append(uid)

    metrics = Metrics()
    recorder = Recorder()
    invalid = InvalidClaims(recorder, metrics.invalid_claims)  # type: ignore[arg-type]
    bad = _other_writers_claim("bad", "gpu-0", {"memory": "-1"})
    invalid.seen(bad)
    invalid.seen(bad)
    assert invalid._pending.qsize() == 1
    assert metrics.invalid_claims._value.get() == 1
    fixed = _other_writers_claim("bad", "gpu-0", {"memory": "1Gi"})
    invalid.seen(fixed)
    assert invalid.problems == {}
    assert recorder.forgotten == ["uid-bad"]
    assert metrics.invalid_claims._value.get() == 0


# DeviceTaintRules (served from 1.37) --------------------------------------------------------------

def _taint_rule(name: str, device: str, effect: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
            "metadata": {"name": name},
            "spec": {"deviceSelector": {"driver": names.DRIVER, "pool": "node-0",
                                        "device": device},
                     "taint": {"key": "example.com/maintenance", "effect": effect}}}


def _device_of(claim: dict[str, Any]) -> str:
    return str(claim["status"]["allocation"]["devices"]["results"][0]["device"])


async def test_a_device_an_administrator_taints_is_not_given_to_a_claim_that_does_not_tolerate_it(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=2)
    await memory_cluster.create(DEVICE_TAINT_RULES, _taint_rule("gpu-0-out", "gpu-0",
                                                                "NoSchedule"))
    async with running_controller(memory_cluster):
        await world.gated_pod("first", [whole_claim_spec()])
        await eventually(lambda: ungated(world, "first"))
        assert [_device_of(c) for c in await world.claims_of("first")] == ["gpu-1"]
        await world.gated_pod("second", [whole_claim_spec()])
        await asyncio.sleep(0.5)
        assert not is_ungated(await world.pod("second"))
        # The rule goes: the device is free again.
        await memory_cluster.delete(DEVICE_TAINT_RULES, "gpu-0-out")
        await eventually(lambda: ungated(world, "second"))
        assert [_device_of(c) for c in await world.claims_of("second")] == ["gpu-0"]


async def test_a_toleration_without_an_effect_tolerates_a_no_execute_rule_as_1_38_does(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=1)
    async with running_controller(memory_cluster):
        await memory_cluster.create(DEVICE_TAINT_RULES, _taint_rule("drain", "gpu-0",
                                                                    "NoExecute"))
        await world.gated_pod("plain", [whole_claim_spec()])
        tolerant = whole_claim_spec()
        toleration = {"key": "example.com/maintenance", "operator": "Exists"}
        tolerant["devices"]["requests"][0]["exactly"]["tolerations"] = [toleration]
        await world.gated_pod("tolerant", [tolerant])
        await eventually(lambda: ungated(world, "tolerant"))
        (claim,) = await world.claims_of("tolerant")
        result = claim["status"]["allocation"]["devices"]["results"][0]
        assert (result["device"], result["tolerations"]) == ("gpu-0", [toleration])
        assert not is_ungated(await world.pod("plain"))


class _SlowTaintRules(MemoryCluster):
    """An API server that answers the list of DeviceTaintRules only once `served` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.served = asyncio.Event()

    async def list(self, rt: ResourceType, **kwargs: Any) -> ObjectList:
        if rt == DEVICE_TAINT_RULES:
            await self.served.wait()
        return await super().list(rt, **kwargs)


@pytest.mark.slow
async def test_the_allocator_plans_nothing_before_it_knows_the_device_taint_rules() -> None:
    """On start the allocator waits for the DeviceTaintRules as for its other mirrors, however
    long their list takes: planning without them gives out a device taken out of service (it
    once gave them 10 s, then planned)."""
    memory = _SlowTaintRules()
    world = World(memory)
    await world.setup(nodes=1, gpus=2)
    await memory.create(DEVICE_TAINT_RULES, _taint_rule("gpu-0-out", "gpu-0", "NoSchedule"))
    await world.gated_pod("first", [whole_claim_spec()])
    controller = Controller(memory, FAST)
    task = asyncio.create_task(controller.run(), name="controller")
    try:
        await asyncio.sleep(10.5)
        assert not controller.ready.is_set()
        assert not is_ungated(await world.pod("first"))
        memory.served.set()
        await eventually(lambda: ungated(world, "first"))
        assert [_device_of(c) for c in await world.claims_of("first")] == ["gpu-1"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
