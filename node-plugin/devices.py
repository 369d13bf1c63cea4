"""Facts to DRA devices: the pure conversion from what discovery found to `spec.devices[]`.

Device names, attribute and capacity names follow ARCHITECTURE.md ("Contracts between components"),
which borrows NVIDIA's DRA driver names so selectors written for it keep working. Every limit of
the API is checked here (DNS-label names, 64-character strings, semver versions, at most 32
attributes and capacities per device), so a slice built from these devices is never refused by
the API server. No I/O and no cluster access: a restart with the same facts gives the same list.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from dra_gateway.gpu import mig
from dra_gateway.gpu.mig import Geometry, Placement
from dra_gateway.kube import names
from dra_gateway.kube.quantity import Quantity
from dra_gateway.node_plugin.facts import GpuFacts, MigFacts, NodeFacts, Sharing
from dra_gateway.node_plugin.miginstances import Wanted
from dra_gateway.node_plugin.versions import semver

MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_STRING = 64
DeviceKind = Literal["gpu", "mig"]

# What is published while the API server has not told whether it keeps consumable capacity:
# the fields, which a server without the DRAConsumableCapacity gate drops silently, whereas
# leaving them out where the gate is on makes every share take a whole card.
CONSUMABLE_CAPACITY_FALLBACK = True

# The placements of the MIG instances the plugin makes or made: (card UUID, first memory slice,
# memory slices), as its journal holds them (`MigInstances.placements`).
Made = frozenset[tuple[str, int, int]]

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DIGITS = re.compile(r"(\d+)")


@dataclass(frozen=True, slots=True)
class DeviceOptions:
    """How devices are published: settings of the plugin, not facts of the node."""

    # Sharing of cards whose facts do not say: "shared" lets several claims use one card.
    default_sharing: Sharing = "exclusive"
    # Whether the cluster keeps consumable-capacity fields (DRAConsumableCapacity gate); when
    # it does not, the API server would drop them silently, so they are not sent at all.
    consumable_capacity: bool = False
    # Granularity of memory shares: requests are rounded up to a multiple of this.
    memory_step: int = names.MEMORY_STEP
    # Whether the node has HAMi-core's library (the plugin checks --hami-library): published
    # as every full card's `hamiCore` attribute.
    hami_core: bool = True
    # Whether the cluster keeps `sharedCounters` and `consumesCounters`
    # (DRAPartitionableDevices): where it does not, MIG on demand says them in attributes only.
    partitionable_devices: bool = False


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """What prepare needs to know about a published device."""

    name: str
    kind: DeviceKind
    uuid: str
    card_uuid: str  # the physical card (the parent of a MIG instance)
    card_index: int
    memory: int
    shared: bool
    # A MIG instance's GPU-instance and compute-instance ids, as NVML discovered them (None for
    # a full card, or where the source does not know them): health scopes XIDs by them.
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    # MIG on demand: the instance prepare makes for it (its `uuid` is the made instance's).
    make: Wanted | None = None


def natural_key(name: str) -> tuple[Any, ...]:
    """`gpu-2` before `gpu-10`: digits compare as numbers, so order follows the hardware."""
    return tuple(int(p) if p.isdigit() else p for p in _DIGITS.split(name))


def gpu_device_name(gpu: GpuFacts) -> str:
    return _label(f"gpu-{gpu.device_number}")


def mig_device_name(gpu: GpuFacts, mig: MigFacts, ordinal: int) -> str:
    """NVIDIA's `gpu-<minor>-mig-<profileId>-<start>-<size>`, or by profile and position."""
    if mig.profile_id is not None and mig.placement_start is not None and (
            mig.placement_size is not None):
        return _label(f"gpu-{gpu.device_number}-mig-{mig.profile_id}-{mig.placement_start}-"
                      f"{mig.placement_size}")
    profile = re.sub(r"[^a-z0-9]+", "-", mig.profile.lower()).strip("-")
    return _label(f"gpu-{gpu.device_number}-mig-{profile}-{ordinal}")


def _label(name: str) -> str:
    if not _DNS_LABEL.match(name):
        raise ValueError(f'device name "{name}" is not a DNS label (lowercase letters, digits '
                         "and '-', at most 63 characters)")
    return name


def _string(value: str) -> dict[str, Any]:
    # The API refuses longer strings; a product name that long would still be recognisable.
    # The limit counts UTF-8 bytes (Go's len), so cut there, never inside a character.
    return {"string": value.encode()[:MAX_STRING].decode(errors="ignore")}


def _version(value: str, *, device: str, attribute: str) -> dict[str, Any]:
    try:
        version = semver(value)
    except ValueError as exc:
        raise ValueError(f"device {device}: attribute {attribute}: {exc}") from None
    if len(version) > MAX_STRING:
        # A version cannot be cut without changing it: refuse it here, not at the API server.
        raise ValueError(f'device {device}: attribute {attribute}: version "{version}" is '
                         f"longer than the API's {MAX_STRING} characters")
    return {"version": version}


def _common_attributes(gpu: GpuFacts, device: str) -> dict[str, dict[str, Any]]:
    attrs: dict[str, dict[str, Any]] = {
        names.ATTR_PRODUCT_NAME: _string(gpu.product_name),
        names.ATTR_INDEX: {"int": gpu.index},
    }
    if gpu.brand:
        attrs[names.ATTR_BRAND] = _string(gpu.brand)
    if gpu.architecture:
        attrs[names.ATTR_ARCHITECTURE] = _string(gpu.architecture)
    for attribute, value in ((names.ATTR_CUDA_COMPUTE_CAPABILITY, gpu.cuda_compute_capability),
                             (names.ATTR_DRIVER_VERSION, gpu.driver_version),
                             (names.ATTR_CUDA_DRIVER_VERSION, gpu.cuda_driver_version)):
        if value:
            attrs[attribute] = _version(value, device=device, attribute=attribute)
    if gpu.pci_bus_id:
        attrs[names.ATTR_PCIE_BUS_ID] = _string(gpu.pci_bus_id)
    if gpu.pcie_root:
        attrs[names.ATTR_PCIE_ROOT] = _string(gpu.pcie_root)
    if gpu.numa_node is not None:
        # The standard name (KEP-6072, 1.37) and the driver's own, kept for older consumers.
        attrs[names.ATTR_NUMA_NODE_STANDARD] = {"int": gpu.numa_node}
        attrs[names.ATTR_NUMA_NODE] = {"int": gpu.numa_node}
    return attrs


def _nvlink_attributes(gpu: GpuFacts) -> dict[str, dict[str, Any]]:
    """A whole card's NVLink island and fabric clique (MIG instances use no NVLink peers)."""
    attrs: dict[str, dict[str, Any]] = {}
    if gpu.nvlink_island is not None:
        attrs[names.ATTR_NVLINK_ISLAND] = {"int": gpu.nvlink_island}
    if gpu.nvlink_clique:
        attrs[names.ATTR_NVLINK_CLIQUE] = _string(gpu.nvlink_clique)
    return attrs


def _quantity(n: int) -> str:
    return str(Quantity.from_bytes(n))


def _shared_capacity(memory: int, options: DeviceOptions) -> dict[str, Any]:
    """Capacities of a card several claims may share, with request policies.

    A request that names no amount takes the whole card (ARCHITECTURE.md: a whole-GPU request
    consumes the full capacity), so each default is the full amount. The API requires the
    default to lie on the range's steps (min + n*step); a card whose memory is not a whole
    number of steps gets a range without a step rather than an invalid policy.
    """
    step = options.memory_step
    memory_range: dict[str, str] = {"min": _quantity(step)}
    if memory % step == 0:
        memory_range["step"] = _quantity(step)
    return {
        names.CAPACITY_MEMORY: {
            "value": _quantity(memory),
            "requestPolicy": {"default": _quantity(memory), "validRange": memory_range},
        },
        names.CAPACITY_CORES: {
            "value": str(names.CORES_PER_CARD),
            "requestPolicy": {"default": str(names.CORES_PER_CARD),
                              "validRange": {"min": "1", "step": "1"}},
        },
    }


def _check_limits(device: Mapping[str, Any]) -> None:
    count = len(device.get("attributes", {})) + len(device.get("capacity", {}))
    if count > MAX_ATTRIBUTES_AND_CAPACITIES:
        raise ValueError(f"device {device['name']}: {count} attributes and capacities, the API "
                         f"allows {MAX_ATTRIBUTES_AND_CAPACITIES}")


def is_shared(gpu: GpuFacts, options: DeviceOptions) -> bool:
    return not gpu.mig_enabled and (gpu.sharing or options.default_sharing) == "shared"


def gpu_device(gpu: GpuFacts, options: DeviceOptions) -> dict[str, Any]:
    name = gpu_device_name(gpu)
    attrs = {names.ATTR_TYPE: {"string": "gpu"}, names.ATTR_UUID: _string(gpu.uuid),
             **_common_attributes(gpu, name), **_nvlink_attributes(gpu),
             names.ATTR_HAMI_CORE: {"bool": options.hami_core}}
    device: dict[str, Any] = {"name": name, "attributes": attrs}
    if is_shared(gpu, options) and options.consumable_capacity:
        device["allowMultipleAllocations"] = True
        device["capacity"] = _shared_capacity(gpu.memory, options)
    else:
        device["capacity"] = {
            names.CAPACITY_MEMORY: {"value": _quantity(gpu.memory)},
            names.CAPACITY_CORES: {"value": str(names.CORES_PER_CARD)},
        }
    _check_limits(device)
    return device


def mig_device(gpu: GpuFacts, mig: MigFacts, ordinal: int) -> dict[str, Any]:
    name = mig_device_name(gpu, mig, ordinal)
    attrs = {names.ATTR_TYPE: {"string": "mig"}, names.ATTR_UUID: _string(mig.uuid),
             names.ATTR_PARENT_UUID: _string(gpu.uuid), names.ATTR_PROFILE: _string(mig.profile),
             **_common_attributes(gpu, name)}
    device: dict[str, Any] = {
        "name": name, "attributes": attrs,
        "capacity": {names.CAPACITY_MEMORY: {"value": _quantity(mig.memory)}},
    }
    _check_limits(device)
    return device


# --- MIG on demand -----------------------------------------------------------------------------


def _hand_made(gpu: GpuFacts, geometry: Geometry, made: Made
               ) -> list[tuple[MigFacts, Placement | None]]:
    """The card's instances the plugin did not make (`made`: the placements it makes or made,
    whatever the stage), with the placement each holds where NVML told it (one that matches no
    profile of the geometry holds none known)."""
    out: list[tuple[MigFacts, Placement | None]] = []
    for instance in gpu.mig_devices:
        if (gpu.uuid, instance.placement_start, instance.placement_size) in made:
            continue
        spot = None
        for profile in geometry.profiles:
            if profile.profile_id == instance.profile_id and (
                    instance.placement_start in profile.starts):
                spot = Placement(profile, instance.placement_start)
        out.append((instance, spot))
    return out


def mig_counter_set(gpu: GpuFacts, geometry: Geometry,
                    made: Made = frozenset()) -> dict[str, Any]:
    """The card's counter set: every memory slice, its compute slices and media-extension
    instances, less what instances made by hand hold (they are allocated to nobody, so
    nothing else would count them)."""
    minor = gpu.device_number
    counter_set = mig.shared_counters(geometry, minor)
    counters: dict[str, dict[str, str]] = counter_set["counters"]
    for _, spot in _hand_made(gpu, geometry, made):
        if spot is None:
            continue  # not cut on demand (`cut_on_demand`): no set is published
        for name, entry in mig.consumed_counters(minor, spot, geometry)["counters"].items():
            left = int(counters[name]["value"]) - int(entry["value"])
            counters[name]["value"] = str(max(0, left))
    return counter_set


def mig_card_device(gpu: GpuFacts, geometry: Geometry, options: DeviceOptions) -> dict[str, Any]:
    """The whole card of a card cut on demand: held alone, it draws every counter, so a claim
    for it blocks every instance and any instance blocks it."""
    device = gpu_device(gpu, options)  # never shared: the card is in MIG mode (`is_shared`)
    device["attributes"].update({
        names.ATTR_COUNTER_SET: {"string": mig.counter_set_name(gpu.device_number)},
        names.ATTR_MIG_MEMORY_SLICES: {"int": geometry.memory_slices},
        names.ATTR_MIG_COMPUTE_SLICES: {"int": geometry.compute_slices},
        names.ATTR_MIG_MEDIA_EXTENSIONS: {"int": geometry.media_extension_instances},
    })
    if options.partitionable_devices:
        device["consumesCounters"] = [mig.consumed_counters(gpu.device_number, None, geometry)]
    _check_limits(device)
    return device


def mig_placement_device(gpu: GpuFacts, geometry: Geometry, placement: Placement,
                         options: DeviceOptions) -> dict[str, Any]:
    """One profile at one placement: an instance made at prepare (so no `uuid` yet), named as
    NVIDIA's DRA driver names it."""
    minor = gpu.device_number
    name = _label(mig.device_name(minor, placement))
    profile = placement.profile
    attrs = {names.ATTR_TYPE: {"string": "mig"}, names.ATTR_PARENT_UUID: _string(gpu.uuid),
             names.ATTR_PROFILE: _string(profile.name), **_common_attributes(gpu, name),
             names.ATTR_COUNTER_SET: {"string": mig.counter_set_name(minor)},
             names.ATTR_MIG_START: {"int": placement.start},
             names.ATTR_MIG_MEMORY_SLICES: {"int": profile.size},
             names.ATTR_MIG_COMPUTE_SLICES: {"int": profile.compute_slices}}
    # Its compute as the card's share (`cores`): what quotas charge an instance of it.
    cores = mig.compute_percent(geometry, profile.compute_slices)
    device: dict[str, Any] = {
        "name": name, "attributes": attrs,
        "capacity": {names.CAPACITY_MEMORY: {"value": _quantity(profile.memory_mib << 20)},
                     names.CAPACITY_CORES: {"value": str(cores)}},
    }
    if options.partitionable_devices:
        device["consumesCounters"] = [mig.consumed_counters(minor, placement, geometry)]
    _check_limits(device)
    return device


def cut_on_demand(gpu: GpuFacts, made: Made = frozenset()) -> bool:
    """Whether the card is published for MIG on demand: opted in, in MIG mode, and every
    instance made by hand at a placement NVML told (else its instances are published as they
    are, and nothing is made there)."""
    return gpu.mig_enabled and gpu.mig_geometry is not None and all(
        spot is not None for _, spot in _hand_made(gpu, gpu.mig_geometry, made))


def mig_on_demand_devices(gpu: GpuFacts, geometry: Geometry, options: DeviceOptions,
                          made: Made = frozenset()) -> list[dict[str, Any]]:
    """A card cut on demand: the whole card, every profile at every legal placement, and the
    instances made by hand as they are (`mig_device`, drawing no counter: the set leaves
    their slices out; their attributes say where they sit, for the world without the
    fields)."""
    out = [mig_card_device(gpu, geometry, options)]
    out += [mig_placement_device(gpu, geometry, p, options) for p in mig.placements_of(geometry)]
    for i, (instance, spot) in enumerate(_hand_made(gpu, geometry, made)):
        device = mig_device(gpu, instance, i)
        if spot is not None:
            device["attributes"].update({
                names.ATTR_COUNTER_SET: {"string": mig.counter_set_name(gpu.device_number)},
                names.ATTR_MIG_START: {"int": spot.start},
                names.ATTR_MIG_MEMORY_SLICES: {"int": spot.profile.size},
                names.ATTR_MIG_COMPUTE_SLICES: {"int": spot.profile.compute_slices}})
            device["capacity"][names.CAPACITY_CORES] = {
                "value": str(mig.compute_percent(geometry, spot.profile.compute_slices))}
            _check_limits(device)
        out.append(device)
    return out


def devices_of(facts: NodeFacts, options: DeviceOptions, *,
               taints: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
               withheld: frozenset[str] = frozenset(),
               made: Made = frozenset()) -> list[dict[str, Any]]:
    """The node's devices in natural name order. A card in MIG mode gives only its instances;
    one cut on demand gives its whole card and every placement besides (`made`: the
    placements of the instances the plugin makes, published as those placements).

    `taints` maps device names to device taints to attach; `withheld` names devices to leave
    out (unhealthy ones, where the cluster cannot keep taints).
    """
    out: list[dict[str, Any]] = []
    for gpu in facts.gpus:
        if gpu.mig_geometry is not None and cut_on_demand(gpu, made):
            out += mig_on_demand_devices(gpu, gpu.mig_geometry, options, made)
        elif gpu.mig_enabled:
            out += [mig_device(gpu, instance, i) for i, instance in enumerate(gpu.mig_devices)]
        else:
            out.append(gpu_device(gpu, options))
    seen: set[str] = set()
    for device in out:
        if device["name"] in seen:
            raise ValueError(f"device name {device['name']} is used twice on this node: give "
                             "each card a distinct index (or minor number)")
        seen.add(device["name"])
    out = [d for d in out if d["name"] not in withheld]
    for device in out:
        if taints and device["name"] in taints:
            device["taints"] = [dict(t) for t in taints[device["name"]]]
    return sorted(out, key=lambda d: natural_key(d["name"]))


def counter_sets_of(facts: NodeFacts, made: Made = frozenset()
                    ) -> list[dict[str, Any]]:
    """The counter sets of the node's cards cut on demand, in card order (`mig_counter_set`)."""
    return [mig_counter_set(gpu, gpu.mig_geometry, made) for gpu in facts.gpus
            if gpu.mig_geometry is not None and cut_on_demand(gpu, made)]


def hand_made_overlap(facts: NodeFacts, wanted: Wanted, made: Made = frozenset()
                      ) -> MigFacts | None:
    """An instance the plugin did not make on the card of `wanted` whose memory slices overlap
    it (one made by hand after the plugin's discovery blocks that placement); None."""
    for gpu in facts.gpus:
        if gpu.uuid != wanted.card_uuid:
            continue
        for instance in gpu.mig_devices:
            start, size = instance.placement_start, instance.placement_size
            if start is None or size is None or (gpu.uuid, start, size) in made:
                continue
            if start < wanted.start + wanted.size and wanted.start < start + size:
                return instance
    return None


def _wanted(gpu: GpuFacts, placement: Placement) -> Wanted:
    profile = placement.profile
    return Wanted(card_uuid=gpu.uuid, profile=profile.nvml_index, start=placement.start,
                  size=profile.size, name=profile.name)


def _on_demand_table(gpu: GpuFacts, geometry: Geometry,
                     made: Made) -> dict[str, DeviceInfo]:
    """A cut card's devices: the whole card is served by its largest profile made at slice 0
    (in MIG mode nothing runs on a card without an instance), each placement by its own."""
    minor = gpu.device_number
    whole = Placement(geometry.ranked()[0], 0)
    table = {gpu_device_name(gpu): DeviceInfo(
        name=gpu_device_name(gpu), kind="mig", uuid="", card_uuid=gpu.uuid,
        card_index=gpu.index, memory=gpu.memory, shared=False, make=_wanted(gpu, whole))}
    for placement in mig.placements_of(geometry):
        name = mig.device_name(minor, placement)
        table[name] = DeviceInfo(name=name, kind="mig", uuid="", card_uuid=gpu.uuid,
                                 card_index=gpu.index,
                                 memory=placement.profile.memory_mib << 20, shared=False,
                                 make=_wanted(gpu, placement))
    for i, (instance, _) in enumerate(_hand_made(gpu, geometry, made)):
        name = mig_device_name(gpu, instance, i)
        table[name] = DeviceInfo(name=name, kind="mig", uuid=instance.uuid, card_uuid=gpu.uuid,
                                 card_index=gpu.index, memory=instance.memory, shared=False,
                                 gpu_instance_id=instance.gpu_instance_id,
                                 compute_instance_id=instance.compute_instance_id)
    return table


def device_table(facts: NodeFacts, options: DeviceOptions,
                 made: Made = frozenset()) -> dict[str, DeviceInfo]:
    """Published device name to what prepare needs (UUIDs, memory, sharing; for a card cut on
    demand, the instance to make)."""
    table: dict[str, DeviceInfo] = {}
    for gpu in facts.gpus:
        if gpu.mig_geometry is not None and cut_on_demand(gpu, made):
            table.update(_on_demand_table(gpu, gpu.mig_geometry, made))
        elif gpu.mig_enabled:
            for i, mig in enumerate(gpu.mig_devices):
                name = mig_device_name(gpu, mig, i)
                table[name] = DeviceInfo(name=name, kind="mig", uuid=mig.uuid,
                                         card_uuid=gpu.uuid, card_index=gpu.index,
                                         memory=mig.memory, shared=False,
                                         gpu_instance_id=mig.gpu_instance_id,
                                         compute_instance_id=mig.compute_instance_id)
        else:
            name = gpu_device_name(gpu)
            table[name] = DeviceInfo(name=name, kind="gpu", uuid=gpu.uuid, card_uuid=gpu.uuid,
                                     card_index=gpu.index, memory=gpu.memory,
                                     shared=is_shared(gpu, options))
    return table
