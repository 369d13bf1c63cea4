"""The CEL `device` variable of a ResourceSlice device (`DeviceView`, `device_view`), and the
sample devices compilation dry-runs selectors on.

`device` has the shape the scheduler gives it: `driver`, `attributes` and `capacity` grouped by
domain, `allowMultipleAllocations`. A DeviceView keeps its engine context and the verdict of
every selector evaluated on it (`Selector.matches` in `evaluation` reads and fills that cache),
so matching the same selector on the same device again costs a dictionary lookup; a view must
not be used from two threads at once. This module builds views: it must not evaluate
expressions.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any, Final

import cel as _engine

from dra_gateway.kube import names
from dra_gateway.kube.cel.library import FUNCTIONS
from dra_gateway.kube.cel.values import is_int, parse_quantity, quantity_value, version_value
from dra_gateway.kube.quantity import Quantity, QuantityError
from dra_gateway.kube.semver import SemverError

# Attributes unique to one physical device (its UUID, its parent's, its PCI address): devices
# alike but for them are interchangeable to every selector that reads none of them. The
# allocator groups devices, and the webhook builds its device profiles, by leaving them out.
IDENTITY_ATTRIBUTES: Final = frozenset({names.ATTR_UUID, names.ATTR_PARENT_UUID,
                                        names.ATTR_PCIE_BUS_ID,
                                        "resource.kubernetes.io/pciBusID"})
# A macro may walk the attribute maps, identity attributes included.
_MACRO_MARKERS: Final = (".all(", ".exists(", ".exists_one(", ".map(", ".filter(")


def may_read_identity(expression: str) -> bool:
    """Whether a selector may tell apart devices alike but for their identity attributes: it
    names one, or walks the attribute maps with a macro (then judge it per device)."""
    return any(a in expression for a in IDENTITY_ATTRIBUTES) or any(
        m in expression for m in _MACRO_MARKERS)


class DeviceView:
    """The CEL `device` variable of one ResourceSlice device, with its engine context.

    Build one per device with `device_view` when its slice changes and keep it: the engine
    context and the selector verdicts it caches are only valid for that device content.
    `value` is the `device` map itself; treat it as read-only (parts are shared between views).
    `_verdicts` belongs to `Selector.matches`, which reads and fills it.
    """

    __slots__ = ("_context", "_verdicts", "driver", "name", "value")

    def __init__(self, driver: str, value: dict[str, Any], name: str = "") -> None:
        self.driver = driver
        self.name = name
        self.value = value
        self._context: _engine.Context | None = None
        self._verdicts: dict[str, bool | str] = {}

    def context(self) -> _engine.Context:
        if self._context is None:
            self._context = _engine.Context(variables={"device": self.value}, functions=FUNCTIONS)
        return self._context

    def __repr__(self) -> str:
        return f"DeviceView(driver={self.driver!r}, name={self.name!r})"


def _qualified(driver: str, name: str) -> tuple[str, str]:
    domain, slash, ident = name.partition("/")
    return (domain, ident) if slash else (driver, name)


def _attribute_value(driver: str, name: str, attribute: Any) -> Any:
    where = f"device attribute {name!r} of driver {driver!r}"
    if not isinstance(attribute, Mapping) or len(attribute) != 1:
        raise ValueError(f"{where}: expected exactly one of int, bool, string, version")
    ((kind, value),) = attribute.items()
    if kind == "int" and is_int(value):
        return value
    if kind == "bool" and isinstance(value, bool):
        return value
    if kind == "string" and isinstance(value, str):
        return value
    if kind == "version" and isinstance(value, str):
        try:
            return version_value(value)
        except SemverError as exc:
            raise ValueError(f"{where}: {exc}") from None
    raise ValueError(
        f"{where}: {kind!r} value {value!r} is not a valid int, bool, string or version"
    )


def device_view(driver: str, device: Mapping[str, Any]) -> DeviceView:
    """The CEL `device` of a ResourceSlice device dict, names grouped by domain.

    Bare attribute and capacity names belong to the driver's domain; a qualified name such as
    `resource.kubernetes.io/pcieRoot` goes to `device.attributes["resource.kubernetes.io"]`.
    Raises ValueError, naming the attribute, for a value the API server would have refused.
    """
    attributes: dict[str, dict[str, Any]] = {}
    for name, attribute in (device.get("attributes") or {}).items():
        domain, ident = _qualified(driver, name)
        attributes.setdefault(domain, {})[ident] = _attribute_value(driver, name, attribute)
    capacity: dict[str, dict[str, Any]] = {}
    for name, entry in (device.get("capacity") or {}).items():
        domain, ident = _qualified(driver, name)
        raw = entry.get("value") if isinstance(entry, Mapping) else None
        if raw is None:
            raise ValueError(f"device capacity {name!r} of driver {driver!r}: no value")
        try:
            amount = (
                parse_quantity(raw)
                if isinstance(raw, str)
                else quantity_value(Quantity.from_int(raw))
            )
        except (QuantityError, TypeError) as exc:
            raise ValueError(f"device capacity {name!r} of driver {driver!r}: {exc}") from None
        capacity.setdefault(domain, {})[ident] = amount
    value = {
        "driver": driver,
        "attributes": attributes,
        "capacity": capacity,
        "allowMultipleAllocations": bool(device.get("allowMultipleAllocations", False)),
    }
    return DeviceView(driver, value, str(device.get("name", "")))


def _sample_device(driver: str, kind: str) -> dict[str, Any]:
    memory = "10Gi" if kind == "mig" else "80Gi"
    attributes: dict[str, Any] = {
        names.ATTR_TYPE: {"string": kind},
        names.ATTR_UUID: {"string": "GPU-00000000-0000-0000-0000-000000000000"},
        names.ATTR_PRODUCT_NAME: {"string": "NVIDIA H100 80GB HBM3"},
        names.ATTR_BRAND: {"string": "Nvidia"},
        names.ATTR_ARCHITECTURE: {"string": "Hopper"},
        names.ATTR_CUDA_COMPUTE_CAPABILITY: {"version": "9.0.0"},
        names.ATTR_DRIVER_VERSION: {"version": "550.54.15"},
        names.ATTR_CUDA_DRIVER_VERSION: {"version": "12.4.0"},
        names.ATTR_PCIE_BUS_ID: {"string": "0000:3b:00.0"},
        names.ATTR_PCIE_ROOT: {"string": "pci0000:3a"},
        names.ATTR_NUMA_NODE: {"int": 0},
        names.ATTR_INDEX: {"int": 0},
    }
    if kind == "mig":
        attributes[names.ATTR_PROFILE] = {"string": "1g.10gb"}
        attributes[names.ATTR_PARENT_UUID] = {"string": "GPU-00000000-0000-0000-0000-000000000000"}
    capacity = {
        names.CAPACITY_MEMORY: {"value": memory},
        names.CAPACITY_CORES: {"value": str(names.CORES_PER_CARD)},
    }
    return {
        "name": f"sample-{kind}",
        "attributes": attributes,
        "capacity": capacity,
        "allowMultipleAllocations": kind == "gpu",
    }


@lru_cache(maxsize=1)
def sample_views() -> tuple[DeviceView, ...]:
    """Representative devices (a gateway GPU, an NVIDIA GPU, a MIG slice) for dry runs."""
    return tuple(
        device_view(driver, _sample_device(driver, kind))
        for driver, kind in (
            (names.DRIVER, "gpu"),
            (names.NVIDIA_GPU_CLASS, "gpu"),
            (names.NVIDIA_MIG_CLASS, "mig"),
        )
    )

