"""Typed models of what crosses component boundaries.

The `GpuShareConfig` document travels in a claim's `config[].opaque.parameters` for driver
`gpu.dra-gateway.io`, from translator to allocator to node plugin. Typed models are for the
edges (loading, validating); hot paths work on plain dicts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, NotRequired, TypedDict

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dra_gateway.kube import names

Enforcement = Literal["none", "hami-core", "mps"]
PolicyName = Literal["default", "binpack", "spread", "first-fit"]
POLICY_NAMES: tuple[str, ...] = ("default", "binpack", "spread", "first-fit")
ENFORCEMENTS: tuple[str, ...] = ("none", "hami-core", "mps")


class GpuShareConfig(BaseModel):
    """How much of each card a request gets and how that is enforced in the container.

    Absolute amounts also travel as `capacity.requests` where the cluster keeps them; they are
    repeated here because an API server without the DRAConsumableCapacity gate drops those
    fields, and the allocator then reads the share from this document (ARCHITECTURE.md,
    "Contracts between components").
    A request with neither memory nor cores set takes whole cards.
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    api_version: Literal["dra-gateway.io/v1alpha1"] = Field(
        default="dra-gateway.io/v1alpha1", alias="apiVersion"
    )
    kind: Literal["GpuShareConfig"] = "GpuShareConfig"
    memory: int | None = Field(default=None, ge=1, description="bytes per card")
    memory_percent: int | None = Field(default=None, ge=1, le=100, alias="memoryPercent")
    cores: int | None = Field(default=None, ge=1, le=100, description="percent of SMs per card")
    enforcement: Enforcement = "none"
    policy: PolicyName | None = None

    @model_validator(mode="after")
    def _one_memory_form(self) -> GpuShareConfig:
        if self.memory is not None and self.memory_percent is not None:
            raise ValueError("set memory or memoryPercent, not both")
        return self

    @property
    def is_whole_card(self) -> bool:
        return self.memory is None and self.memory_percent is None and (
            self.cores is None or self.cores == names.CORES_PER_CARD
        )

    def to_parameters(self) -> dict[str, Any]:
        """The JSON object for `opaque.parameters`, with unset fields left out."""
        return self.model_dump(by_alias=True, exclude_none=True)


def config_applies(requests: Sequence[str] | None, request: str) -> bool:
    """Does a config listing `requests` apply to the allocation result `request`?

    No list means every request; a config for request "gpu" covers the firstAvailable result
    "gpu/large" too, as DRA reads it.
    """
    return not requests or request in requests or request.split("/", 1)[0] in requests


def share_parameters(configs: Iterable[Mapping[str, Any]], request: str, *,
                     driver: str = names.DRIVER) -> dict[str, Any]:
    """The GpuShareConfig parameters that apply to `request`, merged: later entries win key by key.

    `configs` are device configs in DRA's order (a claim's `spec.devices.config`, or an
    allocation's `devices.config`, class configs first); only the opaque configs of `driver`
    that apply to the request count. The node plugin enforces exactly this document in the
    container, so the planner sizes shares from it too. Callers validate or read the result
    (`GpuShareConfig.model_validate`). Raises ValueError naming the request when a matching
    config's parameters are not a JSON object.
    """
    merged: dict[str, Any] = {}
    for config in configs:
        opaque = config.get("opaque")
        if not isinstance(opaque, Mapping) or opaque.get("driver") != driver:
            continue
        if not config_applies(config.get("requests"), request):
            continue
        params = opaque.get("parameters") or {}
        if not isinstance(params, Mapping):
            raise ValueError(f"config for request {request}: parameters must be a JSON object")
        if params.get("kind") == names.KIND_GPU_SHARE_ALLOCATION:
            continue  # the allocator's record of the shares (kube.shares), not a request's
        merged.update(params)
    return merged


# --- resource.k8s.io/v1 shapes, as plain JSON dicts ----------------------------------------------
# TypedDicts rather than models: components pass these dicts across the cluster port unchanged
# and only need the type checker to know the field names (camelCase, as on the wire). Quantities
# are their JSON text ("80Gi"); parse them with dra_gateway.kube.quantity. Field names and
# required fields follow the Kubernetes 1.34 OpenAPI schema (a test compares them).


class CELDeviceSelector(TypedDict):
    expression: str


class DeviceSelector(TypedDict, total=False):
    cel: CELDeviceSelector


class DeviceToleration(TypedDict, total=False):
    key: str
    operator: Literal["Exists", "Equal"]
    value: str
    effect: Literal["NoSchedule", "NoExecute", ""]
    tolerationSeconds: int


class CapacityRequirements(TypedDict, total=False):
    requests: dict[str, str]


class ExactDeviceRequest(TypedDict):
    deviceClassName: str
    selectors: NotRequired[list[DeviceSelector]]
    allocationMode: NotRequired[Literal["ExactCount", "All"]]
    count: NotRequired[int]
    adminAccess: NotRequired[bool]
    tolerations: NotRequired[list[DeviceToleration]]
    capacity: NotRequired[CapacityRequirements]


class DeviceSubRequest(TypedDict):
    name: str
    deviceClassName: str
    selectors: NotRequired[list[DeviceSelector]]
    allocationMode: NotRequired[Literal["ExactCount", "All"]]
    count: NotRequired[int]
    tolerations: NotRequired[list[DeviceToleration]]
    capacity: NotRequired[CapacityRequirements]


class DeviceRequest(TypedDict):
    """Exactly one of `exactly` and `firstAvailable` is set."""

    name: str
    exactly: NotRequired[ExactDeviceRequest]
    firstAvailable: NotRequired[list[DeviceSubRequest]]


class DeviceConstraint(TypedDict, total=False):
    """Exactly one of `matchAttribute` and `distinctAttribute` is set."""

    requests: list[str]
    matchAttribute: str
    distinctAttribute: str


class OpaqueDeviceConfiguration(TypedDict):
    driver: str
    parameters: dict[str, Any]


class DeviceClaimConfiguration(TypedDict, total=False):
    requests: list[str]
    opaque: OpaqueDeviceConfiguration


class DeviceClaim(TypedDict, total=False):
    requests: list[DeviceRequest]
    constraints: list[DeviceConstraint]
    config: list[DeviceClaimConfiguration]


class ResourceClaimSpec(TypedDict, total=False):
    devices: DeviceClaim


class ResourceClaimTemplateSpec(TypedDict):
    spec: ResourceClaimSpec
    metadata: NotRequired[dict[str, Any]]


class DeviceAllocationConfiguration(TypedDict):
    source: Literal["FromClass", "FromClaim"]
    requests: NotRequired[list[str]]
    opaque: NotRequired[OpaqueDeviceConfiguration]


class DeviceRequestAllocationResult(TypedDict):
    request: str
    driver: str
    pool: str
    device: str
    adminAccess: NotRequired[bool]
    tolerations: NotRequired[list[DeviceToleration]]
    bindingConditions: NotRequired[list[str]]
    bindingFailureConditions: NotRequired[list[str]]
    shareID: NotRequired[str]
    consumedCapacity: NotRequired[dict[str, str]]


class DeviceAllocationResult(TypedDict, total=False):
    results: list[DeviceRequestAllocationResult]
    config: list[DeviceAllocationConfiguration]


class AllocationResult(TypedDict, total=False):
    devices: DeviceAllocationResult
    nodeSelector: dict[str, Any]
    allocationTimestamp: str


class ResourceClaimConsumerReference(TypedDict):
    resource: str
    name: str
    uid: str
    apiGroup: NotRequired[str]


class NetworkDeviceData(TypedDict, total=False):
    interfaceName: str
    ips: list[str]
    hardwareAddress: str


class AllocatedDeviceStatus(TypedDict):
    driver: str
    pool: str
    device: str
    shareID: NotRequired[str]
    conditions: NotRequired[list[dict[str, Any]]]
    data: NotRequired[dict[str, Any]]
    networkData: NotRequired[NetworkDeviceData]


class ResourceClaimStatus(TypedDict, total=False):
    allocation: AllocationResult
    reservedFor: list[ResourceClaimConsumerReference]
    devices: list[AllocatedDeviceStatus]


class DeviceAttribute(TypedDict, total=False):
    """Exactly one value is set; `version` is a semantic version such as "550.54.15"."""

    int: int
    bool: bool
    string: str
    version: str


class CapacityRequestPolicyRange(TypedDict):
    min: str
    max: NotRequired[str]
    step: NotRequired[str]


class CapacityRequestPolicy(TypedDict, total=False):
    default: str
    validValues: list[str]
    validRange: CapacityRequestPolicyRange


class DeviceCapacity(TypedDict):
    value: str
    requestPolicy: NotRequired[CapacityRequestPolicy]


class Counter(TypedDict):
    value: str


class DeviceCounterConsumption(TypedDict):
    counterSet: str
    counters: dict[str, Counter]


class DeviceTaint(TypedDict):
    key: str
    effect: Literal["NoSchedule", "NoExecute"]
    value: NotRequired[str]
    timeAdded: NotRequired[str]


class Device(TypedDict):
    """One device of a ResourceSlice; bare attribute and capacity names are the driver's."""

    name: str
    attributes: NotRequired[dict[str, DeviceAttribute]]
    capacity: NotRequired[dict[str, DeviceCapacity]]
    allowMultipleAllocations: NotRequired[bool]
    consumesCounters: NotRequired[list[DeviceCounterConsumption]]
    nodeName: NotRequired[str]
    nodeSelector: NotRequired[dict[str, Any]]
    allNodes: NotRequired[bool]
    taints: NotRequired[list[DeviceTaint]]
    bindsToNode: NotRequired[bool]
    bindingConditions: NotRequired[list[str]]
    bindingFailureConditions: NotRequired[list[str]]


class ResourcePool(TypedDict):
    name: str
    generation: int
    resourceSliceCount: int


class CounterSet(TypedDict):
    name: str
    counters: dict[str, Counter]


class ResourceSliceSpec(TypedDict):
    """Exactly one of nodeName, nodeSelector, allNodes and perDeviceNodeSelection is set."""

    driver: str
    pool: ResourcePool
    nodeName: NotRequired[str]
    nodeSelector: NotRequired[dict[str, Any]]
    allNodes: NotRequired[bool]
    perDeviceNodeSelection: NotRequired[bool]
    devices: NotRequired[list[Device]]
    sharedCounters: NotRequired[list[CounterSet]]
