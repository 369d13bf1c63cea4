"""What the eviction modes read and write through the cluster port: the snapshot every plan
reads (`read_snapshot`), and the records ConfigMap of holds and moves (`holds.py` is its format).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from dra_gateway.allocator.eviction import holds as holdfmt
from dra_gateway.allocator.eviction.inputs import Snapshot
from dra_gateway.allocator.legacypods import LegacyPods
from dra_gateway.kube.cluster.features import slices_show_consumable_capacity
from dra_gateway.kube.cluster.port import AlreadyExists, ApiError, Cluster, NotFound, Object
from dra_gateway.kube.resources import (
    CONFIG_MAPS,
    DEVICE_CLASSES,
    GPU_QUOTAS,
    GPU_SHARING_POLICIES,
    NAMESPACES,
    NODES,
    POD_DISRUPTION_BUDGETS,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    ResourceType,
)
from dra_gateway.policy.catalog import Catalog

LIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"


async def list_items(cluster: Cluster, rt: ResourceType, **kwargs: Any) -> list[Object]:
    try:
        return list((await cluster.list(rt, **kwargs)).items)
    except NotFound:  # a CRD not installed
        return []


async def read_records(cluster: Cluster, namespace: str) -> tuple[holdfmt.Records, Object | None]:
    try:
        config_map = await cluster.get(CONFIG_MAPS, holdfmt.CONFIG_MAP, namespace=namespace)
    except NotFound:
        return holdfmt.Records(), None
    return holdfmt.read(config_map), config_map


async def read_snapshot(cluster: Cluster, *, namespace: str, now: datetime,
                        strategy: str = "default",
                        pod_selector: str | None = LIVE_PODS) -> Snapshot:
    """Everything a plan reads, listed through the port (`pod_selector` None: every pod, for
    a reader such as the report that shows more than a plan needs; the plan reads the live
    ones alone either way)."""
    slices = await list_items(cluster, RESOURCE_SLICES)
    catalog = Catalog.build(quotas=await list_items(cluster, GPU_QUOTAS),
                            sharing=await list_items(cluster, GPU_SHARING_POLICIES),
                            namespaces=await list_items(cluster, NAMESPACES))
    records, _ = await read_records(cluster, namespace)
    native = slices_show_consumable_capacity(slices)
    classes = await list_items(cluster, DEVICE_CLASSES)
    legacy = LegacyPods()
    legacy.set_device_classes(classes)
    return Snapshot(
        now=now, nodes=await list_items(cluster, NODES), slices=slices, classes=classes,
        legacy=legacy,
        pods=await list_items(cluster, PODS, field_selector=pod_selector),
        claims=await list_items(cluster, RESOURCE_CLAIMS),
        budgets=await list_items(cluster, POD_DISRUPTION_BUDGETS),
        catalog=catalog, records=records,
        consumable_capacity=True if native is None else native, strategy=strategy)


async def write_records(cluster: Cluster, namespace: str, data: Mapping[str, str | None],
                        ) -> None:
    """Merge entries into the records ConfigMap (None deletes one), creating it if needed."""
    for _ in range(5):
        try:
            await cluster.patch(CONFIG_MAPS, holdfmt.CONFIG_MAP, {"data": dict(data)},
                                namespace=namespace)
            return
        except NotFound:
            body = {"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": holdfmt.CONFIG_MAP, "namespace": namespace,
                                 "labels": {"app.kubernetes.io/managed-by": "dra-gateway"}},
                    "data": {k: v for k, v in data.items() if v is not None}}
            try:
                await cluster.create(CONFIG_MAPS, body, namespace=namespace)
                return
            except AlreadyExists:
                continue
    raise ApiError(f"ConfigMap {namespace}/{holdfmt.CONFIG_MAP} could not be written")


async def drop_records(cluster: Cluster, namespace: str, keys: Sequence[str]) -> None:
    if keys:
        await write_records(cluster, namespace, dict.fromkeys(keys))


__all__ = ["LIVE_PODS", "drop_records", "list_items", "read_records", "read_snapshot",
           "write_records"]
