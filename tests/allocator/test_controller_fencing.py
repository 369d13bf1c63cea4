"""A tenant cannot stall the allocator into losing its Lease, and a former leader cannot write.

Planning runs in a worker thread with a CEL cost budget per pod, so the loop keeps renewing the
Lease during a slow plan and a pod whose selectors cost too much is refused with the budget in
its reason; every write (allocation, gate removal, release) is fenced by the elector's
`check_leading`, so a leader that stalled past its renew deadline writes nothing once a standby
may have taken over.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from testkit import eventually

from dra_gateway.allocator import planning as planning_module
from dra_gateway.allocator.controller import Controller, ControllerSettings
from dra_gateway.allocator.metrics import Metrics, Stats
from dra_gateway.allocator.work import PodKey
from dra_gateway.allocator.writes import gate_index, remove_gate, write_allocation
from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube import names
from dra_gateway.kube.cel import COST_LIMIT
from dra_gateway.kube.cluster.port import Object
from dra_gateway.kube.resources import EVENTS, LEASES, PODS, RESOURCE_CLAIMS, ResourceType
from dra_gateway.kube.runtime.leader import LeaderElector, LeadershipLost, LeaseSettings

from .conftest import FAST, NAMESPACE, World, ungated
from .conftest import whole_claim_spec as whole

RENEW_DEADLINE = 0.4


def lease(identity: str) -> LeaseSettings:
    return LeaseSettings(identity=identity, namespace="dra-gateway", lease_duration=0.6,
                         renew_deadline=RENEW_DEADLINE, retry_period=0.05)


class LeaseWrites:
    """The memory cluster, recording when each Lease write landed (monotonic seconds)."""

    def __init__(self, inner: MemoryCluster) -> None:
        self.inner = inner
        self.renewals: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def update(self, rt: ResourceType, obj: Object, **kwargs: Any) -> Object:
        written = await self.inner.update(rt, obj, **kwargs)
        if rt is LEASES:
            self.renewals.append(time.monotonic())
        return written


async def test_a_plan_slower_than_the_renew_deadline_does_not_cost_the_lease(
        memory_cluster: MemoryCluster, world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    await world.setup(nodes=1, gpus=1)
    real_plan = planning_module.plan_pod
    planning: list[tuple[float, float]] = []

    def slow_plan(*args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        time.sleep(1.0)  # CPU-bound work holds its thread; 2.5 times the renew deadline
        try:
            return real_plan(*args, **kwargs)
        finally:
            planning.append((started, time.monotonic()))

    monkeypatch.setattr(planning_module, "plan_pod", slow_plan)
    cluster = LeaseWrites(memory_cluster)
    elector = LeaderElector(cluster, lease("slow"))  # type: ignore[arg-type]

    async def lead() -> None:
        await Controller(memory_cluster, FAST, fence=elector.check_leading).run()

    campaign = asyncio.create_task(elector.run(lead))
    try:
        await eventually(lambda: elector.is_leader)
        await world.gated_pod("patient", [whole()])
        await eventually(lambda: ungated(world, "patient"), within=10)
    finally:
        campaign.cancel()
        await asyncio.gather(campaign, return_exceptions=True)
    assert planning, "the slow planner never ran: the check proves nothing"
    assert elector.transitions_seen == 1, "the leader lost its Lease during the slow plan"
    started, ended = planning[0]
    during = [t for t in cluster.renewals if started <= t <= ended]
    assert len(during) >= 2, f"the Lease was renewed {len(during)} times during a 1 s plan"
    gaps = [b - a for a, b in zip([started, *during], [*during, ended], strict=True)]
    assert max(gaps) < RENEW_DEADLINE, f"renewals were {max(gaps):.2f}s apart"


async def test_a_pod_whose_selectors_cost_too_much_is_refused_and_others_are_placed(
        memory_cluster: MemoryCluster, world: World) -> None:
    await world.setup(nodes=4, gpus=8)
    values = ",".join(str(i) for i in range(40))
    # The attack: nested all/exists over a bound 40-element list, ~584k per device,
    # under the per-expression limit; a new constant per pod defeats the verdict cache.
    selector = (f"cel.bind(l, [{values}], l.all(a, l.all(b, l.exists(c, "
                "a * b * c == 7919))))")
    costly = whole()
    costly["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {"expression": selector}}]
    settings = ControllerSettings(**{**FAST.__dict__, "plan_cost_budget": 3 * COST_LIMIT})
    controller = Controller(memory_cluster, settings)
    task = asyncio.create_task(controller.run())
    try:
        await controller.ready.wait()
        await world.gated_pod("attacker", [costly])
        await world.gated_pod("bystander", [whole()])
        await eventually(lambda: ungated(world, "bystander"), within=10)
        await eventually(lambda: refusals(memory_cluster))
        assert not await ungated(world, "attacker")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    # One refusal per attempt: a pod planned again (the bystander's placement changed the
    # cluster) spends less on the class's own selectors, whose verdicts are cached by then.
    messages = {e["message"] for e in refusals(memory_cluster)}
    assert messages
    for message in messages:
        assert message.startswith(f"CEL cost budget exceeded: evaluating the selectors would "
                                  f"cost more than {3 * COST_LIMIT} (at least ")
        assert message.endswith("simplify the claim's selectors")
        # The budget counts estimated costs: evaluation stopped at the first one (~584k each,
        # 5 ran of the 32 devices) that would have overspent it.
        at_least = int(message.split("(at least ")[1].split(")")[0])
        assert 3 * COST_LIMIT < at_least <= 4 * COST_LIMIT


def refusals(cluster: MemoryCluster) -> list[Object]:
    return [e for e in cluster.objects(EVENTS)
            if e["involvedObject"]["name"] == "attacker" and "budget" in e["message"]]


class Stallable:
    """The memory cluster as one replica reaches it: nothing gets through while it stalls."""

    def __init__(self, inner: MemoryCluster) -> None:
        self.inner = inner
        self.awake = asyncio.Event()
        self.awake.set()

    async def get(self, rt: ResourceType, name: str, **kwargs: Any) -> Object:
        await self.awake.wait()
        return await self.inner.get(rt, name, **kwargs)

    async def create(self, rt: ResourceType, obj: Object, **kwargs: Any) -> Object:
        await self.awake.wait()
        return await self.inner.create(rt, obj, **kwargs)

    async def update(self, rt: ResourceType, obj: Object, **kwargs: Any) -> Object:
        await self.awake.wait()
        return await self.inner.update(rt, obj, **kwargs)


def _stalled_clock() -> tuple[Callable[[], float], Callable[[float], None]]:
    now = [1000.0]

    def clock() -> float:
        return now[0]

    def advance(seconds: float) -> None:
        now[0] += seconds

    return clock, advance


async def test_a_stalled_former_leader_writes_nothing_after_a_standby_took_over(
        memory_cluster: MemoryCluster, world: World) -> None:
    await world.setup(nodes=1, gpus=1)
    pod = await world.gated_pod("victim", [whole()])
    claim = (await world.claims_of("victim"))[0]
    clock_a, stall_a = _stalled_clock()
    clock_b, wait_b = _stalled_clock()
    old_link = Stallable(memory_cluster)
    old = LeaderElector(old_link, lease("old"),  # type: ignore[arg-type]
                        monotonic=clock_a)
    new = LeaderElector(memory_cluster, lease("new"),
                        monotonic=clock_b)
    holding = asyncio.Event()

    async def hold() -> None:
        holding.set()
        await asyncio.Event().wait()

    old_term = asyncio.create_task(old.run(hold))
    try:
        await holding.wait()
        old.check_leading()  # leading and fresh: writes may go
        # The old leader's process stalls: no renewal, its clock moves on meanwhile.
        old_link.awake.clear()
        stall_a(RENEW_DEADLINE + 0.01)
        with pytest.raises(LeadershipLost, match=r"ago, beyond the renew deadline of 0\.4s"):
            old.check_leading()  # before its own renewal loop has even run again
        assert not await new.try_acquire_or_renew()  # the record is still fresh to the standby
        await asyncio.sleep(0.1)  # a renewal already in flight lands
        assert not await new.try_acquire_or_renew()
        wait_b(1.01)  # the Lease says 1 s: leaseDurationSeconds is lease_duration rounded up
        assert await new.try_acquire_or_renew(), "the standby did not take over"
        # The old leader wakes and carries on with the write it was about to make.
        with pytest.raises(LeadershipLost):
            await write_allocation(memory_cluster, claim, allocation={"devices": {}},
                                   annotations={}, pod=pod, writes=[], stats=Stats(),
                                   metrics=Metrics(),
                                   fence=old.check_leading)
        with pytest.raises(LeadershipLost):
            await remove_gate(memory_cluster, PodKey(NAMESPACE, "victim", pod["metadata"]["uid"]),
                              pod, gate_index(pod) or 0, fence=old.check_leading)
    finally:
        old_term.cancel()
        await asyncio.gather(old_term, return_exceptions=True)
    stored = await memory_cluster.get(RESOURCE_CLAIMS, claim["metadata"]["name"],
                                      namespace=NAMESPACE)
    assert "allocation" not in (stored.get("status") or {})
    assert names.FINALIZER not in (stored["metadata"].get("finalizers") or [])
    gates = (await memory_cluster.get(PODS, "victim", namespace=NAMESPACE))["spec"][
        "schedulingGates"]
    assert {"name": names.SCHEDULING_GATE} in gates


async def test_a_stalled_former_leader_releases_nothing(
        memory_cluster: MemoryCluster, world: World) -> None:
    await world.setup(nodes=1, gpus=1)
    controller_fence_ok = [True]
    fenced_writes = [0]

    def fence() -> None:
        if not controller_fence_ok[0]:
            fenced_writes[0] += 1
            raise LeadershipLost("old last renewed the Lease 5.0s ago")

    controller = Controller(memory_cluster, FAST, fence=fence)
    task = asyncio.create_task(controller.run())
    try:
        await controller.ready.wait()
        await world.gated_pod("done", [whole()])
        await eventually(lambda: ungated(world, "done"))
        claim = (await world.claims_of("done"))[0]
        controller_fence_ok[0] = False  # stalled past its deadline; a standby leads now
        refused_before = fenced_writes[0]
        await memory_cluster.delete(PODS, "done", namespace=NAMESPACE)
        await eventually(lambda: fenced_writes[0] > refused_before)
        stored = await memory_cluster.get(RESOURCE_CLAIMS, claim["metadata"]["name"],
                                          namespace=NAMESPACE)
        assert (stored.get("status") or {}).get("allocation"), "a fenced replica released"
        assert names.FINALIZER in stored["metadata"]["finalizers"]
        assert controller.stats.claims_released == 0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
