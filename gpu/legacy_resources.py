"""The resource names through which legacy stacks hand out accelerators: one table, every fact.

Every name of the reference "Legacy and vendor GPU request protocols" (resource names), and the
older names that stacks still accept (Koordinator's `kubernetes.io/gpu-*`, Volcano's
`volcano.sh/gpu-*`), one row each (`LegacyResource`). A name is exact, or a prefix ending in
"*" (`nvidia.com/mig-*`: one name per MIG profile). A row says:

- `kind`: `gpu`, GPUs or shares of them that a legacy device plugin or scheduler hands out (the
  node plugin withholds the cards of a node while one of these offers or holds them,
  `node-plugin/legacy.py`); `hint`, a setting, not an amount of anything (HAMi's task
  priority); `other`, devices of other accelerators, which their own drivers allocate;
- `counts`: what one of it counts in the gateway's terms (`devices`, `memory`, `cores`: the
  device capacities), or `memory-percent` (a share of each card's memory, which only the card
  turns into bytes), or `priority` (nothing: a hint);
- `unit`: the unit of its value, as a translation rule writes it (`Mi`: one is a MiB; `""`: a
  plain number, or bytes for `memory`), a key of `UNITS`;
- `allocator`: who allocates its devices under DRA when it is not the gateway ("AMD's
  driver"), empty when the gateway's rules translate it to a gateway class;
- `note`: how counting it as `counts` in the gateway's terms is loose, when it is.

A name under one of `LEGACY_GPU_PREFIXES` is a GPU name too, listed or not: those families
grow (a new MIG profile, a stack's new setting) and a card must not be handed out twice for a
name the list has not caught up with.

Who reads it: the node plugin (`kind`), policy's quota conversion and legacy usage
(`policy/legacyquotas.py` derives each name's GPUQuota facts from `counts`, `unit`,
`allocator` and `note`), and the built-in translation rules (`translator/builtin/`), which must
read every name listed here in its unit (`tests/translator/test_legacy_table.py` says what to
add where when they disagree). A new protocol: its rows here, its rule there.

Constants and lookups only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

__all__ = [
    "LEGACY_GPU_PREFIXES",
    "LEGACY_RESOURCES",
    "UNITS",
    "Counts",
    "Kind",
    "LegacyResource",
    "is_legacy_gpu_resource",
    "legacy_resource",
]

Kind = Literal["gpu", "hint", "other"]
Counts = Literal["devices", "memory", "cores", "memory-percent", "priority"]

# Units a legacy resource's value may be in (a row's `unit`, a translation rule's `unit`): one of
# the value is worth the factor, so that bytes are bytes and everything else a plain number.
UNITS: Final[Mapping[str, int]] = {
    "": 1,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
}


@dataclass(frozen=True, slots=True)
class LegacyResource:
    """One legacy resource name and its protocol's facts (see the module's docstring)."""

    name: str  # exact, or a prefix ending in "*"
    kind: Kind
    stack: str  # who hands it out
    counts: Counts
    unit: str = ""  # a key of UNITS
    allocator: str = ""  # who allocates it under DRA, when not the gateway
    note: str = ""  # how counting it in the gateway's terms is loose


_REPLICAS: Final = "a GPUQuota counts cards touched: replicas sharing one card count once"
_CORE_AND_RATIO: Final = "it also limits the memory ratio, which has no GPUQuota equivalent"

LEGACY_RESOURCES: Final[tuple[LegacyResource, ...]] = (
    # NVIDIA's device plugin and HAMi.
    LegacyResource("nvidia.com/gpu", "gpu", "NVIDIA's device plugin; HAMi's vGPU slots",
                   "devices"),
    LegacyResource("nvidia.com/gpu.shared", "gpu", "NVIDIA's device plugin (time-slicing)",
                   "devices", note=_REPLICAS),
    LegacyResource("nvidia.com/mig-*", "gpu", "NVIDIA's device plugin (MIG mixed); HAMi",
                   "devices", note="each MIG instance is one device"),
    LegacyResource("nvidia.com/gpumem", "gpu", "HAMi", "memory", "Mi",
                   note="HAMi's quota adds each container's per-card value; a GPUQuota counts "
                        "the memory of every card a pod holds"),
    LegacyResource("nvidia.com/gpumem-percentage", "gpu", "HAMi", "memory-percent"),
    LegacyResource("nvidia.com/gpucores", "gpu", "HAMi", "cores"),
    LegacyResource("nvidia.com/priority", "hint", "HAMi", "priority"),
    # Koordinator, and its older kubernetes.io names.
    LegacyResource("koordinator.sh/gpu-core", "gpu", "Koordinator", "cores"),
    LegacyResource("koordinator.sh/gpu-memory", "gpu", "Koordinator", "memory"),
    LegacyResource("koordinator.sh/gpu-memory-ratio", "gpu", "Koordinator", "memory-percent"),
    LegacyResource("koordinator.sh/gpu.shared", "gpu", "Koordinator", "devices"),
    LegacyResource("koordinator.sh/gpu", "gpu", "Koordinator (deprecated)", "cores",
                   note=_CORE_AND_RATIO),
    LegacyResource("kubernetes.io/gpu-core", "gpu", "Koordinator (older name)", "cores"),
    LegacyResource("kubernetes.io/gpu-memory", "gpu", "Koordinator (older name)", "memory"),
    LegacyResource("kubernetes.io/gpu-memory-ratio", "gpu", "Koordinator (older name)",
                   "memory-percent"),
    LegacyResource("kubernetes.io/gpu", "gpu", "Koordinator (older name)", "cores",
                   note=_CORE_AND_RATIO),
    # Volcano, and its older names.
    LegacyResource("volcano.sh/vgpu-number", "gpu", "Volcano vGPU", "devices"),
    LegacyResource("volcano.sh/vgpu-memory", "gpu", "Volcano vGPU", "memory", "Mi"),
    LegacyResource("volcano.sh/vgpu-cores", "gpu", "Volcano vGPU", "cores"),
    LegacyResource("volcano.sh/gpu-number", "gpu", "Volcano (older name)", "devices"),
    LegacyResource("volcano.sh/gpu-memory", "gpu", "Volcano (older name)", "memory", "Mi"),
    # Alibaba gpushare and cGPU.
    LegacyResource("aliyun.com/gpu-count", "gpu", "gpushare", "devices"),
    LegacyResource("aliyun.com/gpu-mem", "gpu", "gpushare", "memory", "Gi"),
    LegacyResource("aliyun.com/gpu-core.percentage", "gpu", "Alibaba cGPU", "cores"),
    # Tencent qGPU.
    LegacyResource("tke.cloud.tencent.com/qgpu-core", "gpu", "Tencent qGPU", "cores"),
    LegacyResource("tke.cloud.tencent.com/qgpu-memory", "gpu", "Tencent qGPU", "memory", "Gi"),
    # Other vendors' whole cards and slices.
    LegacyResource("k8s.amazonaws.com/vgpu", "gpu", "AWS's MPS-backed slices of NVIDIA cards",
                   "devices", note=_REPLICAS),
    LegacyResource("amd.com/gpu", "gpu", "AMD's ROCm device plugin", "devices",
                   allocator="AMD's driver"),
    # Other accelerators: their drivers allocate them, never the gateway.
    LegacyResource("gpu.intel.com/i915", "other", "Intel's GPU plugin", "devices",
                   allocator="Intel's driver"),
    LegacyResource("gpu.intel.com/xe", "other", "Intel's GPU plugin", "devices",
                   allocator="Intel's driver"),
    LegacyResource("habana.ai/gaudi", "other", "Habana's device plugin", "devices",
                   allocator="Habana's driver"),
    LegacyResource("aws.amazon.com/neuron", "other", "AWS Neuron's device plugin", "devices",
                   allocator="AWS Neuron's driver"),
    LegacyResource("aws.amazon.com/neuroncore", "other", "AWS Neuron's device plugin", "devices",
                   allocator="AWS Neuron's driver"),
    LegacyResource("google.com/tpu", "other", "GKE", "devices",
                   allocator="Google's TPU support"),
)

# Families of GPU names: a name under one of these prefixes hands out GPUs, listed or not.
LEGACY_GPU_PREFIXES: Final[tuple[str, ...]] = (
    "nvidia.com/mig-",  # a MIG profile
    "volcano.sh/vgpu-",  # vgpu-number, vgpu-memory, vgpu-cores
    "volcano.sh/gpu-",  # the older gpu-number, gpu-memory
    "koordinator.sh/gpu",  # gpu-core, gpu-memory, gpu-memory-ratio, gpu.shared, gpu
    "kubernetes.io/gpu",  # Koordinator's older gpu-core, gpu-memory, gpu-memory-ratio, gpu
    "aliyun.com/gpu",  # gpushare gpu-mem, gpu-count; cGPU gpu-core.percentage
    "tke.cloud.tencent.com/qgpu-",  # qgpu-core, qgpu-memory
)

_EXACT: Final = {r.name: r for r in LEGACY_RESOURCES if not r.name.endswith("*")}
_PATTERNS: Final = tuple((r.name[:-1], r) for r in LEGACY_RESOURCES if r.name.endswith("*"))
_GPU_NAMES: Final = frozenset(name for name, r in _EXACT.items() if r.kind == "gpu")


def legacy_resource(name: str) -> LegacyResource | None:
    """The entry of a resource name (no prefix such as `requests.`), None if it is not listed."""
    known = _EXACT.get(name)
    if known is not None:
        return known
    for prefix, entry in _PATTERNS:
        if name.startswith(prefix):
            return entry
    return None


def is_legacy_gpu_resource(name: str) -> bool:
    """Does a legacy stack hand out GPUs, or shares of them, under this resource name?"""
    return name in _GPU_NAMES or name.startswith(LEGACY_GPU_PREFIXES)
