"""Feature detection shared by the allocator and the node plugin: one probe, one answer."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube import names
from dra_gateway.kube.cluster.features import (
    BY_PROBE,
    BY_PUBLISHED_SLICES,
    detect_consumable_capacity,
    detect_device_taints,
    probe_slice,
    slices_show_consumable_capacity,
    taint_probe_slice,
)
from dra_gateway.kube.cluster.port import Forbidden
from dra_gateway.kube.resources import RESOURCE_SLICES


class GateOff(MemoryCluster):
    """An API server with DRAConsumableCapacity off: the gated field does not survive."""

    async def create(self, rt: Any, obj: dict[str, Any], *, namespace: str | None = None,
                     dry_run: bool = False) -> dict[str, Any]:
        if rt is RESOURCE_SLICES:
            for device in obj["spec"].get("devices") or []:
                device.pop("allowMultipleAllocations", None)
        return await super().create(rt, obj, namespace=namespace, dry_run=dry_run)


class NoDryRun(MemoryCluster):
    """The probe is refused (a policy, or RBAC without create on ResourceSlices)."""

    async def create(self, rt: Any, obj: dict[str, Any], *, namespace: str | None = None,
                     dry_run: bool = False) -> dict[str, Any]:
        if dry_run:
            raise Forbidden('resourceslices.resource.k8s.io is forbidden: cannot create '
                            'resource "resourceslices"')
        return await super().create(rt, obj, namespace=namespace, dry_run=dry_run)


class OwnNodeOnly(MemoryCluster):
    """The chart's node-plugin-slices admission policy: a node plugin writes only its node's
    slices, a slice of all nodes included in what it may not write."""

    def __init__(self, node: str) -> None:
        super().__init__()
        self.node = node

    async def create(self, rt: Any, obj: dict[str, Any], *, namespace: str | None = None,
                     dry_run: bool = False) -> dict[str, Any]:
        if rt is RESOURCE_SLICES and obj["spec"].get("nodeName") != self.node:
            raise Forbidden(f"the dra-gateway node plugin on node {self.node} may not write "
                            "ResourceSlices of node '' (spec.nodeName)")
        return await super().create(rt, obj, namespace=namespace, dry_run=dry_run)


def published(node: str, *, multi: bool, driver: str = names.DRIVER) -> dict[str, Any]:
    device: dict[str, Any] = {"name": "gpu-0"}
    if multi:
        device["allowMultipleAllocations"] = True
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{driver}-0"},
            "spec": {"driver": driver, "nodeName": node, "devices": [device],
                     "pool": {"name": node, "generation": 0, "resourceSliceCount": 1}}}


@pytest.mark.parametrize("node", [None, "node-a"])
def test_the_probe_slice_is_a_valid_resource_slice(node: str | None) -> None:
    kubernetes_validate.validate(probe_slice("gpu.example.com", node), "1.34", strict=True)


async def test_a_node_plugin_probes_with_a_slice_of_its_own_node() -> None:
    # Its admission policy refuses a slice of all nodes: the probe names the node instead.
    cluster = OwnNodeOnly("node-a")
    assert await detect_consumable_capacity(cluster, node_name="node-a") == (True, BY_PROBE)
    assert cluster.objects(RESOURCE_SLICES) == []
    assert await detect_consumable_capacity(cluster) == (None, BY_PUBLISHED_SLICES)


async def test_a_server_that_keeps_the_field_is_detected_by_a_probe_that_stores_nothing() -> None:
    cluster = MemoryCluster()
    assert await detect_consumable_capacity(cluster) == (True, BY_PROBE)
    assert cluster.objects(RESOURCE_SLICES) == []


async def test_a_server_that_drops_the_field_is_detected_by_the_probe() -> None:
    assert await detect_consumable_capacity(GateOff()) == (False, BY_PROBE)


@pytest.mark.parametrize(("multi", "verdict"), [(True, True), (False, False)])
async def test_a_refused_probe_falls_back_to_the_slices_published_for_the_driver(
        multi: bool, verdict: bool) -> None:
    cluster = NoDryRun()
    await cluster.create(RESOURCE_SLICES, published("node-0", multi=not multi,
                                                    driver="other.example.com"))
    assert await detect_consumable_capacity(cluster, driver="gpu.example.com") == (
        None, BY_PUBLISHED_SLICES)
    await cluster.create(RESOURCE_SLICES, published("node-0", multi=multi,
                                                    driver="gpu.example.com"))
    assert await detect_consumable_capacity(cluster, driver="gpu.example.com") == (
        verdict, BY_PUBLISHED_SLICES)


def test_slices_without_devices_tell_nothing() -> None:
    assert slices_show_consumable_capacity([]) is None
    empty = published("node-0", multi=False)
    empty["spec"]["devices"] = []
    assert slices_show_consumable_capacity([empty]) is None


class TaintsOff(MemoryCluster):
    """An API server with DRADeviceTaints off (1.34 and 1.35 by default): taints are dropped."""

    async def create(self, rt: Any, obj: dict[str, Any], *, namespace: str | None = None,
                     dry_run: bool = False) -> dict[str, Any]:
        if rt is RESOURCE_SLICES:
            for device in obj["spec"].get("devices") or []:
                device.pop("taints", None)
        return await super().create(rt, obj, namespace=namespace, dry_run=dry_run)


@pytest.mark.parametrize(("server", "kept"), [(MemoryCluster, True), (TaintsOff, False),
                                              (NoDryRun, None)])
async def test_device_taints_are_detected_by_a_probe_that_stores_nothing(
        server: type[MemoryCluster], kept: bool | None) -> None:
    cluster = server()
    assert await detect_device_taints(cluster, node_name="node-a") is kept
    assert (await cluster.list(RESOURCE_SLICES)).items == []
    kubernetes_validate.validate(taint_probe_slice("gpu.example.com", "node-a"), "1.34",
                                 strict=True)
