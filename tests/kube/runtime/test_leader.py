"""Leader election through a Lease: one leader, fast handover, work stops when the lease goes."""

from __future__ import annotations

import asyncio
from typing import Any

import kubernetes_validate
import pytest
from testkit import eventually

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube.cluster.port import ApiError, Object
from dra_gateway.kube.resources import LEASES, ResourceType
from dra_gateway.kube.runtime.leader import LeaderElector, LeaseSettings

LEASE_DURATION = 0.6


def settings(identity: str) -> LeaseSettings:
    return LeaseSettings(identity=identity, namespace="dra-gateway",
                         lease_duration=LEASE_DURATION, renew_deadline=0.4, retry_period=0.05)


class Unreachable:
    """A cluster whose reads and writes fail while `down` is set (a partitioned replica)."""

    def __init__(self, inner: MemoryCluster) -> None:
        self.inner = inner
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise ApiError("connection refused", code=503, reason="ServiceUnavailable")

    async def get(self, rt: ResourceType, name: str, *, namespace: str | None = None) -> Object:
        self._check()
        return await self.inner.get(rt, name, namespace=namespace)

    async def create(self, rt: ResourceType, obj: Object, *, namespace: str | None = None,
                     dry_run: bool = False) -> Object:
        self._check()
        return await self.inner.create(rt, obj, namespace=namespace, dry_run=dry_run)

    async def update(self, rt: ResourceType, obj: Object, *, namespace: str | None = None,
                     subresource: str | None = None) -> Object:
        self._check()
        return await self.inner.update(rt, obj, namespace=namespace, subresource=subresource)


class Work:
    def __init__(self) -> None:
        self.running: set[str] = set()
        self.max_running = 0
        self.stopped: list[str] = []

    def lead(self, identity: str) -> Any:
        async def run() -> None:
            self.running.add(identity)
            self.max_running = max(self.max_running, len(self.running))
            try:
                await asyncio.Event().wait()
            finally:
                self.running.discard(identity)
                self.stopped.append(identity)
        return run


async def test_of_two_replicas_one_leads_and_the_lease_is_a_valid_object() -> None:
    cluster = MemoryCluster()
    work = Work()
    a, b = LeaderElector(cluster, settings("a")), LeaderElector(cluster, settings("b"))
    tasks = [asyncio.create_task(a.run(work.lead("a"))),
             asyncio.create_task(b.run(work.lead("b")))]
    try:
        await eventually(lambda: work.running)
        await asyncio.sleep(0.3)  # several renew periods: still exactly one
        assert len(work.running) == 1
        assert work.max_running == 1
        lease = await cluster.get(LEASES, "dra-gateway-allocator", namespace="dra-gateway")
        kubernetes_validate.validate(lease, "1.34", strict=True)
        assert lease["spec"]["holderIdentity"] in {"a", "b"}
        assert lease["spec"]["leaseDurationSeconds"] == 1
        assert lease["spec"]["renewTime"].endswith("Z")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_stopped_leader_releases_and_the_standby_takes_over_at_once() -> None:
    cluster = MemoryCluster()
    work = Work()
    a, b = LeaderElector(cluster, settings("a")), LeaderElector(cluster, settings("b"))
    task_a = asyncio.create_task(a.run(work.lead("a")))
    await eventually(lambda: "a" in work.running)
    task_b = asyncio.create_task(b.run(work.lead("b")))
    try:
        await asyncio.sleep(0.1)
        assert work.running == {"a"}
        task_a.cancel()
        await asyncio.gather(task_a, return_exceptions=True)
        assert work.stopped == ["a"]
        # Released: b need not wait out the lease duration.
        await eventually(lambda: "b" in work.running, within=LEASE_DURATION)
        lease = await cluster.get(LEASES, "dra-gateway-allocator", namespace="dra-gateway")
        assert lease["spec"]["holderIdentity"] == "b"
        assert lease["spec"]["leaseTransitions"] == 1
    finally:
        task_b.cancel()
        await asyncio.gather(task_b, return_exceptions=True)


async def test_a_leader_that_cannot_renew_stops_its_work_before_another_starts() -> None:
    cluster = MemoryCluster()
    partitioned = Unreachable(cluster)
    work = Work()
    stopped_at: dict[str, float] = {}
    started_at: dict[str, float] = {}
    loop = asyncio.get_running_loop()

    def lead(identity: str) -> Any:
        async def run() -> None:
            started_at[identity] = loop.time()
            try:
                await asyncio.Event().wait()
            finally:
                stopped_at[identity] = loop.time()
        return run

    a = LeaderElector(partitioned, settings("a"))  # type: ignore[arg-type]
    b = LeaderElector(cluster, settings("b"))
    task_a = asyncio.create_task(a.run(lead("a")))
    await eventually(lambda: "a" in started_at)
    task_b = asyncio.create_task(b.run(lead("b")))
    try:
        partitioned.down = True
        await eventually(lambda: "b" in started_at)
        assert "a" in stopped_at
        assert stopped_at["a"] < started_at["b"]
        assert not a.is_leader
    finally:
        for task in (task_a, task_b):
            task.cancel()
        await asyncio.gather(task_a, task_b, return_exceptions=True)
    del work


async def test_work_that_fails_ends_the_campaign_with_its_error() -> None:
    cluster = MemoryCluster()

    async def broken() -> None:
        raise RuntimeError("boom")

    elector = LeaderElector(cluster, settings("a"))
    with pytest.raises(RuntimeError, match="boom"):
        await elector.run(broken)
    lease = await cluster.get(LEASES, "dra-gateway-allocator", namespace="dra-gateway")
    assert "holderIdentity" not in lease["spec"]  # released on the way out


def test_lease_timings_must_let_the_leader_stop_before_the_lease_expires() -> None:
    with pytest.raises(ValueError, match="retry_period < renew_deadline < lease_duration"):
        LeaseSettings(identity="a", lease_duration=5, renew_deadline=10, retry_period=2)


async def test_the_lease_never_says_less_than_the_configured_duration() -> None:
    cluster = MemoryCluster()
    elector = LeaderElector(cluster, LeaseSettings(
        identity="a", lease_duration=1.4, renew_deadline=1.3, retry_period=0.1))
    assert await elector.try_acquire_or_renew()
    lease = await cluster.get(LEASES, "dra-gateway-allocator", namespace="dra-gateway")
    # Rounded down to 1 s, a standby could start 0.3 s before this leader must have stopped.
    assert lease["spec"]["leaseDurationSeconds"] == 2
