"""One entry point for both discovery sources: an inventory file or NVML.

Callers get `NodeFacts` or a `DiscoveryError` whose message is ready for the operator.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dra_gateway.node_plugin.facts import NodeFacts
from dra_gateway.node_plugin.inventory import InventoryError, load_inventory
from dra_gateway.node_plugin.nvml import NvmlError, discover_nvml


class DiscoveryError(Exception):
    def __init__(self, message: str, *, nvml: bool) -> None:
        super().__init__(message)
        self.nvml = nvml


def discover(*, inventory: Path | None = None, nvml: bool = False,
             nvml_lib: Any = None, mig_geometry: bool = False) -> NodeFacts:
    """Facts from exactly one source: `inventory` (a YAML file) or `nvml` (with
    `mig_geometry`, each card in MIG mode carries its geometry, for MIG on demand)."""
    if (inventory is None) == (not nvml):
        raise ValueError("choose exactly one discovery source: an inventory file or NVML")
    if inventory is not None:
        try:
            return load_inventory(inventory)
        except InventoryError as exc:
            raise DiscoveryError(str(exc), nvml=False) from None
    try:
        return discover_nvml(nvml_lib, mig_geometry=mig_geometry)
    except NvmlError as exc:
        raise DiscoveryError(str(exc), nvml=True) from None
