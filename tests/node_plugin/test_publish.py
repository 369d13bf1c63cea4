from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube import names
from dra_gateway.kube.resources import NODES, RESOURCE_SLICES
from dra_gateway.node_plugin.devices import DeviceOptions, devices_of
from dra_gateway.node_plugin.inventory import load_inventory
from dra_gateway.node_plugin.metrics import Metrics
from dra_gateway.node_plugin.publish import Publisher

from .claimdata import NODE


def _devices(path: Path) -> list[dict[str, Any]]:
    return devices_of(load_inventory(path), DeviceOptions())


async def _slices(cluster: MemoryCluster) -> list[dict[str, Any]]:
    return (await cluster.list(RESOURCE_SLICES)).items


@contextlib.asynccontextmanager
async def _running(publisher: Publisher) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(publisher.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _synced(publisher: Publisher) -> None:
    await asyncio.wait_for(publisher.synced.wait(), 5)


async def test_publishing_twice_writes_once(cluster: MemoryCluster, h100x8: Path) -> None:
    metrics = Metrics()
    publisher = Publisher(cluster, node_name=NODE, devices=_devices(h100x8), metrics=metrics)
    assert await publisher.reconcile() is True
    assert await publisher.reconcile() is False
    (slice_,) = await _slices(cluster)
    kubernetes_validate.validate(slice_, "1.34", strict=True)
    node = await cluster.get(NODES, NODE)
    assert slice_["metadata"]["ownerReferences"] == [{
        "apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node["metadata"]["uid"],
        "controller": True}]
    assert slice_["spec"]["pool"]["generation"] == 1
    assert metrics.slice_writes.labels("create")._value.get() == 1


async def test_a_restarted_publisher_adopts_identical_slices(cluster: MemoryCluster,
                                                             h100x8: Path) -> None:
    await Publisher(cluster, node_name=NODE, devices=_devices(h100x8)).reconcile()
    before = await _slices(cluster)
    again = Publisher(cluster, node_name=NODE, devices=_devices(h100x8))
    assert await again.reconcile() is False
    assert again.generation == 1
    assert await _slices(cluster) == before


async def test_every_change_bumps_the_pool_generation(cluster: MemoryCluster,
                                                      h100x8: Path) -> None:
    devices = _devices(h100x8)
    publisher = Publisher(cluster, node_name=NODE, devices=devices)
    await publisher.reconcile()
    publisher.set_devices(devices[:5])
    assert await publisher.reconcile() is True
    (slice_,) = await _slices(cluster)
    assert slice_["spec"]["pool"]["generation"] == 2
    assert len(slice_["spec"]["devices"]) == 5


async def test_shrinking_to_fewer_slices_deletes_the_extra_ones(cluster: MemoryCluster,
                                                                h100x8: Path) -> None:
    devices = _devices(h100x8)
    publisher = Publisher(cluster, node_name=NODE, devices=devices, max_devices=3)
    await publisher.reconcile()
    assert [len(s["spec"]["devices"]) for s in await _slices(cluster)] == [3, 3, 2]
    publisher.set_devices(devices[:2])
    await publisher.reconcile()
    (slice_,) = await _slices(cluster)
    assert slice_["spec"]["pool"] == {"name": NODE, "generation": 2, "resourceSliceCount": 1}


async def test_a_deleted_slice_is_republished(cluster: MemoryCluster, h100x8: Path) -> None:
    publisher = Publisher(cluster, node_name=NODE, devices=_devices(h100x8))
    async with _running(publisher):
        await _synced(publisher)
        (first,) = await _slices(cluster)
        await cluster.delete(RESOURCE_SLICES, first["metadata"]["name"])  # the kubelet restarts
        for _ in range(200):
            slices = await _slices(cluster)
            if slices:
                break
            await asyncio.sleep(0.01)
        (second,) = slices
        assert second["spec"]["devices"] == first["spec"]["devices"]
        assert second["metadata"]["name"] == first["metadata"]["name"]
        assert second["spec"]["pool"]["generation"] > first["spec"]["pool"]["generation"]


async def test_an_edited_slice_is_put_back(cluster: MemoryCluster, h100x8: Path) -> None:
    publisher = Publisher(cluster, node_name=NODE, devices=_devices(h100x8))
    async with _running(publisher):
        await _synced(publisher)
        (slice_,) = await _slices(cluster)
        slice_["spec"]["devices"] = slice_["spec"]["devices"][:1]
        await cluster.update(RESOURCE_SLICES, slice_)
        for _ in range(200):
            (now,) = await _slices(cluster)
            if len(now["spec"]["devices"]) == 8:
                break
            await asyncio.sleep(0.01)
        assert len(now["spec"]["devices"]) == 8


async def test_an_expired_watch_relists_and_still_repairs(cluster: MemoryCluster,
                                                          h100x8: Path) -> None:
    publisher = Publisher(cluster, node_name=NODE, devices=_devices(h100x8))
    async with _running(publisher):
        await _synced(publisher)
        assert cluster.open_watches == 1
        cluster.expire_watches()
        (slice_,) = await _slices(cluster)
        await cluster.delete(RESOURCE_SLICES, slice_["metadata"]["name"])
        for _ in range(200):
            if await _slices(cluster):
                break
            await asyncio.sleep(0.01)
        assert len(await _slices(cluster)) == 1


async def test_new_devices_reach_the_cluster_while_running(cluster: MemoryCluster,
                                                           h100x8: Path) -> None:
    devices = _devices(h100x8)
    publisher = Publisher(cluster, node_name=NODE, devices=devices[:1])
    async with _running(publisher):
        await _synced(publisher)
        publisher.set_devices(devices)
        await _synced(publisher)
        (slice_,) = await _slices(cluster)
        assert len(slice_["spec"]["devices"]) == 8


async def test_other_nodes_and_drivers_are_left_alone(cluster: MemoryCluster,
                                                      h100x8: Path) -> None:
    other = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
             "metadata": {"name": "other"},
             "spec": {"driver": "gpu.nvidia.com", "nodeName": NODE,
                      "pool": {"name": NODE, "generation": 7, "resourceSliceCount": 1},
                      "devices": []}}
    await cluster.create(RESOURCE_SLICES, other)
    publisher = Publisher(cluster, node_name=NODE, devices=_devices(h100x8))
    await publisher.reconcile()
    assert sorted(s["metadata"]["name"] for s in await _slices(cluster)) == [
        f"{NODE}-{names.DRIVER}-0", "other"]
    assert (await cluster.get(RESOURCE_SLICES, "other"))["spec"] == other["spec"]


class GateOffCluster(MemoryCluster):
    """An API server without DRAConsumableCapacity: it drops the fields silently."""

    @staticmethod
    def _drop(obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        for device in obj.get("spec", {}).get("devices", []):
            device.pop("allowMultipleAllocations", None)
            for capacity in device.get("capacity", {}).values():
                capacity.pop("requestPolicy", None)
        return obj

    async def create(self, rt: Any, obj: dict[str, Any], **kw: Any) -> dict[str, Any]:
        return await super().create(rt, self._drop(obj), **kw)

    async def update(self, rt: Any, obj: dict[str, Any], **kw: Any) -> dict[str, Any]:
        return await super().update(rt, self._drop(obj), **kw)


async def test_fields_dropped_by_the_server_are_not_drift(mixed: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    cluster = GateOffCluster()
    try:
        devices = devices_of(load_inventory(mixed), DeviceOptions(consumable_capacity=True))
        publisher = Publisher(cluster, node_name=NODE, devices=devices)
        assert await publisher.reconcile() is True
        assert await publisher.reconcile() is False
        assert "do not force --consumable-capacity" in caplog.text
        (slice_,) = await _slices(cluster)
        assert slice_["spec"]["pool"]["generation"] == 1
    finally:
        await cluster.close()
