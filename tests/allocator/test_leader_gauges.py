"""The gauges only a leader keeps (pending pods, quota usage, invalid claims) are cleared when
its term ends: a replica that lost the Lease must not keep the alerts on them firing."""

from __future__ import annotations

import asyncio

from testkit import eventually

from dra_gateway.allocator.metrics import Metrics
from dra_gateway.allocator.process import run_allocator
from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube.runtime.leader import LeaseSettings


def _samples(metrics: Metrics, name: str) -> list[float]:
    return [s.value for family in metrics.registry.collect() if family.name == name
            for s in family.samples]


async def test_a_term_that_ends_clears_the_leader_only_gauges() -> None:
    metrics = Metrics()
    stop = asyncio.Event()
    task = asyncio.create_task(run_allocator(
        MemoryCluster(), namespace="dra-gateway", identity="a", metrics=metrics, stop=stop,
        lease=LeaseSettings(identity="a", namespace="dra-gateway", lease_duration=3.0,
                            renew_deadline=2.0, retry_period=0.5)))
    try:
        await eventually(lambda: _samples(metrics, "dra_gateway_allocator_leader") == [1.0])
        # What the term set, as its writers set it.
        metrics.pending_pods.labels("Unschedulable").set(3)
        metrics.quota_used.labels("team-a", "gpus", "devices").set(4)
        metrics.quota_hard.labels("team-a", "gpus", "devices").set(8)
        metrics.quota_borrowed.labels("team-a", "gpus", "devices").set(1)
        metrics.invalid_claims.set(2)
    finally:
        stop.set()
        await asyncio.gather(task, return_exceptions=True)
    assert _samples(metrics, "dra_gateway_allocator_leader") == [0.0]
    for name in ("dra_gateway_allocator_pending_pods", "dra_gateway_allocator_quota_used",
                 "dra_gateway_allocator_quota_hard", "dra_gateway_allocator_quota_borrowed"):
        assert _samples(metrics, name) == [], name
    assert _samples(metrics, "dra_gateway_allocator_invalid_claims") == [0.0]
