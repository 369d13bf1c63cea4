"""Which feature gates the API server has on, as the components must agree on them.

The API server silently drops the fields of a disabled feature gate, so a component learns a
gate by writing such a field and reading it back: a dry-run create of a probe ResourceSlice
(nothing is stored; it needs only the `create` permission on `resourceslices` that every
component that publishes or probes has), and, where that is refused, the slices the node
plugins published. The allocator and the node plugin both decide here, so that they never
disagree about which world they are in (ARCHITECTURE.md, "Kubernetes versions and feature gates").
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Final

from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import ApiError, Cluster, Object
from dra_gateway.kube.resources import RESOURCE_SLICES

log = logging.getLogger(__name__)

PROBE_SLICE_NAME: Final = "dra-gateway-feature-probe"
# How a verdict was reached, as `detect_consumable_capacity` reports it.
BY_PROBE: Final = "dry-run probe slice"
BY_PUBLISHED_SLICES: Final = "published slices"


def probe_slice(driver: str = names.DRIVER, node_name: str | None = None) -> Object:
    """A slice with one multi-allocatable device: what the dry-run probe sends.

    A node plugin probes with a slice of its own node: the chart's admission policy lets it
    write no other (and no slice of all nodes); the allocator's probe is of all nodes.
    """
    where: Object = {"nodeName": node_name} if node_name else {"allNodes": True}
    return {
        "apiVersion": RESOURCE_SLICES.api_version, "kind": RESOURCE_SLICES.kind,
        "metadata": {"name": PROBE_SLICE_NAME},
        "spec": {"driver": driver, **where,
                 "pool": {"name": PROBE_SLICE_NAME, "generation": 0, "resourceSliceCount": 1},
                 "devices": [{"name": "probe", "allowMultipleAllocations": True,
                              "capacity": {names.CAPACITY_MEMORY: {"value": "1Gi"}}}]},
    }


async def detect_consumable_capacity(cluster: Cluster, *, driver: str = names.DRIVER,
                                     node_name: str | None = None,
                                     ) -> tuple[bool | None, str]:
    """Does the API server keep `allowMultipleAllocations`? (value or None, and how we know).

    First a dry-run create of a probe slice (nothing is stored), read back; when that is
    refused, the slices published for `driver`: the field survives only with the gate on.
    Errors other than a refused probe (the API unreachable, the list refused) are raised.
    `node_name` makes the probe a slice of that node (`probe_slice`).
    """
    try:
        echoed = await cluster.create(RESOURCE_SLICES, probe_slice(driver, node_name),
                                      dry_run=True)
        devices = (echoed.get("spec") or {}).get("devices") or [{}]
        return devices[0].get("allowMultipleAllocations") is True, BY_PROBE
    except ApiError as err:
        log.info("dry-run probe of consumable capacity refused; reading published slices",
                 extra={"code": err.code, "reason": err.reason, "error": err.message})
    published = await cluster.list(RESOURCE_SLICES, field_selector=f"spec.driver={driver}")
    return slices_show_consumable_capacity(published.items), BY_PUBLISHED_SLICES


def taint_probe_slice(driver: str = names.DRIVER, node_name: str | None = None) -> Object:
    """The probe slice with a tainted device: what the dry-run probe of device taints sends."""
    probe = probe_slice(driver, node_name)
    device = probe["spec"]["devices"][0]
    device["taints"] = [{"key": f"{driver}/probe", "effect": "NoSchedule"}]
    return probe


async def detect_device_taints(cluster: Cluster, *, driver: str = names.DRIVER,
                               node_name: str | None = None) -> bool | None:
    """Does the API server keep a device's `taints` (DRADeviceTaints: beta and on from 1.36)?
    None when the dry-run probe was refused: published slices prove nothing, their plugins
    may not have sent taints."""
    try:
        echoed = await cluster.create(RESOURCE_SLICES, taint_probe_slice(driver, node_name),
                                      dry_run=True)
    except ApiError as err:
        log.info("dry-run probe of device taints refused",
                 extra={"code": err.code, "reason": err.reason, "error": err.message})
        return None
    devices = (echoed.get("spec") or {}).get("devices") or [{}]
    return bool(devices[0].get("taints"))


def slices_show_consumable_capacity(slices: Iterable[Object]) -> bool | None:
    """True when a published device kept allowMultipleAllocations; None with no devices."""
    seen_device = False
    for obj in slices:
        for device in (obj.get("spec") or {}).get("devices") or []:
            seen_device = True
            if device.get("allowMultipleAllocations") is True:
                return True
    return False if seen_device else None


def partitionable_probe_slice(driver: str = names.DRIVER, node_name: str | None = None) -> Object:
    """A probe slice with a counter set and no devices: what the dry-run probe of partitionable
    devices sends (from 1.35 a slice's counter sets may not sit beside its devices)."""
    probe = probe_slice(driver, node_name)
    spec = probe["spec"]
    del spec["devices"]
    spec["sharedCounters"] = [{"name": "probe",
                               "counters": {names.CAPACITY_MEMORY: {"value": "1Gi"}}}]
    return probe


async def detect_partitionable_devices(cluster: Cluster, *, driver: str = names.DRIVER,
                                       node_name: str | None = None) -> bool | None:
    """Does the API server keep a slice's `sharedCounters` (DRAPartitionableDevices: alpha and
    off in 1.34, beta and on from 1.36)? None when the dry-run probe was refused. No component
    acts on it yet (the node plugin publishes MIG instances as devices of their own); `dra-gateway
    preflight` reports it."""
    try:
        echoed = await cluster.create(RESOURCE_SLICES, partitionable_probe_slice(driver, node_name),
                                      dry_run=True)
    except ApiError as err:
        log.info("dry-run probe of partitionable devices refused",
                 extra={"code": err.code, "reason": err.reason, "error": err.message})
        return None
    return bool((echoed.get("spec") or {}).get("sharedCounters"))
