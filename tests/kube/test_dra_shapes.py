"""The resource.k8s.io/v1 TypedDicts name exactly the fields of the Kubernetes 1.34 schema."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import kubernetes_validate
import pytest

from dra_gateway.kube import models

SHAPES = [
    "CELDeviceSelector",
    "DeviceSelector",
    "DeviceToleration",
    "CapacityRequirements",
    "ExactDeviceRequest",
    "DeviceSubRequest",
    "DeviceRequest",
    "DeviceConstraint",
    "OpaqueDeviceConfiguration",
    "DeviceClaimConfiguration",
    "DeviceClaim",
    "ResourceClaimSpec",
    "ResourceClaimTemplateSpec",
    "DeviceAllocationConfiguration",
    "DeviceRequestAllocationResult",
    "DeviceAllocationResult",
    "AllocationResult",
    "ResourceClaimConsumerReference",
    "NetworkDeviceData",
    "AllocatedDeviceStatus",
    "ResourceClaimStatus",
    "DeviceAttribute",
    "CapacityRequestPolicyRange",
    "CapacityRequestPolicy",
    "DeviceCapacity",
    "Counter",
    "DeviceCounterConsumption",
    "DeviceTaint",
    "Device",
    "ResourcePool",
    "CounterSet",
    "ResourceSliceSpec",
]


def required_fields(shape: Any) -> set[str]:
    """Required keys as the type checker sees them.

    `__required_keys__` cannot be used: models.py postpones annotations, so at runtime Python
    3.11 does not see `NotRequired[...]` and reports every key of a total TypedDict required.
    """
    required = set()
    for name, annotation in shape.__annotations__.items():
        text = str(getattr(annotation, "__forward_arg__", annotation))
        if text.startswith("NotRequired["):
            continue
        if text.startswith("Required[") or shape.__total__:
            required.add(name)
    return required


@pytest.fixture(scope="module")
def definitions() -> dict[str, Any]:
    schemas = resources.files(kubernetes_validate) / "kubernetes-json-schema"
    path = schemas / "v1.34.0-local-strict" / "_definitions.json"
    loaded: dict[str, Any] = json.loads(path.read_text())["$defs"]
    return loaded


@pytest.mark.parametrize("name", SHAPES)
def test_fields_and_required_fields_match_the_schema(
    name: str, definitions: dict[str, Any]
) -> None:
    shape = getattr(models, name)
    schema = definitions[f"io.k8s.api.resource.v1.{name}"]
    assert set(shape.__annotations__) == set(schema.get("properties", {}))
    assert required_fields(shape) == set(schema.get("required", []))


def test_a_claim_and_a_slice_built_from_the_shapes_validate() -> None:
    request: models.DeviceRequest = {
        "name": "gpu",
        "exactly": {
            "deviceClassName": "gpu.dra-gateway.io",
            "selectors": [{"cel": {"expression": 'device.driver == "gpu.dra-gateway.io"'}}],
            "count": 1,
        },
    }
    spec: models.ResourceClaimSpec = {"devices": {"requests": [request]}}
    device: models.Device = {
        "name": "gpu-0",
        "attributes": {"productName": {"string": "NVIDIA H100 80GB HBM3"}},
        "capacity": {"memory": {"value": "80Gi"}},
    }
    slice_spec: models.ResourceSliceSpec = {
        "driver": "gpu.dra-gateway.io",
        "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
        "nodeName": "node-a",
        "devices": [device],
    }
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "n"},
        "spec": spec,
    }
    resource_slice = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "node-a-gpu"},
        "spec": slice_spec,
    }
    kubernetes_validate.validate(claim, "1.34", strict=True)
    kubernetes_validate.validate(resource_slice, "1.34", strict=True)
