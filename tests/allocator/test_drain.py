"""The drain of failed devices on the embedded API (allocator/eviction/drain.py): where the API
server keeps no device taints, a pod on a device its node plugin withholds for a fatal fault is
marked and evicted through the Eviction API, with an Event naming the device and fault; a degraded
device, a device published again and a budget's refusal leave the pod running."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime
from typing import Any

import pytest
from testkit import eventually

from dra_gateway.allocator.eviction.drain import (
    EVENT_REFUSED,
    EVENT_UNHEALTHY,
    REASON,
    failed_devices,
    victims,
)
from dra_gateway.allocator.eviction.evict import DISRUPTION_TARGET, run_rounds
from dra_gateway.allocator.eviction.inputs import Snapshot
from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import ApiError, Object, TooManyRequests
from dra_gateway.kube.device_health import DeviceMark, marks_message
from dra_gateway.kube.resources import EVENTS, NODES, PODS, RESOURCE_SLICES
from dra_gateway.kube.runtime.leader import LeadershipLost

from .conftest import FAST, World, record_evictions, running_controller, ungated, whole_claim_spec

SETTINGS = dataclasses.replace(FAST, drain_interval=0.05)
SINCE = "2026-12-06T10:00:00Z"


async def _placed(world: World, cluster: MemoryCluster, name: str) -> str:
    """Place a one-card pod, bind it to node-0 as kube-scheduler would; its device."""
    await world.gated_pod(name, [whole_claim_spec(1)])
    await eventually(lambda: ungated(world, name))
    await cluster.patch(PODS, name, {"spec": {"nodeName": "node-0"}},
                        namespace=world.pods[name]["metadata"]["namespace"])
    (claim,) = await world.claims_of(name)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    return str(result["device"])


async def _fail(cluster: MemoryCluster, device: str, *, severity: str = "fatal",
                withhold: bool = True) -> None:
    """Play the node plugin where device taints are dropped: withhold the device from the
    slice and list it in the Node's condition."""
    if withhold:
        piece = await cluster.get(RESOURCE_SLICES, f"node-0-{names.DRIVER}")
        devices = [d for d in piece["spec"]["devices"] if d["name"] != device]
        await cluster.patch(RESOURCE_SLICES, piece["metadata"]["name"],
                            {"spec": {"devices": devices}}, patch_type="merge")
    mark = DeviceMark(device, "xid-79" if severity == "fatal" else "xid-94", severity,
                      "withheld", SINCE)
    await cluster.patch(NODES, "node-0", {"status": {"conditions": [{
        "type": names.NODE_HEALTH_CONDITION, "status": "True", "reason": "DevicesUnhealthy",
        "message": marks_message(names.DRIVER, [mark])}]}}, subresource="status",
        patch_type="strategic")


def _events(cluster: MemoryCluster, reason: str) -> list[Object]:
    return [e for e in cluster.objects(EVENTS) if e["reason"] == reason]


async def test_a_pod_on_a_failed_withheld_device_is_evicted_and_told_why(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=2)
    marked = record_evictions(memory_cluster)
    async with running_controller(memory_cluster, SETTINGS) as controller:
        device = await _placed(world, memory_cluster, "trainer")
        other = await _placed(world, memory_cluster, "bystander")
        await _fail(memory_cluster, device)
        await eventually(lambda: _gone(memory_cluster, "trainer"))
        (victim,) = marked
        (condition,) = [c for c in victim["status"]["conditions"]
                        if c["type"] == DISRUPTION_TARGET]
        assert condition["reason"] == REASON
        assert f"device {device} on node node-0 failed (xid-79, fatal fault since {SINCE})" \
            in condition["message"]
        (event,) = _events(memory_cluster, EVENT_UNHEALTHY)
        assert (event["type"], event["involvedObject"]["name"]) == ("Warning", "trainer")
        assert device in event["message"]
        assert controller.metrics.registry.get_sample_value(
            "dra_gateway_allocator_health_evictions_total", {"result": "evicted"}) == 1
        # The pod on the healthy card stays.
        assert other != device
        assert (await world.pod("bystander"))["metadata"].get("deletionTimestamp") is None


async def _gone(cluster: MemoryCluster, name: str) -> bool:
    return name not in {p["metadata"]["name"] for p in (await cluster.list(PODS)).items}


async def test_a_budget_that_refuses_keeps_the_pod_and_is_told_once_then_tried_again(
        world: World, memory_cluster: MemoryCluster) -> None:
    await world.setup(nodes=1, gpus=1)
    real_evict = memory_cluster.evict
    refusals = 0

    async def evict(name: str, *, namespace: str, uid: str | None = None) -> None:
        nonlocal refusals
        if refusals < 5:
            refusals += 1
            raise TooManyRequests("Cannot evict pod as it would violate the pod's disruption "
                                  "budget.")
        await real_evict(name, namespace=namespace, uid=uid)

    memory_cluster.evict = evict  # type: ignore[method-assign]
    real_patch = memory_cluster.patch
    marks: list[str] = []  # the DisruptionTarget statuses written, in order

    async def patch(rt: Any, name: str, body: Any, **kwargs: Any) -> Any:
        if rt == PODS and kwargs.get("subresource") == "status" and DISRUPTION_TARGET in str(
                body):
            marks.extend(c["status"] for c in body["status"]["conditions"]
                         if c["type"] == DISRUPTION_TARGET)
        return await real_patch(rt, name, body, **kwargs)

    memory_cluster.patch = patch  # type: ignore[method-assign,assignment]
    async with running_controller(memory_cluster, SETTINGS) as controller:
        device = await _placed(world, memory_cluster, "trainer")
        await _fail(memory_cluster, device)
        await eventually(lambda: _gone(memory_cluster, "trainer"))
        # Marked before each try, the mark taken back after each refusal: a pod that stays
        # never keeps a disruption that did not happen.
        assert marks == ["True", "False"] * 5 + ["True"]
        (refused,) = _events(memory_cluster, EVENT_REFUSED)  # told once for five refusals
        assert "disruption budget" in refused["message"]
        assert len(_events(memory_cluster, EVENT_UNHEALTHY)) == 1
        sample = controller.metrics.registry.get_sample_value
        assert sample("dra_gateway_allocator_health_evictions_total",
                      {"result": "refused"}) == 5
        assert sample("dra_gateway_allocator_health_evictions_total",
                      {"result": "evicted"}) == 1


def _snapshot(*, published: bool, severity: str = "fatal", action: str = "withheld",
              phase: str = "Running", reserved: bool = True) -> tuple[Snapshot, Any]:
    mark = DeviceMark("gpu-1", "xid-79", severity, action, SINCE)
    node = {"metadata": {"name": "node-0"}, "status": {"conditions": [{
        "type": names.NODE_HEALTH_CONDITION, "status": "True",
        "message": marks_message(names.DRIVER, [mark])}]}}
    devices = [{"name": "gpu-0"}] + ([{"name": "gpu-1"}] if published else [])
    piece = {"spec": {"driver": names.DRIVER, "nodeName": "node-0",
                      "pool": {"name": "node-0"}, "devices": devices}}
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
           "spec": {"nodeName": "node-0"}, "status": {"phase": phase}}
    claim = {"metadata": {"name": "c", "namespace": "ns"}, "status": {
        "allocation": {"devices": {"results": [
            {"request": "gpu", "driver": names.DRIVER, "pool": "node-0", "device": "gpu-1"}]}},
        "reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}] if reserved else []}}
    snapshot = Snapshot(now=datetime.now(UTC), nodes=[node], slices=[piece], pods=[pod],
                        claims=[claim])
    return snapshot, failed_devices([node])


def test_who_is_drained() -> None:
    snapshot, failed = _snapshot(published=False)
    assert [(v.pod, v.node, v.mark.device) for v in victims(snapshot, names.DRIVER, failed)] == [
        ("ns/p", "node-0", "gpu-1")]
    # Not drained: a device its plugin publishes again (a stale condition), a degraded device,
    # one tainted rather than withheld (kube-controller-manager evicts there), a finished pod,
    # a claim no pod uses, another driver's devices.
    for case in ({"published": True}, {"published": False, "severity": "degraded"},
                 {"published": False, "action": "tainted NoExecute"},
                 {"published": False, "phase": "Succeeded"},
                 {"published": False, "reserved": False}):
        snapshot, failed = _snapshot(**case)
        assert victims(snapshot, names.DRIVER, failed) == [], case
    snapshot, failed = _snapshot(published=False)
    assert victims(snapshot, "other.example.com", failed) == []


async def test_the_modes_loop_survives_failures_backs_off_and_ends_with_leadership(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """run_rounds, the loop of preemption, defrag and the drain: an API error or a bug is
    logged and the next round comes; a round with nothing to do doubles the pause (up to the
    limit); a lost leadership ends the loop."""
    pauses: list[float] = []

    async def sleep(seconds: float) -> None:
        pauses.append(seconds)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    results: list[Any] = [ApiError("etcd timed out"), RuntimeError("a bug"), True, True, False,
                          True, LeadershipLost("lease taken")]

    async def one_round() -> bool:
        result = results.pop(0)
        if isinstance(result, BaseException):
            raise result
        return bool(result)

    with pytest.raises(LeadershipLost):
        await run_rounds("test", one_round, interval=1.0, max_backoff=4)
    assert pauses == [1.0, 2.0, 4.0, 4.0, 4.0, 1.0, 2.0]
