"""GPU discovery and XID health events through NVML (`pynvml` from nvidia-ml-py).

Init and shutdown are explicit (`with Nvml() as nvml:`), and every NVML failure surfaces as an
`NvmlError` whose message says which call failed, what NVML said and what usually fixes it, so
the operator never reads a ctypes trace. Optional facts that a card does not support (NUMA node,
MIG mode on consumer cards) are left unset rather than failing discovery. This module talks to
NVML only: it builds `NodeFacts`, never Kubernetes objects.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import combinations
from pathlib import Path
from types import ModuleType, SimpleNamespace, TracebackType
from typing import Any, TypeVar
from uuid import UUID

from dra_gateway.gpu.mig import MEDIA_EXTENSIONS, Geometry, Profile
from dra_gateway.node_plugin.facts import GpuFacts, MigFacts, NodeFacts
from dra_gateway.node_plugin.faults import APPLICATION_XIDS
from dra_gateway.node_plugin.versions import cuda_version_from_int

log = logging.getLogger(__name__)

T = TypeVar("T")

# NVML return codes (nvml.h); the values are stable across driver releases.
_NOT_SUPPORTED = 3
_NO_PERMISSION = 4
_NOT_FOUND = 6
_DRIVER_NOT_LOADED = 9
_TIMEOUT = 10
_LIBRARY_NOT_FOUND = 12
_FUNCTION_NOT_FOUND = 13
_GPU_IS_LOST = 15
_RESET_REQUIRED = 16
_LIB_RM_VERSION_MISMATCH = 18
# nvmlDeviceGetP2PStatus: NVML_P2P_CAPS_INDEX_NVLINK and NVML_P2P_STATUS_OK.
_P2P_CAPS_INDEX_NVLINK = 2
_P2P_STATUS_OK = 0
_FABRIC_COMPLETED = 3  # NVML_GPU_FABRIC_STATE_COMPLETED

_HINTS: dict[int, str] = {
    _LIBRARY_NOT_FOUND: "libnvidia-ml.so.1 was not found: install the NVIDIA driver on the node "
                        "and make the library visible to the plugin (NVIDIA container runtime "
                        "or a hostPath mount), or use --inventory",
    _DRIVER_NOT_LOADED: "the NVIDIA kernel driver is not loaded on this node",
    _NO_PERMISSION: "the plugin may not open /dev/nvidia*: run it privileged or grant the "
                    "device nodes",
    _GPU_IS_LOST: "the GPU fell off the bus: drain the node and reset or replace the card",
    _RESET_REQUIRED: "the GPU needs a reset (nvidia-smi -r) before it can be used",
    _LIB_RM_VERSION_MISMATCH: "the NVML library and the kernel driver differ in version: "
                              "reboot the node after the driver upgrade",
    _FUNCTION_NOT_FOUND: "this driver's NVML lacks the call: upgrade the NVIDIA driver",
}

_ARCHITECTURES = {2: "Kepler", 3: "Maxwell", 4: "Pascal", 5: "Volta", 6: "Turing",
                  7: "Ampere", 8: "Ada Lovelace", 9: "Hopper", 10: "Blackwell", 13: "Rubin"}
_BRANDS = {1: "Quadro", 2: "Tesla", 3: "NVS", 4: "GRID", 5: "GeForce", 6: "Titan",
           7: "NvidiaVApps", 8: "NvidiaVPC", 9: "NvidiaVCS", 10: "NvidiaVWS",
           11: "NvidiaCloudGaming", 12: "QuadroRTX", 13: "NvidiaRTX", 14: "Nvidia",
           15: "GeForceRTX", 16: "TitanRTX"}

# XIDs caused by applications rather than the card (NVIDIA's device plugin skips the same
# ones): they must not take a healthy GPU out of service.
_XID_CRITICAL_EVENT = 0x8
# NVML_GPU_INSTANCE_PROFILE_COUNT, and the profile indexes whose names carry an attribute
# (nvml.h: *_REV1 have media extensions, *_ALL_ME all of them, *_NO_ME none, *_GFX graphics).
_GI_PROFILE_COUNT = 0x12
_GI_PROFILE_SUFFIXES = {0x7: "+me", 0x8: "+me", 0xF: "+me.all", 0x10: "+me.all",
                        0xD: "-me", 0xE: "-me", 0xA: "+gfx", 0xB: "+gfx", 0xC: "+gfx",
                        0x11: "+gfx"}
_MIG_ENABLED = 1


class NvmlError(Exception):
    """An NVML call failed; `code` is NVML's return code (None when NVML is not importable)."""

    def __init__(self, message: str, *, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code

    @property
    def gpu_lost(self) -> bool:
        return self.code in (_GPU_IS_LOST, _RESET_REQUIRED)


def load_pynvml() -> ModuleType:
    """The pynvml module; NvmlError with the fix when nvidia-ml-py is missing."""
    try:
        import pynvml
    except ImportError:
        raise NvmlError("the pynvml module is missing: install the nvidia-ml-py package "
                        "(not the deprecated pynvml package)") from None
    module: ModuleType = pynvml
    return module


@dataclass(frozen=True, slots=True)
class XidEvent:
    """A critical XID reported by NVML for one card (or one MIG instance on it)."""

    uuid: str
    xid: int
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None

    @property
    def is_application_error(self) -> bool:
        return self.xid in APPLICATION_XIDS


class Nvml:
    """One NVML session. Use as a context manager; `discover()` and `events()` inside it."""

    def __init__(self, lib: Any = None, *, sysfs: Path = Path("/sys")) -> None:
        self._lib = lib
        self._sysfs = sysfs
        self._open = False

    def __enter__(self) -> Nvml:
        if self._lib is None:
            self._lib = load_pynvml()
        self._call("nvmlInit", self._lib.nvmlInit)
        self._open = True
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        if self._open:
            self._open = False
            try:
                self._lib.nvmlShutdown()
            except self._lib.NVMLError as err:  # shutdown failing must not hide the real error
                log.warning("nvmlShutdown failed: %s", err)

    # -- error mapping -------------------------------------------------------------------

    def _call(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(*args)
        except self._lib.NVMLError as err:
            raise self._error(what, err) from None

    def _optional(self, what: str, fn: Callable[..., T], *args: Any) -> T | None:
        """A call a card may not support: NotSupported and missing functions give None."""
        try:
            return fn(*args)
        except self._lib.NVMLError as err:
            code = getattr(err, "value", None)
            if code in (_NOT_SUPPORTED, _FUNCTION_NOT_FOUND, _NOT_FOUND):
                return None
            raise self._error(what, err) from None

    def _error(self, what: str, err: BaseException) -> NvmlError:
        code = getattr(err, "value", None)
        hint = _HINTS.get(code) if isinstance(code, int) else None
        message = f"NVML {what} failed: {err}" + (f" ({hint})" if hint else "")
        return NvmlError(message, code=code if isinstance(code, int) else None)

    # -- discovery -------------------------------------------------------------------------

    def discover(self, *, mig_geometry: bool = False) -> NodeFacts:
        """Every card with its MIG instances, ordered by index; with `mig_geometry`, each card
        in MIG mode also carries its geometry (for MIG on demand: `mig_geometry()`)."""
        lib = self._lib
        driver = _text(self._call("nvmlSystemGetDriverVersion", lib.nvmlSystemGetDriverVersion))
        cuda_int = self._optional("nvmlSystemGetCudaDriverVersion",
                                  lib.nvmlSystemGetCudaDriverVersion)
        cuda = cuda_version_from_int(int(cuda_int)) if cuda_int else None
        count = int(self._call("nvmlDeviceGetCount", lib.nvmlDeviceGetCount))
        gpus: list[GpuFacts] = []
        for i in range(count):
            try:
                gpus.append(self._gpu(i, driver, cuda))
            except NvmlError as err:
                # One card off the bus must not keep the node's healthy cards unpublished.
                if not err.gpu_lost:
                    raise
                log.error("GPU %d is left out: %s", i, err)
        if mig_geometry:
            gpus = [self._with_geometry(g) if g.mig_enabled else g for g in gpus]
        return NodeFacts(gpus=tuple(sorted(self._with_nvlink(gpus), key=lambda g: g.index)))

    def _with_geometry(self, gpu: GpuFacts) -> GpuFacts:
        """The card with its MIG geometry; as it is (its instances published as they are, none
        made) where NVML cannot tell it."""
        try:
            geometry = self.mig_geometry(gpu.index)
        except NvmlError as err:
            if err.gpu_lost:
                raise
            log.error("GPU %d: MIG geometry unknown, no instance is made on it on demand "
                      "(its instances are published as they are): %s", gpu.index, err)
            return gpu
        if geometry is None:
            log.warning("GPU %d is in MIG mode but NVML lists no GPU instance profile for it: "
                        "no instance is made on it on demand", gpu.index)
        return replace(gpu, mig_geometry=geometry)

    def _with_nvlink(self, gpus: list[GpuFacts]) -> list[GpuFacts]:
        """Each card's NVLink island and fabric clique.

        An island is the cards NVLink joins, directly or through NVSwitches (NVML's NVLink P2P
        status between two cards), named by the lowest index among them, so that nodes built
        alike publish alike; a card NVLink joins to no other has none. The clique is the NVLink
        fabric's (cluster UUID and clique id, `nvmlDeviceGetGpuFabricInfoV`) on NVL systems
        whose fabric manager has registered the card; elsewhere none. Either fact failing to
        read leaves it out, never the card.
        """
        lib = self._lib
        handles = {g.index: self._call(f"nvmlDeviceGetHandleByIndex({g.index})",
                                       lib.nvmlDeviceGetHandleByIndex, g.index) for g in gpus}
        parent = {i: i for i in handles}

        def root(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        p2p = getattr(lib, "nvmlDeviceGetP2PStatus", None)
        if p2p is not None:
            for a, b in combinations(sorted(handles), 2):
                try:
                    status = self._optional(f"nvmlDeviceGetP2PStatus (GPU {a}, GPU {b}, NVLink)",
                                            p2p, handles[a], handles[b], _P2P_CAPS_INDEX_NVLINK)
                except NvmlError as err:
                    log.warning("NVLink between GPU %d and GPU %d left unknown: %s", a, b, err)
                    continue
                if status == _P2P_STATUS_OK:
                    parent[root(b)] = root(a)
        members: dict[int, list[int]] = {}
        for i in handles:
            members.setdefault(root(i), []).append(i)
        island = {i: min(group) for group in members.values() if len(group) > 1 for i in group}
        return [replace(g, nvlink_island=island.get(g.index),
                        nvlink_clique=self._fabric_clique(handles[g.index], g.index))
                for g in gpus]

    def _fabric_clique(self, handle: Any, index: int) -> str | None:
        lib = self._lib
        get = getattr(lib, "nvmlDeviceGetGpuFabricInfoV", None)
        struct = getattr(lib, "c_nvmlGpuFabricInfo_v2_t", None)
        if get is None or struct is None:
            return None
        info = struct()
        try:
            if self._optional(f"nvmlDeviceGetGpuFabricInfoV (GPU {index})", get, handle,
                              ctypes.byref(info)) is None:
                return None
        except NvmlError as err:
            log.warning("GPU %d: NVLink fabric left unknown: %s", index, err)
            return None
        cluster = bytes(info.clusterUuid)
        if int(info.state) != _FABRIC_COMPLETED or int(info.status) != 0 or not any(cluster):
            return None
        return f"{UUID(bytes=cluster)}.{int(info.cliqueId)}"

    def _gpu(self, index: int, driver: str, cuda: str | None) -> GpuFacts:
        lib = self._lib
        where = f"GPU {index}"
        handle = self._call(f"nvmlDeviceGetHandleByIndex({index})",
                            lib.nvmlDeviceGetHandleByIndex, index)
        uuid = _text(self._call(f"nvmlDeviceGetUUID ({where})", lib.nvmlDeviceGetUUID, handle))
        name = _text(self._call(f"nvmlDeviceGetName ({where})", lib.nvmlDeviceGetName, handle))
        memory = self._call(f"nvmlDeviceGetMemoryInfo ({where})",
                            lib.nvmlDeviceGetMemoryInfo, handle)
        minor = self._optional(f"nvmlDeviceGetMinorNumber ({where})",
                               lib.nvmlDeviceGetMinorNumber, handle)
        brand = self._optional(f"nvmlDeviceGetBrand ({where})", lib.nvmlDeviceGetBrand, handle)
        arch = self._optional(f"nvmlDeviceGetArchitecture ({where})",
                              lib.nvmlDeviceGetArchitecture, handle)
        cc = self._optional(f"nvmlDeviceGetCudaComputeCapability ({where})",
                            lib.nvmlDeviceGetCudaComputeCapability, handle)
        pci = self._optional(f"nvmlDeviceGetPciInfo ({where})", lib.nvmlDeviceGetPciInfo, handle)
        bus_id = _bus_id(_text(pci.busId)) if pci is not None else None
        numa = self._numa_node(handle, where, bus_id)
        mig_mode = self._optional(f"nvmlDeviceGetMigMode ({where})",
                                  lib.nvmlDeviceGetMigMode, handle)
        mig_enabled = mig_mode is not None and int(mig_mode[0]) == _MIG_ENABLED
        migs = self._migs(handle, where, int(memory.total)) if mig_enabled else ()
        return GpuFacts(
            index=index, uuid=uuid, product_name=name, memory=int(memory.total),
            minor=int(minor) if minor is not None else None,
            brand=_BRANDS.get(int(brand)) if brand is not None else None,
            architecture=_ARCHITECTURES.get(int(arch)) if arch is not None else None,
            cuda_compute_capability=f"{cc[0]}.{cc[1]}" if cc is not None else None,
            driver_version=driver, cuda_driver_version=cuda, pci_bus_id=bus_id,
            pcie_root=self._pcie_root(bus_id), numa_node=numa, mig_enabled=mig_enabled,
            mig_devices=migs,
        )

    def _numa_node(self, handle: Any, where: str, bus_id: str | None) -> int | None:
        """The NUMA node the card hangs off, as the kernel (and the kubelet) see it.

        sysfs first: nvmlDeviceGetNumaNodeId "only applies to platforms where the GPUs are
        NUMA nodes" (Grace Hopper, Grace Blackwell), where it names the node of the GPU's own
        memory, not the CPU node the card is attached to; elsewhere it is NotSupported. It is
        the fallback where sysfs cannot say.
        """
        if bus_id is not None:
            try:
                value = int((self._sysfs / "bus/pci/devices" / bus_id.lower() / "numa_node")
                            .read_text().strip())
            except (OSError, ValueError):
                pass
            else:
                return value if value >= 0 else None  # -1: the platform has no NUMA
        get = getattr(self._lib, "nvmlDeviceGetNumaNodeId", None)
        if get is not None:
            node = self._optional(f"nvmlDeviceGetNumaNodeId ({where})", get, handle)
            if node is not None and int(node) >= 0:
                return int(node)
        return None

    def _pcie_root(self, bus_id: str | None) -> str | None:
        """The PCIe root complex (`pci0000:17`) from sysfs, as the DRA library resolves it."""
        if bus_id is None:
            return None
        try:
            real = os.path.realpath(self._sysfs / "bus/pci/devices" / bus_id.lower())
        except OSError:
            return None
        for part in Path(real).parts:
            if part.startswith("pci") and ":" in part:
                return part
        return None

    def _migs(self, handle: Any, where: str, card_memory: int) -> tuple[MigFacts, ...]:
        lib = self._lib
        slots = int(self._call(f"nvmlDeviceGetMaxMigDeviceCount ({where})",
                               lib.nvmlDeviceGetMaxMigDeviceCount, handle))
        out: list[MigFacts] = []
        for slot in range(slots):
            mig = self._optional(f"nvmlDeviceGetMigDeviceHandleByIndex ({where}, {slot})",
                                 lib.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot)
            if mig is None:  # an empty slot raises NotFound
                continue
            mwhere = f"{where} MIG slot {slot}"
            uuid = _text(self._call(f"nvmlDeviceGetUUID ({mwhere})", lib.nvmlDeviceGetUUID, mig))
            memory = self._call(f"nvmlDeviceGetMemoryInfo ({mwhere})",
                                lib.nvmlDeviceGetMemoryInfo, mig)
            attrs = self._call(f"nvmlDeviceGetAttributes ({mwhere})",
                               lib.nvmlDeviceGetAttributes, mig)
            gi_id = int(self._call(f"nvmlDeviceGetGpuInstanceId ({mwhere})",
                                   lib.nvmlDeviceGetGpuInstanceId, mig))
            ci_id = int(self._call(f"nvmlDeviceGetComputeInstanceId ({mwhere})",
                                   lib.nvmlDeviceGetComputeInstanceId, mig))
            gi = self._call(f"nvmlDeviceGetGpuInstanceById ({mwhere})",
                            lib.nvmlDeviceGetGpuInstanceById, handle, gi_id)
            info = self._call(f"nvmlGpuInstanceGetInfo ({mwhere})",
                              lib.nvmlGpuInstanceGetInfo, gi)
            gi_profile = self._gi_profile(handle, int(info.profileId))
            out.append(MigFacts(
                uuid=uuid, profile=_mig_profile(attrs, card_memory, gi_profile),
                memory=int(memory.total),
                profile_id=int(info.profileId), placement_start=int(info.placement.start),
                placement_size=int(info.placement.size),
                multiprocessors=int(attrs.multiprocessorCount) or None,
                gpu_instance_id=gi_id, compute_instance_id=ci_id,
            ))
        return tuple(sorted(out, key=lambda m: (m.placement_start or 0, m.uuid)))

    def _gi_profile(self, handle: Any, profile_id: int) -> tuple[int, Any] | None:
        """The GPU-instance profile (its NVML index and info) whose id is `profile_id`.

        The index tells the variants apart that the instance's attributes do not (`+me`,
        `-me`, `+gfx`), as NVIDIA's go-nvlib does; None when this NVML cannot say.
        """
        lib = self._lib
        get = getattr(lib, "nvmlDeviceGetGpuInstanceProfileInfo", None)
        if get is None:
            return None
        for index in range(_GI_PROFILE_COUNT):
            try:
                info = get(handle, index)
            except lib.NVMLError:  # a profile this card does not have (NotSupported, ...)
                continue
            if int(info.id) == profile_id:
                return index, info
        return None

    def mig_geometry(self, index: int) -> Geometry | None:
        """Card `index`'s MIG geometry as NVML states it (read-only queries: every GPU
        instance profile the card has, its possible placements, compute slices and memory),
        for making instances on demand; None where the card has no MIG profile."""
        lib = self._lib
        where = f"card {index}"
        handle = self._call(f"nvmlDeviceGetHandleByIndex ({where})",
                            lib.nvmlDeviceGetHandleByIndex, index)
        profiles: list[Profile] = []
        media_instances = 1
        for profile_index in range(_GI_PROFILE_COUNT):
            try:
                info = lib.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile_index)
            except lib.NVMLError:  # a profile this card does not have (NotSupported, ...)
                continue
            # As NVML asks: the count first (no array), then the placements.
            what = f"nvmlDeviceGetGpuInstancePossiblePlacements ({where}, profile {int(info.id)})"
            count = ctypes.c_uint(0)
            self._call(what, lib.nvmlDeviceGetGpuInstancePossiblePlacements, handle,
                       int(info.id), None, ctypes.byref(count))
            found = (lib.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
            self._call(what, lib.nvmlDeviceGetGpuInstancePossiblePlacements, handle,
                       int(info.id), found, ctypes.byref(count))
            placements = [(int(p.start), int(p.size)) for p in found[:count.value]]
            if not placements:
                continue
            name = _profile_name(info, profile_index, lambda: int(self._call(
                f"nvmlDeviceGetMemoryInfo ({where})", lib.nvmlDeviceGetMemoryInfo,
                handle).total))
            if MEDIA_EXTENSIONS in name:
                media_instances = int(info.instanceCount)
            profiles.append(Profile(
                name=name, profile_id=int(info.id), compute_slices=int(info.sliceCount),
                memory_mib=int(info.memorySizeMB), size=placements[0][1],
                starts=tuple(start for start, _ in placements), nvml_index=profile_index))
        if not profiles:
            return None
        return Geometry(
            memory_slices=max(start + p.size for p in profiles for start in p.starts),
            compute_slices=max(p.compute_slices for p in profiles), profiles=tuple(profiles),
            media_extension_instances=media_instances)

    # -- health ----------------------------------------------------------------------------

    def probe(self, uuids: list[str]) -> dict[str, bool]:
        """Card UUID to True when NVML says the card is lost (fell off the bus, needs reset).

        Any other failure is NVML's, not the card's, and raises NvmlError.
        """
        lost: dict[str, bool] = {}
        for uuid in uuids:
            try:
                handle = self._lib.nvmlDeviceGetHandleByUUID(uuid)
                self._lib.nvmlDeviceGetMemoryInfo(handle)
                lost[uuid] = False
            except self._lib.NVMLError as err:
                error = self._error(f"probing GPU {uuid}", err)
                if not error.gpu_lost and error.code != _NOT_FOUND:
                    raise error from None
                lost[uuid] = True
        return lost

    def xid_events(self, uuids: list[str]) -> XidEventSet:
        """An event set listening for critical XIDs on the given cards."""
        return XidEventSet(self, uuids)


class XidEventSet:
    """NVML's event set for critical XIDs; `wait()` blocks, so run it in a worker thread.

    A card that is lost (or gone) while registering is listed in `lost` instead of failing the
    whole set: one card off the bus must not blind the watcher to the others.
    """

    def __init__(self, nvml: Nvml, uuids: list[str]) -> None:
        self._nvml = nvml
        lib = nvml._lib
        self._lib = lib
        self._set = nvml._call("nvmlEventSetCreate", lib.nvmlEventSetCreate)
        self.unsupported: list[str] = []
        self.lost: list[str] = []
        # Handle to UUID, for events from a card that can no longer tell its UUID (XID 79).
        self._uuids: dict[Any, str] = {}
        try:
            for uuid in uuids:
                self._register(uuid)
        except BaseException:
            self.close()
            raise

    def _register(self, uuid: str) -> None:
        nvml, lib = self._nvml, self._lib
        try:
            handle = nvml._call(f"nvmlDeviceGetHandleByUUID({uuid})",
                                lib.nvmlDeviceGetHandleByUUID, uuid)
            supported = nvml._optional(f"nvmlDeviceGetSupportedEventTypes ({uuid})",
                                       lib.nvmlDeviceGetSupportedEventTypes, handle)
            if supported is None or not int(supported) & _XID_CRITICAL_EVENT:
                self.unsupported.append(uuid)
                return
            try:
                nvml._call(f"nvmlDeviceRegisterEvents ({uuid})", lib.nvmlDeviceRegisterEvents,
                           handle, _XID_CRITICAL_EVENT, self._set)
            except NvmlError as err:
                if err.code != _NOT_SUPPORTED:  # a card too old for health checks
                    raise
                self.unsupported.append(uuid)
                return
        except NvmlError as err:
            if not (err.gpu_lost or err.code == _NOT_FOUND):
                raise
            log.error("GPU %s is lost: %s", uuid, err)
            self.lost.append(uuid)
            return
        self._uuids[_handle_key(handle)] = uuid

    def wait(self, timeout_ms: int) -> XidEvent | None:
        """The next XID, or None when `timeout_ms` passed quietly. NvmlError on failure."""
        try:
            data = self._lib.nvmlEventSetWait(self._set, timeout_ms)
        except self._lib.NVMLError as err:
            if getattr(err, "value", None) == _TIMEOUT:
                return None
            raise self._nvml._error("nvmlEventSetWait", err) from None
        if not int(data.eventType) & _XID_CRITICAL_EVENT:
            return None
        # Asking the handle for its UUID is exact; a card that fell off the bus (XID 79) can no
        # longer answer, and is then found by the handle it was registered with.
        try:
            uuid = _text(self._nvml._call("nvmlDeviceGetUUID (event)",
                                          self._lib.nvmlDeviceGetUUID, data.device))
        except NvmlError as err:
            known = self._uuids.get(_handle_key(data.device))
            if known is None or not err.gpu_lost:
                raise
            uuid = known
        gi = int(data.gpuInstanceId)
        ci = int(data.computeInstanceId)
        # 0xFFFFFFFF marks "not a MIG event" in NVML.
        return XidEvent(uuid=uuid, xid=int(data.eventData),
                        gpu_instance_id=None if gi == 0xFFFFFFFF else gi,
                        compute_instance_id=None if ci == 0xFFFFFFFF else ci)

    def close(self) -> None:
        try:
            self._lib.nvmlEventSetFree(self._set)
        except self._lib.NVMLError as err:
            log.warning("nvmlEventSetFree failed: %s", err)


def _handle_key(handle: Any) -> Any:
    """A device handle as a dict key: pynvml's handles are ctypes pointers, equal by address."""
    if isinstance(handle, ctypes._Pointer):
        return ctypes.cast(handle, ctypes.c_void_p).value
    return handle


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _bus_id(raw: str) -> str:
    """NVML's `00000000:18:00.0` as sysfs and Kubernetes write it: `0000:18:00.0`."""
    domain, _, rest = raw.strip().rstrip("\x00").partition(":")
    if len(domain) > 4 and domain[:-4].strip("0") == "":
        domain = domain[-4:]
    return f"{domain}:{rest}".lower()


def _mig_profile(attrs: Any, card_memory: int, gi_profile: tuple[int, Any] | None = None) -> str:
    """NVIDIA's profile name (`1g.10gb`, `1c.2g.20gb`, `1g.18gb+me`) of a MIG device.

    As go-nvlib computes it (what nvidia-smi, NVIDIA's device plugin and DRA driver publish):
    the instance's share of the card rounded up to eighths, times the card's memory in GiB
    rounded up, rounded half away from zero (a plain MiB-to-GiB rounding would call H100's
    3g.40gb "3g.39gb", and rounding the card to the nearest GiB H200's 3g.71gb "3g.70gb").
    `gi_profile` (index, info) from nvmlDeviceGetGpuInstanceProfileInfo adds the suffix.
    """
    gi_slices = int(attrs.gpuInstanceSliceCount)
    ci_slices = int(attrs.computeInstanceSliceCount)
    memory_mb = int(attrs.memorySizeMB)
    suffix = ""
    if gi_profile is not None:
        index, info = gi_profile
        gi_slices = int(info.sliceCount) or gi_slices
        memory_mb = int(info.memorySizeMB) or memory_mb
        suffix = _GI_PROFILE_SUFFIXES.get(index, "")
    mib, gib = 1 << 20, 1 << 30
    fraction = math.ceil(memory_mb * mib / card_memory * 8) / 8
    gigabytes = math.floor(fraction * ((card_memory + gib - 1) // gib) + 0.5)
    prefix = f"{ci_slices}c." if ci_slices and ci_slices != gi_slices else ""
    return f"{prefix}{gi_slices}g.{gigabytes}gb{suffix}"


def _profile_name(info: Any, index: int, card_memory: Callable[[], int]) -> str:
    """NVIDIA's profile name from a GPU instance profile's info: its `name` (version 2:
    "MIG 1g.10gb"), else computed from its slices and memory as `_mig_profile` does."""
    raw = getattr(info, "name", b"")
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    if text.startswith("MIG "):
        return text[4:].strip()
    attrs = SimpleNamespace(gpuInstanceSliceCount=info.sliceCount,
                            computeInstanceSliceCount=info.sliceCount,
                            memorySizeMB=info.memorySizeMB)
    return _mig_profile(attrs, card_memory(), (index, info))


def discover_nvml(lib: Any = None, *, sysfs: Path = Path("/sys"),
                  mig_geometry: bool = False) -> NodeFacts:
    """Facts of every card through one NVML session (init, discover, shutdown)."""
    with Nvml(lib, sysfs=sysfs) as nvml:
        return nvml.discover(mig_geometry=mig_geometry)
