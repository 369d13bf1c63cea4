"""Builders of policy documents, claim specs and allocated claims for the policy tests."""

from __future__ import annotations

from typing import Any

import pytest

from dra_gateway.kube import names


def quota(name: str = "team-a-gpu", namespace: str = "team-a", *, admission: str = "Queue",
          scope: dict[str, Any] | None = None, **hard: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"hard": hard, "admission": admission}
    if scope is not None:
        spec["scope"] = scope
    return {"apiVersion": names.API_VERSION, "kind": "GPUQuota",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def sharing(name: str = "tenants", selector: dict[str, Any] | None = None,
            **spec: Any) -> dict[str, Any]:
    return {"apiVersion": names.API_VERSION, "kind": "GPUSharingPolicy",
            "metadata": {"name": name},
            "spec": {"namespaceSelector": selector or {}, **spec}}


def share_spec(memory: str | None = "10Gi", cores: int | None = 30, *, count: int = 1,
               enforcement: str = "hami-core", cls: str = names.GPU_CLASS,
               request: str = "gpu") -> dict[str, Any]:
    """A claim spec as the translator writes it (whole cards when memory and cores are None)."""
    exactly: dict[str, Any] = {"deviceClassName": cls, "allocationMode": "ExactCount",
                               "count": count}
    requests: dict[str, str] = {}
    parameters: dict[str, Any] = {"apiVersion": names.API_VERSION,
                                  "kind": names.KIND_GPU_SHARE_CONFIG,
                                  "enforcement": enforcement}
    if memory is not None:
        requests["memory"] = memory
    if cores is not None:
        requests["cores"] = str(cores)
        parameters["cores"] = cores
    if requests:
        exactly["capacity"] = {"requests": requests}
    return {"devices": {
        "requests": [{"name": request, "exactly": exactly}],
        "config": [{"requests": [request], "opaque": {"driver": names.DRIVER,
                                                      "parameters": parameters}}]}}


def card(name: str = "gpu-0", product: str = "NVIDIA H100 80GB HBM3",
         memory: str = "80Gi") -> dict[str, Any]:
    return {"name": name,
            "attributes": {"productName": {"string": product}, "type": {"string": "gpu"}},
            "capacity": {"memory": {"value": memory}, "cores": {"value": "100"}}}


def allocated(spec: dict[str, Any], *devices: tuple[str, dict[str, str] | None],
              pool: str = "node-a", namespace: str = "team-a") -> dict[str, Any]:
    """A claim of `spec` allocated on `devices`: (device name, consumedCapacity or None)."""
    request = spec["devices"]["requests"][0]["name"]
    results = []
    for device, consumed in devices:
        result: dict[str, Any] = {"request": request, "driver": names.DRIVER, "pool": pool,
                                  "device": device}
        if consumed is not None:
            result["consumedCapacity"] = consumed
        results.append(result)
    return {"metadata": {"name": "c", "namespace": namespace, "uid": "u"}, "spec": spec,
            "status": {"allocation": {"devices": {"results": results}}}}


@pytest.fixture
def cards() -> dict[tuple[str, str, str], dict[str, Any]]:
    return {(names.DRIVER, "node-a", "gpu-0"): card("gpu-0"),
            (names.DRIVER, "node-a", "gpu-1"): card("gpu-1"),
            (names.DRIVER, "node-a", "gpu-2"): card("gpu-2", "NVIDIA A100-SXM4-40GB", "40Gi")}
