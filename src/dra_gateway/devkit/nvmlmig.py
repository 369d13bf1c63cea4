"""An NVML stand-in for MIG made on demand: the calls that create, find and destroy GPU and
compute instances, over cards of the models in `migcards`, as `pynvml` answers them.

`MigNvml(models).module()` is a `pynvml`-shaped namespace: handles are opaque tuples, errors are
`pynvml.NVMLError` carrying NVML's codes (NotFound 6, InsufficientResources 23, InvalidArgument
2), and a placement that overlaps an instance, or a second media-extension instance, is refused
as the driver refuses it. `fail` makes the next call of a name fail with a code, or run a hook
(a test's crash) before it acts; `instances` and `made_by_hand` let a test see and seed the
card. It also answers what discovery and the health watcher ask (names, memory, MIG mode on,
the instances' attributes; no XID events), so a whole node plugin runs on it: `state` keeps the
cards' instances in a file, as the hardware keeps them across a plugin's restarts, and
`python -m dra_gateway.devkit.standin_nvml` runs `dra-gateway` with it in place of `pynvml`.
Used by the test tiers; never by the product, which loads the real `pynvml`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml

from dra_gateway.devkit.migcards import CardModel, ProfileRow
from dra_gateway.gpu import mig
from dra_gateway.gpu.mig import MEDIA_EXTENSIONS
from dra_gateway.kube.files import atomic_write
from dra_gateway.node_plugin.miginstances import COMPUTE_PROFILE_OF_SLICES

NOT_SUPPORTED = 3
NOT_FOUND = 6
TIMEOUT = 10
INVALID_ARGUMENT = 2
INSUFFICIENT_RESOURCES = 23
INSUFFICIENT_SIZE = 7
MAX_GPU_INSTANCES = 16
MAX_COMPUTE_INSTANCES = 8
SLICES_OF_COMPUTE_PROFILE = {v: k for k, v in COMPUTE_PROFILE_OF_SLICES.items()}
SMS_PER_COMPUTE_SLICE = 16
DRIVER_VERSION = "580.95.05"
CUDA_DRIVER_VERSION = 13000


@dataclass(slots=True)
class GpuInstance:
    gi_id: int
    row: ProfileRow
    start: int
    compute: dict[int, int] = field(default_factory=dict)  # CI id -> compute slices

    def placement(self) -> mig.Placement:
        return mig.Placement(self.row.profile(), self.start)


@dataclass(slots=True)
class StandInCard:
    uuid: str
    model: CardModel
    instances: dict[int, GpuInstance] = field(default_factory=dict)

    def use(self) -> mig.CardUse:
        use = mig.CardUse()
        for gi in self.instances.values():
            use = use.with_placement(gi.placement())
        return use


class MigNvml:
    def __init__(self, models: Sequence[CardModel], *, profile_names: bool = True,
                 state: Path | None = None, uuid_prefix: str = "standin") -> None:
        self.cards = [StandInCard(f"GPU-{i:08x}-0000-4000-8000-{uuid_prefix[:7]:0>7}{i:05d}",
                                  model) for i, model in enumerate(models)]
        self.profile_names = profile_names  # False: profile infos without a name (version 1)
        self._fail: dict[str, int | Callable[[], None]] = {}
        self.calls: list[str] = []
        self.state = state
        self._stamp: tuple[int, int] | None = None  # the state file as last read or written
        self._reload()

    def _reload(self) -> None:
        """Read the state file again where someone else changed it (a test making an
        instance by hand, as an administrator would with nvidia-smi)."""
        if self.state is None or not self.state.exists():
            return
        stat = self.state.stat()
        if (stat.st_mtime_ns, stat.st_size) != self._stamp:
            self._load(self.state)
            self._stamp = (stat.st_mtime_ns, stat.st_size)

    def _load(self, state: Path) -> None:
        saved = json.loads(state.read_text())
        for card, instances in zip(self.cards, saved["cards"], strict=True):
            rows = {r.name: r for r in card.model.rows}
            card.instances = {
                int(gi["gi"]): GpuInstance(int(gi["gi"]), rows[gi["profile"]], int(gi["start"]),
                                           {int(k): int(v) for k, v in gi["compute"].items()})
                for gi in instances}

    def _save(self) -> None:
        if self.state is None:
            return
        saved = {"cards": [[{"gi": gi.gi_id, "profile": gi.row.name, "start": gi.start,
                             "compute": {str(k): v for k, v in gi.compute.items()}}
                            for gi in card.instances.values()] for card in self.cards]}
        atomic_write(self.state, (json.dumps(saved, indent=1) + "\n").encode())
        stat = self.state.stat()
        self._stamp = (stat.st_mtime_ns, stat.st_size)

    def fail(self, name: str, code_or_hook: int | Callable[[], None]) -> None:
        """The next call of `name` fails with the NVML code, or runs the hook first."""
        self._fail[name] = code_or_hook

    def made_by_hand(self, card: int, profile: str, start: int) -> int:
        """An instance an administrator made (GI and CI): its GI id."""
        module = self.module()
        dev = module.nvmlDeviceGetHandleByIndex(card)
        row = next(r for r in self.cards[card].model.rows if r.name == profile)
        gi = module.nvmlDeviceCreateGpuInstanceWithPlacement(
            dev, row.profile_id, pynvml.c_nvmlGpuInstancePlacement_t(start, row.size))
        info = module.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gi, COMPUTE_PROFILE_OF_SLICES[row.compute_slices], 0)
        module.nvmlGpuInstanceCreateComputeInstance(gi, info.id)
        return int(gi[2])

    def instances(self, card: int) -> list[tuple[str, int, list[int]]]:
        """(profile, start, compute instance ids) of each GPU instance on `card`."""
        return sorted((gi.row.name, gi.start, sorted(gi.compute))
                      for gi in self.cards[card].instances.values())

    def module(self) -> Any:
        """The namespace to pass as `lib`: one function per NVML call, as `pynvml` has."""
        nvml = self

        def call(name: str) -> None:
            nvml._reload()
            nvml.calls.append(name)
            failure = nvml._fail.pop(name, None)
            if callable(failure):
                failure()
            elif failure is not None:
                raise pynvml.NVMLError(failure)

        def card_of(handle: Any) -> StandInCard:
            if not (isinstance(handle, tuple) and handle[0] == "gpu"):
                raise pynvml.NVMLError(INVALID_ARGUMENT)
            return nvml.cards[handle[1]]

        def gi_of(handle: Any) -> GpuInstance:
            if not (isinstance(handle, tuple) and handle[0] == "gi"):
                raise pynvml.NVMLError(INVALID_ARGUMENT)
            found = nvml.cards[handle[1]].instances.get(handle[2])
            if found is None:
                raise pynvml.NVMLError(NOT_FOUND)
            return found

        def get_handle_by_index(index: int) -> Any:
            call("nvmlDeviceGetHandleByIndex")
            if not 0 <= index < len(nvml.cards):
                raise pynvml.NVMLError(INVALID_ARGUMENT)
            return ("gpu", index)

        def get_handle_by_uuid(uuid: bytes | str) -> Any:
            call("nvmlDeviceGetHandleByUUID")
            text = uuid.decode() if isinstance(uuid, bytes) else uuid
            for index, card in enumerate(nvml.cards):
                if card.uuid == text:
                    return ("gpu", index)
            raise pynvml.NVMLError(NOT_FOUND)

        def gi_profile_info(dev: Any, index: int, version: int = 2) -> Any:
            call("nvmlDeviceGetGpuInstanceProfileInfo")
            row = next((r for r in card_of(dev).model.rows if r.index == index), None)
            if row is None:
                raise pynvml.NVMLError(INVALID_ARGUMENT)
            media = MEDIA_EXTENSIONS in row.name
            return SimpleNamespace(
                id=row.profile_id, sliceCount=row.compute_slices, memorySizeMB=row.memory_mib,
                instanceCount=1 if media else len(row.starts),
                name=f"MIG {row.name}".encode() if nvml.profile_names else b"")

        def possible_placements(dev: Any, profile_id: int, placements: Any, count: Any) -> int:
            call("nvmlDeviceGetGpuInstancePossiblePlacements")
            row = next((r for r in card_of(dev).model.rows if r.profile_id == profile_id), None)
            if row is None:
                raise pynvml.NVMLError(INVALID_ARGUMENT)
            room = count._obj  # the c_uint passed by reference
            if placements is None:  # NULL: the count alone
                room.value = len(row.starts)
                return 0
            if room.value < len(row.starts):
                raise pynvml.NVMLError(INSUFFICIENT_SIZE)
            for i, start in enumerate(row.starts):
                placements[i].start, placements[i].size = start, row.size
            room.value = len(row.starts)
            return 0

        def memory_info(dev: Any) -> Any:
            call("nvmlDeviceGetMemoryInfo")
            if isinstance(dev, tuple) and dev[0] == "mig":
                return SimpleNamespace(total=mig_row(dev).memory_mib << 20)
            return SimpleNamespace(total=card_of(dev).model.memory_mib << 20)

        def mig_row(handle: Any) -> ProfileRow:
            found: GpuInstance | None = nvml.cards[handle[1]].instances.get(handle[2])
            if found is None or handle[3] not in found.compute:
                raise pynvml.NVMLError(NOT_FOUND)
            return found.row

        # -- what discovery and the health watcher ask besides ---------------------------

        def not_supported(*_: Any) -> Any:
            raise pynvml.NVMLError(NOT_SUPPORTED)

        def attributes(handle: Any) -> Any:
            call("nvmlDeviceGetAttributes")
            if not (isinstance(handle, tuple) and handle[0] == "mig"):
                raise pynvml.NVMLError(NOT_SUPPORTED)
            row = mig_row(handle)
            slices = nvml.cards[handle[1]].instances[handle[2]].compute[handle[3]]
            return SimpleNamespace(gpuInstanceSliceCount=row.compute_slices,
                                   computeInstanceSliceCount=slices,
                                   memorySizeMB=row.memory_mib,
                                   multiprocessorCount=slices * SMS_PER_COMPUTE_SLICE)

        def architecture(dev: Any) -> int:
            return 7 if "A100" in card_of(dev).model.name else 9  # Ampere, Hopper

        def compute_capability(dev: Any) -> tuple[int, int]:
            return (8, 0) if "A100" in card_of(dev).model.name else (9, 0)

        def event_set_wait(event_set: Any, timeout_ms: int) -> Any:
            time.sleep(timeout_ms / 1000)  # no XID ever comes
            raise pynvml.NVMLError(TIMEOUT)

        discovery = {
            "nvmlSystemGetDriverVersion": lambda: DRIVER_VERSION,
            "nvmlSystemGetCudaDriverVersion": lambda: CUDA_DRIVER_VERSION,
            "nvmlDeviceGetCount": lambda: len(nvml.cards),
            "nvmlDeviceGetName": lambda dev: card_of(dev).model.name,
            "nvmlDeviceGetMinorNumber": lambda dev: int(dev[1]),
            "nvmlDeviceGetBrand": lambda dev: 2,  # Tesla
            "nvmlDeviceGetArchitecture": architecture,
            "nvmlDeviceGetCudaComputeCapability": compute_capability,
            "nvmlDeviceGetPciInfo": not_supported,
            "nvmlDeviceGetMigMode": lambda dev: [1, 1] if card_of(dev) else [0, 0],
            "nvmlDeviceGetAttributes": attributes,
            "nvmlDeviceGetSupportedEventTypes": not_supported,
            "nvmlDeviceRegisterEvents": not_supported,
            "nvmlEventSetCreate": lambda: object(),
            "nvmlEventSetFree": lambda event_set: None,
            "nvmlEventSetWait": event_set_wait,
        }

        def create_gi(dev: Any, profile_id: int, placement: Any) -> Any:
            call("nvmlDeviceCreateGpuInstanceWithPlacement")
            card = card_of(dev)
            row = next((r for r in card.model.rows if r.profile_id == profile_id), None)
            if row is None or placement.start not in row.starts or placement.size != row.size:
                raise pynvml.NVMLError(INVALID_ARGUMENT)
            wanted = mig.Placement(row.profile(), placement.start)
            if not mig.fits(card.model.geometry(), card.use(), wanted):
                raise pynvml.NVMLError(INSUFFICIENT_RESOURCES)
            gi_id = next(i for i in range(1, MAX_GPU_INSTANCES) if i not in card.instances)
            card.instances[gi_id] = GpuInstance(gi_id, row, placement.start)
            nvml._save()
            return ("gi", dev[1], gi_id)

        def gi_info(gi: Any) -> Any:
            call("nvmlGpuInstanceGetInfo")
            found = gi_of(gi)
            return SimpleNamespace(id=found.gi_id, profileId=found.row.profile_id,
                                   placement=SimpleNamespace(start=found.start,
                                                             size=found.row.size))

        def gi_by_id(dev: Any, gi_id: int) -> Any:
            call("nvmlDeviceGetGpuInstanceById")
            card = card_of(dev)
            if gi_id not in card.instances:
                raise pynvml.NVMLError(NOT_FOUND)
            return ("gi", dev[1], gi_id)

        def ci_profile_info(gi: Any, profile: int, eng_profile: int, version: int = 2) -> Any:
            call("nvmlGpuInstanceGetComputeInstanceProfileInfo")
            found = gi_of(gi)
            slices = SLICES_OF_COMPUTE_PROFILE.get(profile)
            if slices is None or slices > found.row.compute_slices:
                raise pynvml.NVMLError(INVALID_ARGUMENT)
            return SimpleNamespace(id=profile, sliceCount=slices)

        def create_ci(gi: Any, profile_id: int) -> Any:
            call("nvmlGpuInstanceCreateComputeInstance")
            found = gi_of(gi)
            slices = SLICES_OF_COMPUTE_PROFILE[profile_id]
            if sum(found.compute.values()) + slices > found.row.compute_slices:
                raise pynvml.NVMLError(INSUFFICIENT_RESOURCES)
            ci_id = next(i for i in range(MAX_COMPUTE_INSTANCES) if i not in found.compute)
            found.compute[ci_id] = slices
            nvml._save()
            return ("ci", gi[1], gi[2], ci_id)

        def ci_of(ci: Any) -> tuple[GpuInstance, int]:
            found = gi_of(("gi", ci[1], ci[2]))
            if ci[3] not in found.compute:
                raise pynvml.NVMLError(NOT_FOUND)
            return found, ci[3]

        def ci_info(ci: Any) -> Any:
            call("nvmlComputeInstanceGetInfo")
            _, ci_id = ci_of(ci)
            return SimpleNamespace(id=ci_id)

        def ci_by_id(gi: Any, ci_id: int) -> Any:
            call("nvmlGpuInstanceGetComputeInstanceById")
            if ci_id not in gi_of(gi).compute:
                raise pynvml.NVMLError(NOT_FOUND)
            return ("ci", gi[1], gi[2], ci_id)

        def destroy_ci(ci: Any) -> None:
            call("nvmlComputeInstanceDestroy")
            found, ci_id = ci_of(ci)
            del found.compute[ci_id]
            nvml._save()

        def destroy_gi(gi: Any) -> None:
            call("nvmlGpuInstanceDestroy")
            found = gi_of(gi)
            if found.compute:
                raise pynvml.NVMLError(19)  # NVML_ERROR_IN_USE: compute instances remain
            del nvml.cards[gi[1]].instances[gi[2]]
            nvml._save()

        def mig_devices(dev: Any) -> list[tuple[int, int]]:
            card = card_of(dev)
            return sorted((gi.gi_id, ci_id) for gi in card.instances.values()
                          for ci_id in gi.compute)

        def max_mig_count(dev: Any) -> int:
            call("nvmlDeviceGetMaxMigDeviceCount")
            card_of(dev)
            return 7

        def mig_by_index(dev: Any, index: int) -> Any:
            call("nvmlDeviceGetMigDeviceHandleByIndex")
            present = mig_devices(dev)
            if index >= len(present):
                raise pynvml.NVMLError(NOT_FOUND)
            return ("mig", dev[1], *present[index])

        def gi_id_of(handle: Any) -> int:
            call("nvmlDeviceGetGpuInstanceId")
            if handle[0] != "mig":
                raise pynvml.NVMLError(INVALID_ARGUMENT)
            return int(handle[2])

        def ci_id_of(handle: Any) -> int:
            call("nvmlDeviceGetComputeInstanceId")
            if handle[0] != "mig":
                raise pynvml.NVMLError(INVALID_ARGUMENT)
            return int(handle[3])

        def uuid_of(handle: Any) -> str:
            call("nvmlDeviceGetUUID")
            if handle[0] == "gpu":
                return str(nvml.cards[handle[1]].uuid)
            parent = nvml.cards[handle[1]].uuid
            return f"MIG-{parent[4:12]}-{handle[2]:04x}-4{handle[3]:03x}-8000-{handle[1]:012x}"

        return SimpleNamespace(
            NVMLError=pynvml.NVMLError,
            nvmlInit=lambda: call("nvmlInit"),
            nvmlShutdown=lambda: call("nvmlShutdown"),
            nvmlDeviceGetGpuInstancePossiblePlacements=possible_placements,
            nvmlDeviceGetMemoryInfo=memory_info,
            c_nvmlGpuInstancePlacement_t=pynvml.c_nvmlGpuInstancePlacement_t,
            NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED=0,
            nvmlDeviceGetHandleByIndex=get_handle_by_index,
            nvmlDeviceGetHandleByUUID=get_handle_by_uuid,
            nvmlDeviceGetGpuInstanceProfileInfo=gi_profile_info,
            nvmlDeviceCreateGpuInstanceWithPlacement=create_gi,
            nvmlGpuInstanceGetInfo=gi_info,
            nvmlDeviceGetGpuInstanceById=gi_by_id,
            nvmlGpuInstanceGetComputeInstanceProfileInfo=ci_profile_info,
            nvmlGpuInstanceCreateComputeInstance=create_ci,
            nvmlComputeInstanceGetInfo=ci_info,
            nvmlGpuInstanceGetComputeInstanceById=ci_by_id,
            nvmlComputeInstanceDestroy=destroy_ci,
            nvmlGpuInstanceDestroy=destroy_gi,
            nvmlDeviceGetMaxMigDeviceCount=max_mig_count,
            nvmlDeviceGetMigDeviceHandleByIndex=mig_by_index,
            nvmlDeviceGetGpuInstanceId=gi_id_of,
            nvmlDeviceGetComputeInstanceId=ci_id_of,
            nvmlDeviceGetUUID=uuid_of,
            **discovery,
        )
