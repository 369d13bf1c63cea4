"""Typed models of what crosses component boundaries.

The `GpuShareConfig` document travels in a claim's `config[].opaque.parameters` for driver
`gpu.dra-gateway.io`, from translator to allocator to node plugin. Typed models are for the
edges (loading, validating); hot paths work on plain dicts.
"""

from __future__ import annotations

from typing import Any, Literal

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
    fields, and the allocator then reads the share from this document (DESIGN.md).
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
