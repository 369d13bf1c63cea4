"""The names components agree on (ARCHITECTURE.md, "Contracts between components").

One module so that no component reads another's code to learn a name. It holds constants only.
"""

from typing import Final

DOMAIN: Final = "dra-gateway.io"
API_VERSION: Final = f"{DOMAIN}/v1alpha1"

DRIVER: Final = f"gpu.{DOMAIN}"
GPU_CLASS: Final = f"gpu.{DOMAIN}"
MIG_CLASS: Final = f"mig.{DOMAIN}"
GATEWAY_CLASSES: Final = frozenset({GPU_CLASS, MIG_CLASS})

NVIDIA_GPU_CLASS: Final = "gpu.nvidia.com"
NVIDIA_MIG_CLASS: Final = "mig.nvidia.com"
AMD_GPU_CLASS: Final = "gpu.amd.com"
INTEL_GPU_CLASS: Final = "gpu.intel.com"
GAUDI_CLASS: Final = "gaudi.intel.com"

# The namespace the gateway is installed in unless told otherwise: the components' and the
# commands' --namespace default (the allocator's Lease, defrag's holds, rule ConfigMaps).
GATEWAY_NAMESPACE: Final = "dra-gateway"

SCHEDULING_GATE: Final = f"{DOMAIN}/allocation"
# The Lease through which one allocator replica leads, in the gateway's namespace.
ALLOCATOR_LEASE: Final = "dra-gateway-allocator"
FINALIZER: Final = f"{DOMAIN}/allocation"

RULES_LABEL: Final = f"{DOMAIN}/rules"
RULES_LABEL_VALUE: Final = "true"

# A pod's word on defragmentation: "never" (it is not moved), "allow" (moved although its
# controller is not one the gateway knows to re-create it).
ANNOTATION_DEFRAG: Final = f"{DOMAIN}/defrag"

# Annotations written by the gateway.
ANNOTATION_TRANSLATED: Final = f"{DOMAIN}/translated"
ANNOTATION_SHARES: Final = f"{DOMAIN}/shares"
# On a claim the allocator placed on quota borrowed from a GPUQuota cohort: the cohort's name
# (what ran past the namespace's guarantee when it was placed).
ANNOTATION_BORROWED: Final = f"{DOMAIN}/borrowed-from"
# The component the allocator's Events are reported by.
ALLOCATOR_COMPONENT: Final = "dra-gateway-allocator"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "dra-gateway"

# Kinds of the gateway's own documents (apiVersion API_VERSION).
KIND_GPU_SHARE_CONFIG: Final = "GpuShareConfig"
# The allocator's record of the shares it allocated, an opaque config in status.allocation.
KIND_GPU_SHARE_ALLOCATION: Final = "GpuShareAllocation"
KIND_TRANSLATION_RULES: Final = "TranslationRules"

# Device attribute and capacity names (bare names belong to the driver's domain).
ATTR_TYPE: Final = "type"
ATTR_UUID: Final = "uuid"
ATTR_PARENT_UUID: Final = "parentUUID"
ATTR_PRODUCT_NAME: Final = "productName"
ATTR_BRAND: Final = "brand"
ATTR_ARCHITECTURE: Final = "architecture"
ATTR_CUDA_COMPUTE_CAPABILITY: Final = "cudaComputeCapability"
ATTR_DRIVER_VERSION: Final = "driverVersion"
ATTR_CUDA_DRIVER_VERSION: Final = "cudaDriverVersion"
ATTR_PCIE_BUS_ID: Final = "pcieBusID"
ATTR_PCIE_ROOT: Final = "resource.kubernetes.io/pcieRoot"
ATTR_PROFILE: Final = "profile"
ATTR_NUMA_NODE: Final = "numaNode"
ATTR_NUMA_NODE_STANDARD: Final = "resource.kubernetes.io/numaNode"  # KEP-6072, GA in 1.37
ATTR_NVLINK_ISLAND: Final = "nvlinkIsland"  # the lowest index of the cards NVLink joins
ATTR_NVLINK_CLIQUE: Final = "nvlinkClique"  # NVLink fabric: "<cluster UUID>.<clique id>"
ATTR_INDEX: Final = "index"
# Whether the card's node has HAMi-core's library (the node plugin's --hami-library exists), so
# that a share enforced by HAMi-core can be; translated hami-core shares select it.
ATTR_HAMI_CORE: Final = "hamiCore"
# MIG on demand (gpu/mig.py): what a dynamic MIG device draws from its card's counter set, said
# in attributes too, which every release keeps (the API server drops `consumesCounters` and
# `sharedCounters` without DRAPartitionableDevices): the set, the placement's first memory slice
# (instances only), its memory and compute slices, and the card's media-extension instances.
ATTR_COUNTER_SET: Final = "counterSet"
ATTR_MIG_START: Final = "migStart"
ATTR_MIG_MEMORY_SLICES: Final = "migMemorySlices"
ATTR_MIG_COMPUTE_SLICES: Final = "migComputeSlices"
ATTR_MIG_MEDIA_EXTENSIONS: Final = "migMediaExtensions"
CAPACITY_MEMORY: Final = "memory"
CAPACITY_CORES: Final = "cores"
CORES_PER_CARD: Final = 100
# Granularity of memory shares: the node plugin's request-policy step and minimum for shared
# cards, and the amount the translator states for a share that names no memory.
MEMORY_STEP: Final = 1 << 20

# Kubernetes' own names the gateway reads or must avoid.
K8S_POD_CLAIM_NAME_ANNOTATION: Final = "resource.kubernetes.io/pod-claim-name"

# Moving a live cluster (ARCHITECTURE.md, "Moving a live cluster").
# The namespace label, and the pod annotation, that say whether pods are translated.
TRANSLATION_LABEL: Final = f"{DOMAIN}/translation"
TRANSLATION_ENABLED: Final = "enabled"
TRANSLATION_AUDIT: Final = "audit"
TRANSLATION_DISABLED: Final = "disabled"
TRANSLATION_MODES: Final = (TRANSLATION_ENABLED, TRANSLATION_AUDIT, TRANSLATION_DISABLED)
# A namespace whose pods may hold themselves back from translation (their own annotation
# dra-gateway.io/translation: disabled or audit): the administrator's grant, a label tenants
# with `edit` cannot write. The webhook's --pod-opt-out=everywhere grants it to every namespace.
POD_OPT_OUT_LABEL: Final = f"{DOMAIN}/pod-opt-out"
POD_OPT_OUT_ALLOWED: Final = "allowed"
# The node label an administrator (or `dra-gateway migrate node`) sets to cut a node over: the
# legacy device plugin's DaemonSet is told to leave nodes carrying it.
NODE_CUT_OVER_LABEL: Final = f"{DOMAIN}/cut-over"
NODE_CUT_OVER_VALUE: Final = "true"
# The node condition through which the node plugin says where its node is in the move.
NODE_MIGRATION_CONDITION: Final = "DraGatewayMigration"
# The node plugin's word on its devices' health: a taint `<driver>/unhealthy` (value: the
# reason, effect: the fault's class) where the cluster keeps device taints, else the devices
# are withheld; either way this Node condition lists them (kube/device_health.py).
NODE_HEALTH_CONDITION: Final = "GpuDevicesUnhealthy"
UNHEALTHY_TAINT_SUFFIX: Final = "/unhealthy"
NODE_STATE_LEGACY: Final = "Legacy"
NODE_STATE_CUTTING_OVER: Final = "CuttingOver"
NODE_STATE_DRA: Final = "DRA"
