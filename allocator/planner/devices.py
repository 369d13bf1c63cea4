"""Devices as the planner sees them: parsed once per slice, with capacities in exact integers.

A `Device` is built when its ResourceSlice arrives and replaced when the slice changes, so
everything cached on it (selector verdicts, its content signature) lives exactly as long as the
slice's view of it. Capacities are kept in nanos (billionths) so that memory in bytes and
compute in percent are compared exactly. Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dra_gateway.allocator.planner import counters
from dra_gateway.gpu.mig import Placement
from dra_gateway.kube import names
from dra_gateway.kube.cel.devices import IDENTITY_ATTRIBUTES
from dra_gateway.kube.quantity import Quantity, QuantityError, QuantityFormat, parse_quantity
from dra_gateway.policy.amounts import card_amounts

NANO = 10**9
MIB_NANOS = (1 << 20) * NANO


@dataclass(frozen=True, slots=True)
class RequestPolicy:
    """A capacity's `requestPolicy`: what a request may consume, in nanos."""

    default: int | None
    valid_values: tuple[int, ...] | None
    minimum: int | None
    maximum: int | None
    step: int | None

    def round_up(self, requested: int) -> int | None:
        """The smallest valid amount at least `requested`, or None (upstream rounding)."""
        if self.valid_values is not None:
            for value in self.valid_values:
                if value >= requested:
                    return value
            return None
        if self.minimum is not None:
            value = max(requested, self.minimum)
            if self.step:
                steps = -(-(value - self.minimum) // self.step)
                value = self.minimum + steps * self.step
            if self.maximum is not None and value > self.maximum:
                return None
            return value
        return requested


def _nanos(value: Any) -> int:
    return parse_quantity(value).nanos


def _request_policy(raw: Mapping[str, Any]) -> RequestPolicy:
    default = _nanos(raw["default"]) if raw.get("default") is not None else None
    values = raw.get("validValues")
    valid = tuple(sorted(_nanos(v) for v in values)) if values else None
    rng = raw.get("validRange") or {}
    return RequestPolicy(
        default=default,
        valid_values=valid,
        minimum=_nanos(rng["min"]) if rng.get("min") is not None else None,
        maximum=_nanos(rng["max"]) if rng.get("max") is not None else None,
        step=_nanos(rng["step"]) if rng.get("step") is not None else None,
    )


def qualify(driver: str, name: str) -> str:
    """A fully qualified attribute or capacity name (bare names belong to the driver)."""
    return name if "/" in name else f"{driver}/{name}"


class Device:
    """One published device, node-local, with parsed attributes, capacities and taints."""

    __slots__ = (
        "_view",
        "attributes",
        "capacity",
        "capacity_format",
        "card_amounts",
        "counters",
        "driver",
        "gpu_memory",
        "group",
        "group_id",
        "is_gateway_gpu",
        "key",
        "mig",
        "name",
        "node",
        "policies",
        "pool",
        "raw",
        "serial",
        "shareable",
        "taints",
        "verdicts",
    )

    def __init__(self, *, driver: str, pool: str, node: str | None, raw: Mapping[str, Any],
                 consumable_capacity: bool) -> None:
        self.driver = driver
        self.pool = pool
        self.node = node
        self.raw = raw
        self.name: str = raw.get("name", "")
        self.key = (driver, pool, self.name)
        attrs: dict[str, Any] = {}
        for attr_name, wrapped in (raw.get("attributes") or {}).items():
            if isinstance(wrapped, Mapping) and wrapped:
                attrs[qualify(driver, attr_name)] = next(iter(wrapped.values()))
        self.attributes = attrs
        capacity: dict[str, int] = {}
        formats: dict[str, QuantityFormat] = {}
        policies: dict[str, RequestPolicy] = {}
        for cap_name, entry in (raw.get("capacity") or {}).items():
            try:
                quantity = parse_quantity((entry or {}).get("value", "0"))
                capacity[cap_name] = quantity.nanos
                formats[cap_name] = quantity.format
                if entry.get("requestPolicy"):
                    policies[cap_name] = _request_policy(entry["requestPolicy"])
            except (QuantityError, KeyError, TypeError):
                capacity[cap_name] = 0
                formats[cap_name] = "DecimalSI"
        self.capacity = capacity
        self.capacity_format = formats
        self.policies = policies
        self.taints: tuple[Mapping[str, Any], ...] = tuple(raw.get("taints") or ())
        # What it draws from its pool's counter sets (partitionable devices), and the MIG
        # placement that describes, set by the inventory once the card's geometry is known.
        self.counters = counters.consumed(driver, pool, raw, attrs)
        self.mig: tuple[counters.SetKey, Placement] | None = None
        self.is_gateway_gpu = (
            driver == names.DRIVER
            and attrs.get(qualify(driver, names.ATTR_TYPE), "gpu") == "gpu"
            and names.CAPACITY_MEMORY in capacity
        )
        # Without the gate the API server drops allowMultipleAllocations, and the gateway (the
        # only allocator of its classes in that world) shares its own GPUs by its records;
        # never a card cut into MIG instances on demand (it draws on counters).
        self.shareable = bool(raw.get("allowMultipleAllocations")) or (
            not consumable_capacity and self.is_gateway_gpu and not self.counters
        )
        self.gpu_memory = capacity.get(names.CAPACITY_MEMORY, 0) // NANO
        # What a charge holding the whole device counts against quotas (memory, cores).
        self.card_amounts = card_amounts(raw)
        self.verdicts: dict[str, bool | str] = {}
        self._view: Any = None
        self.group = self.group_sig()
        self.group_id = -1  # interned by the state
        self.serial = -1  # unique per device version, set by the state

    def view(self) -> Any:
        """The CEL `device` value, built once per slice version."""
        if self._view is None:
            from dra_gateway.kube import cel

            self._view = cel.device_view(self.driver, dict(self.raw))
        return self._view

    def group_sig(self) -> str:
        """Content without identity attributes: equal for interchangeable devices."""
        attrs = {
            k: v for k, v in (self.raw.get("attributes") or {}).items()
            if k not in IDENTITY_ATTRIBUTES and qualify(self.driver, k).rsplit("/", 1)[-1]
            not in IDENTITY_ATTRIBUTES
        }
        body = {k: v for k, v in self.raw.items() if k not in ("name", "attributes")}
        return json.dumps([self.driver, body, attrs], sort_keys=True, default=str)

    def quantity(self, cap_name: str, nanos: int) -> Quantity:
        """`nanos` of capacity `cap_name` as a Quantity in the device's own format."""
        fmt = self.capacity_format.get(cap_name, "DecimalSI")
        return Quantity(nanos, fmt)
