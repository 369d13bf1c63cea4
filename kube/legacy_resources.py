"""The resource names through which legacy stacks hand out accelerators, in one list.

Every name of the reference "Legacy and vendor GPU request protocols" (resource names), and the
older names that stacks still accept (Koordinator's `kubernetes.io/gpu-*`, Volcano's
`volcano.sh/gpu-*`). Each is exact, or a prefix ending in "*" (`nvidia.com/mig-*`: one name
per MIG profile), of one kind:

- `gpu`: GPUs, or shares of them, that a legacy device plugin or scheduler hands out: the node
  plugin withholds the cards of a node while one of these offers or holds them
  (`node-plugin/legacy.py`);
- `hint`: a setting, not an amount of anything (HAMi's task priority);
- `other`: devices of other accelerators, which their own drivers allocate.

A name under one of `LEGACY_GPU_PREFIXES` is a GPU name too, listed or not: those families
grow (a new MIG profile, a stack's new setting) and a card must not be handed out twice for a
name the list has not caught up with. What a name counts in GPUQuota terms is policy's
(`policy/legacyquotas.py`, which knows every name listed here); how a name is translated is the
rules' (`translator/builtin/`).

Constants and lookups only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

__all__ = [
    "LEGACY_GPU_PREFIXES",
    "LEGACY_RESOURCES",
    "LegacyResource",
    "is_legacy_gpu_resource",
    "legacy_resource",
]

Kind = Literal["gpu", "hint", "other"]


@dataclass(frozen=True, slots=True)
class LegacyResource:
    name: str  # exact, or a prefix ending in "*"
    kind: Kind
    stack: str  # who hands it out


LEGACY_RESOURCES: Final[tuple[LegacyResource, ...]] = (
    # NVIDIA's device plugin and HAMi.
    LegacyResource("nvidia.com/gpu", "gpu", "NVIDIA's device plugin; HAMi's vGPU slots"),
    LegacyResource("nvidia.com/gpu.shared", "gpu", "NVIDIA's device plugin (time-slicing)"),
    LegacyResource("nvidia.com/mig-*", "gpu", "NVIDIA's device plugin (MIG mixed); HAMi"),
    LegacyResource("nvidia.com/gpumem", "gpu", "HAMi"),
    LegacyResource("nvidia.com/gpumem-percentage", "gpu", "HAMi"),
    LegacyResource("nvidia.com/gpucores", "gpu", "HAMi"),
    LegacyResource("nvidia.com/priority", "hint", "HAMi"),
    # Koordinator, and its older kubernetes.io names.
    LegacyResource("koordinator.sh/gpu-core", "gpu", "Koordinator"),
    LegacyResource("koordinator.sh/gpu-memory", "gpu", "Koordinator"),
    LegacyResource("koordinator.sh/gpu-memory-ratio", "gpu", "Koordinator"),
    LegacyResource("koordinator.sh/gpu.shared", "gpu", "Koordinator"),
    LegacyResource("koordinator.sh/gpu", "gpu", "Koordinator (deprecated)"),
    LegacyResource("kubernetes.io/gpu-core", "gpu", "Koordinator (older name)"),
    LegacyResource("kubernetes.io/gpu-memory", "gpu", "Koordinator (older name)"),
    LegacyResource("kubernetes.io/gpu-memory-ratio", "gpu", "Koordinator (older name)"),
    LegacyResource("kubernetes.io/gpu", "gpu", "Koordinator (older name)"),
    # Volcano, and its older names.
    LegacyResource("volcano.sh/vgpu-number", "gpu", "Volcano vGPU"),
    LegacyResource("volcano.sh/vgpu-memory", "gpu", "Volcano vGPU"),
    LegacyResource("volcano.sh/vgpu-cores", "gpu", "Volcano vGPU"),
    LegacyResource("volcano.sh/gpu-number", "gpu", "Volcano (older name)"),
    LegacyResource("volcano.sh/gpu-memory", "gpu", "Volcano (older name)"),
    # Alibaba gpushare and cGPU.
    LegacyResource("aliyun.com/gpu-count", "gpu", "gpushare"),
    LegacyResource("aliyun.com/gpu-mem", "gpu", "gpushare"),
    LegacyResource("aliyun.com/gpu-core.percentage", "gpu", "Alibaba cGPU"),
    # Tencent qGPU.
    LegacyResource("tke.cloud.tencent.com/qgpu-core", "gpu", "Tencent qGPU"),
    LegacyResource("tke.cloud.tencent.com/qgpu-memory", "gpu", "Tencent qGPU"),
    # Other vendors' whole cards and slices.
    LegacyResource("k8s.amazonaws.com/vgpu", "gpu", "AWS's MPS-backed slices of NVIDIA cards"),
    LegacyResource("amd.com/gpu", "gpu", "AMD's ROCm device plugin"),
    # Other accelerators: their drivers allocate them, never the gateway.
    LegacyResource("gpu.intel.com/i915", "other", "Intel's GPU plugin"),
    LegacyResource("gpu.intel.com/xe", "other", "Intel's GPU plugin"),
    LegacyResource("habana.ai/gaudi", "other", "Habana's device plugin"),
    LegacyResource("aws.amazon.com/neuron", "other", "AWS Neuron's device plugin"),
    LegacyResource("aws.amazon.com/neuroncore", "other", "AWS Neuron's device plugin"),
    LegacyResource("google.com/tpu", "other", "GKE"),
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
