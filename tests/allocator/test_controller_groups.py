"""Pod groups on the embedded API (allocator/groups.py, PodAllocator): a group's members are
allocated all together or not at all, two groups that cannot both fit never both hold devices,
an incomplete group holds nothing, and members past its size are placed as they come."""

from __future__ import annotations

import asyncio

from testkit import eventually

from dra_gateway.allocator.conditions import pod_condition
from dra_gateway.allocator.groups import GROUP_CONDITION
from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.gpu.groups import (
    DOMAIN_ANNOTATION,
    GROUP_ANNOTATION,
    GROUP_SIZE_ANNOTATION,
    JOBSET_NAME_LABEL,
    KUEUE_COUNT_ANNOTATION,
    KUEUE_GROUP_LABEL,
    MODELS_ANNOTATION,
    VOLCANO_GROUP_ANNOTATION,
)
from dra_gateway.kube.cluster.port import Object
from dra_gateway.kube.resources import (
    EVENTS,
    JOBSETS,
    POD_GROUPS_V1BETA1,
    PODS,
    RESOURCE_CLAIMS,
    VOLCANO_POD_GROUPS,
)

from .conftest import NAMESPACE, World, is_ungated, running_controller, ungated, whole_claim_spec


def _grouped(group: str, size: int | str) -> dict[str, str]:
    return {GROUP_ANNOTATION: group, GROUP_SIZE_ANNOTATION: str(size)}


async def _held(memory_cluster: MemoryCluster, prefix: str) -> int:
    """Devices the claims of pods named `prefix`... hold."""
    claims = (await memory_cluster.list(RESOURCE_CLAIMS)).items
    return sum(len((c.get("status") or {}).get("allocation", {}).get("devices", {}).get(
        "results") or ()) for c in claims if c["metadata"]["generateName"].startswith(prefix))


async def _said(world: World, name: str) -> Object | None:
    return pod_condition(await world.pod(name), GROUP_CONDITION)


async def test_two_interleaved_groups_one_placed_whole_the_other_holding_nothing(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=8)
    async with running_controller(memory_cluster) as controller:
        # Created interleaved: a-0, b-0, a-1, b-1, a-2, b-2; each pod asks for two cards.
        for i in range(3):
            for job in ("a", "b"):
                await world.gated_pod(f"{job}-{i}", [whole_claim_spec(2)],
                                      annotations=_grouped(f"job-{job}", 3))
        await eventually(lambda: all_ungated(world, ["a-0", "a-1", "a-2"]))
        await asyncio.sleep(0.3)
        assert await _held(memory_cluster, "a-") == 6
        assert await _held(memory_cluster, "b-") == 0  # two cards left: b holds none
        for name in ("b-0", "b-1", "b-2"):
            assert not is_ungated(await world.pod(name)), name
        said = await eventually(lambda: _said(world, "b-2"))
        assert said["reason"] == "GroupDoesNotFit", said
        assert "pod group team-a/job-b" in said["message"], said
        # a ends: b is placed whole.
        for i in range(3):
            await world.finish(f"a-{i}")
        await eventually(lambda: all_ungated(world, ["b-0", "b-1", "b-2"]), within=10)
        assert await _held(memory_cluster, "b-") == 6
        assert (await _said(world, "b-0"))["reason"] == "GroupPlaced"
        # Counted per convention and result: both placed once, b refused at least once.
        sample = controller.metrics.registry.get_sample_value
        labels = {"source": "dra-gateway"}
        assert sample("dra_gateway_allocator_group_plans_total",
                      {**labels, "result": "placed"}) == 2
        refused = sample("dra_gateway_allocator_group_plans_total",
                         {**labels, "result": "does-not-fit"})
        assert refused is not None
        assert refused >= 1


async def test_an_incomplete_group_holds_nothing_until_its_last_member_arrives(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=4)
    kueue = {KUEUE_GROUP_LABEL: "train"}
    count = {KUEUE_COUNT_ANNOTATION: "3"}
    async with running_controller(memory_cluster):
        for i in range(2):
            await world.gated_pod(f"w-{i}", [whole_claim_spec(1)], labels=kueue,
                                  annotations=count)
        said = await eventually(lambda: _said(world, "w-1"))
        assert said["reason"] == "GroupIncomplete", said
        assert "needs 3 members" in said["message"]
        assert "1 more to arrive" in said["message"]

        async def warned() -> list[Object]:
            events = (await memory_cluster.list(EVENTS, namespace=NAMESPACE)).items
            return [e for e in events if e.get("reason") == "GroupIncomplete"
                    and e["involvedObject"]["name"] == "w-1"]

        (event,) = await eventually(warned)
        assert event["type"] == "Warning"
        assert "needs 3 members" in event["message"]
        await asyncio.sleep(0.3)
        assert await _held(memory_cluster, "w-") == 0
        await world.gated_pod("w-2", [whole_claim_spec(1)], labels=kueue, annotations=count)
        await eventually(lambda: all_ungated(world, ["w-0", "w-1", "w-2"]))
        assert await _held(memory_cluster, "w-") == 3
        # A fourth member, past the size, is placed as it comes.
        await world.gated_pod("w-3", [whole_claim_spec(1)], labels=kueue, annotations=count)
        await eventually(lambda: ungated(world, "w-3"))


async def test_a_group_without_a_usable_size_says_what_to_fix(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=2)
    async with running_controller(memory_cluster):
        await world.gated_pod("odd", [whole_claim_spec(1)], annotations=_grouped("x", "three"))
        said = await eventually(lambda: _said(world, "odd"))
        assert said["reason"] == "GroupInvalid"
        assert "dra-gateway.io/group-size is 'three', not a number of members" in \
            said["message"]
        assert not is_ungated(await world.pod("odd"))
        # Fixed: placed.
        await memory_cluster.patch(PODS, "odd", {"metadata": {"annotations": {
            GROUP_SIZE_ANNOTATION: "1"}}}, namespace=NAMESPACE)
        await eventually(lambda: ungated(world, "odd"))


async def _pools(memory_cluster: MemoryCluster, prefix: str) -> set[str]:
    """The pools (nodes) whose devices the claims of pods named `prefix`... hold."""
    claims = (await memory_cluster.list(RESOURCE_CLAIMS)).items
    return {r["pool"] for c in claims if c["metadata"]["generateName"].startswith(prefix)
            for r in (c.get("status") or {}).get("allocation", {}).get("devices", {}).get(
                "results") or ()}


async def test_a_group_with_room_only_across_two_models_waits_then_lands_on_one(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=0)
    await world.add_node("a100", gpus=2)
    await world.add_node("h100", gpus=2, product="NVIDIA H100 80GB HBM3")
    async with running_controller(memory_cluster):
        for i in range(3):
            await world.gated_pod(f"m-{i}", [whole_claim_spec(1)],
                                  annotations=_grouped("job-m", 3))
        said = await eventually(lambda: _said(world, "m-2"))
        assert said["reason"] == "GroupDoesNotFit", said
        assert "no model has room for all" in said["message"]
        assert "NVIDIA H100 80GB HBM3: 2 of 3 fit" in said["message"]
        await asyncio.sleep(0.3)
        assert await _held(memory_cluster, "m-") == 0
        # Two more H100s: the three land on H100s alone.
        await world.add_node("h100-b", gpus=2, product="NVIDIA H100 80GB HBM3")
        await eventually(lambda: all_ungated(world, ["m-0", "m-1", "m-2"]))
        assert await _pools(memory_cluster, "m-") <= {"h100", "h100-b"}
        # A member past the size joins the model its group holds, though A100s are free.
        await world.gated_pod("m-3", [whole_claim_spec(1)], annotations=_grouped("job-m", 3))
        await eventually(lambda: ungated(world, "m-3"))
        assert await _pools(memory_cluster, "m-") <= {"h100", "h100-b"}


async def test_a_group_that_allows_any_model_spreads_over_two(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=0)
    await world.add_node("a100", gpus=2)
    await world.add_node("h100", gpus=2, product="NVIDIA H100 80GB HBM3")
    async with running_controller(memory_cluster):
        for i in range(3):
            await world.gated_pod(f"y-{i}", [whole_claim_spec(1)], annotations={
                **_grouped("job-y", 3), MODELS_ANNOTATION: "Any"})
        await eventually(lambda: all_ungated(world, ["y-0", "y-1", "y-2"]))
        assert await _pools(memory_cluster, "y-") == {"a100", "h100"}


async def test_volcano_pods_wait_for_their_podgroup_and_its_min_member(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=4)
    named = {VOLCANO_GROUP_ANNOTATION: "train"}
    async with running_controller(memory_cluster):
        for i in range(2):
            await world.gated_pod(f"v-{i}", [whole_claim_spec(1)], annotations=named)
        said = await eventually(lambda: _said(world, "v-0"))
        assert said["reason"] == "GroupInvalid", said
        assert "names PodGroup team-a/train (scheduling.volcano.sh/v1beta1), which does not " \
            "exist" in said["message"], said
        # Volcano's job controller creates the PodGroup: three members needed, two here.
        await memory_cluster.create(VOLCANO_POD_GROUPS, {
            "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
            "metadata": {"name": "train", "namespace": NAMESPACE},
            "spec": {"minMember": 3}}, namespace=NAMESPACE)
        said = await eventually(lambda: _reason_is(world, "v-0", "GroupIncomplete"))
        assert "PodGroup team-a/train (scheduling.volcano.sh/v1beta1) spec.minMember=3" in \
            said["message"], said
        assert await _held(memory_cluster, "v-") == 0
        await world.gated_pod("v-2", [whole_claim_spec(1)], annotations=named)
        await eventually(lambda: all_ungated(world, ["v-0", "v-1", "v-2"]))
        assert await _held(memory_cluster, "v-") == 3


async def test_pods_of_an_upstream_pod_group_wait_for_its_gang_min_count(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=4)
    async with running_controller(memory_cluster):
        await memory_cluster.create(POD_GROUPS_V1BETA1, {
            "apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
            "metadata": {"name": "train", "namespace": NAMESPACE},
            "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}}}, namespace=NAMESPACE)
        await world.gated_pod("u-0", [whole_claim_spec(2)], scheduling_group="train")
        said = await eventually(lambda: _reason_is(world, "u-0", "GroupIncomplete"))
        assert "spec.schedulingGroup.podGroupName=train" in said["message"], said
        assert await _held(memory_cluster, "u-") == 0
        await world.gated_pod("u-1", [whole_claim_spec(2)], scheduling_group="train")
        await eventually(lambda: all_ungated(world, ["u-0", "u-1"]))
        assert await _held(memory_cluster, "u-") == 4


async def test_a_jobset_s_pods_are_placed_together_once_all_have_arrived(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=4)
    labels = {JOBSET_NAME_LABEL: "train"}
    async with running_controller(memory_cluster):
        await memory_cluster.create(JOBSETS, {
            "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "train", "namespace": NAMESPACE},
            "spec": {"replicatedJobs": [{"name": "w", "replicas": 1, "template": {
                "spec": {"parallelism": 2, "template": {"spec": {}}}}}]}},
            namespace=NAMESPACE)
        await world.gated_pod("js-0", [whole_claim_spec(1)], labels=labels)
        said = await eventually(lambda: _reason_is(world, "js-0", "GroupIncomplete"))
        assert "spec.replicatedJobs: 2 pod(s) in all" in said["message"], said
        await world.gated_pod("js-1", [whole_claim_spec(1)], labels=labels)
        await eventually(lambda: all_ungated(world, ["js-0", "js-1"]))


async def test_a_member_past_the_size_keeps_to_the_domain_its_group_requires(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=0)
    for name, rack in (("a1", "r1"), ("b1", "r2"), ("b2", "r2")):
        await world.add_node(name, gpus=2, labels={"example.com/rack": rack})
    grouped = {**_grouped("job-d", 2), DOMAIN_ANNOTATION: "example.com/rack"}
    async with running_controller(memory_cluster):
        for i in range(2):
            await world.gated_pod(f"d-{i}", [whole_claim_spec(1)], annotations=grouped)
        await eventually(lambda: all_ungated(world, ["d-0", "d-1"]))
        racks = {"a1": "r1", "b1": "r2", "b2": "r2"}
        held = {racks[p] for p in await _pools(memory_cluster, "d-")}
        assert len(held) == 1, held
        # Three more members past the size: they fill the group's rack and the third waits,
        # though the other rack has free cards.
        for i in range(2, 5):
            await world.gated_pod(f"d-{i}", [whole_claim_spec(1)], annotations=grouped)
        await asyncio.sleep(1.0)
        assert {racks[p] for p in await _pools(memory_cluster, "d-")} == held
        room = 2 if held == {"r1"} else 4
        assert await _held(memory_cluster, "d-") == room


async def _reason_is(world: World, name: str, reason: str) -> Object | None:
    said = await _said(world, name)
    return said if said is not None and said.get("reason") == reason else None


async def all_ungated(world: World, names_: list[str]) -> bool:
    return all([is_ungated(await world.pod(n)) for n in names_])
