"""The one carry-out path of every eviction (allocator/eviction/evict.py): the pod is marked
`DisruptionTarget` before the Eviction API is called, so that the pod deleted carries it, and an
eviction the API does not carry out takes the mark back, so that a pod that stays never carries
a disruption that did not happen (a Job's podFailurePolicy would read its next crash as one)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from dra_gateway.allocator.conditions import pod_condition
from dra_gateway.allocator.eviction.evict import (
    DISRUPTION_TARGET,
    EVICTED,
    FAILED,
    GONE,
    NOT_EVICTED,
    REFUSED,
    Evictions,
)
from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube.cluster.port import ApiError, Forbidden, Object, TooManyRequests
from dra_gateway.kube.resources import EVENTS, PODS
from dra_gateway.kube.runtime.leader import LeadershipLost

from .conftest import record_evictions

NOW = datetime(2026, 12, 6, 10, 0, tzinfo=UTC)


async def _pod(cluster: MemoryCluster) -> Object:
    return await cluster.create(PODS, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "worker", "namespace": "ns"},
        "spec": {"nodeName": "node-0", "containers": [{"name": "main", "image": "cuda:12"}]},
        "status": {"phase": "Running"}}, namespace="ns")


@pytest.mark.parametrize(("answer", "result"), [
    (TooManyRequests("Cannot evict pod as it would violate the pod's disruption budget."),
     REFUSED),
    (Forbidden("ValidatingAdmissionPolicy 'no-evictions' denied request"), FAILED),
])
async def test_an_eviction_not_carried_out_takes_back_the_disruption_target_it_wrote(
        memory_cluster: MemoryCluster, answer: ApiError, result: str) -> None:
    pod = await _pod(memory_cluster)

    async def evict(name: str, *, namespace: str, uid: str | None = None) -> None:
        raise answer

    memory_cluster.evict = evict  # type: ignore[method-assign]
    evictions = Evictions(memory_cluster, clock=lambda: NOW)
    said = await evictions.leave("ns/worker", pod["metadata"]["uid"], reason="SomeCause",
                                 message="making room")
    assert said == (result, answer.message)
    stays = await memory_cluster.get(PODS, "worker", namespace="ns")
    condition = pod_condition(stays, DISRUPTION_TARGET)
    assert condition is not None
    assert (condition["status"], condition["reason"]) == ("False", NOT_EVICTED)
    assert answer.message in condition["message"]


async def test_an_accepted_eviction_deletes_a_pod_that_carries_the_disruption_target(
        memory_cluster: MemoryCluster) -> None:
    pod = await _pod(memory_cluster)
    evicted = record_evictions(memory_cluster)
    evictions = Evictions(memory_cluster, clock=lambda: NOW)
    said = await evictions.leave("ns/worker", pod["metadata"]["uid"], reason="SomeCause",
                                 message="making room")
    assert said == (EVICTED, "")
    (gone,) = evicted
    condition = pod_condition(gone, DISRUPTION_TARGET)
    assert condition is not None
    assert (condition["status"], condition["reason"]) == ("True", "SomeCause")


async def test_a_pod_made_again_under_the_name_is_neither_marked_nor_evicted(
        memory_cluster: MemoryCluster) -> None:
    """A StatefulSet's pod deleted and made again between the plan and its eviction: the
    condition and the eviction name the planned pod's uid, and the new pod gets neither."""
    planned = await _pod(memory_cluster)
    await memory_cluster.delete(PODS, "worker", namespace="ns")
    again = await _pod(memory_cluster)
    evicted = record_evictions(memory_cluster)
    evictions = Evictions(memory_cluster, clock=lambda: NOW)
    said = await evictions.leave("ns/worker", planned["metadata"]["uid"], reason="SomeCause",
                                 message="making room")
    assert said[0] == GONE
    assert evicted == []
    stays = await memory_cluster.get(PODS, "worker", namespace="ns")
    assert stays["metadata"]["uid"] == again["metadata"]["uid"]
    assert pod_condition(stays, DISRUPTION_TARGET) is None


async def test_a_replica_that_lost_its_lease_records_no_event(
        memory_cluster: MemoryCluster) -> None:
    pod = await _pod(memory_cluster)

    def lost() -> None:
        raise LeadershipLost("another replica leads")

    evictions = Evictions(memory_cluster, clock=lambda: NOW, fence=lost)
    with pytest.raises(LeadershipLost):
        await evictions.event(pod, "Preempting", "making room")
    assert (await memory_cluster.list(EVENTS, namespace="ns")).items == []
