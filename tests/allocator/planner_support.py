"""Builders of the planner's inputs (devices, slices, classes, nodes, pods, claims) and of a
planner state, shared by the planner's tests. Plain data, as the API serves it.
"""

from __future__ import annotations

import json
from typing import Any

import kubernetes_validate

from dra_gateway.allocator.planner import ClusterState, PlannerSettings, PodPlan, plan_pod
from dra_gateway.kube import names
from dra_gateway.kube.api_rules import allocation_problems

GI = 1 << 30
MI = 1 << 20
DRIVER = names.DRIVER


def gpu(index: int, *, memory_gib: int = 16, product: str = "T4", numa: int = 0,
        shared: bool = True, taints: list[dict[str, Any]] | None = None,
        policy: dict[str, Any] | None = None, pcie_root: str | None = None,
        island: int | None = None) -> dict[str, Any]:
    """A GPU device as the node plugin publishes it (consumable capacity when shared)."""
    device: dict[str, Any] = {
        "name": f"gpu-{index}",
        "attributes": {
            "type": {"string": "gpu"}, "uuid": {"string": f"GPU-{index:04d}-{memory_gib}"},
            "productName": {"string": product}, "index": {"int": index},
            "numaNode": {"int": numa},
        },
    }
    if pcie_root is not None:
        device["attributes"][names.ATTR_PCIE_ROOT] = {"string": pcie_root}
    if island is not None:
        device["attributes"][names.ATTR_NVLINK_ISLAND] = {"int": island}
    memory = f"{memory_gib}Gi"
    if shared:
        device["allowMultipleAllocations"] = True
        device["capacity"] = {
            "memory": {"value": memory, "requestPolicy": policy or {
                "default": memory, "validRange": {"min": "1Mi", "step": "1Mi"}}},
            "cores": {"value": "100", "requestPolicy": {
                "default": "100", "validRange": {"min": "1", "step": "1"}}},
        }
    else:
        device["capacity"] = {"memory": {"value": memory}, "cores": {"value": "100"}}
    if taints:
        device["taints"] = taints
    return device


def mig(index: int, profile: str, memory_gib: int) -> dict[str, Any]:
    return {
        "name": f"gpu-0-mig-{profile.replace('.', '-')}-{index}",
        "attributes": {"type": {"string": "mig"}, "profile": {"string": profile},
                       "productName": {"string": "A100"}, "index": {"int": 0}},
        "capacity": {"memory": {"value": f"{memory_gib}Gi"}},
    }


def resource_slice(node: str, devices: list[dict[str, Any]], *, generation: int = 1,
                   driver: str = DRIVER) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}-0"},
        "spec": {"driver": driver, "nodeName": node, "devices": devices,
                 "pool": {"name": node, "generation": generation, "resourceSliceCount": 1}},
    }


def device_class(name: str, device_type: str) -> dict[str, Any]:
    expression = (f"device.driver == '{DRIVER}' && "
                  f"device.attributes['{DRIVER}'].type == '{device_type}'")
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": expression}}]}}


def node(name: str, *, cpu: str = "64", memory: str = "256Gi",
         taints: list[dict[str, Any]] | None = None,
         labels: dict[str, str] | None = None) -> dict[str, Any]:
    resources = {"cpu": cpu, "memory": memory, "pods": "110"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels or {}},
            "spec": {"taints": taints or []},
            "status": {"allocatable": resources, "capacity": dict(resources)}}


def pod(name: str = "p", *, cpu: str = "1", memory: str = "1Gi", uid: str | None = None,
        node_name: str | None = None, annotations: dict[str, str] | None = None,
        **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "uid": uid or f"uid-{name}",
                         "annotations": annotations or {}},
            "spec": {"containers": [{"name": "main", "image": "x", "resources": {
                "requests": {"cpu": cpu, "memory": memory}}}],
                     **({"nodeName": node_name} if node_name else {}), **spec}}


def share_config(requests: list[str] | None = None, **params: Any) -> dict[str, Any]:
    config: dict[str, Any] = {"opaque": {"driver": DRIVER, "parameters": {
        "apiVersion": names.API_VERSION, "kind": "GpuShareConfig", **params}}}
    if requests is not None:
        config["requests"] = requests
    return config


def exactly(*, count: int = 1, cls: str = names.GPU_CLASS, mode: str = "ExactCount",
            selectors: list[str] | None = None, capacity: dict[str, str] | None = None,
            tolerations: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": cls, "allocationMode": mode}
    if mode == "ExactCount":
        body["count"] = count
    if selectors:
        body["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    if capacity:
        body["capacity"] = {"requests": capacity}
    if tolerations:
        body["tolerations"] = tolerations
    return body


def claim(name: str = "c", *, requests: list[dict[str, Any]] | None = None,
          constraints: list[dict[str, Any]] | None = None,
          config: list[dict[str, Any]] | None = None, uid: str | None = None,
          **main: Any) -> dict[str, Any]:
    devices: dict[str, Any] = {
        "requests": requests or [{"name": "main", "exactly": exactly(**main)}]}
    if constraints:
        devices["constraints"] = constraints
    if config:
        devices["config"] = config
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "ns", "uid": uid or f"uid-{name}"},
            "spec": {"devices": devices}}


def cluster(nodes: dict[str, list[dict[str, Any]]], *, strategy: str = "first-fit",
            consumable_capacity: bool = True, topology: bool = True, memo: bool = True,
            rankings: bool = True, **node_args: Any) -> ClusterState:
    state = ClusterState(PlannerSettings(default_strategy=strategy,
                                         consumable_capacity=consumable_capacity,
                                         topology=topology, memo=memo, rankings=rankings))
    state.set_device_class(device_class(names.GPU_CLASS, "gpu"))
    state.set_device_class(device_class(names.MIG_CLASS, "mig"))
    for name, devices in nodes.items():
        state.set_node(node(name, **node_args))
        state.set_slice(resource_slice(name, devices))
    return state


def place(state: ClusterState, p: dict[str, Any], *claims: dict[str, Any],
          strategy: str | None = None) -> PodPlan:
    """Plan and assume, as the controller does before writing."""
    plan = plan_pod(state, p, list(claims), strategy=strategy)
    if plan.node_name is not None:
        state.assume(p, plan)
    return plan


def results(plan: PodPlan, c: dict[str, Any]) -> list[dict[str, Any]]:
    allocation = plan.allocations[c["metadata"]["uid"]]
    return list(allocation["devices"]["results"])


def devices_of(plan: PodPlan, c: dict[str, Any]) -> list[str]:
    return [r["device"] for r in results(plan, c)]


def validate_allocated(c: dict[str, Any], plan: PodPlan) -> None:
    obj = json.loads(json.dumps(c))
    obj["status"] = {"allocation": plan.allocations[c["metadata"]["uid"]]}
    kubernetes_validate.validate(obj, "1.34", strict=True)
    # What 1.38 validates beyond the schemas (kube/api_rules.py).
    assert allocation_problems(obj["status"]["allocation"]) == []
