"""A fake `pynvml` module: the calls discovery and health make, over a scripted node.

Errors are raised as the real module raises them (an `NVMLError` subclass carrying `.value`),
so the error mapping is exercised, not bypassed.
"""

from __future__ import annotations

import ctypes
import queue
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
# c_nvmlEventData_t's gpuInstanceId / computeInstanceId when the event is not MIG-specific.
NOT_MIG_SPECIFIC = 0xFFFFFFFF


# pynvml's own exception: `NVMLError(code)` builds the subclass the real calls raise
# (`NVMLError_GpuIsLost`, ...), with `.value` and NVML's message, without loading the library.
NVMLError = pynvml.NVMLError


@dataclass
class FakeMig:
    uuid: str
    memory_mb: int
    gi_slices: int
    ci_slices: int
    profile_id: int
    start: int
    size: int
    gi_id: int  # nvmlDeviceGetGpuInstanceId on the MIG handle
    ci_id: int = 0  # nvmlDeviceGetComputeInstanceId on the MIG handle
    sms: int = 14
    # NVML's GPU-instance profile index (NVML_GPU_INSTANCE_PROFILE_*); None: from gi_slices.
    profile_index: int | None = None

    @property
    def index(self) -> int:
        if self.profile_index is not None:
            return self.profile_index
        return {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}[self.gi_slices]


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    memory: int = 80 * 2**30
    minor: int = 0
    brand: int = 14  # NVML_BRAND_NVIDIA
    arch: int = 9  # Hopper
    cc: tuple[int, int] = (9, 0)
    bus_id: bytes = b"00000000:18:00.0"
    numa: int | None = None  # nvmlDeviceGetNumaNodeId: None is NotSupported, as on x86
    mig_mode: int | None = 0  # None: not supported
    migs: list[FakeMig | None] = field(default_factory=list)
    lost: bool = False
    error: int | None = None  # every call on the card fails with this NVML code
    # nvmlDeviceGetGpuFabricInfoV: (cluster UUID bytes, clique id, state); None: NotSupported.
    fabric: tuple[bytes, int, int] | None = None


class FakeNvml:
    """Use `module()` as the `lib` argument of `Nvml`."""

    def __init__(self, gpus: list[FakeGpu], *, driver: str = "550.54.15",
                 cuda: int = 12040, init_error: int | None = None,
                 nvlink: list[set[int]] | None = None, p2p_error: int | None = None) -> None:
        self.gpus = gpus
        # Cards NVLink joins (directly or through NVSwitches): NVML's NVLink P2P status is OK
        # between any two of one set; `p2p_error` makes every such query fail with it.
        self.nvlink = nvlink or []
        self.p2p_error = p2p_error
        self.driver = driver
        self.cuda = cuda
        self.init_error = init_error
        self.initialised = 0
        self.shutdowns = 0
        self.events: queue.Queue[SimpleNamespace] = queue.Queue()
        self.registered: list[str] = []
        self.event_sets_open = 0
        self.fail_everything: int | None = None

    def _check(self) -> None:
        if self.fail_everything is not None:
            raise NVMLError(self.fail_everything)
        if self.initialised <= 0:
            raise NVMLError(1)

    def module(self) -> Any:
        fake = self

        def checked(value: Any) -> Any:
            fake._check()
            return value

        def handle(i: int) -> Any:
            fake._check()
            return ("gpu", i)

        def gpu(h: Any) -> FakeGpu:
            fake._check()
            g: FakeGpu = fake.gpus[h[1]]
            if g.lost:
                raise NVMLError(NVML_ERROR_GPU_IS_LOST)
            if g.error is not None:
                raise NVMLError(g.error)
            return g

        def mig(h: Any) -> FakeMig:
            m: FakeMig | None = fake.gpus[h[1]].migs[h[2]]
            assert m is not None
            return m

        def instance_ids(h: Any) -> FakeMig:
            # NVML answers these for MIG device handles only (InvalidArgument otherwise).
            fake._check()
            if h[0] != "mig":
                raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
            return mig(h)

        def init() -> None:
            if fake.init_error is not None:
                raise NVMLError(fake.init_error)
            fake.initialised += 1

        def shutdown() -> None:
            fake.initialised -= 1
            fake.shutdowns += 1

        def uuid(h: Any) -> str:
            return mig(h).uuid if h[0] == "mig" else gpu(h).uuid

        def memory(h: Any) -> Any:
            if h[0] == "mig":
                return SimpleNamespace(total=mig(h).memory_mb * 2**20)
            return SimpleNamespace(total=gpu(h).memory)

        def numa(h: Any) -> int:
            value = gpu(h).numa
            if value is None:
                raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
            return value

        def mig_mode(h: Any) -> list[int]:
            value = gpu(h).mig_mode
            if value is None:
                raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
            return [value, value]

        def mig_handle(h: Any, i: int) -> Any:
            if gpu(h).migs[i] is None:
                raise NVMLError(NVML_ERROR_NOT_FOUND)
            return ("mig", h[1], i)

        def attributes(h: Any) -> Any:
            m = mig(h)
            return SimpleNamespace(multiprocessorCount=m.sms, gpuInstanceSliceCount=m.gi_slices,
                                   computeInstanceSliceCount=m.ci_slices,
                                   memorySizeMB=m.memory_mb)

        def gi_by_id(h: Any, gi_id: int) -> Any:
            for m in gpu(h).migs:
                if m is not None and m.gi_id == gi_id:
                    return m
            raise NVMLError(NVML_ERROR_NOT_FOUND)

        def gi_profile_info(h: Any, index: int) -> Any:
            for m in gpu(h).migs:
                if m is not None and m.index == index:
                    return SimpleNamespace(id=m.profile_id, sliceCount=m.gi_slices,
                                           memorySizeMB=m.memory_mb)
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED if index < 0x12 else 2)

        def gi_info(m: FakeMig) -> Any:
            return SimpleNamespace(profileId=m.profile_id,
                                   placement=SimpleNamespace(start=m.start, size=m.size))

        def by_uuid(u: str) -> Any:
            fake._check()
            for i, g in enumerate(fake.gpus):
                if g.uuid == u:
                    return ("gpu", i)
            raise NVMLError(NVML_ERROR_NOT_FOUND)

        def p2p(a: Any, b: Any, index: int) -> int:
            gpu(a), gpu(b)
            if fake.p2p_error is not None:
                raise NVMLError(fake.p2p_error)
            if index != pynvml.NVML_P2P_CAPS_INDEX_NVLINK:
                return pynvml.NVML_P2P_STATUS_OK
            joined = any(a[1] in s and b[1] in s for s in fake.nvlink)
            return pynvml.NVML_P2P_STATUS_OK if joined else \
                pynvml.NVML_P2P_STATUS_NOT_SUPPORTED

        def fabric(h: Any, info: Any) -> int:
            found = gpu(h).fabric
            if found is None:
                raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
            struct = info._obj  # ctypes.byref(struct), as the real call takes it
            cluster, clique, state = found
            ctypes.memmove(struct.clusterUuid, cluster, len(cluster))
            struct.cliqueId, struct.state, struct.status = clique, state, 0
            return 0

        def event_set_create() -> Any:
            fake._check()
            fake.event_sets_open += 1
            return object()  # an opaque pointer in pynvml

        def event_set_free(event_set: Any) -> None:
            fake.event_sets_open -= 1

        def register(h: Any, types: int, event_set: Any) -> None:
            fake.registered.append(gpu(h).uuid)

        def wait(event_set: Any, timeout_ms: int) -> Any:
            fake._check()
            try:
                return fake.events.get(timeout=min(timeout_ms, 50) / 1000)
            except queue.Empty:
                raise NVMLError(NVML_ERROR_TIMEOUT) from None

        return SimpleNamespace(
            NVMLError=NVMLError,
            nvmlInit=init, nvmlShutdown=shutdown,
            nvmlSystemGetDriverVersion=lambda: checked(fake.driver),
            nvmlSystemGetCudaDriverVersion=lambda: checked(fake.cuda),
            nvmlDeviceGetCount=lambda: checked(len(fake.gpus)),
            nvmlDeviceGetHandleByIndex=handle,
            nvmlDeviceGetHandleByUUID=by_uuid,
            nvmlDeviceGetUUID=uuid,
            nvmlDeviceGetName=lambda h: gpu(h).name,
            nvmlDeviceGetMemoryInfo=memory,
            nvmlDeviceGetMinorNumber=lambda h: gpu(h).minor,
            nvmlDeviceGetBrand=lambda h: gpu(h).brand,
            nvmlDeviceGetArchitecture=lambda h: gpu(h).arch,
            nvmlDeviceGetCudaComputeCapability=lambda h: gpu(h).cc,
            nvmlDeviceGetPciInfo=lambda h: SimpleNamespace(busId=gpu(h).bus_id),
            nvmlDeviceGetNumaNodeId=numa,
            nvmlDeviceGetMigMode=mig_mode,
            nvmlDeviceGetMaxMigDeviceCount=lambda h: len(gpu(h).migs),
            nvmlDeviceGetMigDeviceHandleByIndex=mig_handle,
            nvmlDeviceGetAttributes=attributes,
            # pynvml returns the c_uint out-parameter's `.value`: a plain int.
            nvmlDeviceGetGpuInstanceId=lambda h: instance_ids(h).gi_id,
            nvmlDeviceGetComputeInstanceId=lambda h: instance_ids(h).ci_id,
            nvmlDeviceGetGpuInstanceById=gi_by_id,
            nvmlGpuInstanceGetInfo=gi_info,
            nvmlDeviceGetGpuInstanceProfileInfo=gi_profile_info,
            nvmlDeviceGetP2PStatus=p2p,
            nvmlDeviceGetGpuFabricInfoV=fabric,
            c_nvmlGpuFabricInfo_v2_t=pynvml.c_nvmlGpuFabricInfo_v2_t,
            nvmlEventSetCreate=event_set_create,
            nvmlEventSetFree=event_set_free,
            nvmlDeviceGetSupportedEventTypes=lambda h: (gpu(h), 0x8 | 0x4)[1],
            nvmlDeviceRegisterEvents=register,
            nvmlEventSetWait=wait,
        )

    def xid(self, index: int, xid: int, *, gi: int = NOT_MIG_SPECIFIC,
            ci: int = NOT_MIG_SPECIFIC) -> None:
        """Queue a critical XID event for card `index`; `gi`/`ci` name the MIG instance hit.

        As pynvml's c_nvmlEventData_t: `device` is the (parent) card's handle the events were
        registered on, eventType/eventData are c_ulonglong and gpuInstanceId/computeInstanceId
        c_uint fields, which read back as plain ints.
        """
        self.events.put(SimpleNamespace(device=("gpu", index), eventType=0x8,
                                        eventData=ctypes.c_ulonglong(xid).value,
                                        gpuInstanceId=ctypes.c_uint(gi).value,
                                        computeInstanceId=ctypes.c_uint(ci).value))
