"""What discovery learns about a node's GPUs, as frozen data.

Both discovery sources (NVML and an inventory file) produce these facts, and everything
downstream (devices, slices, CDI) is computed from them, so a simulated node and a real one
take the same path. This module holds data only: no I/O, no Kubernetes shapes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from dra_gateway.gpu.mig import Geometry

Sharing = Literal["exclusive", "shared"]


@dataclass(frozen=True, slots=True)
class MigFacts:
    """One MIG instance of a card in MIG mode."""

    uuid: str
    profile: str  # e.g. "1g.10gb"
    memory: int  # bytes
    # GPU-instance profile id and placement identify the slot; NVML knows them, an inventory
    # may not, in which case the instance is named by its position on the card.
    profile_id: int | None = None
    placement_start: int | None = None
    placement_size: int | None = None
    multiprocessors: int | None = None
    # NVML's GPU-instance and compute-instance ids (nvmlDeviceGetGpuInstanceId and
    # nvmlDeviceGetComputeInstanceId on the MIG handle): an XID event names the instance it
    # hit by them. None where the source does not know them (an inventory file).
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass(frozen=True, slots=True)
class GpuFacts:
    """One physical card. A card with `mig_enabled` is published as its MIG instances only."""

    index: int
    uuid: str
    product_name: str
    memory: int  # bytes
    minor: int | None = None
    brand: str | None = None
    architecture: str | None = None
    cuda_compute_capability: str | None = None  # as reported, e.g. "9.0"
    driver_version: str | None = None  # as reported, e.g. "535.104.05"
    cuda_driver_version: str | None = None  # e.g. "12.4"
    pci_bus_id: str | None = None
    pcie_root: str | None = None
    numa_node: int | None = None
    nvlink_island: int | None = None  # the lowest index of the cards NVLink joins it to
    nvlink_clique: str | None = None  # the NVLink fabric's "<cluster UUID>.<clique id>"
    mig_enabled: bool = False
    mig_devices: tuple[MigFacts, ...] = ()
    sharing: Sharing | None = None  # None: the plugin's default applies
    # MIG on demand (an administrator's opt-in, on a card in MIG mode): the card's geometry as
    # NVML reads it; its instances are made at prepare, and those in `mig_devices` that the
    # plugin did not make are an administrator's, published as they are.
    mig_geometry: Geometry | None = None

    @property
    def device_number(self) -> int:
        """The number in the device name: the minor number when known, else the index."""
        return self.minor if self.minor is not None else self.index


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """Everything discovered on one node, cards ordered by index."""

    gpus: tuple[GpuFacts, ...] = field(default_factory=tuple)
