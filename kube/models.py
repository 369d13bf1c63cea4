"""Typed models of what crosses component boundaries.

The `GpuShareConfig` document travels in a claim's `config[].opaque.parameters` for driver
`gpu.dra-gateway.io`, from translator to allocator to node plugin. Typed models are for the
edges (loading, validating); hot paths work on plain dicts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dra_gateway.kube import names

Enforcement = Literal["none", "hami-core", "mps"]
# How the allocator packs a pod onto nodes and cards: carried in the field `policy`, its wire name.
Strategy = Literal["default", "binpack", "spread", "first-fit"]
# The same names as tuples, for what checks a value: each enumeration is declared once.
STRATEGIES: tuple[str, ...] = get_args(Strategy)
ENFORCEMENTS: tuple[str, ...] = get_args(Enforcement)


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
    policy: Strategy | None = None  # the packing strategy

    @model_validator(mode="after")
    def _one_memory_form(self) -> GpuShareConfig:
        if self.memory is not None and self.memory_percent is not None:
            raise ValueError("set memory or memoryPercent, not both")
        return self

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
            continue  # the allocator's record of the shares (gpu.shares), not a request's
        merged.update(params)
    return merged



def read_share_config(configs: Iterable[Mapping[str, Any]], request: str, *,
                      driver: str = names.DRIVER) -> GpuShareConfig:
    """The GpuShareConfig that applies to `request` (`share_parameters`), validated: what the
    planner sizes a share by and the node plugin enforces, read one way. Raises ValueError
    naming the request and each field that is wrong."""
    merged = share_parameters(configs, request, driver=driver)
    try:
        return GpuShareConfig.model_validate(merged)
    except ValidationError as exc:
        detail = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(document)'}: {e['msg']}"
                           for e in exc.errors())
        raise ValueError(f"GpuShareConfig for request {request} is invalid: {detail}") from None
