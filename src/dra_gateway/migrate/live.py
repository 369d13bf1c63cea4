"""Reading a live cluster through the cluster port into a `ClusterObjects`.

The kinds the project's core does not name (ResourceQuotas, the workloads) are typed here; a
type the API does not serve (the GPUQuota CRD not installed yet, an API server without apps/v1
such as the embedded one) is left out with a note, so the plan says what it could not see
instead of failing. Any other API error is the caller's to report.

This module only lists objects: it must not write to the cluster, translate or plan.
"""

from __future__ import annotations

from typing import Final

from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import Cluster, NotFound
from dra_gateway.kube.resources import (
    CONFIG_MAPS,
    DAEMON_SETS,
    GPU_QUOTAS,
    GPU_SHARING_POLICIES,
    NAMESPACES,
    NODES,
    PODS,
    ResourceType,
)
from dra_gateway.migrate.inventory import ClusterObjects, Object

RESOURCE_QUOTAS: Final = ResourceType("", "v1", "resourcequotas", "ResourceQuota",
                                      namespaced=True, has_status=True)
WORKLOAD_TYPES: Final = (
    ResourceType("apps", "v1", "deployments", "Deployment", namespaced=True, has_status=True),
    ResourceType("apps", "v1", "statefulsets", "StatefulSet", namespaced=True, has_status=True),
    DAEMON_SETS,
    ResourceType("apps", "v1", "replicasets", "ReplicaSet", namespaced=True, has_status=True),
    ResourceType("batch", "v1", "jobs", "Job", namespaced=True, has_status=True),
    ResourceType("batch", "v1", "cronjobs", "CronJob", namespaced=True, has_status=True),
)


async def read_cluster(cluster: Cluster, *,
                       gateway_namespace: str = names.GATEWAY_NAMESPACE) -> ClusterObjects:
    """Every object migrate reads, across all namespaces; the rule ConfigMaps of the gateway's
    namespace only, the one the webhook reads them from."""
    inventory = ClusterObjects()
    missing: list[str] = []

    async def items(rt: ResourceType, label_selector: str | None = None,
                    namespace: str | None = None) -> list[Object]:
        try:
            listed = await cluster.list(rt, namespace=namespace, label_selector=label_selector)
        except NotFound:
            missing.append(f"{rt.plural}.{rt.group}" if rt.group else rt.plural)
            return []
        # The API leaves apiVersion and kind out of list items; the inventory files by kind.
        return [{**obj, "apiVersion": rt.api_version, "kind": rt.kind} for obj in listed.items]

    for rt in (NAMESPACES, PODS, NODES, RESOURCE_QUOTAS, GPU_QUOTAS, GPU_SHARING_POLICIES,
               *WORKLOAD_TYPES):
        for obj in await items(rt):
            inventory.add(obj)
    for obj in await items(CONFIG_MAPS, f"{names.RULES_LABEL}={names.RULES_LABEL_VALUE}",
                           gateway_namespace):
        inventory.add(obj)
    if missing:
        inventory.notes.append(f"the API does not serve {', '.join(missing)}: those objects are "
                               "not in this plan")
    return inventory
