"""Preemption on the embedded API (allocator/eviction/preemption.py): a pod of higher priority that
fits nowhere gets its cards from the fewest pods of lower priority, evicted with a DisruptionTarget
condition and Events; a pod whose policy is Never, or of equal priority, preempts nothing."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from typing import Any

import pytest
from testkit import eventually

from dra_gateway.allocator.conditions import PREEMPTION_CONDITION, pod_condition
from dra_gateway.allocator.controller import Controller
from dra_gateway.allocator.eviction import holds as holdfmt
from dra_gateway.allocator.eviction.evict import DISRUPTION_TARGET
from dra_gateway.allocator.eviction.holds import never_carried_out
from dra_gateway.allocator.eviction.inputs import Snapshot
from dra_gateway.allocator.eviction.preemption import REASON, PreemptionMode
from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import Forbidden, Object
from dra_gateway.kube.resources import (
    CONFIG_MAPS,
    EVENTS,
    GPU_QUOTAS,
    POD_DISRUPTION_BUDGETS,
    PODS,
)

from .conftest import (
    FAST,
    NAMESPACE,
    World,
    record_evictions,
    running_controller,
    ungated,
    whole_claim_spec,
)

SETTINGS = dataclasses.replace(FAST, preemption_interval=0.05)


async def _fill(world: World, memory_cluster: MemoryCluster, count: int, priority: int, *,
                namespace: str = NAMESPACE) -> None:
    """`count` one-card pods of `priority` placed and bound on node-0."""
    for i in range(count):
        await world.gated_pod(f"low-{i}", [whole_claim_spec(1)], priority=priority,
                              namespace=namespace)
        await eventually(lambda i=i: ungated(world, f"low-{i}"))  # type: ignore[misc]
        # Play kube-scheduler: bind it where its claim was allocated.
        await memory_cluster.patch(PODS, f"low-{i}", {"spec": {"nodeName": "node-0"}},
                                   namespace=namespace)


async def _live(memory_cluster: MemoryCluster) -> set[str]:
    return {p["metadata"]["name"] for p in (await memory_cluster.list(PODS)).items}


async def test_a_pod_for_two_cards_is_placed_after_exactly_two_are_preempted(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=8)
    marked = record_evictions(memory_cluster)
    async with running_controller(memory_cluster, SETTINGS) as controller:
        await _fill(world, memory_cluster, 8, priority=10)
        await world.gated_pod("urgent", [whole_claim_spec(2)], priority=1000)
        await eventually(lambda: ungated(world, "urgent"))
        assert len(await _live(memory_cluster)) == 1 + 6  # exactly two preempted
        # Each victim was marked before its eviction, and said who it made room for.
        assert len(marked) == 2
        for victim in marked:
            (condition,) = [c for c in victim["status"]["conditions"]
                            if c["type"] == DISRUPTION_TARGET]
            assert condition["reason"] == REASON
            assert f"higher priority pod {NAMESPACE}/urgent (priority 1000)" in condition["message"]
        events = memory_cluster.objects(EVENTS)
        assert sorted(e["involvedObject"]["name"] for e in events
                      if e["reason"] == "Preempted") == sorted(
            v["metadata"]["name"] for v in marked)
        assert any(e["reason"] == "Preempting" and e["involvedObject"]["name"] == "urgent"
                   for e in events)
        assert controller.metrics.registry.get_sample_value(
            "dra_gateway_allocator_preemptions_total", {"result": "evicted"}) == 2

        # The hold that kept the freed cards for it is dropped once it has served.
        async def holds_left() -> bool:
            records = await memory_cluster.get(CONFIG_MAPS, holdfmt.CONFIG_MAP,
                                               namespace="dra-gateway")
            return not any(k.startswith(holdfmt.HOLD) for k in records.get("data") or {})

        await eventually(holds_left)

        # The pod said what it waited for, and says it was placed.
        async def placed_condition() -> Object | None:
            pod = await memory_cluster.get(PODS, "urgent", namespace=NAMESPACE)
            for entry in (pod.get("status") or {}).get("conditions") or ():
                if entry["type"] == PREEMPTION_CONDITION and entry["status"] == "False":
                    return dict(entry)
            return None

        assert (await eventually(placed_condition))["reason"] == "Placed"


async def test_a_pod_of_equal_priority_or_policy_never_preempts_nothing(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=4)
    async with running_controller(memory_cluster, SETTINGS):
        await _fill(world, memory_cluster, 4, priority=10)
        await world.gated_pod("peer", [whole_claim_spec(1)], priority=10)
        # Never from the start: its claims are made once its policy is in place.
        await world.gated_pod("polite", [whole_claim_spec(1)], priority=1000,
                              create_claims=False)
        await memory_cluster.patch(PODS, "polite", {"spec": {"preemptionPolicy": "Never"}},
                                   namespace=NAMESPACE)
        await world.create_claims("polite", [whole_claim_spec(1)])
        await asyncio.sleep(0.5)  # many preemption rounds
        assert await _live(memory_cluster) == {"low-0", "low-1", "low-2", "low-3", "peer",
                                               "polite"}
        assert not await ungated(world, "peer")
        assert not await ungated(world, "polite")


async def test_nothing_is_preempted_for_a_pod_its_quota_holds_back(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=2)
    async with running_controller(memory_cluster, SETTINGS):
        await _fill(world, memory_cluster, 2, priority=10, namespace="batch")
        # Its namespace's quota is held by a pod a legacy plugin serves elsewhere: freeing
        # cards would not let the pod in, so nobody is evicted for it.
        await memory_cluster.create(GPU_QUOTAS, {
            "apiVersion": names.API_VERSION, "kind": "GPUQuota",
            "metadata": {"name": "gpus", "namespace": NAMESPACE},
            "spec": {"hard": {"devices": 1}}}, namespace=NAMESPACE)
        await memory_cluster.create(PODS, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "legacy", "namespace": NAMESPACE},
            "spec": {"nodeName": "legacy-node", "containers": [{
                "name": "main", "image": "cuda:12",
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Running"}}, namespace=NAMESPACE)
        await world.gated_pod("urgent", [whole_claim_spec(1)], priority=1000)
        await asyncio.sleep(0.6)
        assert {"low-0", "low-1", "urgent"} <= await _live(memory_cluster)
        assert not await ungated(world, "urgent")


async def test_victims_a_budget_protects_are_not_evicted(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=2)
    async with running_controller(memory_cluster, SETTINGS):
        await _fill(world, memory_cluster, 2, priority=10)
        for i in range(2):
            await memory_cluster.patch(PODS, f"low-{i}", {"metadata": {"labels": {
                "app": "keep"}}}, namespace=NAMESPACE)
        await memory_cluster.create(POD_DISRUPTION_BUDGETS, {
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "keep", "namespace": NAMESPACE, "generation": 1},
            "spec": {"selector": {"matchLabels": {"app": "keep"}}, "minAvailable": 2},
            "status": {"observedGeneration": 1, "disruptionsAllowed": 0}},
            namespace=NAMESPACE)
        await world.gated_pod("urgent", [whole_claim_spec(1)], priority=1000)
        await asyncio.sleep(0.6)
        assert {"low-0", "low-1"} <= await _live(memory_cluster)
        assert not await ungated(world, "urgent")
        # It waits, and says for which budget.
        pod = await memory_cluster.get(PODS, "urgent", namespace=NAMESPACE)
        said = pod_condition(pod, PREEMPTION_CONDITION)
        assert said is not None, pod.get("status")
        assert said["reason"] == "DisruptionBudget"
        assert f"PodDisruptionBudget {NAMESPACE}/keep" in said["message"]


async def test_a_preemption_an_admission_policy_refused_is_tried_again_once_it_allows(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=2)
    real_evict = memory_cluster.evict
    denying = [True]  # a ValidatingAdmissionPolicy that denies evictions, until deleted

    async def evict(name: str, *, namespace: str, uid: str | None = None) -> None:
        if denying[0]:
            raise Forbidden("pods \"x\" is forbidden: ValidatingAdmissionPolicy 'no-evictions' "
                            "denied request")
        await real_evict(name, namespace=namespace, uid=uid)

    memory_cluster.evict = evict  # type: ignore[method-assign]
    async with running_controller(memory_cluster, SETTINGS) as controller:
        await _fill(world, memory_cluster, 2, priority=10)
        await world.gated_pod("urgent", [whole_claim_spec(1)], priority=1000)

        async def refused() -> Mapping[str, Any] | None:
            pod = await memory_cluster.get(PODS, "urgent", namespace=NAMESPACE)
            said = pod_condition(pod, PREEMPTION_CONDITION)
            return said if said is not None and said["reason"] == "PreemptionRefused" else None

        said = await eventually(refused)
        assert "ValidatingAdmissionPolicy" in said["message"]
        assert "preemption is tried again" in said["message"]
        # The victim it tried stays, and carries no disruption that did not happen.
        for name in ("low-0", "low-1"):
            pod = await memory_cluster.get(PODS, name, namespace=NAMESPACE)
            target = pod_condition(pod, DISRUPTION_TARGET)
            assert target is None or target["status"] == "False", target
        denying[0] = False  # the policy is deleted
        await eventually(lambda: ungated(world, "urgent"))
        assert len(await _live(memory_cluster)) == 2  # one preempted, for good this time
        sample = controller.metrics.registry.get_sample_value
        assert (sample("dra_gateway_allocator_preemptions_total", {"result": "failed"})
                or 0) >= 1
        assert sample("dra_gateway_allocator_preemptions_total", {"result": "evicted"}) == 1


def _mode(memory_cluster: MemoryCluster, controller: Controller,
          first: Snapshot | None = None) -> PreemptionMode:
    """A preemption mode run by hand; its first look at the cluster is `first` (a view taken
    before the cluster moved on) where given, the mirrors' after."""
    views = [first] if first is not None else []

    def snapshot() -> Snapshot:
        return views.pop() if views else controller.snapshot()

    return PreemptionMode(memory_cluster, controller.settings, snapshot=snapshot,
                          metrics=controller.metrics, fence=lambda: None)


async def test_a_preemption_planned_before_its_pod_was_placed_evicts_nobody(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=2)
    evicted = record_evictions(memory_cluster)
    manual = dataclasses.replace(SETTINGS, preemption=False)
    async with running_controller(memory_cluster, manual) as controller:
        await _fill(world, memory_cluster, 2, priority=10)
        await world.gated_pod("urgent", [whole_claim_spec(1)], priority=1000)
        await asyncio.sleep(0.2)
        before = controller.snapshot()  # urgent fits nowhere: one of low-* would be preempted
        # Meanwhile low-0 finishes and urgent is placed on its card.
        await memory_cluster.delete(PODS, "low-0", namespace=NAMESPACE)
        await eventually(lambda: ungated(world, "urgent"))
        (found,) = await _mode(memory_cluster, controller, before).round() or []
        assert [v.pod for v in found.victims] == [f"{NAMESPACE}/low-1"]  # as planned then
        assert evicted == []
        assert "low-1" in await _live(memory_cluster)


async def test_a_preemption_stops_once_its_pod_is_gone(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=2)
    real_evict = memory_cluster.evict
    evicted: list[str] = []

    async def evict(name: str, *, namespace: str, uid: str | None = None) -> None:
        evicted.append(name)
        await real_evict(name, namespace=namespace, uid=uid)
        # The pod preempted for is deleted as its first victim leaves.
        await memory_cluster.delete(PODS, "urgent", namespace=NAMESPACE)

    memory_cluster.evict = evict  # type: ignore[method-assign]
    manual = dataclasses.replace(SETTINGS, preemption=False)
    async with running_controller(memory_cluster, manual) as controller:
        await _fill(world, memory_cluster, 2, priority=10)
        await world.gated_pod("urgent", [whole_claim_spec(2)], priority=1000)
        await asyncio.sleep(0.2)
        (found,) = await _mode(memory_cluster, controller).round() or []
        assert len(found.victims) == 2
        assert len(evicted) == 1, "the second victim was evicted for a pod that is gone"


class _Killed(BaseException):
    """The allocator's process killed: nothing after it runs, nothing catches it."""


async def _kill_after(mode: PreemptionMode, evictions: int) -> None:
    """Run a round of `mode` whose process is killed after its first `evictions` evictions
    (the hold written, and whatever came before the next eviction)."""
    real_leave = mode.evictions.leave
    done = [0]

    async def leave(*args: Any, **kwargs: Any) -> tuple[str, str]:
        if done[0] == evictions:
            raise _Killed
        done[0] += 1
        return await real_leave(*args, **kwargs)

    mode.evictions.leave = leave  # type: ignore[method-assign]
    with pytest.raises(_Killed):
        await mode.round()


async def _held_in_mirror(controller: Controller, world: World, name: str) -> bool:
    uid = (await world.pod(name))["metadata"]["uid"]
    return uid in controller.snapshot().records.holds


@contextlib.asynccontextmanager
async def _killed_mid_preemption(world: World, cluster: MemoryCluster, evictions: int
                                 ) -> AsyncIterator[tuple[Controller, list[Any]]]:
    """Eight low-priority pods fill a node and an urgent one needs two cards; a leader's
    preemption round for it is killed after `evictions` evictions, its hold in the mirror.
    Yields the controller (preemption off: the test runs the rounds) and the evictions."""
    await world.setup(nodes=1, gpus=8)
    evicted = record_evictions(cluster)
    manual = dataclasses.replace(SETTINGS, preemption=False)
    async with running_controller(cluster, manual) as controller:
        await _fill(world, cluster, 8, priority=10)
        await world.gated_pod("urgent", [whole_claim_spec(2)], priority=1000)
        await asyncio.sleep(0.2)
        await _kill_after(_mode(cluster, controller), evictions=evictions)
        await eventually(lambda: _held_in_mirror(controller, world, "urgent"))
        yield controller, evicted


async def test_a_hold_whose_leader_was_killed_before_evicting_is_replanned_by_the_next(
        world: World, memory_cluster: MemoryCluster) -> None:
    async with _killed_mid_preemption(world, memory_cluster,
                                      evictions=0) as (controller, evicted):
        assert evicted == []
        # The next leader's preemption, with the records as the killed one left them: the
        # hold (300 s) no longer keeps the pod from being preempted for.
        successor = _mode(memory_cluster, controller)
        found = await successor.round() or []
        assert [len(f.victims) for f in found] == [2], "the hold kept its pod from a preemption"
        assert len(evicted) == 2
        await eventually(lambda: ungated(world, "urgent"))
        assert len(await _live(memory_cluster)) == 1 + 6  # exactly two preempted, once


async def test_a_leader_killed_between_two_evictions_leaves_only_the_rest_still_needed(
        world: World, memory_cluster: MemoryCluster) -> None:
    async with _killed_mid_preemption(world, memory_cluster,
                                      evictions=1) as (controller, evicted):
        assert len(evicted) == 1
        successor = _mode(memory_cluster, controller)

        async def placed_after_a_round() -> Object | None:
            await successor.round()
            return await ungated(world, "urgent")

        await eventually(placed_after_a_round, interval=0.05)
        # The victim evicted before the kill counts: one more leaves, not two.
        assert len(evicted) == 2
        assert len(await _live(memory_cluster)) == 1 + 6


def _victim(name: str, uid: str, **meta: Any) -> Object:
    return {"metadata": {"name": name, "namespace": NAMESPACE, "uid": uid, **meta},
            "spec": {"nodeName": "node-0"}, "status": {"phase": "Running"}}


def test_a_hold_stands_while_a_victim_leaves_and_is_spent_once_none_does() -> None:
    hold = holdfmt.Hold("uid-urgent", f"{NAMESPACE}/urgent", "node-0", {}, datetime.now(UTC),
                        (f"{NAMESPACE}/low-0", f"{NAMESPACE}/low-1"), preempted=True,
                        victims=("uid-0", "uid-1"))
    deleting = _victim("low-0", "uid-0", deletionTimestamp="2025-01-01T00:00:00Z")
    staying = _victim("low-1", "uid-1")
    assert never_carried_out(hold, [deleting, staying]) is None
    # Gone, but a claim still allocated to it: its devices are not free yet.
    claim = {"metadata": {"name": "c", "namespace": NAMESPACE, "uid": "uid-c"},
             "status": {"allocation": {"devices": {"results": []}},
                        "reservedFor": [{"resource": "pods", "name": "low-0", "uid": "uid-0"}]}}
    assert never_carried_out(hold, [staying], [claim]) is None
    assert never_carried_out(hold, [staying]) == (
        f"its victims {NAMESPACE}/low-1 were never evicted ({NAMESPACE}/low-0 left)")
    # A DisruptionTarget whose eviction never came is no deletion.
    marked = dict(staying, status={"phase": "Running", "conditions": [
        {"type": DISRUPTION_TARGET, "status": "True", "reason": REASON}]})
    assert never_carried_out(hold, [_victim("low-0", "uid-0"), marked]) == (
        f"its victims {NAMESPACE}/low-0, {NAMESPACE}/low-1 were never evicted")
    # A pod of a victim's name made again by its controller is not the victim.
    assert never_carried_out(hold, [_victim("low-0", "uid-new")]) is None
