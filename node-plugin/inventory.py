"""The inventory file: GPUs of a simulated node (or of a node without NVML) as YAML.

It must not guess: unknown or invalid fields are refused, every message names the field path
(`gpus[2].memory: invalid quantity "80GB"`), and the result is the same `NodeFacts` NVML gives.

    driverVersion: "550.54.15"        # defaults for every card (optional)
    cudaDriverVersion: "12.4"
    sharing: exclusive                # exclusive | shared (optional)
    gpus:
      - index: 0
        uuid: GPU-4f6b...
        productName: NVIDIA H100 80GB HBM3
        architecture: Hopper
        memory: 80Gi
        cudaComputeCapability: "9.0"
        pciBusID: "0000:18:00.0"
        numaNode: 0
        migDevices:                   # optional: the card is in MIG mode
          - {profile: 1g.10gb, uuid: MIG-..., memory: 9856Mi, profileId: 19,
             placement: {start: 0, size: 1}}

Optional per card: `minor` (names the device `gpu-<minor>`, default the index), `brand`,
`pcieRoot`, `nvlinkIsland` (cards NVLink joins share one: by convention the lowest index among
them), `nvlinkClique` (the NVLink fabric's `<cluster UUID>.<clique id>` on NVL systems),
`driverVersion`, `cudaDriverVersion`, `sharing`; per MIG instance `profileId` with `placement`
(NVIDIA's device names) and `multiprocessors`.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dra_gateway.kube.quantity import Quantity, QuantityError, bytes_of
from dra_gateway.node_plugin.facts import GpuFacts, MigFacts, NodeFacts, Sharing
from dra_gateway.node_plugin.versions import semver

_UUID = re.compile(r"^(GPU|MIG)-[0-9A-Za-z-]+$")
_PCI_BUS_ID = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]$")
_MIG_PROFILE = re.compile(r"^[0-9]+(c\.[0-9]+)?g\.[0-9]+gb(\+[a-z0-9]+)*$")


class InventoryError(Exception):
    """The inventory cannot be used; `errors` lists `path: problem` for each fault."""

    def __init__(self, source: str, errors: Sequence[str]) -> None:
        self.source = source
        self.errors = list(errors)
        count = f"{len(self.errors)} error{'s' if len(self.errors) != 1 else ''}"
        super().__init__(f"{source}: {count}: " + "; ".join(self.errors))


_GIB = 1 << 30


def _memory(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"invalid quantity {value!r}: expected bytes or a quantity like 80Gi")
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"invalid quantity {value}: must be positive")
        if value < _GIB:
            # No GPU or MIG instance has less than 1Gi: a bare number this small is MiB (as
            # nvidia-smi counts), not bytes.
            raise ValueError(f"{value} has no unit and, read as bytes, is "
                             f"{Quantity.from_bytes(value)}: less than any GPU holds; write "
                             f"the unit, e.g. {value}Mi (nvidia-smi counts MiB)")
        return value
    if not isinstance(value, str):
        raise ValueError(f"invalid quantity {value!r}: expected bytes or a quantity like 80Gi")
    try:
        amount = bytes_of(value)
    except QuantityError as exc:
        raise ValueError(str(exc)) from None
    if amount <= 0:
        raise ValueError(f'invalid quantity "{value}": must be positive')
    return amount


def _version(value: Any) -> str | None:
    if value is None:
        return None
    text = str(value)
    semver(text)  # raises ValueError naming the text
    return text


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class Placement(_Model):
    start: int = Field(ge=0)
    size: int = Field(ge=1)


class MigEntry(_Model):
    profile: str
    uuid: str
    memory: int
    profile_id: int | None = Field(default=None, alias="profileId", ge=0)
    placement: Placement | None = None
    multiprocessors: int | None = Field(default=None, ge=1)

    _check_memory = field_validator("memory", mode="before")(_memory)

    @field_validator("uuid")
    @classmethod
    def _uuid(cls, value: str) -> str:
        if not value.startswith("MIG-") or not _UUID.match(value):
            raise ValueError(f'invalid MIG UUID "{value}": expected "MIG-" and hex digits')
        return value

    @field_validator("profile")
    @classmethod
    def _profile(cls, value: str) -> str:
        if not _MIG_PROFILE.match(value):
            raise ValueError(f'invalid MIG profile "{value}": expected a form like "1g.10gb"')
        return value


class GpuEntry(_Model):
    index: int = Field(ge=0)
    uuid: str
    product_name: str = Field(alias="productName", min_length=1, max_length=64)
    memory: int
    minor: int | None = Field(default=None, ge=0)
    brand: str | None = Field(default=None, max_length=64)
    architecture: str | None = Field(default=None, max_length=64)
    cuda_compute_capability: str | None = Field(default=None, alias="cudaComputeCapability")
    driver_version: str | None = Field(default=None, alias="driverVersion")
    cuda_driver_version: str | None = Field(default=None, alias="cudaDriverVersion")
    pci_bus_id: str | None = Field(default=None, alias="pciBusID")
    pcie_root: str | None = Field(default=None, alias="pcieRoot", max_length=64)
    numa_node: int | None = Field(default=None, alias="numaNode", ge=0)
    nvlink_island: int | None = Field(default=None, alias="nvlinkIsland", ge=0)
    nvlink_clique: str | None = Field(default=None, alias="nvlinkClique", min_length=1,
                                      max_length=64)
    sharing: Sharing | None = None
    mig_devices: tuple[MigEntry, ...] = Field(default=(), alias="migDevices")

    _check_memory = field_validator("memory", mode="before")(_memory)
    _check_versions = field_validator(
        "cuda_compute_capability", "driver_version", "cuda_driver_version", mode="before"
    )(_version)

    @field_validator("uuid")
    @classmethod
    def _uuid(cls, value: str) -> str:
        if not value.startswith("GPU-") or not _UUID.match(value):
            raise ValueError(f'invalid GPU UUID "{value}": expected "GPU-" and hex digits')
        return value

    @field_validator("pci_bus_id")
    @classmethod
    def _bus_id(cls, value: str | None) -> str | None:
        if value is not None and not _PCI_BUS_ID.match(value):
            raise ValueError(f'invalid PCI bus ID "{value}": expected a form like '
                             '"0000:18:00.0"')
        return value

    @model_validator(mode="after")
    def _mig_fits(self) -> GpuEntry:
        total = sum(m.memory for m in self.mig_devices)
        if total > self.memory:
            raise ValueError(f"migDevices: their memory ({total} bytes) exceeds the card's "
                             f"({self.memory} bytes)")
        placed = sorted((m.placement.start, m.placement.start + m.placement.size, i)
                        for i, m in enumerate(self.mig_devices) if m.placement is not None)
        for (start, end, i), (next_start, _, j) in itertools.pairwise(placed):
            if next_start < end:
                first, second = sorted((i, j))
                raise ValueError(
                    f"migDevices[{first}] and migDevices[{second}] overlap: their placements "
                    f"share slices of the card (one from {start} to {end - 1}, the other from "
                    f"{next_start}); MIG instances of one card never share a slice")
        return self


class InventoryFile(_Model):
    """An inventory file: the node's GPUs, for nodes without NVML (or tests)."""

    driver_version: str | None = Field(default=None, alias="driverVersion")
    cuda_driver_version: str | None = Field(default=None, alias="cudaDriverVersion")
    sharing: Sharing | None = None
    gpus: tuple[GpuEntry, ...]

    _check_versions = field_validator(
        "driver_version", "cuda_driver_version", mode="before"
    )(_version)

    def duplicates(self) -> list[str]:
        """Errors for identities that must be unique on a node (index, minor, UUID)."""
        errors: list[str] = []
        seen: dict[tuple[str, object], int] = {}
        for i, gpu in enumerate(self.gpus):
            keys: list[tuple[str, object, str]] = [("index", gpu.index, f"gpus[{i}].index"),
                                                   ("uuid", gpu.uuid, f"gpus[{i}].uuid")]
            if gpu.minor is not None:
                keys.append(("minor", gpu.minor, f"gpus[{i}].minor"))
            keys += [("uuid", m.uuid, f"gpus[{i}].migDevices[{j}].uuid")
                     for j, m in enumerate(gpu.mig_devices)]
            for kind, value, path in keys:
                if (kind, value) in seen:
                    errors.append(f"{path}: duplicate {kind} {value!r} (also gpus"
                                  f"[{seen[(kind, value)]}])")
                else:
                    seen[(kind, value)] = i
        return errors

    def to_facts(self) -> NodeFacts:
        gpus = []
        for entry in sorted(self.gpus, key=lambda g: g.index):
            migs = tuple(
                MigFacts(
                    uuid=m.uuid, profile=m.profile, memory=m.memory, profile_id=m.profile_id,
                    placement_start=m.placement.start if m.placement else None,
                    placement_size=m.placement.size if m.placement else None,
                    multiprocessors=m.multiprocessors,
                )
                for m in entry.mig_devices
            )
            gpus.append(GpuFacts(
                index=entry.index, uuid=entry.uuid, product_name=entry.product_name,
                memory=entry.memory, minor=entry.minor, brand=entry.brand,
                architecture=entry.architecture,
                cuda_compute_capability=entry.cuda_compute_capability,
                driver_version=entry.driver_version or self.driver_version,
                cuda_driver_version=entry.cuda_driver_version or self.cuda_driver_version,
                pci_bus_id=entry.pci_bus_id, pcie_root=entry.pcie_root,
                numa_node=entry.numa_node, nvlink_island=entry.nvlink_island,
                nvlink_clique=entry.nvlink_clique, mig_enabled=bool(migs), mig_devices=migs,
                sharing=entry.sharing or self.sharing,
            ))
        return NodeFacts(gpus=tuple(gpus))


def _path(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + _FIELD_NAMES.get(part, part)
    return out or "(top level)"


# pydantic reports Python names for fields given by alias only when validation by name
# happens; map them back so messages use the file's spelling.
_FIELD_NAMES = {
    "product_name": "productName", "cuda_compute_capability": "cudaComputeCapability",
    "driver_version": "driverVersion", "cuda_driver_version": "cudaDriverVersion",
    "pci_bus_id": "pciBusID", "pcie_root": "pcieRoot", "numa_node": "numaNode",
    "nvlink_island": "nvlinkIsland", "nvlink_clique": "nvlinkClique",
    "mig_devices": "migDevices", "profile_id": "profileId",
}


def _message(error: Any) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "missing":
        return "required field is missing"
    message = str(error["msg"])
    for prefix in ("Value error, ", "Assertion failed, "):
        if message.startswith(prefix):
            return message[len(prefix):]
    return message


def parse_inventory(data: Any, *, source: str = "inventory") -> NodeFacts:
    """Facts from an already-parsed inventory document; InventoryError lists every fault."""
    if not isinstance(data, dict):
        raise InventoryError(source, ["(top level): expected a mapping with a `gpus` list"])
    try:
        inventory = InventoryFile.model_validate(data)
    except ValidationError as exc:
        errors = []
        for err in exc.errors():
            loc = [p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
            errors.append(f"{_path(loc)}: {_message(err)}")
        raise InventoryError(source, errors) from None
    duplicates = inventory.duplicates()
    if duplicates:
        raise InventoryError(source, duplicates)
    return inventory.to_facts()


def load_inventory(path: Path) -> NodeFacts:
    """Facts from an inventory YAML file; InventoryError names the file and every fault."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InventoryError(str(path), [f"cannot read the file: {exc.strerror or exc}"]) from None
    except UnicodeDecodeError:
        raise InventoryError(str(path), ["not a text file (not UTF-8): give the YAML "
                                         "inventory"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise InventoryError(str(path), [f"{where}not valid YAML: "
                                         f"{getattr(exc, 'problem', None) or exc}"]) from None
    return parse_inventory(data, source=str(path))
