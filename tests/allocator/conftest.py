"""Fixtures for the allocator controller's tests: a small GPU cluster, gated pods, claims.

`World` plays the parts the controller relies on but does not own: the node plugin (slices),
the admission webhook (gated pods) and the built-in claim controller (claims owned by the pod
and recorded in `status.resourceClaimStatuses`). `check_no_overcommit` is the safety property
every correctness test ends with; `LaggingClaimWatch` a cluster whose claim watch falls behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest

from dra_gateway.allocator.controller import Controller, ControllerSettings
from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import Cluster, Object, ObjectList, PatchType, WatchEvent
from dra_gateway.kube.quantity import parse_quantity
from dra_gateway.kube.resources import (
    DEVICE_CLASSES,
    NODES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    ResourceType,
)

from .planner_support import device_class, node

GIB = 1 << 30
NAMESPACE = "team-a"


def gpu(index: int, node_name: str, *, memory_gib: int, native: bool,
        product: str = "NVIDIA A100-SXM4-80GB") -> Object:
    memory = f"{memory_gib}Gi"
    device: dict[str, Any] = {
        "name": f"gpu-{index}",
        "attributes": {
            names.ATTR_TYPE: {"string": "gpu"},
            names.ATTR_UUID: {"string": f"GPU-{node_name}-{index}"},
            names.ATTR_PRODUCT_NAME: {"string": product},
            names.ATTR_INDEX: {"int": index},
        },
    }
    if native:
        device["allowMultipleAllocations"] = True
        device["capacity"] = {
            names.CAPACITY_MEMORY: {"value": memory, "requestPolicy": {
                "default": memory, "validRange": {"min": "256Mi", "step": "256Mi"}}},
            names.CAPACITY_CORES: {"value": "100", "requestPolicy": {
                "default": "100", "validRange": {"min": "1", "step": "1"}}},
        }
    else:
        device["capacity"] = {names.CAPACITY_MEMORY: {"value": memory},
                              names.CAPACITY_CORES: {"value": "100"}}
    return device


def resource_slice(node_name: str, gpus: int, *, memory_gib: int = 80, native: bool = True,
                   generation: int = 0, product: str = "NVIDIA A100-SXM4-80GB") -> Object:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node_name}-{names.DRIVER}"},
            "spec": {"driver": names.DRIVER, "nodeName": node_name,
                     "pool": {"name": node_name, "generation": generation,
                              "resourceSliceCount": 1},
                     "devices": [gpu(i, node_name, memory_gib=memory_gib, native=native,
                                     product=product) for i in range(gpus)]}}


def share_claim_spec(*, memory_gib: int | None = None, cores: int | None = None,
                     count: int = 1) -> Object:
    """A claim spec as the translator writes it: capacity requests plus a GpuShareConfig; a
    share states the capacity it leaves open at its smallest amount (1 core, 1Mi), so that
    it is not charged the request policy's default (the whole card)."""
    exactly: dict[str, Any] = {"deviceClassName": names.GPU_CLASS, "count": count}
    requests: dict[str, str] = {}
    params: dict[str, Any] = {"apiVersion": names.API_VERSION,
                              "kind": names.KIND_GPU_SHARE_CONFIG}
    if memory_gib is not None:
        requests[names.CAPACITY_MEMORY] = f"{memory_gib}Gi"
        params["memory"] = memory_gib * GIB
    if cores is not None:
        requests[names.CAPACITY_CORES] = str(cores)
        params["cores"] = cores
    if requests:
        requests.setdefault(names.CAPACITY_MEMORY, "1Mi")
        requests.setdefault(names.CAPACITY_CORES, "1")
        exactly["capacity"] = {"requests": requests}
    return {"devices": {
        "requests": [{"name": "gpu", "exactly": exactly}],
        "config": [{"requests": ["gpu"], "opaque": {"driver": names.DRIVER,
                                                    "parameters": params}}],
    }}


def whole_claim_spec(count: int = 1) -> Object:
    return share_claim_spec(count=count)


@dataclass
class World:
    """A cluster with GPU nodes and helpers to create gated pods and their claims."""

    cluster: Cluster
    native: bool = True
    pods: dict[str, Object] = field(default_factory=dict)

    async def setup(self, *, nodes: int = 2, gpus: int = 2, memory_gib: int = 80,
                    cpu: str = "64") -> None:
        await self.cluster.create(DEVICE_CLASSES, device_class(names.GPU_CLASS, "gpu"))
        await self.cluster.create(DEVICE_CLASSES, device_class(names.MIG_CLASS, "mig"))
        for i in range(nodes):
            await self.add_node(f"node-{i}", gpus=gpus, memory_gib=memory_gib, cpu=cpu)

    async def add_node(self, name: str, *, gpus: int = 2, memory_gib: int = 80,
                       cpu: str = "64", product: str = "NVIDIA A100-SXM4-80GB",
                       labels: dict[str, str] | None = None) -> None:
        await self.cluster.create(NODES, node(name, cpu=cpu, labels=labels))
        await self.cluster.create(RESOURCE_SLICES, resource_slice(
            name, gpus, memory_gib=memory_gib, native=self.native, product=product))

    async def gated_pod(self, name: str, claim_specs: Iterable[Object], *, cpu: str = "1",
                        create_claims: bool = True, gated: bool = True,
                        annotations: dict[str, str] | None = None,
                        namespace: str = NAMESPACE, priority: int | None = None,
                        other_gates: tuple[str, ...] = (),
                        labels: dict[str, str] | None = None,
                        scheduling_group: str | None = None) -> Object:
        specs = list(claim_specs)
        pod: Object = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace,
                         "annotations": annotations or {}, "labels": labels or {}},
            "spec": {
                "containers": [{"name": "main", "image": "cuda:12",
                                "resources": {"requests": {"cpu": cpu, "memory": "1Gi"},
                                              "claims": [{"name": f"gpu-{i}"}
                                                         for i in range(len(specs))]}}],
                "resourceClaims": [{"name": f"gpu-{i}",
                                    "resourceClaimTemplateName": f"template-{i}"}
                                   for i in range(len(specs))],
            },
        }
        if priority is not None:
            pod["spec"]["priority"] = priority  # as the API server fills it from the class
        if scheduling_group is not None:  # upstream's PodGroup (GenericWorkload, 1.36 on)
            pod["spec"]["schedulingGroup"] = {"podGroupName": scheduling_group}
        if gated:
            # Another admission system's gates (Kueue's) come first, as they are added first.
            pod["spec"]["schedulingGates"] = [*({"name": g} for g in other_gates),
                                              {"name": names.SCHEDULING_GATE}]
        created = await self.cluster.create(PODS, pod, namespace=namespace)
        self.pods[name] = created
        if create_claims:
            await self.create_claims(name, specs)
        return created

    async def create_claims(self, pod_name: str, specs: list[Object]) -> list[Object]:
        """Play the claim controller: claims owned by the pod, then the pod's claim statuses."""
        pod = self.pods[pod_name]
        namespace = pod["metadata"]["namespace"]
        claims: list[Object] = []
        statuses: list[Object] = []
        for i, spec in enumerate(specs):
            claim = await self.cluster.create(RESOURCE_CLAIMS, {
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {
                    "generateName": f"{pod_name}-gpu-{i}-", "namespace": namespace,
                    "annotations": {names.K8S_POD_CLAIM_NAME_ANNOTATION: f"gpu-{i}"},
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod_name,
                                         "uid": pod["metadata"]["uid"], "controller": True,
                                         "blockOwnerDeletion": True}]},
                "spec": spec}, namespace=namespace)
            claims.append(claim)
            statuses.append({"name": f"gpu-{i}", "resourceClaimName": claim["metadata"]["name"]})
        await self.cluster.patch(PODS, pod_name, {"status": {"resourceClaimStatuses": statuses}},
                                 namespace=namespace, subresource="status")
        return claims

    def _namespace(self, name: str) -> str:
        known = self.pods.get(name)
        return str(known["metadata"]["namespace"]) if known is not None else NAMESPACE

    async def pod(self, name: str) -> Object:
        return await self.cluster.get(PODS, name, namespace=self._namespace(name))

    async def claims_of(self, pod_name: str) -> list[Object]:
        pod = await self.pod(pod_name)
        ns = self._namespace(pod_name)
        names_ = [s["resourceClaimName"] for s in
                  (pod.get("status") or {}).get("resourceClaimStatuses") or []]
        return [await self.cluster.get(RESOURCE_CLAIMS, n, namespace=ns) for n in names_]

    async def finish(self, name: str, phase: str = "Succeeded") -> None:
        await self.cluster.patch(PODS, name, {"status": {"phase": phase}},
                                 namespace=self._namespace(name), subresource="status")


def record_evictions(cluster: MemoryCluster) -> list[Object]:
    """The pods evicted from now on, each as it was just before its eviction (its
    DisruptionTarget condition included)."""
    evicted: list[Object] = []
    real_evict = cluster.evict

    async def evict(name: str, *, namespace: str, uid: str | None = None) -> None:
        evicted.append(await cluster.get(PODS, name, namespace=namespace))
        await real_evict(name, namespace=namespace, uid=uid)

    cluster.evict = evict  # type: ignore[method-assign]
    return evicted


def is_ungated(pod: Object) -> bool:
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return all(g.get("name") != names.SCHEDULING_GATE for g in gates)


async def ungated(world: World, name: str) -> Object | None:
    """The pod once it has lost the gateway's gate, else None (a check for `eventually`)."""
    pod = await world.pod(name)
    return pod if is_ungated(pod) else None


def consumption(claims: Iterable[Object], slices: Iterable[Object]) -> dict[
        tuple[str, str, str], list[tuple[str, dict[str, int], bool]]]:
    """Per device: (claim, consumed capacity, whole card?) of every allocated claim.

    Reads consumedCapacity from the results, or the fallback annotation; a result with neither
    counts as the whole card.
    """
    capacity: dict[tuple[str, str, str], dict[str, int]] = {}
    for obj in slices:
        spec = obj["spec"]
        for device in spec.get("devices") or []:
            key = (spec["driver"], spec["pool"]["name"], device["name"])
            capacity[key] = {n: parse_quantity(c["value"]).nanos
                             for n, c in (device.get("capacity") or {}).items()}
    uses: dict[tuple[str, str, str], list[tuple[str, dict[str, int], bool]]] = defaultdict(list)
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation")
        if not allocation:
            continue
        meta = claim["metadata"]
        recorded: dict[tuple[str, str, str], list[Object]] = defaultdict(list)
        raw = (meta.get("annotations") or {}).get(names.ANNOTATION_SHARES)
        for entry in json.loads(raw) if raw else []:
            recorded[(entry["driver"], entry["pool"], entry["device"])].append(entry)
        for result in allocation["devices"]["results"]:
            key = (result["driver"], result["pool"], result["device"])
            consumed_raw = result.get("consumedCapacity")
            if consumed_raw is None and recorded.get(key):
                consumed_raw = recorded[key].pop(0).get("consumedCapacity")
            whole = consumed_raw is None
            consumed = ({n: parse_quantity(v).nanos for n, v in consumed_raw.items()}
                        if consumed_raw is not None else dict(capacity.get(key, {})))
            uses[key].append((f"{meta['namespace']}/{meta['name']}", consumed, whole))
    return uses


def check_no_overcommit(claims: Iterable[Object], slices: Iterable[Object]) -> None:
    """No device gives more memory or cores than it has; a whole card is never shared."""
    slices = list(slices)
    capacity: dict[tuple[str, str, str], dict[str, int]] = {}
    for obj in slices:
        spec = obj["spec"]
        for device in spec.get("devices") or []:
            capacity[(spec["driver"], spec["pool"]["name"], device["name"])] = {
                n: parse_quantity(c["value"]).nanos
                for n, c in (device.get("capacity") or {}).items()}
    for key, uses in consumption(claims, slices).items():
        holders = [u[0] for u in uses]
        if any(whole for _, _, whole in uses):
            assert len(uses) == 1, f"{key}: a whole card is shared by {holders}"
        totals: dict[str, int] = defaultdict(int)
        for _, consumed, _ in uses:
            for cap_name, amount in consumed.items():
                totals[cap_name] += amount
        for cap_name, total in totals.items():
            have = capacity.get(key, {}).get(cap_name)
            if have is not None:
                assert total <= have, (f"{key}: {cap_name} overcommitted: {total} > {have} by "
                                       f"{holders}")


class LaggingClaimWatch:
    """A cluster whose ResourceClaim watches hold events back while `hold` is set."""

    def __init__(self, inner: MemoryCluster) -> None:
        self.inner = inner
        self.hold = False
        self.released = 0  # held events let through so far
        self._changed = asyncio.Event()

    def let_through(self, count: int) -> None:
        self.released += count
        self._changed.set()

    async def get(self, rt: ResourceType, name: str, *, namespace: str | None = None) -> Object:
        return await self.inner.get(rt, name, namespace=namespace)

    async def list(self, rt: ResourceType, *, namespace: str | None = None,
                   label_selector: str | None = None,
                   field_selector: str | None = None) -> ObjectList:
        return await self.inner.list(rt, namespace=namespace, label_selector=label_selector,
                                     field_selector=field_selector)

    async def watch(self, rt: ResourceType, *, namespace: str | None = None,
                    resource_version: str | None = None, label_selector: str | None = None,
                    field_selector: str | None = None,
                    timeout_seconds: float | None = None) -> AsyncIterator[WatchEvent]:
        held = 0
        async for event in self.inner.watch(rt, namespace=namespace,
                                            resource_version=resource_version,
                                            label_selector=label_selector,
                                            field_selector=field_selector,
                                            timeout_seconds=timeout_seconds):
            if rt is RESOURCE_CLAIMS and self.hold:
                held += 1
                while held > self.released:
                    self._changed.clear()
                    await self._changed.wait()
            yield event

    async def create(self, rt: ResourceType, obj: Object, *, namespace: str | None = None,
                     dry_run: bool = False) -> Object:
        return await self.inner.create(rt, obj, namespace=namespace, dry_run=dry_run)

    async def update(self, rt: ResourceType, obj: Object, *, namespace: str | None = None,
                     subresource: str | None = None) -> Object:
        return await self.inner.update(rt, obj, namespace=namespace, subresource=subresource)

    async def patch(self, rt: ResourceType, name: str, patch: Any, *,
                    namespace: str | None = None, patch_type: PatchType = "merge",
                    subresource: str | None = None) -> Object:
        return await self.inner.patch(rt, name, patch, namespace=namespace,
                                      patch_type=patch_type, subresource=subresource)

    async def delete(self, rt: ResourceType, name: str, *, namespace: str | None = None,
                     resource_version: str | None = None) -> Object | None:
        return await self.inner.delete(rt, name, namespace=namespace,
                                       resource_version=resource_version)

    async def close(self) -> None:
        await self.inner.close()


FAST = ControllerSettings(base_delay=0.01, max_delay=0.2, retry_unplaceable_after=0.02,
                          resync_period=5.0, identity="test-allocator", event_interval=0.0)


@contextlib.asynccontextmanager
async def running_controller(cluster: Cluster, settings: ControllerSettings = FAST,
                             ) -> AsyncIterator[Controller]:
    controller = Controller(cluster, settings)
    task = asyncio.create_task(controller.run(), name="controller")
    try:
        ready = asyncio.create_task(controller.ready.wait())
        await asyncio.wait({ready, task}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            ready.cancel()
            await asyncio.gather(ready, return_exceptions=True)
            task.result()
        assert ready.done(), "the controller did not become ready"
        yield controller
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@pytest.fixture
def memory_cluster() -> MemoryCluster:
    return MemoryCluster()


@pytest.fixture
def world(memory_cluster: MemoryCluster) -> World:
    return World(memory_cluster)
